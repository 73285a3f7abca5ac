#include "kwq/internal/periodic_timer.h"

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
  timer_ = timers_->ScheduleAfter(period_, [this] {
    fn_();
    Arm();
  });
}

}  // namespace kwq::internal
