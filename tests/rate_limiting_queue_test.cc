#include "kwq/rate_limiting_queue.h"

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kwq/internal/failure_counts.h"
#include "kwq/priority_queue.h"
#include "testing/async_get.h"
#include "testing/counted_limiter.h"
#include "testing/counting_clock.h"
#include "testing/eventually.h"
#include "testing/hint_recorder.h"
#include "testing/not_counting.h"
#include "testing/queue_peer.h"
#include "testing/recording_metrics.h"
#include "testing/serial_check_metrics.h"

namespace kwq {

namespace {

class RateLimitingQueueTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  std::unique_ptr<TimerService> timers_ = *TimerService::Create({.clock = &clock_});

  // ExponentialFailure(10 ms, 1 s) on clock_, with the default idle horizon or `horizon`.
  std::unique_ptr<RateLimiter<std::string>> Exponential(
      std::optional<absl::Duration> horizon = std::nullopt) {
    return std::move(
        *ExponentialFailureRateLimiter<std::string>::Create({.base = absl::Milliseconds(10),
                                                             .max = absl::Seconds(1),
                                                             .clock = &clock_,
                                                             .idle_horizon = horizon}));
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

// A limiter that keeps its own counts (as a user's limiter does) is called with the item:
// AddRateLimited(item) is AddAfter(item, When(item)), and NumRequeues and Forget reach it.
TEST_F(RateLimitingQueueTest, ALimiterKeepingItsOwnCountsIsCalledWithTheItem) {
  RateLimitingQueue<std::string> q(
      std::make_unique<testing::NotCounting<std::string>>(Exponential()),
      {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");  // 10 ms
  EXPECT_EQ(q.NumRequeues("a"), 1);
  EXPECT_EQ(q.rate_limiter().TrackedItems(), 1u);  // the count is the limiter's
  clock_.Advance(absl::Milliseconds(10) - absl::Nanoseconds(1));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Nanoseconds(1));
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  q.AddRateLimited(lease->item());  // 20 ms
  lease->Done();
  clock_.Advance(absl::Milliseconds(20) - absl::Nanoseconds(1));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(q.TryGet().has_value());
  EXPECT_EQ(q.NumRequeues("a"), 2);
  q.Forget("a");
  EXPECT_EQ(q.NumRequeues("a"), 0);
  EXPECT_EQ(q.rate_limiter().TrackedItems(), 0u);
  q.AddRateLimited("a");  // the first delay again
  clock_.Advance(absl::Milliseconds(10) - absl::Nanoseconds(1));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(q.TryGet().has_value());
}

// Go embeds the delaying queue's interface in the rate-limiting one, so ported code holds
// a RateLimitingQueue as a DelayingQueue; deleting it that way must destroy all of it.
TEST_F(RateLimitingQueueTest, DeletingThroughADelayingQueuePointerDestroysTheLimiter) {
  static_assert(std::has_virtual_destructor_v<DelayingQueue<std::string>>);
  class Tracked final : public RateLimiter<std::string> {
   public:
    explicit Tracked(bool* destroyed) : destroyed_(destroyed) {}
    ~Tracked() override { *destroyed_ = true; }
    absl::Duration When(const std::string&) override { return absl::ZeroDuration(); }
    void Forget(const std::string&) override {}
    int NumRequeues(const std::string&) override { return 0; }

   private:
    bool* const destroyed_;
  };
  bool destroyed = false;
  std::unique_ptr<DelayingQueue<std::string>> q = std::make_unique<RateLimitingQueue<std::string>>(
      std::make_unique<Tracked>(&destroyed),
      QueueOptions{.clock = &clock_, .timers = timers_.get()});
  q->Add("a");
  q.reset();
  EXPECT_TRUE(destroyed);
}

// AddRateLimited is AddAfter(item, When(item)) at the edges too: a zero delay adds now
// (and ends a wait), with the queue keeping the counts and with a limiter keeping its own;
// also on a clock between two nanoseconds (the item waited for the next one).
TEST_F(RateLimitingQueueTest, ZeroDelayAddsNowAndEndsAWait) {
  for (bool counted : {true, false}) {
    std::unique_ptr<RateLimiter<std::string>> limiter =
        *ExponentialFailureRateLimiter<std::string>::Create(
            {.base = absl::ZeroDuration(), .max = absl::ZeroDuration(), .clock = &clock_});
    if (!counted) limiter = std::make_unique<testing::NotCounting<std::string>>(std::move(limiter));
    RateLimitingQueue<std::string> q(std::move(limiter),
                                     {.clock = &clock_, .timers = timers_.get()});
    q.AddAfter("a", absl::Seconds(10));
    q.AddRateLimited("a");
    EXPECT_EQ(q.Waiting(), 0u) << "counted " << counted;
    EXPECT_EQ(q.Len(), 1u) << "counted " << counted;
    q.TryGet();  // handed out and done
    clock_.Advance(absl::Seconds(10));
    EXPECT_FALSE(q.TryGet().has_value()) << "counted " << counted;
    clock_.Advance(absl::Nanoseconds(0.5));
    q.AddRateLimited("b");
    EXPECT_EQ(q.Waiting(), 0u) << "counted " << counted;
    EXPECT_EQ(q.Len(), 1u) << "counted " << counted;
    q.TryGet();
    clock_.Advance(absl::Nanoseconds(0.5));
  }
}

// An infinite delay (a token bucket that never refills) waits for ever; a plain Add
// still runs the item now.
TEST_F(RateLimitingQueueTest, InfiniteDelayWaitsUntilAPlainAdd) {
  RateLimitingQueue<std::string> q(
      *BucketRateLimiter<std::string>::Create({.qps = 0, .burst = 1, .clock = &clock_}),
      {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");  // the one token: now
  ASSERT_TRUE(q.TryGet().has_value());
  q.AddRateLimited("a");  // no token, none to come
  EXPECT_EQ(q.Waiting(), 1u);
  clock_.Advance(absl::Hours(1000));
  EXPECT_FALSE(q.TryGet().has_value());
  q.Add("a");
  EXPECT_EQ(q.Waiting(), 0u);
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

// client-go's DefaultControllerRateLimiter: MaxOf(ExponentialFailure(5 ms, 1000 s),
// Bucket(10 qps, burst 100)), both on the queue's clock. 110 distinct first failures at
// one instant: the first 100 wait the exponential 5 ms, the bucket holds the other 10
// back by 100 ms, 200 ms, ..., and refills on the queue's clock (it passed with no
// bucket, and with the limiter on the real clock, when it checked one item).
TEST_F(RateLimitingQueueTest, DefaultLimiterIsClientGos) {
  RateLimitingQueue<std::string> q({.clock = &clock_, .timers = timers_.get()});
  for (int i = 0; i < 110; ++i) q.AddRateLimited(absl::StrCat("k", i));
  const auto take_all = [&q] {
    int n = 0;
    while (auto lease = q.TryGet()) ++n;
    return n;
  };
  clock_.Advance(absl::Milliseconds(4));
  EXPECT_EQ(take_all(), 0);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(take_all(), 100);
  clock_.Advance(absl::Milliseconds(94));  // 99 ms in
  EXPECT_EQ(take_all(), 0);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(take_all(), 1);
  clock_.Advance(absl::Milliseconds(900));
  EXPECT_EQ(take_all(), 9);
  EXPECT_EQ(q.NumRequeues("k0"), 1);
  // The bucket refills on the queue's clock: 2 s later it holds 20 tokens (it held none
  // at 1 s), so 10 new failures wait only their 5 ms.
  clock_.Advance(absl::Seconds(2));
  for (int i = 0; i < 10; ++i) q.AddRateLimited(absl::StrCat("n", i));
  clock_.Advance(absl::Milliseconds(5));
  EXPECT_EQ(take_all(), 10);
}

// NumRequeues saturates at INT_MAX, and the count itself at INT64_MAX: a key that failed
// more often than an int can say reads INT_MAX, one more failure changes nothing, and its
// delay is the limiter's maximum.
TEST_F(RateLimitingQueueTest, NumRequeuesSaturatesAtIntMax) {
  RateLimitingQueue<std::string> q(Exponential(), {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  ASSERT_EQ(q.NumRequeues("a"), 1);
  internal::QueuePeer::SetFailures(q, std::string("a"), int64_t{INT_MAX} + 5);
  EXPECT_EQ(q.NumRequeues("a"), INT_MAX);
  internal::QueuePeer::SetFailures(q, std::string("a"), INT64_MAX);
  q.CancelAfter("a");
  q.AddRateLimited("a");  // the count stays at INT64_MAX: no overflow
  EXPECT_EQ(q.NumRequeues("a"), INT_MAX);
  clock_.Advance(absl::Seconds(1) - absl::Nanoseconds(1));
  EXPECT_FALSE(q.TryGet().has_value());  // waits the maximum, 1 s
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(q.TryGet().has_value());
}

TEST_F(RateLimitingQueueTest, RetriesAreCountedInMetrics) {
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider(&rec, /*refresh_gauges=*/false);
  RateLimitingQueue<std::string> q(
      Exponential(), {.metrics = &provider, .clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.AddRateLimited("b");
  q.AddAfter("c", absl::Seconds(1));  // client-go counts every AddAfter as a retry
  EXPECT_EQ(rec.Get("retries"), 3);
  q.ShutDown();
  q.AddRateLimited("a");  // ignored after ShutDown, and not counted (client-go's)
  q.AddAfter("c", absl::Seconds(1));
  EXPECT_EQ(rec.Get("retries"), 3);
}

// The same with a limiter that does not count by failure number (the limiter keeps the
// counts; AddRateLimited goes through AddAfter).
TEST_F(RateLimitingQueueTest, RetriesOfANonCountingLimiterAreCountedOnce) {
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider(&rec, /*refresh_gauges=*/false);
  auto bucket = *BucketRateLimiter<std::string>::Create({.qps = 1, .burst = 1, .clock = &clock_});
  RateLimitingQueue<std::string> q(
      std::move(bucket), {.metrics = &provider, .clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");  // no delay (the burst): still a retry, as client-go's AddAfter(0)
  q.AddRateLimited("b");  // waits 1 s
  EXPECT_EQ(rec.Get("retries"), 2);
  q.ShutDown();
  q.AddRateLimited("c");
  EXPECT_EQ(rec.Get("retries"), 2);
}

// With a counting limiter the queue keeps the failure counts itself (the limiter's table
// stays empty) and the delays are the limiter's, whether the item is passed back as the
// leased object (found by address) or as a copy (looked up).
TEST_F(RateLimitingQueueTest, CountingLimiterLeavesTheCountsToTheQueue) {
  RateLimitingQueue<std::string> q(Exponential(), {.clock = &clock_, .timers = timers_.get()});
  q.Add("a");
  for (int failure = 0; failure < 4; ++failure) {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value()) << failure;
    ASSERT_EQ(**lease, "a");
    const std::string copy = **lease;
    EXPECT_EQ(q.NumRequeues(lease->item()), failure);
    EXPECT_EQ(q.NumRequeues(copy), failure);
    if (failure % 2 == 0) {
      q.AddRateLimited(lease->item());
    } else {
      q.AddRateLimited(copy);
    }
    lease->Done();
    const absl::Duration delay = absl::Milliseconds(10) * (1 << failure);
    clock_.Advance(delay - absl::Nanoseconds(1));
    EXPECT_FALSE(q.TryGet().has_value()) << failure;
    clock_.Advance(absl::Nanoseconds(1));
  }
  EXPECT_EQ(q.rate_limiter().TrackedItems(), 0u);
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(q.NumRequeues(**lease), 4);
  q.Forget(lease->item());
  EXPECT_EQ(q.NumRequeues(**lease), 0);
  q.AddRateLimited("a");  // the first delay again
  lease->Done();
  clock_.Advance(absl::Milliseconds(10));
  EXPECT_TRUE(q.TryGet().has_value());
  EXPECT_EQ(q.NumRequeues("unknown"), 0);
  q.Forget("unknown");  // a no-op
}

// A queue-kept count lapses once its key has been idle (not waiting, queued or in
// flight) for longer than the horizon, counted from when it went idle.
TEST_F(RateLimitingQueueTest, QueueKeptCountsLapseAfterTheIdleHorizon) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.AddRateLimited("a");  // still waiting: the earlier ready time stays
  EXPECT_EQ(q.NumRequeues("a"), 2);
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done: idle from here
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(q.NumRequeues("a"), 2);  // idle for exactly the horizon: kept
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(q.NumRequeues("a"), 0);
  q.AddRateLimited("a");  // counts from zero again: the base delay
  EXPECT_EQ(q.NumRequeues("a"), 1);
  clock_.Advance(absl::Milliseconds(10));
  EXPECT_TRUE(q.TryGet().has_value());
}

// Idle for centuries: times more than 292 years apart overflowed the difference the lapse
// is decided on (undefined; in practice the count never lapsed).
TEST(RateLimitingQueueRangeTest, ACountLapsesAfterCenturiesIdle) {
  constexpr int64_t kYear = 24 * 365;
  FakeClock clock(absl::UnixEpoch() - absl::Hours(200 * kYear));
  auto timers = *TimerService::Create({.clock = &clock});
  RateLimitingQueue<std::string> q(
      *ExponentialFailureRateLimiter<std::string>::Create({.base = absl::Milliseconds(10),
                                                           .max = absl::Seconds(1),
                                                           .clock = &clock,
                                                           .idle_horizon = absl::Seconds(60)}),
      {.clock = &clock, .timers = timers.get()});
  q.AddRateLimited("b");
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done: idle from here
  clock.SetTime(absl::UnixEpoch() + absl::Hours(250 * kYear));
  EXPECT_EQ(q.NumRequeues("b"), 0);
}

// An idle horizon longer than 292 years is kept exactly, as the limiter's own table
// keeps it: it saturated to an int64 count of nanoseconds, which meant "never", so the
// queue's count never lapsed while the limiter's did.
TEST(RateLimitingQueueRangeTest, AHorizonOfCenturiesLapsesAsTheLimitersDoes) {
  constexpr int64_t kYear = 24 * 365;
  FakeClock clock(absl::UnixEpoch() - absl::Hours(150 * kYear));
  auto timers = *TimerService::Create({.clock = &clock});
  const auto make = [&clock] {
    return *ExponentialFailureRateLimiter<std::string>::Create(
        {.base = absl::Milliseconds(10),
         .max = absl::Seconds(1),
         .clock = &clock,
         .idle_horizon = absl::Hours(300 * kYear)});
  };
  auto alone = make();
  RateLimitingQueue<std::string> q(make(), {.clock = &clock, .timers = timers.get()});
  alone->When("b");
  q.AddRateLimited("b");
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done: idle from here
  clock.Advance(absl::Hours(299 * kYear));
  EXPECT_EQ(alone->NumRequeues("b"), 1);
  EXPECT_EQ(q.NumRequeues("b"), 1);
  clock.Advance(absl::Hours(2 * kYear));
  EXPECT_EQ(alone->NumRequeues("b"), 0);
  EXPECT_EQ(q.NumRequeues("b"), 0);
}

// A count does not lapse while its key waits, is queued or is being processed, however
// long that takes: a retried item keeps its history (a horizon counted from the last
// failure would reset NumRequeues of an item stuck behind a backlog, and a
// `NumRequeues < maxRetries` check would then never give up).
TEST_F(RateLimitingQueueTest, ACountDoesNotLapseWhileItsKeyIsBusy) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.AddRateLimited("a");
  clock_.Advance(absl::Seconds(60));  // due after 10 ms, then queued behind a backlog
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.NumRequeues("a"), 2);
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  clock_.Advance(absl::Seconds(60));  // a long reconcile
  EXPECT_EQ(q.NumRequeues(lease->item()), 2);
  EXPECT_EQ(q.NumRequeues("a"), 2);  // a copy: found under the lock
  q.AddRateLimited(lease->item());   // the third failure counts on
  EXPECT_EQ(q.NumRequeues(lease->item()), 3);
  lease->Done();
  clock_.Advance(absl::Milliseconds(40));  // its third backoff
  lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  lease->Done();  // idle from here, with its count
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(q.NumRequeues("a"), 3);  // idle for exactly the horizon
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(q.NumRequeues("a"), 0);
}

// Waiting longer than the horizon, here behind a token bucket's backlog (as under
// DefaultControllerRateLimiter with many items failing), does not lapse a count either.
TEST_F(RateLimitingQueueTest, ACountDoesNotLapseWhileItsKeyWaitsBehindABucket) {
  std::vector<std::unique_ptr<RateLimiter<std::string>>> children;
  children.push_back(Exponential(absl::Seconds(10)));
  children.push_back(*BucketRateLimiter<std::string>::Create(
      {.qps = 0.01, .burst = 1, .clock = &clock_}));  // one token per 100 s
  RateLimitingQueue<std::string> q(*MaxOfRateLimiter<std::string>::Create(std::move(children)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");  // the bucket's one token: 10 ms
  clock_.Advance(absl::Milliseconds(10));
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  q.AddRateLimited(lease->item());  // 100 s for the next token
  lease->Done();
  EXPECT_EQ(q.NumRequeues("a"), 2);
  clock_.Advance(absl::Seconds(99));
  EXPECT_EQ(q.Waiting(), 1u);
  EXPECT_EQ(q.NumRequeues("a"), 2);
  clock_.Advance(absl::Seconds(1));
  lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(q.NumRequeues(lease->item()), 2);
}

// A count that lapsed while its key was idle (nobody asked) stays gone when the key is
// added again: busy keys' counts do not lapse, so it must not come back with the add.
TEST_F(RateLimitingQueueTest, ACountThatLapsedWhileIdleStaysGoneOnTheNextAdd) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  for (const char* key : {"a", "b"}) q.AddRateLimited(key);
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // both handed out and Done: idle from here
  ASSERT_TRUE(q.TryGet().has_value());
  clock_.Advance(absl::Seconds(11));
  q.Add("a");
  q.AddAfter("b", absl::Seconds(1));
  EXPECT_EQ(q.NumRequeues("a"), 0);
  EXPECT_EQ(q.NumRequeues("b"), 0);
}

// A wait ended by CancelAfter makes an idle key: its horizon starts then.
TEST_F(RateLimitingQueueTest, CancelAfterStartsTheHorizon) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.AddAfter("a", absl::Seconds(1));  // the earlier (10 ms) stays
  clock_.Advance(absl::Milliseconds(5));
  ASSERT_TRUE(q.CancelAfter("a"));
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(q.NumRequeues("a"), 1);
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(q.NumRequeues("a"), 0);
}

// A long reconcile that ends in Done (no retry, no Forget) starts the horizon at the
// Done: a failure recorded right after it still counts on.
TEST_F(RateLimitingQueueTest, DoneStartsTheHorizon) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  clock_.Advance(absl::Milliseconds(10));
  {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    clock_.Advance(absl::Seconds(30));  // longer than the horizon since the failure
  }
  EXPECT_EQ(q.NumRequeues("a"), 1);
  q.AddRateLimited("a");  // the second failure: 20 ms
  EXPECT_EQ(q.NumRequeues("a"), 2);
  clock_.Advance(absl::Milliseconds(19));
  EXPECT_FALSE(q.TryGet().has_value());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(q.TryGet().has_value());
}

// A key that failed and went idle without a Forget keeps its count while thousands of
// idle keys are evicted around it (eviction would forget it before the horizon).
TEST_F(RateLimitingQueueTest, IdleKeyWithACountIsNotEvicted) {
  RateLimitingQueue<std::string> q(Exponential(), {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done: idle, one failure
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 20000; ++i) q.Add(absl::StrCat("k", round, "-", i));
    int n = 0;
    while (q.TryGet().has_value()) ++n;
    ASSERT_EQ(n, 20000);
  }
  EXPECT_EQ(q.NumRequeues("a"), 1);
}

// absl::Hash that counts its calls (for tests that a path hashes nothing).
struct CountingHash {
  static inline std::atomic<int> calls{0};
  size_t operator()(const std::string& s) const {
    calls.fetch_add(1, std::memory_order_relaxed);
    return absl::Hash<std::string>{}(s);
  }
};

// The leased item passed back is found by its address: NumRequeues, AddRateLimited,
// Forget and AddAfter hash nothing (a copy of the item is hashed, once per call).
TEST_F(RateLimitingQueueTest, TheLeasedItemPassedBackIsNotHashed) {
  using Q = RateLimitingQueue<std::string, CountingHash>;
  Q q(std::move(*ExponentialFailureRateLimiter<std::string, CountingHash>::Create(
          {.base = absl::Milliseconds(10), .max = absl::Seconds(1), .clock = &clock_})),
      {.clock = &clock_, .timers = timers_.get()});
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  CountingHash::calls = 0;
  EXPECT_EQ(q.NumRequeues(lease->item()), 0);
  q.AddRateLimited(lease->item());
  q.AddAfter(lease->item(), absl::Milliseconds(5));
  EXPECT_EQ(q.NumRequeues(**lease), 1);
  q.Forget(lease->item());
  EXPECT_EQ(CountingHash::calls.load(), 0);
  const std::string copy = **lease;
  EXPECT_EQ(q.NumRequeues(copy), 0);
  EXPECT_EQ(CountingHash::calls.load(), 1);
  lease->Done();
  clock_.Advance(absl::Milliseconds(5));
  EXPECT_TRUE(q.TryGet().has_value());  // the earlier of the two delays
}

// A lapsed count is gone for good, as the limiter's table erases a lapsed entry: moving
// the clock back does not revive it.
TEST_F(RateLimitingQueueTest, ALapsedCountStaysGoneWhenTheClockMovesBack) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  const absl::Time t0 = clock_.Now();
  q.AddRateLimited("a");
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // idle from here
  clock_.Advance(absl::Seconds(20));
  EXPECT_EQ(q.NumRequeues("a"), 0);
  clock_.SetTime(t0 + absl::Seconds(5));
  EXPECT_EQ(q.NumRequeues("a"), 0);
}

// After ShutDown an AddRateLimited queues nothing but still counts the failure of a known
// item, as a limiter called with the item would.
TEST_F(RateLimitingQueueTest, AddRateLimitedAfterShutDownStillCounts) {
  RateLimitingQueue<std::string> q(Exponential(), {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  q.ShutDown();
  q.AddRateLimited("a");
  EXPECT_EQ(q.NumRequeues("a"), 2);
  EXPECT_EQ(q.Waiting(), 0u);
  EXPECT_FALSE(q.TryGet().has_value());
}

// The contract: the failure table is bounded, entries "may be evicted once idle longer
// than a configurable horizon, so a caller that never Forgets does not leak". With the
// counts beside the keys: keys that failed and went idle without a Forget stay while
// their counts are live, and are evicted once the counts lapse.
TEST_F(RateLimitingQueueTest, KeysWhoseCountsLapsedAreEvicted) {
  constexpr int kFailed = 20000;
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  for (int i = 0; i < kFailed; ++i) q.AddRateLimited(absl::StrCat("failed-", i));
  clock_.Advance(absl::Milliseconds(10));
  auto churn = [&q](int round) {  // 5,000 keys through the queue, idle afterwards
    for (int i = 0; i < 5000; ++i) q.Add(absl::StrCat("churn-", round, "-", i));
    while (q.TryGet().has_value()) {
    }
  };
  churn(0);  // also hands out the failed keys (Done, no Forget)
  churn(1);
  EXPECT_GE(internal::QueuePeer::StoredKeys(q), kFailed);  // counts live: kept
  clock_.Advance(absl::Seconds(11));
  churn(2);
  churn(3);
  EXPECT_LT(internal::QueuePeer::StoredKeys(q), 6000);  // lapsed: evicted down to ~4096
  EXPECT_EQ(q.NumRequeues("failed-0"), 0);
  // New keys take the evicted keys' slots, and none inherits a count from them.
  int inherited = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::string key = absl::StrCat("new-", i);
    q.Add(key);  // queued: a count it had could not lapse
    if (q.NumRequeues(key) != 0) ++inherited;
  }
  EXPECT_EQ(inherited, 0);
}

// Forget drops a queue-kept count, so the key becomes evictable at once: a caller that
// Forgets does not pin its keys until the idle horizon (here there is none).
TEST_F(RateLimitingQueueTest, ForgottenKeysAreEvictedWithoutWaitingForTheHorizon) {
  constexpr int kFailed = 20000;
  RateLimitingQueue<std::string> q(Exponential(absl::InfiniteDuration()),
                                   {.clock = &clock_, .timers = timers_.get()});
  for (int i = 0; i < kFailed; ++i) q.AddRateLimited(absl::StrCat("failed-", i));
  clock_.Advance(absl::Milliseconds(10));
  while (auto lease = q.TryGet()) q.Forget(lease->item());  // each retried once, then fine
  for (int round = 0; round < 2; ++round) {  // 5,000 keys through the queue, idle afterwards
    for (int i = 0; i < 5000; ++i) q.Add(absl::StrCat("churn-", round, "-", i));
    while (q.TryGet().has_value()) {
    }
  }
  EXPECT_LT(internal::QueuePeer::StoredKeys(q), 6000);  // evicted down to ~4096
}

using testing::HintRecorder;
using testing::StoredHash;

TEST_F(RateLimitingQueueTest, EachHandOutNamesTheNextItemToTheLimiter) {
  auto recorder = std::make_unique<HintRecorder<std::string>>();
  HintRecorder<std::string>* limiter = recorder.get();
  RateLimitingQueue<std::string> q(std::move(recorder),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.Add("a");
  q.Add("b");
  q.Add("c");
  auto a = q.Get();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(**a, "a");
  EXPECT_EQ(limiter->Hints(), std::vector<uint32_t>{StoredHash("b")});
  auto b = q.TryGet();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(**b, "b");
  EXPECT_EQ(limiter->Hints(), (std::vector<uint32_t>{StoredHash("b"), StoredHash("c")}));
  auto c = q.Get(Context());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(**c, "c");
  EXPECT_EQ(limiter->Hints().size(), 2u);  // nothing was next in line
}

// Past the ring's capacity items wait in the overflow list and are handed out from the
// outbox; items added after that go to the ring while the outbox still holds older ones.
// Every hint names the item actually handed out next (so the outbox is looked at before
// the ring), and at most the hand-out that empties the ring (whose cached view cannot
// see the overflow) and the last one give none.
TEST_F(RateLimitingQueueTest, HintsFollowTheHandOutOrderThroughRingAndOutbox) {
  auto recorder = std::make_unique<HintRecorder<std::string>>();
  HintRecorder<std::string>* limiter = recorder.get();
  RateLimitingQueue<std::string> q(std::move(recorder),
                                   {.clock = &clock_, .timers = timers_.get()});
  constexpr int kFirst = 3000, kLater = 200;
  for (int i = 0; i < kFirst; ++i) q.Add(absl::StrCat("item-", i));
  std::vector<std::string> order;
  std::vector<std::optional<uint32_t>> hint_of;  // the hint each hand-out gave, if any
  for (;;) {
    if (order.size() == 1500) {
      // The outbox now holds the older overflow; these go to the ring behind it.
      for (int i = 0; i < kLater; ++i) q.Add(absl::StrCat("later-", i));
    }
    const size_t before = limiter->Hints().size();
    auto lease = q.TryGet();
    if (!lease.has_value()) break;
    order.push_back(**lease);
    hint_of.push_back(limiter->Hints().size() > before ? std::optional(limiter->Hints().back())
                                                       : std::nullopt);
  }
  ASSERT_EQ(order.size(), static_cast<size_t>(kFirst + kLater));
  EXPECT_EQ(order[kFirst - 1], absl::StrCat("item-", kFirst - 1));  // FIFO across both
  int without = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (!hint_of[i].has_value()) {
      ++without;
      continue;
    }
    ASSERT_LT(i + 1, order.size());
    EXPECT_EQ(*hint_of[i], StoredHash(order[i + 1])) << "hand-out " << i << " " << order[i];
  }
  EXPECT_LE(without, 3);
}

// Several workers run the reconcile loop of the ratelimited scenario on a real clock, with
// more items than the limiters' prefetch threshold. With the counts in the queue (true),
// NumRequeues, AddRateLimited and Forget of leased items race on the queue's counts and
// waiting entries; with them in the limiter (false), hints, prefetches (try-locks on the
// limiter), NumRequeues, When, Forget and AddAfter race (TSan checks both in make test).
// Every item is retried exactly twice and then forgotten; none is lost or handed to two
// workers at once.
// ---- user code that throws ----

// The queue-kept failure counts read the clock in the middle of state changes (an add of
// an idle key, a Done, a CancelAfter, a shutdown's drop of waiting items). A clock that
// throws there no longer cuts them short: the counts keep the last time read. Before, the
// add left the key marked dirty and never queued (every later add merged into it), the
// Done left the item in flight for ever, the CancelAfter left it marked waiting outside
// the heap (the next add crashed), and the shutdown left its timer armed on a freed queue.
TEST(RateLimitingQueueClockTest, CountsWhoseClockThrowsLeaveTheQueueWhole) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  auto q = std::make_unique<RateLimitingQueue<std::string>>(
      std::make_unique<testing::CountedLimiter>(&clock, absl::ZeroDuration()),
      RateLimitingQueue<std::string>::Options{.clock = &clock, .timers = timers.get()});
  q->Add("a");
  {
    auto lease = q->Get();
    q->AddRateLimited(lease->item());  // a failure counted; runs again after this Done
  }
  q->TryGet()->Done();  // "a" is idle, with a count
  clock.ThrowNext(1);
  EXPECT_TRUE(q->Add("a"));  // the count's idle time ends: a reading that throws
  auto lease = q->TryGet();
  ASSERT_TRUE(lease.has_value()) << "the add left the item marked but not queued";
  clock.ThrowNext(1);
  lease->Done();  // "a" goes idle again: a reading that throws
  EXPECT_EQ(q->InFlight(), 0u);
  EXPECT_EQ(q->NumRequeues("a"), 1);

  auto waiting = std::make_unique<RateLimitingQueue<std::string>>(
      std::make_unique<testing::CountedLimiter>(&clock, absl::Hours(1)),
      RateLimitingQueue<std::string>::Options{.clock = &clock, .timers = timers.get()});
  waiting->AddRateLimited("w");  // waits an hour, with a count
  clock.ThrowNext(1);
  EXPECT_TRUE(waiting->CancelAfter("w"));
  EXPECT_EQ(waiting->Waiting(), 0u);
  EXPECT_TRUE(waiting->Add("w"));
  EXPECT_EQ(waiting->Len(), 1u);
  waiting->AddRateLimited("x");  // waits an hour: the queue's timer is armed
  const size_t pending = timers->Pending();
  clock.ThrowNext(1, /*after=*/1);  // the shutdown's own reading passes, the count's throws
  waiting->ShutDown();
  waiting.reset();
  fake.Advance(absl::Hours(2));  // a timer left armed would fire on the freed queue (ASan)
  EXPECT_EQ(timers->Pending(), pending - 1);  // the shut-down queue's timer is gone
  EXPECT_TRUE(q->ShutDownWithDrain());
}

// An AddRateLimited whose limiter throws adds nothing (PriorityQueue's
// AnAddWhoseLimiterThrowsDoesNotHappen). Before, a key the queue did not hold was moved in
// before the limiter was asked: the caller lost its item, and the key stayed stored, idle,
// with a failure counted (kept from eviction until the idle horizon).
TEST(RateLimitingQueueClockTest, AnAddRateLimitedWhoseLimiterThrowsDoesNotHappen) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  auto owned = std::make_unique<testing::CountedLimiter>(&clock, absl::Seconds(1));
  testing::CountedLimiter* limiter = owned.get();
  RateLimitingQueue<std::string> q(std::move(owned), {.clock = &clock, .timers = timers.get()});
  const std::string key(40, 'n');  // past the small-string buffer: a move takes its bytes
  std::string item = key;
  limiter->throw_next = true;
  EXPECT_THROW(q.AddRateLimited(std::move(item)), std::runtime_error);
  EXPECT_EQ(item, key) << "the failed add took the caller's item";
  EXPECT_EQ(q.NumRequeues(key), 0) << "the failed add counted a failure";
  EXPECT_EQ(internal::QueuePeer::StoredKeys(q), 0) << "the failed add stored the key";
  EXPECT_EQ(q.Waiting(), 0u);

  q.AddRateLimited(key);  // the first failure: waits 1 s
  EXPECT_EQ(q.NumRequeues(key), 1);
  limiter->throw_next = true;
  EXPECT_THROW(q.AddRateLimited(key), std::runtime_error);  // a known key: the failure stays
  EXPECT_EQ(q.NumRequeues(key), 2);
  EXPECT_EQ(q.Waiting(), 1u);  // still waiting for the first delay, not moved
  EXPECT_FALSE(q.TryGet().has_value());
  clock.Advance(absl::Seconds(1));
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->item(), key);
}

// The same with the built-in limiters only: the default's shape (MaxOf of an exponential
// and a bucket) whose bucket reads a clock that throws.
TEST(RateLimitingQueueClockTest, ABucketWhoseClockThrowsKeepsTheCallersItem) {
  FakeClock fake;
  testing::CountingClock bucket_clock(&fake);
  auto timers = *TimerService::Create({.clock = &fake});
  std::vector<std::unique_ptr<RateLimiter<std::string>>> children;
  children.push_back(*ExponentialFailureRateLimiter<std::string>::Create({.clock = &fake}));
  children.push_back(*BucketRateLimiter<std::string>::Create({.clock = &bucket_clock}));
  RateLimitingQueue<std::string> q(*MaxOfRateLimiter<std::string>::Create(std::move(children)),
                                   {.clock = &fake, .timers = timers.get()});
  const std::string key(40, 'y');
  std::string item = key;
  bucket_clock.ThrowNext(1);
  EXPECT_THROW(q.AddRateLimited(std::move(item)), std::runtime_error);
  EXPECT_EQ(item, key) << "the failed add took the caller's item";
  EXPECT_EQ(internal::QueuePeer::StoredKeys(q), 0) << "the failed add stored the key";
  q.AddRateLimited(std::move(item));
  EXPECT_EQ(q.NumRequeues(key), 1);
}

// A custom limiter's Prefetch (a hint) that throws is dropped: it came after the hand-out,
// and the lease just handed out ended unseen (RateLimitingQueue), or stayed counted in
// flight with no lease, so a drain waited for ever (PriorityQueue).
class ThrowingPrefetchLimiter : public RateLimiter<std::string> {
 public:
  absl::Duration When(const std::string&) override { return absl::ZeroDuration(); }
  void Forget(const std::string&) override {}
  int NumRequeues(const std::string&) override { return 0; }
  void Prefetch(uint32_t) override { throw std::runtime_error("prefetch"); }
};

TEST(RateLimitingQueueClockTest, APrefetchThatThrowsIsDropped) {
  RateLimitingQueue<std::string> q(std::make_unique<ThrowingPrefetchLimiter>());
  q.Add("a");
  q.Add("b");
  auto first = q.Get();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->item(), "a");
  first->Done();
  EXPECT_EQ(q.TryGet()->item(), "b");

  PriorityQueue<std::string>::Options options;
  options.rate_limiter = std::make_unique<ThrowingPrefetchLimiter>();
  auto pq = *PriorityQueue<std::string>::Create(std::move(options));
  pq->Add("a", {.rate_limited = true});  // turns the hints on
  pq->Add("b");
  {
    auto lease = pq->Get();
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(pq->InFlight(), 1u);
  }
  EXPECT_EQ(pq->InFlight(), 0u);
  pq->TryGet()->Done();
  EXPECT_TRUE(pq->ShutDownWithDrain());
}

// PriorityQueue: a Done whose clock throws (read for a re-add owed a run) still makes the
// item ready, and a timer firing whose clock throws wakes the Gets asleep, which then
// re-arm the timer. Before, the Done left the re-add neither ready nor delayed (a drain
// waited for ever), and the Get slept on beside a due item.
TEST(RateLimitingQueueClockTest, PriorityQueueClockThatThrowsLosesNothing) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  PriorityQueue<std::string>::Options options;
  options.clock = &clock;
  auto q = *PriorityQueue<std::string>::Create(std::move(options));
  q->Add("a");
  auto lease = q->Get();
  q->Add("a");  // owed a run at the Done
  clock.ThrowNext(1);
  lease->Done();
  EXPECT_EQ(q->Len(), 1u);
  q->TryGet()->Done();

  q->AddAfter("d", absl::Seconds(1));
  testing::AsyncGet getter([&] {
    auto l = q->Get();
    return l ? l->item() : "none";
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Waiters(*q) > 0; }));
  clock.ThrowNext(1);  // the firing's reading
  EXPECT_THROW(fake.Advance(absl::Seconds(2)), std::runtime_error);
  // The ShutDown lets a sleeping Get end (it then finds "d" due).
  EXPECT_TRUE(getter.Await([&] { q->ShutDown(); })) << "the sleeping Get was not woken";
  EXPECT_EQ(getter.outcome(), "d");
  EXPECT_TRUE(q->ShutDownWithDrain());
}

// A Done whose clock throws makes the owed re-add ready at the time an add last read,
// not at the distant past: with aging on, that made the item aged at once, handed out
// ahead of every higher priority.
TEST(RateLimitingQueueClockTest, PriorityQueueDoneWhoseClockThrowsKeepsThePriorityOrder) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  PriorityQueue<std::string>::Options options;
  options.clock = &clock;
  options.aging = absl::Hours(1);
  auto q = *PriorityQueue<std::string>::Create(std::move(options));
  q->Add("low", {.priority = 0});
  auto lease = q->Get();
  q->Add("low", {.priority = 0});  // owed a run at the Done
  q->Add("high", {.priority = 10});
  clock.ThrowNext(1);
  lease->Done();
  fake.Advance(absl::Seconds(1));
  auto next = q->TryGet();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->item(), "high");
}

