// File: kwq/clock.h
//
// Clocks for everything in kwq that waits: timers, delaying queues, context deadlines.
//
// Every time-based component takes a `Clock*`, so that tests and the simulator can drive
// time by hand. `RealClock` reads the monotonic clock (CLOCK_MONOTONIC): its absl::Time
// values lie on a monotonic timeline, not the calendar, and must not be formatted as dates.
// `FakeClock` only moves when told to; moving it runs every timer and wakes every sleeper
// that became due, on the thread that moved it, before Advance/SetTime returns, so tests
// never need a real sleep.
//
// Thread safety: every member of every clock here may be called from any thread.

#ifndef KWQ_CLOCK_H_
#define KWQ_CLOCK_H_

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "kwq/internal/mutex.h"

namespace kwq {

// Told by a manual clock each time it moves forward or stays put (Advance, SetTime to
// Now() or later); a backward jump is not reported, since nothing becomes due by going
// back. TimerService uses it to run due timers when a FakeClock advances; users rarely
// implement it.
class ClockObserver {
 public:
  virtual ~ClockObserver() = default;
  // Called on the thread that moved the clock, one move at a time: a manual clock must
  // not call its observers for two moves at once (FakeClock holds its move lock around
  // the calls; TimerService relies on it when it records the callback it is running).
  // `now` is the new time, never earlier than the previous call's unless a backward
  // jump (which calls no observer) came in between. May call
  // Clock::Now(); must not move the clock (the move in progress is still running; a
  // FakeClock fails a check rather than deadlock). FakeClock also lets it add and remove
  // observers of the same clock.
  virtual void OnClockMoved(absl::Time now) = 0;
};

// A source of time. Implementations must be monotonic (for each thread's readings)
// unless documented otherwise.
class Clock {
 public:
  virtual ~Clock() = default;

  // The current time. Never blocks.
  virtual absl::Time Now() const = 0;

  // A cheaper, coarser reading for bookkeeping that tolerates a few milliseconds of error
  // (the rate limiters' idle horizons): never later than a Now() that follows it on the
  // same thread, and at most the clock's coarse resolution behind it (RealClock on
  // clock_gettime: CLOCK_MONOTONIC_COARSE, one kernel tick, typically 1-4 ms, at under a
  // third of Now's cost; RealClock on the TSC: Now() itself, which costs about as
  // little). Monotonic like Now, as far as the kernel keeps it so (older kernels could
  // step the coarse clock back by nanoseconds while NTP adjusted its rate; the rate
  // limiters tolerate a clock that goes back). The default returns Now(), so manual
  // clocks stay exact. Never blocks.
  virtual absl::Time CoarseNow() const { return Now(); }

  // Blocks the calling thread until Now() >= deadline (a manual clock: until it is moved
  // to or past deadline; FakeClock then returns even if it is set back before the thread
  // wakes). Returns at once for a deadline in the past; absl::InfiniteFuture() blocks
  // forever on a real clock (a manual clock moved to absl::InfiniteFuture() wakes it).
  virtual void SleepUntil(absl::Time deadline) = 0;

  // SleepUntil(Now() + d); saturates rather than overflowing for huge d.
  void SleepFor(absl::Duration d) { SleepUntil(Now() + d); }

  // True for clocks that move only when told to (FakeClock). Users of a manual clock do
  // not wait with a thread of their own: they observe the clock (AddObserver).
  virtual bool is_manual() const { return false; }

  // Manual clocks accept observers and return true; real clocks return false, and their
  // users must wait with their own thread. The observer must stay alive until removed. A
  // manual clock must override it (TimerService::Create refuses one that returns false).
  virtual bool AddObserver(ClockObserver* observer);
  // Removes an observer. After it returns, the observer is not being called and will not
  // be called again. Must not be called from inside that observer's OnClockMoved unless
  // the clock allows it (FakeClock does: that call goes on, and no later one comes).
  // Whether either may be called from inside another observer's OnClockMoved is up to
  // the clock (FakeClock allows it).
  virtual void RemoveObserver(ClockObserver* observer);
};

// The monotonic system clock: CLOCK_MONOTONIC's timeline (std::chrono::steady_clock's on
// Linux). Where the kernel itself computes CLOCK_MONOTONIC from an invariant TSC (its
// clocksource is "tsc"), Now() reads the TSC and scales it in user space, about 9 ns
// against clock_gettime's 24 on the development VM. The scale is calibrated against
// clock_gettime over two windows of at least 10 ms that must agree (each ends at the
// first Now() past it, so about 20 ms after the program starts in a program that reads
// the clock; Now() returns clock_gettime until then) and re-synchronised every second,
// steered like an NTP slew so that the timeline stays continuous and within about a
// microsecond of the kernel's (after a suspend, which the TSC runs through and
// CLOCK_MONOTONIC does not, it may lead by up to 2 s for under a minute).
// Each thread's readings are monotonic; a reading ordered after another thread's (by a
// lock) may be earlier than it, because the rdtsc is not fenced (fencing cost more than
// clock_gettime): usually by tens of nanoseconds, but on the development VM by up to
// 1.4 us under a mutex and 15 us through release/acquire atomics (docs/design.md).
// Compare times across threads with that slack, or use KWQ_CLOCK=kernel. The environment variable
// KWQ_CLOCK=kernel, read once before main() runs, keeps clock_gettime, as does a kernel
// on another clocksource at start-up (the choice is not revisited). Not
// async-signal-safe on the TSC path. docs/design.md ("A TSC-read RealClock") has the
// details and measurements.
class RealClock final : public Clock {
 public:
  // The process-wide instance; never destroyed.
  static RealClock* Default();

