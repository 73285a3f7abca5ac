// Timers of a TimerService: callbacks in a slab of slots, ordered by an IndexedHeap (not
// thread-safe; the service's lock guards it).
//
// A timer's id is its slot number plus a 32-bit generation that changes each time the
// slot is freed, so a stale id is rejected instead of cancelling someone else's timer. A
// slot whose generation has named 2^32 - 1 timers is retired rather than wrapped, so an
// id is never issued twice: that keeps one unused slot (about 70 bytes with its heap
// index) per 2^32 - 1 timers.
//
// Heap keys are quarter nanoseconds (absl::Time's resolution) from an origin (the
// service's start): within about 73 years of it a key is the exact deadline, so a timer
// is due exactly when the time compared reaches it, and equal keys are equal deadlines
// (FIFO). Beyond that, keys saturate (kFar, kPast) and the exact deadline kept in the slot
// decides both whether such a timer is due and its order among the saturated ones
// (FirstWithTopKey, which looks at all the entries sharing the top key, but only when
// that key is saturated and stands for more than one deadline, and for kFar only once the
// time compared is past the range too: a process 73 years old, or a FakeClock moved that
// far). Many saturated timers of one side still cost their pops N^2 / 2 looks between
// them: deadlines 73 years from the service's start are not worth an ordered index.

#ifndef KWQ_SRC_INTERNAL_TIMER_HEAP_H_
#define KWQ_SRC_INTERNAL_TIMER_HEAP_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"
#include "kwq/internal/indexed_heap.h"

namespace kwq::internal {

struct TimerHeapPeer;  // tests: a slot's generation

class TimerHeap {
 public:
  using Fn = absl::AnyInvocable<void()>;
  // A timer's callback: a callable, or a plain function and its argument (InsertRaw:
  // nothing is stored or moved but those two words, no callable's manager called).
  struct Callback {
    Fn fn;
    void (*raw)(void*) = nullptr;
    void* arg = nullptr;
    void operator()() {
      if (raw != nullptr) {
        raw(arg);
      } else {
        fn();
      }
    }
    // Destroys the callable (and its captures), if any.
    void Reset() {
      if (raw == nullptr) fn = nullptr;
      raw = nullptr;
    }
  };

  // `origin`: the instant keys count from; timers within about 73 years of it are keyed
  // by their exact deadlines, the others by a saturated key and their exact deadline.
  explicit TimerHeap(absl::Time origin = absl::UnixEpoch()) : origin_(origin) {}

  // Adds a timer; returns its id (never 0).
  uint64_t Insert(absl::Time deadline, Fn&& fn);
  // Adds a timer that runs fn(arg).
  uint64_t InsertRaw(absl::Time deadline, void (*fn)(void*), void* arg);
  // Removes a pending timer; returns false if `id` is not pending. Its callback moves to
  // `*fn` when given (so the caller can destroy it after releasing its lock: a capture's
  // destructor may call back into the timer's owner), else is destroyed here.
  bool Remove(uint64_t id, Callback* fn = nullptr);
  // Moves a pending timer (behind others with the same deadline); false if not pending.
  bool Update(uint64_t id, absl::Time deadline);
  // When the earliest timer becomes due (its deadline rounded up to a whole nanosecond),
  // or absl::InfiniteFuture() when empty. When that deadline is past the key range and
  // `now` is not, the range's end instead: a time before it, but at most 73 years early,
  // that takes no look at the saturated timers (which cost every call a pass over them,
  // 250 us for 100,000 timers 300 years out, each time the service thread went back to
  // sleep). The caller asks again then.
  absl::Time NextDeadline(absl::Time now) const;
  // If the earliest timer is due at `now` (its deadline <= now), removes it, moves its
  // callback to `*fn`, sets `*id` and returns true. A timer at absl::InfiniteFuture() is
  // never due.
  bool PopDue(absl::Time now, uint64_t* id, Callback* fn);
  size_t size() const { return heap_.size(); }
  bool Contains(uint64_t id) const { return Find(id) != kNoSlot; }

 private:
  friend struct TimerHeapPeer;
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  // Keys: kNever for absl::InfiniteFuture(), kPast for absl::InfinitePast() and instants
  // too early for the range, kFar for finite instants too late for it.
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  static constexpr int64_t kFar = kNever - 1;
  static constexpr int64_t kPast = std::numeric_limits<int64_t>::min();
  // Whole nanoseconds from the origin below which (in magnitude) a time's key is exact.
  static constexpr int64_t kMaxNs = kFar / 4 - 1;
  struct Slot {
    Callback cb;
    absl::Time deadline;  // exact: it decides where the key saturated (kFar, kPast)
    uint32_t generation = 1;
    uint32_t next_free = kNoSlot;
    bool inexact = false;  // pending, and its key saturated
  };
  // The pending slot that goes first among those with the top key: the earliest exact
  // deadline, then the earliest scheduled. Timers whose deadlines share a saturated key
  // sit in the heap in scheduling order, and a later one at the top hid an earlier one
  // that was due. Looks past the top only where the top key is saturated and may stand for
  // more than one deadline: kFar, or kPast while some finite pre-range timer is pending.
  uint32_t FirstWithTopKey() const;
  // Sets slot `slot`'s deadline and its inexact flag, keeping inexact_past_ counted.
  void SetDeadline(uint32_t slot, absl::Time deadline, bool inexact);
  // The key of a time (a deadline, or the time it is compared with). `*inexact` (when
  // given): whether the key saturated, so that it stands for more than one time.
  int64_t KeyOf(absl::Time t, bool* inexact) const;
  // The first instant whose key saturates to kFar.
  absl::Time RangeEnd() const;
  static uint64_t IdOf(uint32_t slot, uint32_t generation) {
    return (static_cast<uint64_t>(generation) << 32) | slot;
  }
  // Slot of a pending id, or kNoSlot.
  uint32_t Find(uint64_t id) const;
  // A free slot (reused or new) for a timer at `deadline`, pushed on the heap.
  uint32_t NewSlot(absl::Time deadline);
  // Moves slot `slot`'s callback to `*out` (or destroys it when `out` is null).
  void TakeCallback(uint32_t slot, Callback* out);
  void FreeSlot(uint32_t slot);

  absl::Time origin_;
  std::vector<Slot> slots_;
  IndexedHeap heap_;  // pending slots by deadline key
  uint32_t free_head_ = kNoSlot;
  // Pending slots with inexact set and a deadline before the range (keyed kPast beside
  // any at absl::InfinitePast()).
  size_t inexact_past_ = 0;
};

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_TIMER_HEAP_H_