// The queue-kept failure counts read the clock once when made, so a clock that throws
// before any other reading still leaves them a time: a key that went idle then keeps its
// count for its horizon once the clock is back. It was stamped with time 0, and lapsed
// at the first reading after.
TEST(RateLimitingQueueClockTest, CountsStampedWhileTheClockThrowsKeepTheirHorizon) {
  FakeClock fake(absl::FromUnixSeconds(1'000'000));
  testing::CountingClock clock(&fake);
  internal::FailureCounts counts(absl::Minutes(10), &clock);
  counts.Reset(0);
  clock.ThrowNext(2);
  counts.Record(0, counts.Now(), /*busy=*/true);
  counts.Touch(0);  // the key goes idle
  fake.Advance(absl::Seconds(1));
  EXPECT_EQ(counts.Failures(0, counts.Now(), /*busy=*/false), 1);
}

// The time that stands in for a clock that throws is the latest reading, not the first:
// a count stamped while the clock throws an hour after the counts were made keeps its
// horizon. (With the first reading it lapsed at once; the test above could not tell.)
TEST(RateLimitingQueueClockTest, CountsStampedWhileTheClockThrowsUseTheLatestReading) {
  FakeClock fake(absl::FromUnixSeconds(1'000'000));
  testing::CountingClock clock(&fake);
  internal::FailureCounts counts(absl::Minutes(10), &clock);
  counts.Reset(0);
  fake.Advance(absl::Hours(1));
  (void)counts.Now();  // a reading an hour after the first
  clock.ThrowNext(2);
  counts.Record(0, counts.Now(), /*busy=*/true);
  counts.Touch(0);  // goes idle while the clock throws
  fake.Advance(absl::Seconds(1));
  EXPECT_EQ(counts.Failures(0, counts.Now(), /*busy=*/false), 1);
}

