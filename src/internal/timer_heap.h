// Timers of a TimerService: callbacks in a slab of slots, ordered by an IndexedHeap (not
// thread-safe; the service's lock guards it).
//
// A timer's id is its slot number plus a 32-bit generation that changes each time the
// slot is freed, so a stale id is rejected instead of cancelling someone else's timer.

#ifndef KWQ_SRC_INTERNAL_TIMER_HEAP_H_
#define KWQ_SRC_INTERNAL_TIMER_HEAP_H_

#include <cstdint>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"
#include "kwq/internal/indexed_heap.h"

namespace kwq::internal {

class TimerHeap {
 public:
  using Callback = absl::AnyInvocable<void()>;

  // Adds a timer; returns its id (never 0).
  uint64_t Insert(absl::Time deadline, Callback fn);
  // Removes a pending timer; returns false if `id` is not pending.
  bool Remove(uint64_t id);
  // Moves a pending timer (behind others with the same deadline); false if not pending.
  bool Update(uint64_t id, absl::Time deadline);
  // Earliest deadline, or absl::InfiniteFuture() when empty.
  absl::Time NextDeadline() const;
  // If the earliest timer is due at `now`, removes it, moves its callback to `*fn`, sets
  // `*id` and returns true. A timer at absl::InfiniteFuture() is never due.
  bool PopDue(absl::Time now, uint64_t* id, Callback* fn);
  size_t size() const { return heap_.size(); }
  bool Contains(uint64_t id) const { return Find(id) != kNoSlot; }

 private:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  struct Slot {
    Callback fn;
    uint32_t generation = 1;
    uint32_t next_free = kNoSlot;
  };
  static int64_t KeyOf(absl::Time t);
  static uint64_t IdOf(uint32_t slot, uint32_t generation) {
    return (static_cast<uint64_t>(generation) << 32) | slot;
  }
  // Slot of a pending id, or kNoSlot.
  uint32_t Find(uint64_t id) const;
  void FreeSlot(uint32_t slot);

  std::vector<Slot> slots_;
  IndexedHeap heap_;  // pending slots by deadline
  uint32_t free_head_ = kNoSlot;
};

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_TIMER_HEAP_H_
