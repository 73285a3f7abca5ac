#include "kwq/internal/periodic_timer.h"

#include <atomic>
#include <cstdio>
#include <utility>

namespace kwq::internal {

PeriodicTimer::PeriodicTimer(TimerService* timers, absl::Duration period,
                             absl::AnyInvocable<void()> fn)
    : timers_(timers), period_(period), fn_(std::move(fn)) {
  Arm();
}

void PeriodicTimer::Stop() {
  TimerId timer;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    timer = timer_;
  }
  // A run in progress re-arms only if it finds stopping_ clear: waiting for `timer`
  // (the one running, or the one it re-armed before stopping_ was set) is enough.
  if (timer != 0) timers_->CancelSync(timer);
}

void PeriodicTimer::Arm() {
  MutexLock lock(&mu_);
  if (stopping_) return;
  timer_ = timers_->ScheduleAfter(period_, [this] { Run(); });
}

void PeriodicTimer::Run() {
  // A timer callback must not throw (on a real clock's service that ends the process): a
  // run that throws (a metrics flush without memory, say) is dropped, and so is a re-arm
  // that cannot allocate, which stops the runs (said once on stderr).
  try {
    fn_();
  } catch (...) {
  }
  try {
    Arm();
  } catch (...) {
    MutexLock lock(&mu_);
    timer_ = 0;
    static std::atomic<bool> said{false};
    if (!said.exchange(true, std::memory_order_relaxed)) {
      std::fprintf(stderr, "kwq: a periodic timer could not be re-armed and stopped\n");
    }
  }
}

}  // namespace kwq::internal