  // Whether Now() reads the TSC (see above). Thread-safe.
  static bool ReadsTsc();

  absl::Time Now() const override;
  absl::Time CoarseNow() const override;
  void SleepUntil(absl::Time deadline) override;
};

// A clock that moves only when told to. Starts at `start` (a fixed, arbitrary instant by
// default). Advance and SetTime run the observers (the timers of every TimerService built
// on this clock) and wake sleepers before they return. A timer callback's exception does
// not keep the move from the other services: Advance/SetTime rethrow the first one once
// every observer was told (the throwing service runs its other due timers at the next
// move). Calls to Advance/SetTime from
// several threads are serialised: a move holds the clock's move lock while it calls the
// observers, so Advance, SetTime, AddObserver and RemoveObserver on other threads wait
// for it (an observer, or a timer callback, that waits for such a thread deadlocks).
//
// From inside an observer call (a timer callback of a TimerService on this clock), on
// the moving thread: AddObserver and RemoveObserver do not wait (so a callback may create
// or destroy another TimerService on the same clock); Advance and SetTime fail a
// KWQ_CHECK, since the move in progress cannot finish before they do.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000));
  ~FakeClock() override;

  absl::Time Now() const override;

  // Blocks until another thread moves the clock to or past `deadline` (returns then even
  // if the clock is set back before this thread wakes). From inside one of
  // its observers (a timer callback) with `deadline` still ahead it fails a KWQ_CHECK: no
  // other thread can move the clock before that observer returns.
  void SleepUntil(absl::Time deadline) override;

  // Moves the clock forward by `d` (negative `d` is treated as zero; use SetTime to jump
  // backwards). Advance(absl::ZeroDuration()) runs timers that are already due. Must not
  // be called from inside an observer of this clock (checked: see above).
  void Advance(absl::Duration d);

  // Sets the clock to `t`, which may be earlier than Now() (a clock jump, for fault
  // injection). A backward jump fires nothing, not even timers that were already due
  // (they run at the next move that does not go back), calls no observer, and sleepers
  // keep sleeping. Must not be called from inside an observer of this clock (checked).
  void SetTime(absl::Time t);

  // Number of threads blocked in SleepUntil. Tests use it to know a thread is waiting.
  size_t NumSleepers() const;

  bool is_manual() const override { return true; }
  // True. Waits for a move in progress, except from inside one of its observer calls,
  // where it does not wait: the new observer is first called for the next move.
  // Observers are called in the order they were added; adding one that is observing
  // already changes nothing (it is still called once per move). O(1) amortised.
  // Returns false for nullptr (and RemoveObserver(nullptr) does nothing).
  bool AddObserver(ClockObserver* observer) override;
  // Waits for a move in progress, except from inside one of its observer calls, where it
  // does not wait: the observer is not called again (and is not being called, unless it
  // is the observer making the call, whose own call of course goes on). O(1) amortised
  // (destroying N queues on one clock took N^2 / 2 steps: 80,000 took 2 s).
  void RemoveObserver(ClockObserver* observer) override;

 private:
  void MoveTo(absl::Time t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);
  // Whether the calling thread is inside this clock's observer calls (and so holds
  // move_mu_).
  bool CalledByObserver() const {
    return mover_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

  // Held for the whole of a move, so observers are called by one mover at a time and
  // RemoveObserver waits for a move in progress. Acquired before mu_.
  internal::Mutex move_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Drops the null entries of observers_ and renumbers index_.
  void CompactObservers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(move_mu_);

  // The observers in the order added. Null entries are removed ones, erased at the end of
  // a move or once they are half the list (not during a move, which walks it by position).
  std::vector<ClockObserver*> observers_ ABSL_GUARDED_BY(move_mu_);
  absl::flat_hash_map<ClockObserver*, size_t> index_ ABSL_GUARDED_BY(move_mu_);  // position
  size_t removed_ ABSL_GUARDED_BY(move_mu_) = 0;  // null entries in observers_
  // The thread calling the observers, or none. Written only by that thread, with
  // move_mu_ held; read by any thread only to compare with its own id, which it can see
  // there only if it wrote it itself, so relaxed order is enough.
  std::atomic<std::thread::id> mover_{};

  // A thread in SleepUntil, listed on its own stack. `due`: a move reached `deadline`
  // (set by the mover under mu_, so a later move back does not undo it).
  struct Sleeper {
    absl::Time deadline;
    bool due = false;
    Sleeper* prev = nullptr;
    Sleeper* next = nullptr;
  };

  mutable internal::Mutex mu_;
  internal::CondVar moved_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  Sleeper* sleepers_head_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kwq

#endif  // KWQ_CLOCK_H_
