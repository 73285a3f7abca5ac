// CountingClock: a manual clock that counts its readings and otherwise is a FakeClock, for
// tests that a path reads no clock (priority queues without aging, queues with no
// metrics). ThrowNext makes its next readings throw (a user's clock that fails).

#ifndef KWQ_TESTS_TESTING_COUNTING_CLOCK_H_
#define KWQ_TESTS_TESTING_COUNTING_CLOCK_H_

#include <atomic>
#include <stdexcept>

#include "kwq/clock.h"

namespace kwq::testing {

class CountingClock final : public Clock {
 public:
  explicit CountingClock(FakeClock* inner) : inner_(inner) {}
  absl::Time Now() const override {
    reads_.fetch_add(1);
    if (throws_.load() > 0 && (skips_.load() <= 0 || skips_.fetch_sub(1) <= 0) &&
        throws_.fetch_sub(1) > 0) {
      throw std::runtime_error("clock (ThrowNext)");
    }
    return inner_->Now();
  }
  // The next `reads` readings throw std::runtime_error, after `after` that do not.
  void ThrowNext(int reads, int after = 0) {
    skips_.store(after);
    throws_.store(reads);
  }
  absl::Time CoarseNow() const override { return Now(); }
  void SleepUntil(absl::Time deadline) override { inner_->SleepUntil(deadline); }
  bool is_manual() const override { return true; }
  bool AddObserver(ClockObserver* observer) override { return inner_->AddObserver(observer); }
  void RemoveObserver(ClockObserver* observer) override { inner_->RemoveObserver(observer); }
  int reads() const { return reads_.load(); }

 private:
  FakeClock* const inner_;
  mutable std::atomic<int> reads_{0};
  mutable std::atomic<int> throws_{0};
  mutable std::atomic<int> skips_{0};
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_COUNTING_CLOCK_H_
