// File: kwq/internal/periodic_timer.h
//
// PeriodicTimer: runs a function every `period` on a TimerService, re-arming itself after
// each run, until it is stopped. Serves the queues' metric refresh (queue_metrics.h) and
// the Prometheus provider's flushes. Internal: kwq users must not depend on this header.
//
// Thread safety: Stop (and the destructor) may be called from any thread except from
// inside `fn`; after it returns, `fn` is not running and will not run again.
// Out of memory: a run of `fn` that throws is dropped (the next comes a period later); a
// re-arm that cannot allocate stops the runs (said once on stderr), rather than throw
// from a timer callback, which would end the process.

#ifndef KWQ_INTERNAL_PERIODIC_TIMER_H_
#define KWQ_INTERNAL_PERIODIC_TIMER_H_

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"
#include "kwq/internal/mutex.h"
#include "kwq/timer.h"

namespace kwq::internal {

class PeriodicTimer {
 public:
  // Starts at once: the first run comes `period` from now. `timers` must outlive this.
  PeriodicTimer(TimerService* timers, absl::Duration period, absl::AnyInvocable<void()> fn);
  ~PeriodicTimer() { Stop(); }
  PeriodicTimer(const PeriodicTimer&) = delete;
  PeriodicTimer& operator=(const PeriodicTimer&) = delete;

  // Stops the runs, waiting for one in progress. Idempotent.
  void Stop();

 private:
  void Arm();  // may throw std::bad_alloc
  void Run();  // the timer's callback: fn_, then Arm; never throws

  TimerService* const timers_;
  const absl::Duration period_;
  absl::AnyInvocable<void()> fn_;  // run only by the timer callback
  Mutex mu_;
  TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_PERIODIC_TIMER_H_
