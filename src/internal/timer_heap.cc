#include "internal/timer_heap.h"

#include <utility>

namespace kwq::internal {

int64_t TimerHeap::KeyOf(absl::Time t, bool* inexact) const {
  if (inexact != nullptr) *inexact = false;
  if (t == absl::InfiniteFuture()) return kNever;
  if (t == absl::InfinitePast()) return kPast;
  // Quarter nanoseconds, absl::Time's resolution: within the range a key is the exact
  // time, so equal keys are equal deadlines. (Whole nanoseconds made fractional deadlines
  // share a key, and ordering them by their exact times cost every pop a look at all the
  // timers of that nanosecond: 20,000 at one third of a second took 834 ms to run.)
  const absl::Duration since = t - origin_;            // saturates to +-InfiniteDuration
  const int64_t ns = absl::ToInt64Nanoseconds(since);  // truncates toward zero; saturates
  if (ns > -kMaxNs && ns < kMaxNs) {
    // A whole nanosecond (a real clock's readings, and deadlines made from them) skips
    // the Duration multiplication.
    if (absl::Nanoseconds(ns) == since) return ns * 4;
    return absl::ToInt64Nanoseconds(since * 4);  // exact: quarters are whole nanoseconds
  }
  if (inexact != nullptr) *inexact = true;
  return ns > 0 ? kFar : kPast;
}

absl::Time TimerHeap::RangeEnd() const { return origin_ + absl::Nanoseconds(kMaxNs); }

uint32_t TimerHeap::NewSlot(absl::Time deadline) {
  // Every allocation first (each may throw std::bad_alloc, nothing changed yet): a new
  // slot appended before a heap growth that threw was lost for good.
  const bool reuse = free_head_ != kNoSlot;
  heap_.ReserveOneMore(reuse ? slots_.size() : slots_.size() + 1);
  uint32_t slot;
  if (reuse) {
    slot = free_head_;
    free_head_ = slots_[slot].next_free;
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();  // may throw, leaving slots_ as it was; the push below cannot
  }
  Slot& s = slots_[slot];
  s.next_free = kNoSlot;
  bool inexact;
  heap_.Push(slot, KeyOf(deadline, &inexact));
  SetDeadline(slot, deadline, inexact);
  return slot;
}

void TimerHeap::SetDeadline(uint32_t slot, absl::Time deadline, bool inexact) {
  Slot& s = slots_[slot];
  if (s.inexact && s.deadline < origin_) --inexact_past_;
  if (inexact && deadline < origin_) ++inexact_past_;
  s.deadline = deadline;
  s.inexact = inexact;
}

uint32_t TimerHeap::FirstWithTopKey() const {
  uint32_t first = heap_.TopId();
  const int64_t key = heap_.TopKey();
  // Equal exact keys are equal deadlines, so FIFO (the heap's order) is the order: for
  // every key within the range, and for kPast while it holds only absl::InfinitePast().
  // (Looking at the top key's entries whenever any timer anywhere was saturated made the
  // pops of N timers sharing one deadline cost N^2 / 2 looks while a single timer 300
  // years out was pending: timer_bench's BM_EqualDeadlinesFire.)
  if (key != kFar && (key != kPast || inexact_past_ == 0)) return first;
  heap_.ForEachWithTopKey([&](uint32_t slot) {
    const absl::Time d = slots_[slot].deadline;
    if (d < slots_[first].deadline || (d == slots_[first].deadline && heap_.Before(slot, first))) {
      first = slot;
    }
  });
  return first;
}

uint64_t TimerHeap::Insert(absl::Time deadline, Fn&& fn) {
  const uint32_t slot = NewSlot(deadline);
  slots_[slot].cb.fn = std::move(fn);
  return IdOf(slot, slots_[slot].generation);
}

uint64_t TimerHeap::InsertRaw(absl::Time deadline, void (*fn)(void*), void* arg) {
  const uint32_t slot = NewSlot(deadline);
  slots_[slot].cb.raw = fn;
  slots_[slot].cb.arg = arg;
  return IdOf(slot, slots_[slot].generation);
}

void TimerHeap::TakeCallback(uint32_t slot, Callback* out) {
  Callback& cb = slots_[slot].cb;
  if (cb.raw != nullptr) {
    if (out != nullptr) {
      out->raw = cb.raw;
      out->arg = cb.arg;
    }
    cb.raw = nullptr;
    return;
  }
  if (out != nullptr) out->fn = std::move(cb.fn);
  cb.fn = nullptr;
}

uint32_t TimerHeap::Find(uint64_t id) const {
  const uint32_t slot = static_cast<uint32_t>(id);
  if (slot >= slots_.size() || slots_[slot].generation != static_cast<uint32_t>(id >> 32) ||
      !heap_.Contains(slot)) {
    return kNoSlot;
  }
  return slot;
}

bool TimerHeap::Remove(uint64_t id, Callback* fn) {
  const uint32_t slot = Find(id);
  if (slot == kNoSlot) return false;
  heap_.Remove(slot);
  TakeCallback(slot, fn);
  FreeSlot(slot);
  return true;
}

bool TimerHeap::Update(uint64_t id, absl::Time deadline) {
  const uint32_t slot = Find(id);
  if (slot == kNoSlot) return false;
  bool inexact;
  heap_.Update(slot, KeyOf(deadline, &inexact));
  SetDeadline(slot, deadline, inexact);
  return true;
}

absl::Time TimerHeap::NextDeadline(absl::Time now) const {
  if (heap_.empty()) return absl::InfiniteFuture();
  const int64_t key = heap_.TopKey();
  if (key == kNever) return absl::InfiniteFuture();
  if (key == kFar && KeyOf(now, nullptr) != kFar) return RangeEnd();
  if (key == kFar || key == kPast) return slots_[FirstWithTopKey()].deadline;
  return origin_ + absl::Nanoseconds(key) / 4;
}

bool TimerHeap::PopDue(absl::Time now, uint64_t* id, Callback* fn) {
  if (heap_.empty()) return false;
  const int64_t key = heap_.TopKey();
  if (key == kNever) return false;
  const int64_t now_key = KeyOf(now, nullptr);
  if (key > now_key) return false;  // within the range the keys are the exact times
  const uint32_t slot = FirstWithTopKey();
  // Only where both keys saturated can the exact deadline tell otherwise.
  if (key == now_key && (key == kFar || key == kPast) && slots_[slot].deadline > now) {
    return false;
  }
  heap_.Remove(slot);
  Slot& s = slots_[slot];
  *id = IdOf(slot, s.generation);
  TakeCallback(slot, fn);
  FreeSlot(slot);
  return true;
}

void TimerHeap::FreeSlot(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.inexact && s.deadline < origin_) --inexact_past_;
  s.inexact = false;
  // Its last generation used: a wrap would issue its first id again, so retire it (it
  // stays in slots_, off the free list, and Find rejects its ids since it is not pending).
  if (s.generation == UINT32_MAX) return;
  ++s.generation;
  s.next_free = free_head_;
  free_head_ = slot;
}

}  // namespace kwq::internal
