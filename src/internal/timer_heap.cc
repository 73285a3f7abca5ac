#include "internal/timer_heap.h"

#include <limits>
#include <utility>

namespace kwq::internal {

int64_t TimerHeap::KeyOf(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::numeric_limits<int64_t>::max();
  if (t == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  return absl::ToUnixNanos(t);  // saturates outside the int64 range
}

uint64_t TimerHeap::Insert(absl::Time deadline, Callback fn) {
  uint32_t slot;
  if (free_head_ != kNotInHeap) {
    slot = free_head_;
    free_head_ = slots_[slot].next_free;
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.fn = std::move(fn);
  s.next_free = kNotInHeap;
  const uint32_t pos = static_cast<uint32_t>(heap_.size());
  heap_.push_back(Entry{KeyOf(deadline), next_seq_++, slot});
  s.heap_pos = pos;
  SiftUp(pos);
  return (static_cast<uint64_t>(s.generation) << 32) | slot;
}

uint32_t TimerHeap::Find(uint64_t id) const {
  const uint32_t slot = static_cast<uint32_t>(id);
  const uint32_t generation = static_cast<uint32_t>(id >> 32);
  if (slot >= slots_.size()) return kNotInHeap;
  const Slot& s = slots_[slot];
  if (s.generation != generation || s.heap_pos == kNotInHeap) return kNotInHeap;
  return slot;
}

bool TimerHeap::Contains(uint64_t id) const { return Find(id) != kNotInHeap; }

bool TimerHeap::Remove(uint64_t id) {
  const uint32_t slot = Find(id);
  if (slot == kNotInHeap) return false;
  RemoveAt(slots_[slot].heap_pos);
  slots_[slot].fn = nullptr;
  FreeSlot(slot);
  return true;
}

bool TimerHeap::Update(uint64_t id, absl::Time deadline) {
  const uint32_t slot = Find(id);
  if (slot == kNotInHeap) return false;
  const uint32_t pos = slots_[slot].heap_pos;
  heap_[pos].key = KeyOf(deadline);
  heap_[pos].seq = next_seq_++;
  SiftUp(pos);
  SiftDown(slots_[slot].heap_pos);
  return true;
}

absl::Time TimerHeap::NextDeadline() const {
  if (heap_.empty()) return absl::InfiniteFuture();
  const int64_t key = heap_[0].key;
  if (key == std::numeric_limits<int64_t>::max()) return absl::InfiniteFuture();
  if (key == std::numeric_limits<int64_t>::min()) return absl::InfinitePast();
  return absl::FromUnixNanos(key);
}

bool TimerHeap::PopDue(absl::Time now, uint64_t* id, Callback* fn) {
  if (heap_.empty() || heap_[0].key == std::numeric_limits<int64_t>::max() ||
      heap_[0].key > KeyOf(now)) {
    return false;
  }
  const uint32_t slot = heap_[0].slot;
  Slot& s = slots_[slot];
  *id = (static_cast<uint64_t>(s.generation) << 32) | slot;
  *fn = std::move(s.fn);
  s.fn = nullptr;
  RemoveAt(0);
  FreeSlot(slot);
  return true;
}

void TimerHeap::Place(uint32_t pos, const Entry& e) {
  heap_[pos] = e;
  slots_[e.slot].heap_pos = pos;
}

void TimerHeap::SiftUp(uint32_t pos) {
  const Entry e = heap_[pos];
  while (pos > 0) {
    const uint32_t parent = (pos - 1) / 4;
    if (!Less(e, heap_[parent])) break;
    Place(pos, heap_[parent]);
    pos = parent;
  }
  Place(pos, e);
}

void TimerHeap::SiftDown(uint32_t pos) {
  const Entry e = heap_[pos];
  const uint32_t n = static_cast<uint32_t>(heap_.size());
  for (;;) {
    const uint32_t first = pos * 4 + 1;
    if (first >= n) break;
    uint32_t best = first;
    const uint32_t last = first + 4 < n ? first + 4 : n;
    for (uint32_t c = first + 1; c < last; ++c) {
      if (Less(heap_[c], heap_[best])) best = c;
    }
    if (!Less(heap_[best], e)) break;
    Place(pos, heap_[best]);
    pos = best;
  }
  Place(pos, e);
}

void TimerHeap::RemoveAt(uint32_t pos) {
  const uint32_t slot = heap_[pos].slot;
  const uint32_t last = static_cast<uint32_t>(heap_.size() - 1);
  if (pos != last) {
    const uint32_t moved = heap_[last].slot;
    Place(pos, heap_[last]);
    heap_.pop_back();
    SiftUp(pos);
    SiftDown(slots_[moved].heap_pos);
  } else {
    heap_.pop_back();
  }
  slots_[slot].heap_pos = kNotInHeap;
}

void TimerHeap::FreeSlot(uint32_t slot) {
  Slot& s = slots_[slot];
  s.heap_pos = kNotInHeap;
  ++s.generation;
  if (s.generation == 0) s.generation = 1;  // keep ids non-zero after wrap-around
  s.next_free = free_head_;
  free_head_ = slot;
}

}  // namespace kwq::internal
