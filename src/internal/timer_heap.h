// Indexed 4-ary min-heap of timers for TimerService (not thread-safe; the service's lock
// guards it).
//
// Why hand-written: a timer must be cancellable and movable in O(log n) by id, which
// std::priority_queue cannot do, and absl has no indexed heap. Timers live in a slab of
// slots (reused through a free list, with a generation per slot so stale ids are
// rejected); the heap holds (deadline, sequence, slot) so sift operations touch only the
// heap array.

#ifndef KWQ_SRC_INTERNAL_TIMER_HEAP_H_
#define KWQ_SRC_INTERNAL_TIMER_HEAP_H_

#include <cstdint>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

namespace kwq::internal {

class TimerHeap {
 public:
  using Callback = absl::AnyInvocable<void()>;

  // Adds a timer; returns its id (never 0).
  uint64_t Insert(absl::Time deadline, Callback fn);
  // Removes a pending timer; returns false if `id` is not pending.
  bool Remove(uint64_t id);
  // Moves a pending timer; returns false if `id` is not pending.
  bool Update(uint64_t id, absl::Time deadline);
  // Earliest deadline, or absl::InfiniteFuture() when empty.
  absl::Time NextDeadline() const;
  // If the earliest timer is due at `now`, removes it, moves its callback to `*fn`, sets
  // `*id` and returns true.
  bool PopDue(absl::Time now, uint64_t* id, Callback* fn);
  size_t size() const { return heap_.size(); }
  bool Contains(uint64_t id) const;

 private:
  static constexpr uint32_t kNotInHeap = UINT32_MAX;
  struct Slot {
    Callback fn;
    uint32_t generation = 1;
    uint32_t heap_pos = kNotInHeap;
    uint32_t next_free = kNotInHeap;
  };
  struct Entry {
    int64_t key;  // deadline in ns since the Unix epoch (saturated)
    uint64_t seq;
    uint32_t slot;
  };
  static bool Less(const Entry& a, const Entry& b) {
    return a.key < b.key || (a.key == b.key && a.seq < b.seq);
  }
  static int64_t KeyOf(absl::Time t);
  // Slot index of a pending id, or kNotInHeap.
  uint32_t Find(uint64_t id) const;
  void Place(uint32_t pos, const Entry& e);
  void SiftUp(uint32_t pos);
  void SiftDown(uint32_t pos);
  void RemoveAt(uint32_t pos);
  void FreeSlot(uint32_t slot);

  std::vector<Slot> slots_;
  std::vector<Entry> heap_;
  uint32_t free_head_ = kNotInHeap;
  uint64_t next_seq_ = 0;
};

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_TIMER_HEAP_H_
