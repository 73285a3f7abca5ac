#include "internal/timer_heap.h"

#include <limits>
#include <utility>

namespace kwq::internal {

namespace {
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
}

int64_t TimerHeap::KeyOf(absl::Time t) {
  if (t == absl::InfiniteFuture()) return kNever;
  if (t == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  const int64_t ns = absl::ToUnixNanos(t);  // saturates outside the int64 range
  return ns == kNever ? kNever - 1 : ns;    // only InfiniteFuture means never
}

uint64_t TimerHeap::Insert(absl::Time deadline, Callback fn) {
  uint32_t slot;
  if (free_head_ != kNoSlot) {
    slot = free_head_;
    free_head_ = slots_[slot].next_free;
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.fn = std::move(fn);
  s.next_free = kNoSlot;
  heap_.Push(slot, KeyOf(deadline));
  return IdOf(slot, s.generation);
}

uint32_t TimerHeap::Find(uint64_t id) const {
  const uint32_t slot = static_cast<uint32_t>(id);
  if (slot >= slots_.size() || slots_[slot].generation != static_cast<uint32_t>(id >> 32) ||
      !heap_.Contains(slot)) {
    return kNoSlot;
  }
  return slot;
}

bool TimerHeap::Remove(uint64_t id) {
  const uint32_t slot = Find(id);
  if (slot == kNoSlot) return false;
  heap_.Remove(slot);
  slots_[slot].fn = nullptr;
  FreeSlot(slot);
  return true;
}

bool TimerHeap::Update(uint64_t id, absl::Time deadline) {
  const uint32_t slot = Find(id);
  if (slot == kNoSlot) return false;
  heap_.Update(slot, KeyOf(deadline));
  return true;
}

absl::Time TimerHeap::NextDeadline() const {
  if (heap_.empty()) return absl::InfiniteFuture();
  const int64_t key = heap_.TopKey();
  if (key == kNever) return absl::InfiniteFuture();
  if (key == std::numeric_limits<int64_t>::min()) return absl::InfinitePast();
  return absl::FromUnixNanos(key);
}

bool TimerHeap::PopDue(absl::Time now, uint64_t* id, Callback* fn) {
  if (heap_.empty() || heap_.TopKey() == kNever || heap_.TopKey() > KeyOf(now)) return false;
  const uint32_t slot = heap_.TopId();
  heap_.Pop();
  Slot& s = slots_[slot];
  *id = IdOf(slot, s.generation);
  *fn = std::move(s.fn);
  s.fn = nullptr;
  FreeSlot(slot);
  return true;
}

void TimerHeap::FreeSlot(uint32_t slot) {
  Slot& s = slots_[slot];
  ++s.generation;
  if (s.generation == 0) s.generation = 1;  // keep ids non-zero after wrap-around
  s.next_free = free_head_;
  free_head_ = slot;
}

}  // namespace kwq::internal
