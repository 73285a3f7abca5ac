// NotCounting<T>: wraps a rate limiter and forwards When, Forget, NumRequeues,
// TrackedItems and Prefetch to it, but not Counting, so a RateLimitingQueue calls it with
// the item (and gives prefetch hints) as it would any user limiter, instead of keeping
// the failure counts itself. For tests and benchmarks that compare the two ways.
// Thread-safe as the wrapped limiter is.

#ifndef KWQ_TESTS_TESTING_NOT_COUNTING_H_
#define KWQ_TESTS_TESTING_NOT_COUNTING_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "kwq/rate_limiter.h"

namespace kwq::testing {

template <typename T>
class NotCounting final : public RateLimiter<T> {
 public:
  explicit NotCounting(std::unique_ptr<RateLimiter<T>> inner) : inner_(std::move(inner)) {}
  absl::Duration When(const T& item) override { return inner_->When(item); }
  void Forget(const T& item) override { inner_->Forget(item); }
  int NumRequeues(const T& item) override { return inner_->NumRequeues(item); }
  size_t TrackedItems() const override { return inner_->TrackedItems(); }
  void Prefetch(uint32_t hash) override { inner_->Prefetch(hash); }

 private:
  const std::unique_ptr<RateLimiter<T>> inner_;
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_NOT_COUNTING_H_
