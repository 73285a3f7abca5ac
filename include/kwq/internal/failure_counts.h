// File: kwq/internal/failure_counts.h
//
// FailureCounts: the per-item state of a counting rate limiter (one whose delay depends on
// an item only through its failures since its last Forget, see
// RateLimiter::FailureCounting), kept by a RateLimitingQueue beside each key of its key
// table instead of in the limiter's own hash table. Indexed by the queue's slot numbers,
// so a retry of the item being processed finds its count without hashing the item.
//
// A count lapses (reads as zero, and is cleared by the next call under the lock that sees
// it so, as the limiter's table erases such an entry) only while its key is idle: once
// the key has been neither queued, waiting nor in flight for longer than the idle horizon,
// counted from its last failure or from when it last went idle (Touch), whichever is
// later (a count that lapsed while idle is cleared when the key becomes busy again,
// EndIdle, so it does not count again). The limiter's own table can only count from the last
// failure, so there the time an item spends waiting (also behind another limiter's delay, such as a
// token bucket's), queued behind a backlog or being processed counts against the horizon. Times are
// whole nanoseconds of the clock's CoarseNow. Internal: used by Queue and PriorityQueue.
//
// Thread safety: Reset, Record and Forget run under the owning queue's table lock;
// Failures, Held and Touch may also run without it, for a slot that cannot be erased meanwhile
// (one that is in flight, or under the lock): entries never move.

#ifndef KWQ_INTERNAL_FAILURE_COUNTS_H_
#define KWQ_INTERNAL_FAILURE_COUNTS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/internal/time_key.h"

namespace kwq::internal {

struct FailureCountsPeer;  // tests: set a count near its saturation

class FailureCounts {
 public:
  // `idle_horizon` >= 0 (absl::InfiniteDuration(): counts never lapse), read on
  // `clock`->CoarseNow(). `clock` must outlive this object. Reads the clock once, and
  // lets an exception from it go on.
  FailureCounts(absl::Duration idle_horizon, Clock* clock);
  FailureCounts(const FailureCounts&) = delete;
  FailureCounts& operator=(const FailureCounts&) = delete;

  // The current time as this object measures it (ns, for the calls below). Never throws:
  // while a clock throws (a user's), it gives the last time it read, to within a
  // millisecond (the constructor reads once), so no count lapses meanwhile, and the
  // owner's state changes around these calls are never cut short (a throw left a key
  // marked dirty but never queued, or waiting outside the heap). A key that goes idle
  // meanwhile is stamped with that time, so its idle horizon may end early by as long as
  // the clock threw.
  int64_t Now() const noexcept {
    try {
      const int64_t now = absl::ToUnixNanos(clock_->CoarseNow());
      // Stored at most once per kStandInStep: every reading's store made the line
      // bounce between the threads that read the clock here.
      const int64_t last = last_now_.load(std::memory_order_relaxed);
      if (now > last && static_cast<uint64_t>(now) - static_cast<uint64_t>(last) > kStandInStep) {
        last_now_.store(now, std::memory_order_relaxed);
      }
      return now;
    } catch (...) {
      return last_now_.load(std::memory_order_relaxed);
    }
  }
  // Now(), or `now` when it is a reading of this object's clock: a precise reading serves
  // as well as a coarse one and saves reading the clock again.
  int64_t NowGiven(const Clock* clock, absl::Time now) const {
    return clock == clock_ ? absl::ToUnixNanos(now) : Now();
  }

  // Clears `slot`, making room for it (a key was just stored there). Under the lock.
  void Reset(uint32_t slot);

  // Makes room for every slot below `limit` (zero counts), for an owner that starts
  // counting after keys were stored. Under the lock.
  void Reserve(uint32_t limit);

  // The failures recorded for `slot` since its last Forget. `busy`: the slot's key is
  // queued, waiting or in flight, so its count cannot lapse. An idle key's count reads 0
  // once idle past the horizon (then `*lapsed`, if given, is set: a caller holding the
  // lock should Forget the count, as the limiter's table erases a lapsed entry, so that a
  // clock moved back later does not revive it).
  // Always inlined: a few loads on every NumRequeues and retry, which g++ left out of line
  // in a big caller once its inlining budget ran out (docs/benchmark-history.md,
  // 2026-12-02).
  ABSL_ATTRIBUTE_ALWAYS_INLINE int64_t Failures(uint32_t slot, int64_t now, bool busy,
                                                bool* lapsed = nullptr) const {
    const Entry& e = At(slot);
    const int64_t failures = e.failures.load(std::memory_order_relaxed);
    if (failures == 0) return 0;
    if (!busy && Lapsed(e.last.load(std::memory_order_relaxed), now)) {
      if (lapsed != nullptr) *lapsed = true;
      return 0;
    }
    return failures;
  }

