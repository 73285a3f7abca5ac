// File: kwq/timer.h
//
// TimerService: one service thread that runs callbacks at deadlines, shared by every
// delaying queue, delayed work item and context deadline of a process (not a thread per
// queue or per timer).
//
// Timers live in an indexed 4-ary heap ordered by (deadline, scheduling order): Schedule,
// Cancel and Reschedule are O(log n) under one short lock, and the service thread is
// woken only when a new timer becomes the earliest. Callbacks run one at a time, in
// deadline order (FIFO among equal deadlines), on the service thread, with no kwq lock
// held (on a manual clock, see below); a slow callback delays the timers behind it, so
// callbacks should hand real work to a queue.
//
// How the service thread sleeps is the backend:
//   - kIoUring: io_uring (liburing). An eventfd read stays posted on the ring; the thread
//     waits in io_uring_enter with the time to the next deadline as its timeout
//     (IORING_FEAT_EXT_ARG), so arming costs no system call and a wake-up is one eventfd
//     write. Needs Linux >= 5.11 and a process allowed to use io_uring. Should waiting
//     on the ring start failing (io_uring_enter failing with anything but its timeout or
//     an interruption), the service says so once on stderr and waits as kPortable does
//     for the rest of its life, rather than spin.
//   - kPortable: a condition variable waiting until the next deadline. Works everywhere.
//   - kAuto (default): io_uring when it can be set up, else portable, without error
//     (seccomp, kernel.io_uring_disabled and old kernels are all handled).
// The environment variable KWQ_TIMER_BACKEND=auto|portable|io_uring overrides kAuto (auto
// keeps it).
//
// With a manual clock (FakeClock) there is no thread at all: due timers run inside
// FakeClock::Advance/SetTime on the calling thread, deterministically. A timer scheduled
// at or before Now() then runs at the next Advance (Advance(absl::ZeroDuration()) is
// enough, also for times between two nanoseconds: see Schedule). The callbacks
// then run inside the clock's move, which holds FakeClock's move lock: they may schedule
// and cancel timers and create or destroy other services on the same clock, but must not
// move the clock (FakeClock fails a check) or wait for a thread that moves it or adds or
// removes its observers (that would deadlock). A timer a callback schedules at or before
// Now() on its own service (or on one created after it on the same clock: the clock tells
// its services of a move in creation order, once each) runs in the same move (unlike
// the kernel, which defers it to the next tick), so
// a callback that keeps rescheduling itself at Now() keeps the move from returning:
// reschedule periodic work at Now() + period. Having no backend, such a service ignores
// Options::backend and does not read KWQ_TIMER_BACKEND (a bad value is not reported), so
// fake-clock tests behave the same whatever the variable says.
//
// Thread safety: every member may be called from any thread, also from inside a callback
// of the same service (which holds none of its locks), except the destructor. Schedule,
// Cancel, Reschedule and Pending take the service's one lock, held only for the heap
// operation; only CancelSync and the destructor wait for a callback.

#ifndef KWQ_TIMER_H_
#define KWQ_TIMER_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kwq/clock.h"

namespace kwq {

// Names one scheduled timer. 0 is never a valid id. Ids are never reused while the
// service lives, so a stale id is harmless: Cancel returns false. (An id is a slot and a
// 32-bit generation; a slot that has named 2^32 - 1 timers is retired, which keeps about
// 70 bytes per 2^32 - 1 timers.)
using TimerId = uint64_t;

namespace internal {
class TimerCore;
}

class TimerService {
 public:
  enum class Backend { kAuto, kPortable, kIoUring };

  struct Options {
    // The clock deadlines are read on. nullptr means RealClock::Default(). Must outlive
    // the service.
    Clock* clock = nullptr;
    // kAuto: io_uring if usable, else portable; KWQ_TIMER_BACKEND overrides it.
    // An explicit kIoUring fails Create when io_uring is refused. Ignored, like the
    // variable, for a manual clock.
    Backend backend = Backend::kAuto;
  };

