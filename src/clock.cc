#include "kwq/clock.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace kwq {

bool Clock::AddObserver(ClockObserver*) { return false; }
void Clock::RemoveObserver(ClockObserver*) {}

RealClock* RealClock::Default() {
  static RealClock* const clock = new RealClock();
  return clock;
}

absl::Time RealClock::Now() const {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

absl::Time RealClock::CoarseNow() const {
  // The same timeline as steady_clock (CLOCK_MONOTONIC), as of the last kernel tick.
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return absl::UnixEpoch() + absl::DurationFromTimespec(ts);
}

void RealClock::SleepUntil(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
  }
  const absl::Duration left = deadline - Now();
  if (left > absl::ZeroDuration()) std::this_thread::sleep_for(absl::ToChronoNanoseconds(left));
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

FakeClock::~FakeClock() = default;

absl::Time FakeClock::Now() const {
  internal::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepUntil(absl::Time deadline) {
  internal::MutexLock lock(&mu_);
  ++sleepers_;
  while (now_ < deadline) moved_.Wait(&mu_);
  --sleepers_;
}

void FakeClock::Advance(absl::Duration d) {
  internal::MutexLock move_lock(&move_mu_);
  absl::Time target;
  {
    internal::MutexLock lock(&mu_);
    target = now_ + std::max(d, absl::ZeroDuration());
  }
  MoveTo(target);
}

void FakeClock::SetTime(absl::Time t) {
  internal::MutexLock move_lock(&move_mu_);
  MoveTo(t);
}

void FakeClock::MoveTo(absl::Time t) {
  // Called with move_mu_ held (by Advance/SetTime).
  {
    internal::MutexLock lock(&mu_);
    now_ = t;
  }
  moved_.SignalAll();
  for (ClockObserver* observer : observers_) observer->OnClockMoved(t);
}

size_t FakeClock::NumSleepers() const {
  internal::MutexLock lock(&mu_);
  return sleepers_;
}

bool FakeClock::AddObserver(ClockObserver* observer) {
  internal::MutexLock move_lock(&move_mu_);
  observers_.push_back(observer);
  return true;
}

void FakeClock::RemoveObserver(ClockObserver* observer) {
  internal::MutexLock move_lock(&move_mu_);
  observers_.erase(std::remove(observers_.begin(), observers_.end(), observer), observers_.end());
}

}  // namespace kwq