  // Records one failure at `now` (`busy` as for Failures); returns the failures before
  // it. Under the lock.
  int64_t Record(uint32_t slot, int64_t now, bool busy) {
    Entry& e = At(slot);
    const int64_t before = Failures(slot, now, busy);
    e.failures.store(before < INT64_MAX ? before + 1 : before, std::memory_order_relaxed);
    e.last.store(now, std::memory_order_relaxed);
    return before;
  }

  // Restarts the idle horizon of `slot`'s count, if it has one: its key is going idle
  // now. Reads the clock only for a slot with a count. Under the lock, or, for a slot in
  // flight, by the thread ending its lease (a racing Record stores a time as recent).
  void Touch(uint32_t slot) {
    Entry& e = At(slot);
    if (e.failures.load(std::memory_order_relaxed) != 0) {
      e.last.store(Now(), std::memory_order_relaxed);
    }
  }

  // `slot`'s key is idle and about to become busy (an add): clears its count if it lapsed
  // while idle, since a busy key's count does not lapse and this one would count again.
  // Reads the clock only for a slot with a count. Under the lock.
  void EndIdle(uint32_t slot) {
    Entry& e = At(slot);
    if (e.failures.load(std::memory_order_relaxed) != 0 &&
        Lapsed(e.last.load(std::memory_order_relaxed), Now())) {
      Forget(slot);
    }
  }

  // Clears the count. Under the lock.
  void Forget(uint32_t slot) { At(slot).failures.store(0, std::memory_order_relaxed); }

  // Failures, clearing a lapsed count. Under the lock.
  int64_t FailuresLocked(uint32_t slot, int64_t now, bool busy) {
    bool lapsed = false;
    const int64_t failures = Failures(slot, now, busy, &lapsed);
    if (lapsed) Forget(slot);
    return failures;
  }

  // Whether the idle key in `slot` holds a count that has not lapsed: it must stay in the
  // table (an eviction would forget the failures before the horizon).
  bool Held(uint32_t slot, int64_t now) const { return Failures(slot, now, /*busy=*/false) != 0; }

 private:
  friend struct FailureCountsPeer;
  struct Entry {
    std::atomic<int64_t> failures{0};
    std::atomic<int64_t> last{0};
  };
  static constexpr uint32_t kChunk = 4096;  // entries per chunk, like KeyTable's

  // now - last > horizon, computed without overflow (times more than 292 years apart,
  // on a FakeClock or a custom clock, overflowed the difference: the count never lapsed).
  // (A horizon over 292 years used to saturate there and mean "never".)
  bool Lapsed(int64_t last, int64_t now) const { return AtLeastApart(last, now, lapse_ns_); }
  Entry& At(uint32_t slot) const {
    return dir_.load(std::memory_order_acquire)[slot / kChunk][slot % kChunk];
  }

  Clock* const clock_;
  // The horizon in whole nanoseconds (rounded down) plus one: a count lapses once now -
  // last > horizon, that is now - last >= lapse_ns_. kNeverSpan: never.
  const uint64_t lapse_ns_;
  // Chunks and the directory only grow (as in KeyTable), so lock-free readers of a slot
  // that existed when they were handed it never see memory move or go.
  std::vector<std::unique_ptr<Entry[]>> chunks_;
  std::vector<std::unique_ptr<Entry*[]>> dirs_;
  std::atomic<Entry* const*> dir_{nullptr};
  size_t dir_capacity_ = 0;
  // How stale the stand-in time may be (ns): a coarse clock's tick.
  static constexpr int64_t kStandInStep = 1'000'000;
  // A time Now() read, at most kStandInStep before its last reading (first by the
  // constructor); its own line, as readers without the lock share the others.
  alignas(64) mutable std::atomic<int64_t> last_now_{0};
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_FAILURE_COUNTS_H_
