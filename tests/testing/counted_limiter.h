// CountedLimiter: a rate limiter whose failure counts the queue keeps (Counting: by count,
// reporting them, on `clock`), with a fixed delay for every failure. `throw_next` makes
// its next When/WhenCounted throw std::runtime_error once (a user's limiter that fails).
// Not thread-safe: for single-threaded tests.

#ifndef KWQ_TESTS_TESTING_COUNTED_LIMITER_H_
#define KWQ_TESTS_TESTING_COUNTED_LIMITER_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/rate_limiter.h"

namespace kwq::testing {

class CountedLimiter final : public RateLimiter<std::string> {
 public:
  CountedLimiter(Clock* clock, absl::Duration delay) : clock_(clock), delay_(delay) {}
  absl::Duration When(const std::string&) override { return WhenCounted(0); }
  void Forget(const std::string&) override {}
  int NumRequeues(const std::string&) override { return 0; }
  FailureCounting Counting() const override {
    return {.by_count = true, .reports_count = true, .clock = clock_};
  }
  absl::Duration WhenCounted(int64_t) override {
    if (std::exchange(throw_next, false)) throw std::runtime_error("limiter failed");
    return delay_;
  }
  bool throw_next = false;

 private:
  Clock* const clock_;
  const absl::Duration delay_;
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_COUNTED_LIMITER_H_