class RateLimitingQueueRealTest : public ::testing::TestWithParam<bool> {};

TEST_P(RateLimitingQueueRealTest, WorkersRetryingManyItemsLoseNothing) {
  constexpr int kItems = 10'000;  // past FailureTable's kPrefetchMin (8192)
  constexpr int kWorkers = 4;
  std::unique_ptr<RateLimiter<std::string>> limiter =
      std::move(*ExponentialFailureRateLimiter<std::string>::Create(
          {.base = absl::Microseconds(1), .max = absl::Microseconds(100)}));
  if (!GetParam())
    limiter = std::make_unique<testing::NotCounting<std::string>>(std::move(limiter));
  RateLimitingQueue<std::string> q(std::move(limiter));
  std::vector<std::string> keys;
  for (int i = 0; i < kItems; ++i) keys.push_back(absl::StrCat("default/object-", i));
  q.AddAll(keys);
  std::atomic<int> forgotten{0};
  std::atomic<int> in_flight_max{0};
  std::vector<std::atomic<int>> runs(kItems);
  std::vector<std::atomic<int>> active(kItems);
  const CancelableContext deadline = WithTimeout(Background(), absl::Seconds(30));
  const Context& ctx = deadline.context;
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&] {
      // A lost item would leave the workers waiting: the deadline turns that into a
      // failed count below instead of a hang.
      while (auto lease = q.Get(ctx)) {
        const std::string& key = **lease;
        const int i = std::stoi(key.substr(key.rfind('-') + 1));
        if (active[i].fetch_add(1) != 0) in_flight_max.store(2);
        runs[i].fetch_add(1);
        if (q.NumRequeues(key) < 2) {
          q.AddRateLimited(key);
        } else {
          q.Forget(key);
          if (forgotten.fetch_add(1) + 1 == kItems) q.ShutDown();
        }
        active[i].fetch_sub(1);
      }
    });
  }
  for (auto& worker : workers) worker.join();
  EXPECT_EQ(forgotten.load(), kItems);
  EXPECT_EQ(in_flight_max.load(), 0) << "an item was handed to two workers at once";
  for (int i = 0; i < kItems; ++i) ASSERT_EQ(runs[i].load(), 3) << keys[i];
  // Every count was forgotten: the queue's (true) or the limiter's (false), whose table
  // is then empty too.
  for (int i = 0; i < kItems; ++i) ASSERT_EQ(q.NumRequeues(keys[i]), 0) << keys[i];
  if (!GetParam()) {
    EXPECT_EQ(q.rate_limiter().TrackedItems(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(CountsInQueueOrLimiter, RateLimitingQueueRealTest, ::testing::Bool());

// kwq/metrics.h lets a provider that serves one queue be thread-unsafe: every metric call
// of a queue (adds, hand-outs, Dones, retries and the delayed gauge, from any thread) is
// made under one lock. Workers retrying items call all of them at once from two threads;
// under TSan an unserialised pair is a reported race on the provider's plain counter.
TEST(RateLimitingQueueMetricsTest, OneQueuesMetricCallsAreSerialised) {
  constexpr int kItems = 2000;
  testing::SerialCheckProvider provider;
  {
    auto limiter = std::move(*ExponentialFailureRateLimiter<std::string>::Create(
        {.base = absl::Microseconds(1), .max = absl::Microseconds(20)}));
    RateLimitingQueue<std::string> q(std::move(limiter), {.metrics = &provider});
    std::vector<std::string> keys;
    for (int i = 0; i < kItems; ++i) keys.push_back(absl::StrCat("default/object-", i));
    q.AddAll(keys);
    std::atomic<int> forgotten{0};
    const CancelableContext deadline = WithTimeout(Background(), absl::Seconds(30));
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&] {
        while (auto lease = q.Get(deadline.context)) {
          if (q.NumRequeues(**lease) < 2) {
            q.AddRateLimited(**lease);
          } else {
            q.Forget(**lease);
            if (forgotten.fetch_add(1) + 1 == kItems) q.ShutDown();
          }
        }
      });
    }
    for (auto& worker : workers) worker.join();
    ASSERT_EQ(forgotten.load(), kItems);
  }
  EXPECT_GT(provider.calls(), 3 * kItems);
  EXPECT_EQ(provider.overlaps(), 0);
}