  // Starts a service (and its thread, for a real clock).
  // Errors, for a real clock: InvalidArgument for an unknown KWQ_TIMER_BACKEND value
  // (read only with backend = kAuto);
  // Unavailable when kIoUring is asked for (by option or variable) and io_uring cannot be
  // set up; Internal when the thread cannot be started. For a manual clock:
  // FailedPrecondition when its AddObserver refuses the service (returns false), since
  // nothing would ever run its timers.
  static absl::StatusOr<std::unique_ptr<TimerService>> Create(Options options);
  static absl::StatusOr<std::unique_ptr<TimerService>> Create() { return Create(Options{}); }

  // The process-wide service on RealClock::Default(), created on first use and never
  // destroyed. Context deadlines use it unless their root names another service. If
  // KWQ_TIMER_BACKEND is not a known value or forces a backend that cannot be used, it
  // warns on stderr and uses the portable backend; if even that cannot start (no
  // thread), it says so on stderr and aborts.
  static TimerService& Default();

  // Stops the service: timers still pending are dropped without running (their callables
  // are destroyed on the calling thread), a callback running on another thread is waited
  // for, and the service thread is joined. Must not be called from one of this service's
  // callbacks (with a manual clock that fails a KWQ_CHECK).
  ~TimerService();

  TimerService(const TimerService&) = delete;
  TimerService& operator=(const TimerService&) = delete;

  // Runs `fn` once, on the service thread, at or soon after `deadline`, never before it
  // (clock().Now() >= deadline when it runs, compared exactly, to absl::Time's quarter
  // nanosecond: a FakeClock at 10.5 ns runs a timer at 10.25 ns; a real clock reads whole
  // nanoseconds). A deadline in the past runs as soon as possible;
  // absl::InfiniteFuture() never runs (it can still be cancelled or rescheduled). Timers
  // more than about 73 years from the service's creation keep all of this too, and cost
  // the service thread nothing while they wait (a "no timeout" of the largest Duration
  // Go allows, 292 years, is such a timer). Never blocks on the service thread or on
  // callbacks. An empty `fn` makes a timer that runs nothing. `fn` must not throw on a
  // real clock: the exception leaves the service thread, which ends the process. On a
  // manual clock it leaves the FakeClock::Advance/SetTime that ran it, and this service's
  // other due timers run at the next move. Throws std::bad_alloc, with nothing
  // scheduled, when the heap cannot grow.
  TimerId Schedule(absl::Time deadline, absl::AnyInvocable<void()> fn);
  // Schedule(clock().Now() + delay, fn); saturates for huge delays.
  TimerId ScheduleAfter(absl::Duration delay, absl::AnyInvocable<void()> fn);
  // Schedule for fn(arg), a plain function: the same contract, with no callable to store,
  // move or destroy (about 8 ns less per Schedule + Cancel; contexts' deadlines use it).
  // `arg` must stay valid until the timer has run or been cancelled (CancelSync when it
  // may be running). A null `fn` makes a timer that runs nothing.
  TimerId Schedule(absl::Time deadline, void (*fn)(void*), void* arg);

  // Removes a pending timer. Returns true when this call stopped the callback from
  // running; false when it already ran, is running now, was cancelled, or `id` is
  // unknown. Never waits for a callback. The cancelled callable is destroyed on the
  // calling thread, after the service's lock is released.
  bool Cancel(TimerId id);

  // Like Cancel, and when the callback is running on another thread, waits for it to
  // return (the kernel's del_timer_sync). Called from inside that callback it does not
  // wait. After it returns, `id`'s callback is not running and never will. An unknown
  // id (0 included) returns false at once.
  bool CancelSync(TimerId id);

  // Moves a pending timer to `deadline`, keeping its callback. Returns false (and changes
  // nothing) when the timer is no longer pending.
  bool Reschedule(TimerId id, absl::Time deadline);

  // Timers scheduled and not yet run or cancelled (a callback running now is not counted).
  size_t Pending() const;

  Clock& clock() const;
  // The backend in use: kPortable or kIoUring for a real clock (kPortable once an
  // io_uring service has fallen back, see above); kPortable for a manual one.
  Backend backend() const;
  // backend() as text: "portable" or "io_uring".
  std::string_view backend_name() const;

 private:
  explicit TimerService(std::unique_ptr<internal::TimerCore> core);
  std::unique_ptr<internal::TimerCore> core_;
};

}  // namespace kwq

#endif  // KWQ_TIMER_H_
