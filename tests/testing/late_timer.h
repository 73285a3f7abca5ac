// LateTimer: makes a TimerService on a FakeClock late, so that a test can look at timers
// that are due but have not fired (what a real service's busy thread produces). It
// schedules a callback due `by` - 1 ns from now that spins until Release(); Start() then
// moves the clock by `by` on a thread of its own: the service runs the spinning callback
// inside that move, and every timer due at `by` waits behind it, with the clock past
// their time.
//
//   testing::LateTimer late(*timers_, clock_, absl::Seconds(1));
//   q.AddAfter("a", absl::Seconds(1));
//   ASSERT_TRUE(late.Start());  // "a" is due, its timer not yet run
//   ...
//   late.Release();             // (also the destructor) the timers run; the move returns

#ifndef KWQ_TESTS_TESTING_LATE_TIMER_H_
#define KWQ_TESTS_TESTING_LATE_TIMER_H_

#include <atomic>
#include <thread>

#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/timer.h"
#include "testing/eventually.h"

namespace kwq::testing {

class LateTimer {
 public:
  LateTimer(TimerService& timers, FakeClock& clock, absl::Duration by)
      : timers_(timers), clock_(clock), by_(by) {
    id_ = timers.Schedule(clock.Now() + by - absl::Nanoseconds(1), [this] {
      holding_ = true;
      while (!release_) std::this_thread::yield();
    });
  }
  ~LateTimer() { Release(); }
  LateTimer(const LateTimer&) = delete;
  LateTimer& operator=(const LateTimer&) = delete;

  // Moves the clock on another thread; returns whether the spinning callback started
  // (within Eventually's limit).
  bool Start() {
    mover_ = std::thread([this] { clock_.Advance(by_); });
    return Eventually([this] { return holding_.load(); });
  }
  // Lets the callbacks run and waits for the move to end (never started: takes the
  // spinning callback off the service). Idempotent.
  void Release() {
    release_ = true;
    if (mover_.joinable()) {
      mover_.join();
    } else {
      timers_.Cancel(id_);
    }
  }

 private:
  TimerService& timers_;
  FakeClock& clock_;
  const absl::Duration by_;
  TimerId id_ = 0;
  std::atomic<bool> holding_{false}, release_{false};
  std::thread mover_;
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_LATE_TIMER_H_