// A wait ended by ShutDown makes an idle key, as one ended by CancelAfter does: its
// horizon starts then, not at the key's last failure or Done.
TEST_F(RateLimitingQueueTest, ShutDownStartsTheHorizonOfTheWaitsItDrops) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done
  q.AddAfter("a", absl::Hours(1));      // busy again: waiting
  clock_.Advance(absl::Seconds(30));    // longer than the horizon since the Done
  q.ShutDown();                         // drops the wait: idle from here
  clock_.Advance(absl::Seconds(10));    // the horizon, counted from the ShutDown
  EXPECT_EQ(q.NumRequeues("a"), 1);
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(q.NumRequeues("a"), 0);
}

// A rate-limited add after ShutDown still counts, and as before it: a count that lapsed
// while its key was idle starts again at one.
TEST_F(RateLimitingQueueTest, AddRateLimitedAfterShutDownLetsALapsedCountGo) {
  RateLimitingQueue<std::string> q(Exponential(absl::Seconds(10)),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("a");
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done: idle from here
  clock_.Advance(absl::Seconds(11));    // past the horizon: the count lapsed
  q.ShutDown();
  q.AddRateLimited("a");
  EXPECT_EQ(q.NumRequeues("a"), 1);  // a fresh count, not 2
}

// ---- Queue-kept counts at a fractional-nanosecond horizon ----

// A horizon with a fraction of a nanosecond lapses a queue-kept count as the limiter's own
// table lapses its entry: times are whole nanoseconds, so idle > 1.5 ns is idle >= 2 ns.
TEST_F(RateLimitingQueueTest, AFractionalNanosecondHorizonLapsesAsTheLimitersDoes) {
  const absl::Duration horizon = absl::Nanoseconds(3) / 2;
  auto alone = Exponential(horizon);
  RateLimitingQueue<std::string> q(Exponential(horizon),
                                   {.clock = &clock_, .timers = timers_.get()});
  q.AddRateLimited("b");
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(q.TryGet().has_value());  // handed out and Done: idle from here
  alone->When("b");                     // its horizon starts at the same instant
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(alone->NumRequeues("b"), 1);
  EXPECT_EQ(q.NumRequeues("b"), 1);
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(alone->NumRequeues("b"), 0);
  EXPECT_EQ(q.NumRequeues("b"), 0);
}

}  // namespace
}  // namespace kwq
