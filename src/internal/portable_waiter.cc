// Portable TimerService backend: a condition variable wait with a timeout.

#include <algorithm>
#include <chrono>

#include "internal/timer_waiter.h"

namespace kwq::internal {

absl::Duration TimeLeft(absl::Time deadline, const Clock& clock) {
  if (deadline == absl::InfiniteFuture()) return absl::Hours(24);
  return std::clamp(deadline - clock.Now(), absl::ZeroDuration(), absl::Hours(24));
}

namespace {

class PortableWaiter final : public TimerWaiter {
 public:
  void Wait(Mutex* mu, absl::Time deadline, const Clock& clock) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // A Wake() that raced ahead of this Wait left `woken_` set: consume it.
    if (woken_.exchange(false, std::memory_order_acquire)) return;
    const absl::Duration left = TimeLeft(deadline, clock);
    if (left <= absl::ZeroDuration()) return;
    cv_.WaitFor(mu, left);
    woken_.store(false, std::memory_order_relaxed);
  }

  void Wake() override {
    // Callers call Wake after releasing the service mutex, so the service thread may not
    // be in cv_ yet: the flag carries the wake-up to its next Wait.
    woken_.store(true, std::memory_order_release);
    cv_.Signal();
  }

  TimerService::Backend kind() const override { return TimerService::Backend::kPortable; }

 private:
  CondVar cv_;
  std::atomic<bool> woken_{false};
};

}  // namespace

std::unique_ptr<TimerWaiter> NewPortableWaiter() { return std::make_unique<PortableWaiter>(); }

}  // namespace kwq::internal
