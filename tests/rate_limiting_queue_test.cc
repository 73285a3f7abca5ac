#include "kwq/rate_limiting_queue.h"

#include <string>

#include "gtest/gtest.h"
#include "testing/recording_metrics.h"

namespace kwq {
namespace {

class RateLimitingQueueTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  std::unique_ptr<TimerService> timers_ = *TimerService::Create({.clock = &clock_});

  std::unique_ptr<RateLimiter<std::string>> Exponential() {
    return std::move(*ExponentialFailureRateLimiter<std::string>::Create(
        {.base = absl::Milliseconds(10), .max = absl::Seconds(1), .clock = &clock_}));
  }
};

TEST_F(RateLimitingQueueTest, AddRateLimitedWaitsTheLimitersDelay) {
  RateLimitingQueue<std::string> q(Exponential(), {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");  // 10 ms
  EXPECT_EQ(q.NumRequeues("a"), 1);
  EXPECT_EQ(q.Waiting(), 1u);
  clock_.Advance(absl::Milliseconds(9));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Milliseconds(1));
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(**lease, "a");
  lease->Done();
  q.AddRateLimited("a");  // 20 ms now
  EXPECT_EQ(q.NumRequeues("a"), 2);
  clock_.Advance(absl::Milliseconds(19));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(q.TryGet().has_value());
}

TEST_F(RateLimitingQueueTest, ForgetResetsBackoff) {
  RateLimitingQueue<std::string> q(Exponential(), {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.AddRateLimited("a");
  EXPECT_EQ(q.NumRequeues("a"), 2);
  q.Forget("a");
  EXPECT_EQ(q.NumRequeues("a"), 0);
}

TEST_F(RateLimitingQueueTest, DefaultLimiterIsClientGos) {
  RateLimitingQueue<std::string> q({.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");  // 5 ms (the bucket allows a burst of 100)
  clock_.Advance(absl::Milliseconds(4));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(q.TryGet().has_value());
}

TEST_F(RateLimitingQueueTest, RetriesAreCountedInMetrics) {
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider(&rec, /*refresh_gauges=*/false);
  RateLimitingQueue<std::string> q(
      Exponential(), {.metrics = &provider, .clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.AddRateLimited("b");
  EXPECT_EQ(rec.Get("retries"), 2);
}

}  // namespace
}  // namespace kwq
