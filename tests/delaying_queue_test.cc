#include "kwq/delaying_queue.h"

#include <atomic>
#include <chrono>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kwq/rate_limiting_queue.h"
#include "testing/async_get.h"
#include "testing/cancel_check.h"
#include "testing/counted_limiter.h"
#include "testing/counting_clock.h"
#include "testing/drain_check.h"
#include "testing/eventually.h"
#include "testing/fragile_key.h"
#include "testing/late_timer.h"
#include "testing/pause_points.h"
#include "testing/queue_peer.h"
#include "testing/recording_metrics.h"

namespace kwq {

namespace {

// A delaying queue on a clock whose readings can be made to throw (a user's clock):
// testing::CountingClock::ThrowNext.
class DelayingQueueClockTest : public ::testing::Test {
 protected:
  FakeClock fake_;
  testing::CountingClock clock_{&fake_};
  std::unique_ptr<TimerService> timers_ = *TimerService::Create({.clock = &clock_});
  // Shared, so that a call left hanging on its own thread (ReturnsInTime) keeps it alive.
  std::shared_ptr<DelayingQueue<std::string>> q_ = std::make_shared<DelayingQueue<std::string>>(
      DelayingQueue<std::string>::Options{.clock = &clock_, .timers = timers_.get()});
};

// A manual clock that reads `inner`'s time and takes observers without ever telling them
// of a move: a timer service on it never fires, so only a queue's own promotion (an add,
// or a Get looking for due items) moves its waiting items. (Those tests ran the timers
// on a second clock that never moved, which a DelayingQueue no longer accepts.)
class UnheardClock final : public Clock {
 public:
  explicit UnheardClock(FakeClock* inner) : inner_(inner) {}
  absl::Time Now() const override { return inner_->Now(); }
  void SleepUntil(absl::Time) override {}
  bool is_manual() const override { return true; }
  bool AddObserver(ClockObserver*) override { return true; }
  void RemoveObserver(ClockObserver*) override {}

 private:
  FakeClock* const inner_;
};

class DelayingQueueTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  std::unique_ptr<TimerService> timers_ = *TimerService::Create({.clock = &clock_});
  DelayingQueue<std::string> q_{{.clock = &clock_, .timers = timers_.get()}};

  std::vector<std::string> Ready() {
    std::vector<std::string> out;
    while (auto lease = q_.TryGet()) out.push_back(lease->item());
    return out;
  }

  // Starts a Get on another thread, waits until it sleeps (a polling Get reads the clock
  // and would take a due item itself), runs `then`, and returns the item the Get got: ""
  // when none came within 5 s (the queue is then shut down to release the worker).
  template <typename Then>
  std::string GetOnceAsleep(Then then, bool with_context = false) {
    std::promise<std::string> got;
    auto [ctx, cancel] = WithCancel(Background());
    std::thread worker([&, c = ctx] {
      auto lease = with_context ? q_.Get(c) : q_.Get();
      got.set_value(lease ? lease->item() : "");
    });
    EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q_) > 0; }));
    then();
    std::future<std::string> result = got.get_future();
    const bool woken = result.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!woken) q_.ShutDown();
    worker.join();
    return woken ? result.get() : "";
  }
};

TEST_F(DelayingQueueTest, ItemBecomesReadyAfterDelay) {
  q_.AddAfter("a", absl::Seconds(10));
  EXPECT_EQ(q_.Waiting(), 1u);
  EXPECT_EQ(q_.Depth(), 0u);  // waiting items are not in depth
  clock_.Advance(absl::Seconds(9));
  EXPECT_TRUE(Ready().empty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(q_.Waiting(), 0u);
}

// With a FakeClock and no timer service, the queue makes one on that clock. Delays used
// to go to the default service on the real clock: a Get asleep when the fake clock
// passed the ready time slept on for 10 real seconds (a TryGet, which reads the clock
// itself, did not show it).
TEST_F(DelayingQueueClockTest, FakeClockWithoutTimerServiceWakesASleepingGet) {
  FakeClock clock;
  for (bool rate_limiting : {false, true}) {
    std::unique_ptr<DelayingQueue<std::string>> q =
        rate_limiting
            ? std::make_unique<RateLimitingQueue<std::string>>(QueueOptions{.clock = &clock})
            : std::make_unique<DelayingQueue<std::string>>(QueueOptions{.clock = &clock});
    q->AddAfter("a", absl::Seconds(10));
    std::atomic<bool> got{false};
    std::thread getter([&] {
      std::optional<DelayingQueue<std::string>::Lease> lease = q->Get();
      got = lease.has_value() && lease->item() == "a";
    });
    EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(*q) > 0; }));
    clock.Advance(absl::Seconds(10));
    EXPECT_TRUE(testing::Eventually([&] { return got.load(); }, absl::Seconds(5)))
        << "the Get slept through its item's ready time, rate_limiting " << rate_limiting;
    q->ShutDown();
    getter.join();
  }
}

// A delay shorter than a nanosecond still waits (ready times round up; they used to round
// down, and such an item was ready at once).
// A timer service on another clock than the queue's: Create refuses it (as
// PriorityQueue::Create does), and the constructor makes a service of its own on the
// queue's clock, so a Get asleep for a delayed item is woken at its ready time. The
// timer was armed on the other clock, and the Get slept for ever.
TEST_F(DelayingQueueTest, ATimerServiceOnAnotherClockIsNotUsed) {
  FakeClock other;
  auto other_timers = *TimerService::Create({.clock = &other});
  const DelayingQueue<std::string>::Options wrong{.clock = &clock_, .timers = other_timers.get()};
  EXPECT_EQ(DelayingQueue<std::string>::Create(wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RateLimitingQueue<std::string>::Create(nullptr, wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DelayingQueue<std::string>::Create({.clock = &clock_, .timers = timers_.get()}).ok());
  EXPECT_TRUE(DelayingQueue<std::string>::Create({.clock = &clock_}).ok());  // one of its own

  DelayingQueue<std::string> q(wrong);
  q.AddAfter("a", absl::Seconds(1));
  std::promise<std::string> got;
  std::thread worker([&] {
    auto lease = q.Get();
    got.set_value(lease ? lease->item() : "");
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; }));
  clock_.Advance(absl::Seconds(1));
  std::future<std::string> result = got.get_future();
  const bool woken = result.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!woken) q.ShutDown();  // releases the worker, so the test fails instead of hanging
  worker.join();
  EXPECT_TRUE(woken) << "the Get slept past the item's ready time";
}

// Create refuses a manual clock whose service of the queue's own cannot start (it refuses
// observers), as PriorityQueue::Create does: the constructor would fall back to the
// default service, on the real clock. Create returned OK for it.
TEST(DelayingQueueCreateTest, AManualClockThatRefusesObserversIsRefused) {
  class DeafClock final : public Clock {  // keeps Clock's AddObserver, which refuses
   public:
    absl::Time Now() const override { return absl::UnixEpoch(); }
    void SleepUntil(absl::Time) override {}
    bool is_manual() const override { return true; }
  } clock;
  EXPECT_EQ(DelayingQueue<std::string>::Create({.clock = &clock}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RateLimitingQueue<std::string>::Create(nullptr, {.clock = &clock}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DelayingQueueTest, SubNanosecondDelayIsNotReadyEarly) {
  q_.AddAfter("a", absl::Nanoseconds(0.5));
  clock_.Advance(absl::ZeroDuration());
  EXPECT_TRUE(Ready().empty());
  EXPECT_EQ(q_.Waiting(), 1u);
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
}

// A delaying queue on a FakeClock whose metrics go to a recorder (gauges not refreshed).
class DelayingQueueMetricsTest : public ::testing::Test {
 protected:
  FakeClock clock;
  std::unique_ptr<TimerService> timers = *TimerService::Create({.clock = &clock});
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider{&rec, /*refresh_gauges=*/false};
  DelayingQueue<std::string> q{{.metrics = &provider, .clock = &clock, .timers = timers.get()}};
};

// A waiting item is counted by the `delayed` metric, not by `depth`, from AddAfter until it
// comes due, is cancelled or is dropped at shutdown.
TEST_F(DelayingQueueMetricsTest, WaitingItemsAreCountedInDelayedNotDepth) {
  q.AddAfter("a", absl::Seconds(1));
  q.AddAfter("a", absl::Milliseconds(500));  // moves the one entry
  q.AddAfter("b", absl::Seconds(2));
  EXPECT_EQ(rec.Get("delayed"), 2);
  EXPECT_EQ(rec.Get("depth"), 0);
  EXPECT_EQ(rec.Get("adds"), 0);
  clock.Advance(absl::Milliseconds(500));  // "a" comes due
  EXPECT_EQ(rec.Get("delayed"), 1);
  EXPECT_EQ(rec.Get("depth"), 1);
  EXPECT_EQ(rec.Get("adds"), 1);
  EXPECT_TRUE(q.CancelAfter("b"));
  EXPECT_EQ(rec.Get("delayed"), 0);
  q.AddAfter("c", absl::Seconds(3));
  q.Add("c");  // ready now: its waiting entry goes
  EXPECT_EQ(rec.Get("delayed"), 0);
  EXPECT_EQ(rec.Get("depth"), 2);
  q.AddAfter("d", absl::Seconds(3));
  EXPECT_EQ(rec.Get("delayed"), 1);
  q.ShutDown();  // drops the waiting "d"
  EXPECT_EQ(rec.Get("delayed"), 0);
  EXPECT_EQ(rec.Get("depth"), 2);
}

// ShutDownWithDrain drops waiting items (also an in-flight item's delayed re-add) before
// it waits for the leases: nothing waits, the delayed gauge is back at zero and no timer
// is left armed once the drain returns.
TEST_F(DelayingQueueMetricsTest, ShutDownWithDrainDropsWaitingItems) {
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  q.AddAfter("b", absl::Seconds(1));
  q.AddAfter(lease->item(), absl::Seconds(1));
  EXPECT_EQ(rec.Get("delayed"), 2);
  std::promise<bool> drained;
  std::thread drainer([&] { drained.set_value(q.ShutDownWithDrain()); });
  EXPECT_TRUE(testing::Eventually([&] { return q.ShuttingDown(); }));
  EXPECT_EQ(q.Waiting(), 0u);
  EXPECT_EQ(rec.Get("delayed"), 0);
  lease->Done();
  drainer.join();
  EXPECT_TRUE(drained.get_future().get());
  EXPECT_EQ(timers->Pending(), 0u);
  clock.Advance(absl::Seconds(2));
  EXPECT_FALSE(q.TryGet().has_value());
}

// Every AddAfter before ShutDown is a retry, with or without a delay (client-go's).
TEST_F(DelayingQueueMetricsTest, EveryAddAfterCountsARetryUntilShutDown) {
  q.AddAfter("a", absl::Seconds(1));
  q.AddAfter("a", absl::Seconds(2));  // merged, still counted
  q.AddAfter("b", absl::ZeroDuration());
  q.Add("c");  // not a retry
  EXPECT_EQ(rec.Get("retries"), 3);
  q.ShutDown();
  q.AddAfter("d", absl::Seconds(1));
  q.AddAfter("e", absl::ZeroDuration());
  EXPECT_EQ(rec.Get("retries"), 3);
}

// An AddAfter or AddRateLimited that throws (here a key whose copy throws) adds nothing
// and counts no retry, whatever its delay. One with no delay, and AddRateLimited with a
// counting limiter, counted the retry before the key was stored.
TEST(DelayingQueueRetryMetricTest, AnAddThatThrowsCountsNoRetry) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider(&rec, /*refresh_gauges=*/false);
  const QueueOptions options{.metrics = &provider, .clock = &clock, .timers = timers.get()};
  const testing::FragileKey seven(7);  // its copy throws
  {
    DelayingQueue<testing::FragileKey> q(options);
    EXPECT_THROW(q.AddAfter(seven, absl::Seconds(1)), std::runtime_error);
    EXPECT_THROW(q.AddAfter(seven, absl::ZeroDuration()), std::runtime_error);
    EXPECT_EQ(rec.Get("retries"), 0);
    EXPECT_EQ(rec.Get("depth"), 0);
  }
  RateLimitingQueue<testing::FragileKey> q(nullptr, options);  // a counting limiter
  EXPECT_THROW(q.AddRateLimited(seven), std::runtime_error);
  EXPECT_EQ(rec.Get("retries"), 0);
  EXPECT_EQ(rec.Get("delayed"), 0);
  q.AddRateLimited(testing::FragileKey(1));  // and one that works counts
  EXPECT_EQ(rec.Get("retries"), 1);
}

// An in-flight item's delayed re-add: counted in `delayed` while it waits, then in depth
// (dirty, not ready: it runs after its Done) once it comes due.
TEST_F(DelayingQueueMetricsTest, InFlightItemsDelayedReAddMovesFromDelayedToDepth) {
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  q.AddAfter(lease->item(), absl::Seconds(1));
  EXPECT_EQ(rec.Get("delayed"), 1);
  EXPECT_EQ(rec.Get("depth"), 0);
  EXPECT_EQ(q.Depth(), 0u);
  clock.Advance(absl::Seconds(1));  // due while in flight
  EXPECT_EQ(rec.Get("delayed"), 0);
  EXPECT_EQ(rec.Get("depth"), 1);
  EXPECT_EQ(q.Depth(), 1u);
  EXPECT_EQ(q.Len(), 0u);  // not ready before the Done
  lease->Done();
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(rec.Get("depth"), 1);
}

TEST_F(DelayingQueueTest, NonPositiveDelayAddsNow) {
  q_.AddAfter("zero", absl::ZeroDuration());
  q_.AddAfter("neg", -absl::Seconds(1));
  q_.AddAfter("neginf", -absl::InfiniteDuration());
  EXPECT_EQ(Ready(), (std::vector<std::string>{"zero", "neg", "neginf"}));
  EXPECT_EQ(q_.Waiting(), 0u);
}

TEST_F(DelayingQueueTest, ReadyInDeadlineOrder) {
  q_.AddAfter("c", absl::Seconds(3));
  q_.AddAfter("a", absl::Seconds(1));
  q_.AddAfter("b", absl::Seconds(2));
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST_F(DelayingQueueTest, EarliestReadyTimeWins) {
  q_.AddAfter("a", absl::Seconds(10));
  q_.AddAfter("a", absl::Seconds(20));  // later: ignored
  q_.AddAfter("a", absl::Seconds(5));   // earlier: moves the entry
  EXPECT_EQ(q_.Waiting(), 1u);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
  clock_.Advance(absl::Seconds(30));
  EXPECT_TRUE(Ready().empty());  // one entry, so it ran once
  // A later add after an earlier one keeps the earlier: above, the last add was also the
  // earliest, so "the latest add wins" passed.
  q_.AddAfter("b", absl::Seconds(5));
  q_.AddAfter("b", absl::Seconds(20));
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"b"}));
}

// Waiting items that ShutDown drops become idle keys like any other, so the table sheds
// them instead of keeping them until the queue is destroyed.
TEST_F(DelayingQueueTest, WaitingItemsShutDownDropsAreEvicted) {
  for (int i = 0; i < 10'000; ++i) q_.AddAfter(absl::StrCat("d", i), absl::Hours(1));
  q_.ShutDown();
  EXPECT_LT(internal::QueuePeer::StoredKeys(q_), 6000u);  // evicted down to ~4096
}

// Keys whose waits were cancelled go idle with no hand-out to evict them: they are evicted
// as they are cancelled, down to about twice the idle allowance (all 20,000 stayed stored).
TEST_F(DelayingQueueTest, CancelledKeysAreEvicted) {
  for (int i = 0; i < 20'000; ++i) q_.AddAfter(absl::StrCat("c", i), absl::Hours(1));
  for (int i = 0; i < 20'000; ++i) ASSERT_TRUE(q_.CancelAfter(absl::StrCat("c", i)));
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_LT(internal::QueuePeer::StoredKeys(q_), 10'000u);  // about 2 * 4096
  q_.AddAfter("c7", absl::Seconds(1));                      // an evicted key comes back whole
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"c7"}));
}

// AddAfter with no delay is an Add, also on a clock between two nanoseconds: the item is
// ready at once, not waiting for a ready time rounded up to the next nanosecond.
TEST_F(DelayingQueueTest, ZeroDelayIsAnAddOnAClockBetweenNanoseconds) {
  clock_.Advance(absl::Nanoseconds(0.5));
  q_.AddAfter("z", absl::ZeroDuration());
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(q_.Len(), 1u);
}

TEST_F(DelayingQueueTest, AddOfWaitingItemRunsItOnceNow) {
  q_.AddAfter("a", absl::Seconds(10));
  EXPECT_TRUE(q_.Add("a"));
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
  clock_.Advance(absl::Seconds(10));
  EXPECT_TRUE(Ready().empty());  // kubernetes#126027: not a second time
}

// AddAll likewise: each waiting item of the batch runs once, now, and not again at its
// old ready time.
TEST_F(DelayingQueueTest, AddAllOfWaitingItemsRunsEachOnceNow) {
  q_.AddAfter("a", absl::Seconds(10));
  q_.AddAfter("b", absl::Seconds(10));
  EXPECT_EQ(q_.AddAll(std::vector<std::string>{"a", "b", "c"}), 3u);
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a", "b", "c"}));
  clock_.Advance(absl::Seconds(10));
  EXPECT_TRUE(Ready().empty());
}

TEST_F(DelayingQueueTest, CancelAfterRemovesWaitingEntry) {
  q_.AddAfter("a", absl::Seconds(1));
  q_.AddAfter("b", absl::Seconds(1));
  EXPECT_TRUE(q_.CancelAfter("a"));
  EXPECT_FALSE(q_.CancelAfter("a"));
  EXPECT_FALSE(q_.CancelAfter("never"));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"b"}));
}

TEST_F(DelayingQueueTest, DelayedItemDedupsWithQueuedOne) {
  q_.Add("a");
  q_.AddAfter("a", absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));  // still queued only once
}

// One entry per item, the earliest ready time wins: an item that is ready already does
// not also wait. It used to (as in client-go), and ran a second time when its delay
// ended, although it had been handed out and done in between.
TEST_F(DelayingQueueTest, AddAfterOfAReadyItemAddsNoSecondRun) {
  q_.Add("a");
  q_.AddAfter("a", absl::Seconds(1));
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));  // handed out and done
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(Ready().empty());
}

// The same for an in-flight item added again (it runs once more after its Done): that
// run is the earliest, and the delayed add merges into it.
TEST_F(DelayingQueueTest, AddAfterOfAnItemOwedARunAfterItsDoneAddsNoSecondRun) {
  q_.Add("a");
  {
    auto lease = q_.TryGet();
    ASSERT_TRUE(lease.has_value());
    q_.Add("a");  // runs again after this Done
    q_.AddAfter(lease->item(), absl::Seconds(1));
    EXPECT_EQ(q_.Waiting(), 0u);
  }
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(Ready().empty());
}

TEST_F(DelayingQueueTest, HugeDelayDoesNotOverflow) {
  q_.AddAfter("inf", absl::InfiniteDuration());
  q_.AddAfter("huge", absl::Hours(1e12));
  clock_.Advance(absl::Hours(24 * 365 * 1000));
  EXPECT_TRUE(Ready().empty());
  EXPECT_EQ(q_.Waiting(), 2u);
  EXPECT_TRUE(q_.CancelAfter("inf"));
}

// An item that waits forever has the same key as an empty heap's head (kNever): Add still
// finds and removes its waiting entry (Add skips the lock only when nothing waits).
TEST_F(DelayingQueueTest, AddOfItemWaitingForeverRunsItNow) {
  q_.AddAfter("inf", absl::InfiniteDuration());
  ASSERT_EQ(q_.Waiting(), 1u);
  EXPECT_TRUE(q_.Add("inf"));
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"inf"}));
  // Once nothing waits, Add and CancelAfter still behave.
  EXPECT_FALSE(q_.CancelAfter("inf"));
  EXPECT_TRUE(q_.Add("x"));
  q_.AddAfter("y", absl::Seconds(1));
  EXPECT_TRUE(q_.Add("y"));  // removes the entry made after the queue had emptied
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"x", "y"}));
}

// On a clock before the int64-nanosecond range (about 1677), now and now + 1 h both
// saturated to the lowest key, so a delayed item was handed out at once. It now waits
// for the clock to enter the range (never before its time).
TEST(DelayingQueueRangeTest, AClockBeforeTheKeyRangeHandsOutNothingEarly) {
  for (absl::Time start :
       {absl::FromCivil(absl::CivilSecond(1, 1, 1), absl::UTCTimeZone()), absl::InfinitePast()}) {
    FakeClock clock(start);
    auto timers = *TimerService::Create({.clock = &clock});
    DelayingQueue<std::string> q({.clock = &clock, .timers = timers.get()});
    q.AddAfter("a", absl::Hours(1));
    EXPECT_FALSE(q.TryGet().has_value()) << start;
    EXPECT_EQ(q.Waiting(), 1u) << start;
    if (start != absl::InfinitePast()) {
      clock.SetTime(absl::FromCivil(absl::CivilSecond(2000, 1, 1), absl::UTCTimeZone()));
      auto lease = q.TryGet();  // due long ago
      ASSERT_TRUE(lease.has_value()) << start;
      EXPECT_EQ(**lease, "a");
    }
  }
}

TEST_F(DelayingQueueTest, ManyItemsOneTimer) {
  for (int i = 0; i < 1000; ++i) q_.AddAfter(absl::StrCat("k", i), absl::Milliseconds(i + 1));
  EXPECT_EQ(timers_->Pending(), 1u);  // one timer for the whole queue
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_EQ(Ready().size(), 500u);
  EXPECT_EQ(timers_->Pending(), 1u);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready().size(), 500u);
  EXPECT_EQ(timers_->Pending(), 0u);
}

// client-go's AddAfter blocks once 1000 adds wait for its goroutine; this one never
// blocks on a buffer: with no consumer and the clock frozen, 20,000 distinct delayed adds
// from one thread all return and all wait.
TEST_F(DelayingQueueTest, AddAfterNeverBlocksOnABuffer) {
  constexpr int kItems = 20'000;
  for (int i = 0; i < kItems; ++i) q_.AddAfter(absl::StrCat("k", i), absl::Seconds(1 + i % 7));
  EXPECT_EQ(q_.Waiting(), static_cast<size_t>(kItems));
  EXPECT_EQ(q_.Len(), 0u);
  clock_.Advance(absl::Seconds(7));
  EXPECT_EQ(q_.Len(), static_cast<size_t>(kItems));
}

// Lateness does not grow with the number of items due at once: one firing makes all of
// them ready (the timer moves them in batches, 16 per hold of the lock, but all in the
// same firing), with no Get needed to move the rest.
TEST_F(DelayingQueueTest, OneFiringMakesEveryDueItemReady) {
  for (int i = 0; i < 100; ++i) q_.AddAfter(absl::StrCat("k", i), absl::Milliseconds(1));
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(q_.Len(), 100u);
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(timers_->Pending(), 0u);  // nothing left to fire for
}

// A cancel wakes a Get(ctx) asleep while an item waits on the queue's armed timer.
TEST_F(DelayingQueueTest, GetWithContextAsleepIsWokenByTheCancel) {
  q_.AddAfter("later", absl::Hours(1));
  testing::ExpectCancelWakesASleepingGet(
      q_, [](auto& queue) { return internal::QueuePeer::Sleepers(queue); });
}

// A ready item wins over a done context, also one that is due but still waits for the
// timer to move it: Get(ctx) moves due items before it looks at the context. A callback
// of the same service, due just before, holds the timer up meanwhile.
TEST_F(DelayingQueueTest, GetWithADoneContextTakesADueItemTheTimerHasNotMoved) {
  testing::LateTimer late(*timers_, clock_, absl::Seconds(1));
  q_.AddAfter("a", absl::Seconds(1));
  const bool held = late.Start();
  EXPECT_TRUE(held);
  EXPECT_EQ(q_.Waiting(), 1u);  // due, not moved
  auto [ctx, cancel] = WithCancel(Background());
  cancel();
  std::optional<DelayingQueue<std::string>::Lease> lease = q_.Get(ctx);
  late.Release();
  ASSERT_TRUE(held);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->item(), "a");
}

TEST_F(DelayingQueueTest, BlockedGetIsWokenAtTheExactReadyTime) {
  // After a firing the timer coalesces (50 us), but a worker that blocks re-arms it
  // for the exact ready time of the next item.
  for (bool with_context : {false, true}) {
    q_.AddAfter("a", absl::Seconds(1));
    q_.AddAfter("b", absl::Seconds(1) + absl::Microseconds(10));
    clock_.Advance(absl::Seconds(1));
    EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
    EXPECT_EQ(GetOnceAsleep([&] { clock_.Advance(absl::Microseconds(10)); }, with_context),
              "b")  // not 50
        << "Get(ctx): " << with_context;
  }
}

// The other way round: a Get already asleep with nothing waiting, then an AddAfter right
// after a firing. Coalescing (up to 50 us after a firing) is only for when no Get waits.
TEST_F(DelayingQueueTest, AddAfterWithAGetAsleepArmsTheExactReadyTime) {
  for (bool with_context : {false, true}) {
    q_.AddAfter("a", absl::Seconds(1));
    clock_.Advance(absl::Seconds(1));  // fires: the next firing would be coalesced
    EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
    EXPECT_EQ(GetOnceAsleep(
                  [&] {
                    q_.AddAfter("b", absl::Microseconds(10));
                    clock_.Advance(absl::Microseconds(10));  // not 50
                  },
                  with_context),
              "b")
        << "Get(ctx): " << with_context;
  }
}

// A firing wakes a sleeping Get for "a"; when another thread takes "a" first, that Get
// sleeps again without re-arming anything, so the firing itself must arm the timer for
// "b"'s exact ready time (it coalesced while the Get counted as signalled).
TEST_F(DelayingQueueTest, FiringWithAGetAsleepArmsTheNextReadyTimeExactly) {
  std::thread worker([this] {
    while (q_.Get()) {
    }
  });
  // Rounds until this thread has won "a" from the woken Get a few times (it usually
  // does); a round the worker wins re-arms through its own sleeping Get and shows nothing.
  int won = 0;
  for (int round = 0; round < 200 && won < 3; ++round) {
    const std::string a = absl::StrCat("a", round), b = absl::StrCat("b", round);
    q_.AddAfter(a, absl::Seconds(1));
    q_.AddAfter(b, absl::Seconds(1) + absl::Microseconds(10));
    const bool asleep = testing::Eventually([&] { return internal::QueuePeer::Sleepers(q_) > 0; });
    EXPECT_TRUE(asleep);
    if (!asleep) break;
    clock_.Advance(absl::Seconds(1));  // fires: `a` ready, the Get signalled
    std::optional<DelayingQueue<std::string>::Lease> got = q_.TryGet();
    const bool this_thread_won = got.has_value();
    if (this_thread_won) {
      EXPECT_EQ(got->item(), a);
    }
    clock_.Advance(absl::Microseconds(10));
    if (this_thread_won) {
      ++won;
      EXPECT_EQ(q_.Waiting(), 0u) << "round " << round << ": no timer fired for " << b;
    }
    got.reset();
    // Settle: `b` is handed out and the worker is back asleep before the next round.
    clock_.Advance(absl::Milliseconds(1));
    EXPECT_TRUE(testing::Eventually([&] { return q_.Waiting() == 0 && q_.Len() == 0; }));
  }
  EXPECT_GT(won, 0) << "this thread never took the item the firing made ready";
  q_.ShutDown();
  worker.join();
}

// A Get going to sleep on the timer (its promote step found it armed by the next ready
// time) whose timer fires before the Get is counted asleep: the firing sees no Get asleep
// and re-arms the timer coalesced, 50 us past "b"'s ready time. The Get, counted asleep,
// re-arms it exactly (in the same hold of the lock); it used to sleep on, and on this
// FakeClock, stopped at "b"'s ready time, it never woke.
TEST_F(DelayingQueueTest, AGetCountedAsleepAfterAFiringRearmsTheExactReadyTime) {
  q_.AddAfter("a", absl::Seconds(1));  // the timer: at 1 s
  q_.AddAfter("b", absl::Seconds(1) + absl::Microseconds(10));
  q_.Add("a");  // ready now: its waiting entry goes, and the timer stays at 1 s
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
  testing::PausePoints hooks;
  testing::PausePoints::Pause& will_wait =
      hooks.Arm(internal::HookPoint::kGetWillWait, &internal::QueuePeer::Core(q_));
  std::promise<std::string> got;
  std::thread worker([&] {
    auto lease = q_.Get();
    got.set_value(lease ? lease->item() : "");
  });
  ASSERT_TRUE(will_wait.WaitPaused());  // nothing due: it relies on the timer at 1 s
  clock_.Advance(absl::Seconds(1));     // fires with no Get asleep: re-armed coalesced
  will_wait.Resume();
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q_) > 0; }));
  clock_.Advance(absl::Microseconds(10));  // "b"'s ready time, not 50 us past it
  std::future<std::string> result = got.get_future();
  const bool woken = result.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!woken) q_.ShutDown();
  worker.join();
  EXPECT_TRUE(woken) << "the Get slept past b's ready time";
  if (woken) {
    EXPECT_EQ(result.get(), "b");
  }
}

// A quiet window left from before the clock moved back does not hold the timer: items
// are at most the coalescing window (50 us) late, not the size of the jump.
TEST_F(DelayingQueueTest, ClockMovedBackDoesNotHoldTheTimer) {
  const absl::Time t0 = clock_.Now();
  q_.AddAfter("a", absl::Hours(1));
  clock_.Advance(absl::Hours(1));  // fires: no firing before t0 + 1 h + 50 us
  q_.AddAfter("c", absl::Hours(2));
  clock_.SetTime(t0);
  q_.AddAfter("b", absl::Milliseconds(10));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(q_.Waiting(), 1u);  // "b" moved by the timer, "c" still waits
  EXPECT_EQ(q_.Len(), 2u);
}

// A clock moved to InfiniteFuture (FakeClock saturates there) fires everything due, with
// no overflow in the timer's bookkeeping (UBSan checks), and "never" still waits.
TEST_F(DelayingQueueTest, ClockAtInfiniteFutureFiresEverythingDue) {
  q_.AddAfter("a", absl::Seconds(1));
  q_.AddAfter("b", absl::Hours(1));
  q_.AddAfter("never", absl::InfiniteDuration());
  clock_.Advance(absl::InfiniteDuration());
  EXPECT_EQ(q_.Waiting(), 1u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a", "b"}));
  q_.AddAfter("c", absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{}));
}

// After a firing at the end of the key range (its coalescing window saturated there), a
// clock set back just before the end and an item due within the window: the timer is
// armed for the item, not parked at InfiniteFuture (it never fired; only a Get moved it).
TEST_F(DelayingQueueTest, AnItemDueNearTheKeyRangesEndFiresAfterAFiringThere) {
  q_.AddAfter("a", absl::Seconds(1));
  clock_.SetTime(absl::InfiniteFuture());  // fires "a"
  ASSERT_EQ(q_.Waiting(), 0u);
  constexpr int64_t kLast = std::numeric_limits<int64_t>::max();
  clock_.SetTime(absl::FromUnixNanos(kLast - 1000));
  q_.AddAfter("b", absl::Nanoseconds(900));  // due 100 ns before the range's end
  clock_.Advance(absl::Nanoseconds(999));    // the last finite key: the window ends there
  EXPECT_EQ(q_.Waiting(), 0u) << "the timer for b never fired";
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(DelayingQueueTest, TryGetPromotesDueItemsItself) {
  q_.AddAfter("a", absl::Seconds(1));
  q_.AddAfter("b", absl::Seconds(1) + absl::Microseconds(10));
  clock_.Advance(absl::Seconds(1));
  clock_.SetTime(clock_.Now() + absl::Microseconds(10));  // timer not due (coalescing)
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a", "b"}));
}

// Workers skip the queue's lock while nothing is due (PromoteDue's lock-free exit on a
// published "next ready time"). With timers that never fire (UnheardClock), only that
// promotion can move items, so a stale published time would leave them waiting.
TEST(DelayingQueueHintTest, PromotionSeesEveryNewEarliestReadyTime) {
  FakeClock fake;
  UnheardClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  DelayingQueue<std::string> q({.clock = &clock, .timers = timers.get()});
  auto take = [&q]() -> std::string {
    auto lease = q.TryGet();
    return lease ? lease->item() : "";
  };
  q.AddAfter("late", absl::Seconds(10));
  EXPECT_EQ(take(), "");                 // nothing due before 10 s
  q.AddAfter("soon", absl::Seconds(1));  // a new earliest ready time
  fake.Advance(absl::Seconds(1));
  EXPECT_EQ(take(), "soon");
  EXPECT_TRUE(q.CancelAfter("late"));  // nothing waits now
  EXPECT_EQ(take(), "");
  q.AddAfter("third", absl::Seconds(2));
  q.AddAfter("third", absl::Milliseconds(500));  // earlier ready time for a waiting item
  fake.Advance(absl::Milliseconds(500));
  EXPECT_EQ(take(), "third");
  q.AddAfter("fourth", absl::Seconds(1));
  fake.Advance(absl::Seconds(1));
  auto lease = q.Get();  // the blocking Get promotes before it polls
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->item(), "fourth");
}

TEST_F(DelayingQueueTest, ShutDownDropsWaitingItemsAndIgnoresAddAfter) {
  q_.AddAfter("a", absl::Seconds(1));
  q_.ShutDown();
  EXPECT_EQ(q_.Waiting(), 0u);
  q_.AddAfter("b", absl::Seconds(1));
  EXPECT_EQ(q_.Waiting(), 0u);
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(q_.Get().has_value());
  EXPECT_EQ(timers_->Pending(), 0u);
}

// Items already due when the queue shuts down are queued and handed out, whether or not
// the timer has moved them yet; the others are dropped. They were all dropped while the
// timer was late (a callback of the same service, due just before, holds it up here),
// so whether a due item ran depended on the timer thread.
TEST_F(DelayingQueueTest, ShutDownQueuesItemsAlreadyDue) {
  testing::LateTimer late(*timers_, clock_, absl::Seconds(1));
  q_.AddAfter("due", absl::Seconds(1));
  q_.AddAfter("later", absl::Seconds(2));
  EXPECT_TRUE(late.Start());
  EXPECT_EQ(q_.Waiting(), 2u);  // one due, not moved
  q_.ShutDown();
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(Ready(), std::vector<std::string>{"due"});
}

// A drain queues the items already due too, and waits for them: a worker still gets the
// due item after ShutDownWithDrain has begun, and the drain returns once it is Done.
TEST_F(DelayingQueueTest, ShutDownWithDrainRunsItemsAlreadyDue) {
  testing::LateTimer late(*timers_, clock_, absl::Seconds(1));
  q_.AddAfter("due", absl::Seconds(1));
  q_.AddAfter("later", absl::Seconds(2));
  ASSERT_TRUE(late.Start());
  testing::ExpectDrainRunsTheDueItem(q_);
}

// ShutDownWithDrain(ctx) drops the waiting items, as ShutDownWithDrain does, and a done
// context ends the wait for the rest, undrained.
TEST_F(DelayingQueueTest, AContextEndsADrain) {
  q_.AddAfter("later", absl::Seconds(5));
  testing::ExpectContextEndsADrain(
      q_, [](auto& q) { return internal::QueuePeer::Draining(q); }, /*done_first=*/false);
  EXPECT_EQ(q_.Waiting(), 0u);
}
TEST_F(DelayingQueueTest, AContextDoneBeforeTheDrainEndsItAtOnce) {
  testing::ExpectContextEndsADrain(
      q_, [](auto& q) { return internal::QueuePeer::Draining(q); }, /*done_first=*/true);
}

// A retry of the item being processed, AddAfter(lease->item(), d), finds the key by its
// address (no hash, no lookup): it runs again after its Done and its delay, once.
TEST_F(DelayingQueueTest, AddAfterOfTheLeasedItemRunsItAgainAfterTheDelay) {
  q_.Add("a");
  q_.Add("b");
  {
    auto lease = q_.TryGet();
    ASSERT_TRUE(lease.has_value());
    ASSERT_EQ(lease->item(), "a");
    q_.AddAfter(lease->item(), absl::Seconds(2));
    q_.AddAfter(lease->item(), absl::Seconds(5));  // later: the earlier ready time stays
    q_.AddAfter(lease->item(), absl::Seconds(1));  // earlier: wins
    EXPECT_EQ(q_.Waiting(), 1u);
  }
  EXPECT_EQ(Ready(), (std::vector<std::string>{"b"}));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(q_.Waiting(), 0u);
}

// The address of an item leased from another queue names nothing in this one: its value
// is looked up. (Its slot number, 20000, is past the end of this queue's chunk directory,
// which ASan would catch were it used.)
TEST_F(DelayingQueueTest, AddAfterOfAnotherQueuesLeasedItemAddsItsValue) {
  DelayingQueue<std::string> other({.clock = &clock_, .timers = timers_.get()});
  q_.Add("x");
  for (int i = 0; i < 20000; ++i) other.Add(absl::StrCat("o", i));
  other.Add("y");
  while (other.Len() > 1) other.TryGet();
  {
    auto lease = other.TryGet();
    ASSERT_TRUE(lease.has_value());
    ASSERT_EQ(lease->item(), "y");
    q_.AddAfter(lease->item(), absl::Seconds(1));
    const std::string copy = lease->item();
    q_.AddAfter(copy, absl::Seconds(1));  // the same key: merges
  }
  EXPECT_EQ(q_.Waiting(), 1u);
  EXPECT_EQ(Ready(), (std::vector<std::string>{"x"}));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Ready(), (std::vector<std::string>{"y"}));
  EXPECT_EQ(other.Waiting(), 0u);
}

// Waiting keys share the table with idle ones, which are erased once thousands pile up;
// a waiting key is not idle.
TEST_F(DelayingQueueTest, WaitingItemsSurviveIdleKeyEviction) {
  for (int i = 0; i < 100; ++i) q_.AddAfter(absl::StrCat("w", i), absl::Seconds(1));
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 20000; ++i) q_.Add(absl::StrCat("k", round, "-", i));
    EXPECT_EQ(Ready().size(), 20000u);
  }
  EXPECT_EQ(q_.Waiting(), 100u);
  clock_.Advance(absl::Seconds(1));
  std::vector<std::string> ready = Ready();
  std::vector<std::string> want;
  for (int i = 0; i < 100; ++i) want.push_back(absl::StrCat("w", i));
  EXPECT_EQ(ready, want);
}

// A delayed add moves up to two already due items along the way (a reconcile loop's
// retries then move its own due retries rather than wait for the timer thread). The
// timers here never fire (UnheardClock), so only the adds can move anything.
TEST(DelayingQueuePiggybackTest, DelayedAddMovesDueItemsAlongTheWay) {
  FakeClock fake;
  UnheardClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  DelayingQueue<std::string> q({.clock = &clock, .timers = timers.get()});
  for (const char* key : {"a", "b", "c"}) q.AddAfter(key, absl::Seconds(1));
  fake.Advance(absl::Seconds(1));
  EXPECT_EQ(q.Len(), 0u);  // due, but nothing has moved them
  q.AddAfter("d", absl::Seconds(1));
  EXPECT_EQ(q.Len(), 2u);  // "a" and "b", in ready-time order
  EXPECT_EQ(q.Waiting(), 2u);
  q.AddAfter("d", absl::Seconds(5));  // changes nothing about "d", still moves "c"
  EXPECT_EQ(q.Len(), 3u);
  std::vector<std::string> order;
  while (auto lease = q.TryGet()) order.push_back(lease->item());
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(DelayingQueueRealTest, AddAfterFromManyThreadsLosesNothing) {
  DelayingQueue<int> q;
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        q.AddAfter(t * kPerThread + i, absl::Microseconds(i % 50));
      }
    });
  }
  std::vector<bool> seen(kThreads * kPerThread);
  int count = 0;
  // A lost item would leave Get waiting: the deadline turns that into a failure.
  const CancelableContext deadline = WithTimeout(Background(), absl::Seconds(30));
  while (count < kThreads * kPerThread) {
    auto lease = q.Get(deadline.context);
    if (!lease.has_value()) break;
    EXPECT_FALSE(seen[**lease]) << **lease << " handed out twice";
    seen[**lease] = true;
    ++count;
  }
  for (auto& p : producers) p.join();
  EXPECT_EQ(count, kThreads * kPerThread) << "items lost";
  EXPECT_EQ(q.Waiting(), 0u);
  EXPECT_FALSE(q.TryGet().has_value()) << "an item handed out once more";
}

// An Add racing the timer's promotion of the same waiting item queues it once: both end
// the wait, and only one may queue the item (a broken hand-over would queue it twice, or
// lose it). Another thread adds each key right at its ready time, while the timer thread
// promotes it; nothing is handed out until the races are over, so each key must come out
// exactly once.
TEST(DelayingQueueRealTest, AddRacingThePromotionQueuesTheItemOnce) {
  // Each key waits until its ready time, and an Add of it comes at about that time,
  // racing the timer's promotion. Whichever comes first, the key is queued once (a
  // second ready entry would hand it out twice), and none is left waiting: the Add ended
  // the wait if the promotion had not. Every fourth key waits an hour longer, so its Add
  // always comes first, while the timer promotes the others.
  constexpr int kKeys = 2000;
  constexpr absl::Duration kStep = absl::Microseconds(100);
  Clock* clock = RealClock::Default();
  DelayingQueue<int> q;  // on the same real clock
  const absl::Time first = clock->Now() + absl::Milliseconds(10);
  for (int k = 0; k < kKeys; ++k) {
    q.AddAfter(
        k, first + k * kStep - clock->Now() + (k % 4 == 0 ? absl::Hours(1) : absl::ZeroDuration()));
  }
  std::thread adder([&] {
    for (int k = 0; k < kKeys; ++k) {
      while (clock->Now() < first + k * kStep) {
      }
      q.Add(k);
    }
  });
  adder.join();
  EXPECT_EQ(q.Waiting(), 0u);  // at once: every key has been added since its AddAfter
  std::vector<int> runs(kKeys);
  int total = 0;
  while (auto lease = q.TryGet()) {
    ++runs[**lease];
    ++total;
  }
  EXPECT_EQ(total, kKeys);
  int wrong = 0;
  for (int k = 0; k < kKeys; ++k) wrong += runs[k] != 1;
  EXPECT_EQ(wrong, 0);
}

// ShutDown drops every waiting item, also one whose AddAfter races it: nothing is left
// waiting once both are over. (An add that got past the inner queue's shutdown check
// before the waiting items were dropped left an entry waiting for ever, counted in
// Waiting() and the delayed metric.)
TEST(DelayingQueueRealTest, AnAddAfterRacingShutDownLeavesNothingWaiting) {
  int stray = 0;
  for (int round = 0; round < 50; ++round) {
    DelayingQueue<int> q;
    std::atomic<bool> started{false};
    std::thread adder([&] {
      for (int i = 0; !q.ShuttingDown(); ++i) {
        q.AddAfter(i % 10'000, absl::Hours(1));
        if (i == 10) started = true;
      }
    });
    while (!started.load()) std::this_thread::yield();
    q.ShutDown();
    adder.join();
    if (q.Waiting() != 0) ++stray;
  }
  EXPECT_EQ(stray, 0);
}

TEST(DelayingQueueRealTest, DestroyWhileTimerArmedIsSafe) {
  for (int i = 0; i < 100; ++i) {
    DelayingQueue<int> q;
    q.AddAfter(1, absl::Microseconds(i % 7));
    q.AddAfter(2, absl::Hours(1));
  }
}

// Destroying the queue while its timer's Fire moves due items batch by batch (it releases
// the lock between batches) waits for that Fire to end: ASan and TSan check the overlap.
TEST(DelayingQueueRealTest, DestroyWhileTheTimerMovesBatchesIsSafe) {
  for (int round = 0; round < 5; ++round) {
    FakeClock clock;
    auto timers = *TimerService::Create({.clock = &clock});
    auto q =
        std::make_unique<DelayingQueue<int>>(QueueOptions{.clock = &clock, .timers = timers.get()});
    for (int i = 0; i < 20000; ++i) q->AddAfter(i, absl::Seconds(1));
    std::thread mover([&clock] { clock.Advance(absl::Seconds(1)); });
    EXPECT_TRUE(testing::Eventually([&] { return q->Len() > 0; }));  // the Fire is moving batches
    q.reset();
    mover.join();
  }
}

// A timer firing whose clock reading throws (a user's clock) ends with the queue's lock
// released: the firing held it by hand, and the throw left it locked, so the next add
// blocked for ever. The item waits on, and the next firing an add arms moves it.
TEST_F(DelayingQueueClockTest, AFiringWhoseClockThrowsLeavesTheQueueUsable) {
  q_->AddAfter("a", absl::Milliseconds(1));
  clock_.ThrowNext(1);  // the firing's first reading
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  // A hang here is left on its own thread (the queue is shared with it).
  ASSERT_TRUE(testing::ReturnsInTime([q = q_] { q->AddAfter("b", absl::Milliseconds(1)); }))
      << "the queue's lock was left held";
  fake_.Advance(absl::Milliseconds(2));
  EXPECT_EQ(q_->Len(), 2u);
}

// A Get whose clock reading throws under the queue's lock (moving due items itself)
// releases the lock: it was held by hand there, and the next call deadlocked.
TEST_F(DelayingQueueClockTest, AGetWhoseClockThrowsLeavesTheQueueUsable) {
  q_->AddAfter("a", absl::Milliseconds(1));
  clock_.ThrowNext(1);  // the firing's first reading: "a" is left due, unmoved
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  // TryGet's first reading (without the lock) passes, its second (under it) throws.
  clock_.ThrowNext(1, /*after=*/1);
  EXPECT_THROW(q_->TryGet(), std::runtime_error);
  // A hang here is left on its own thread (the queue is shared with it).
  ASSERT_TRUE(testing::ReturnsInTime([q = q_] { (void)q->Len(); }))
      << "the queue's lock was left held";
  auto lease = q_->TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->item(), "a");
}

// A firing whose clock throws leaves the items waiting with no timer; a Get asleep then is
// woken and looks for due items itself, in steps, until a timer is armed again. It slept
// on, and only an add would have woken it.
TEST_F(DelayingQueueClockTest, AFiringWhoseClockThrowsWakesSleepingGets) {
  testing::AsyncGet getter([&] {
    auto lease = q_->Get();
    return lease ? lease->item() : "none";
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(*q_) > 0; }));
  q_->AddAfter("a", absl::Milliseconds(1));
  clock_.ThrowNext(1);  // the firing's first reading
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  EXPECT_TRUE(getter.Await([&] { q_->Add("a"); })) << "the sleeping Get was not woken";
  EXPECT_EQ(getter.outcome(), "a");
}

// An AddAfter that has to make the timer (a firing's clock threw, and none is left) arms
// it for the items already waiting, also when the add changes no waiting entry. It was
// left parked at the end of time, and those items waited for the next add or Get.
TEST_F(DelayingQueueClockTest, AnAddAfterThatMakesTheTimerArmsItForTheItemsWaiting) {
  q_->AddAfter("a", absl::Milliseconds(1));
  q_->AddAfter("b", absl::Milliseconds(5));
  clock_.ThrowNext(1);  // the firing's first reading
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  q_->AddAfter("b", absl::Hours(1));  // b already waits for an earlier time: no change
  fake_.Advance(absl::Milliseconds(4));
  EXPECT_EQ(q_->Len(), 2u) << "no timer moved the due items";
  EXPECT_EQ(q_->Waiting(), 0u);
}

// Plain Adds that end the last waits of items with no timer also end the Gets' sleeping in
// steps: nothing is left to look for. It stayed on (every sleeping Get woke each
// millisecond) until the stale ready hint came due, an hour here.
TEST_F(DelayingQueueClockTest, AnAddThatEndsTheLastTimerlessWaitEndsTheSteps) {
  q_->AddAfter("a", absl::Milliseconds(1));
  q_->AddAfter("b", absl::Hours(1));
  clock_.ThrowNext(1);  // the firing's first reading: it ends with no timer
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  EXPECT_TRUE(internal::QueuePeer::SleepsInSteps(*q_));
  q_->Add("b");
  EXPECT_TRUE(internal::QueuePeer::SleepsInSteps(*q_));  // "a" still waits
  q_->Add("a");
  EXPECT_FALSE(internal::QueuePeer::SleepsInSteps(*q_));
  EXPECT_EQ(q_->Waiting(), 0u);
  EXPECT_EQ(q_->Len(), 2u);
}

// A Get whose clock throws while it polls (it reads the clock to look for due items)
// leaves the count of polling Gets as it was: the count stayed up, and since a poller
// takes the next item itself, no add woke a sleeping Get any more.
TEST_F(DelayingQueueClockTest, APollingGetWhoseClockThrowsLeavesNoPollerCounted) {
  clock_.ThrowNext(1, /*after=*/1);  // the Get's first reading passes, its first poll's throws
  EXPECT_THROW(q_->Get(), std::runtime_error);
  EXPECT_EQ(internal::QueuePeer::Polling(*q_), 0);
  testing::AsyncGet getter([&] {
    auto lease = q_->Get();
    return lease ? lease->item() : "none";
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(*q_) > 0; }));
  q_->Add("x");
  EXPECT_TRUE(getter.Await([&] { q_->ShutDown(); })) << "the add did not wake the sleeping Get";
  EXPECT_EQ(getter.outcome(), "x");
}

// A Get(ctx) that sleeps registers a wake-up on ctx that points into its frame; a throw
// out of it (its clock, read when the Get wakes to look for due items) removes that
// wake-up first. It was left on ctx, and cancelling ctx then ran it on the dead frame
// (the scribbled stack makes that crash).
TEST_F(DelayingQueueClockTest, AGetWithAContextWhoseClockThrowsLeavesNoWakeUpOnIt) {
  q_->AddAfter("b", absl::Hours(1));
  auto [ctx, cancel] = WithCancel(Background());
  testing::AsyncGet getter(
      [&, c = ctx] {
        auto lease = q_->Get(c);
        return lease ? lease->item() : "none";
      },
      testing::AsyncGet::kScribbleAndStay);
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(*q_) > 0; }));
  clock_.ThrowNext(2);  // the firing's reading, then the woken Get's
  EXPECT_THROW(fake_.Advance(absl::Hours(2)), std::runtime_error);
  const bool returned = getter.ReturnsWithin(absl::Seconds(5));
  if (returned) cancel();  // runs nothing of the Get's now
  EXPECT_TRUE(getter.Await([&] { q_->ShutDown(); }, absl::ZeroDuration()));
  EXPECT_EQ(getter.outcome(), "threw");
}

// A firing that moves several due items wakes a sleeping Get for each (it counted every
// sleeper as signalled, so one woken by Signal alone left the others asleep for ever).
TEST_F(DelayingQueueTest, AFiringThatMovesSeveralItemsWakesEverySleepingGet) {
  q_.AddAfter("a", absl::Seconds(1));
  q_.AddAfter("b", absl::Seconds(1));
  const auto get = [&] { return q_.Get() ? "item" : "none"; };
  testing::AsyncGet first(get), second(get);
  ASSERT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q_) >= 2; }));
  clock_.Advance(absl::Seconds(1));  // the timer moves both
  EXPECT_TRUE(first.Await([&] { q_.ShutDown(); })) << "a sleeping Get was not woken";
  EXPECT_TRUE(second.Await([&] { q_.ShutDown(); })) << "a sleeping Get was not woken";
  EXPECT_EQ(first.outcome(), "item");
  EXPECT_EQ(second.outcome(), "item");
}

// A destroyed delaying queue takes what it still counted off a shared delayed gauge, no more.
TEST_F(DelayingQueueMetricsTest, ADestroyedQueueLeavesTheSharedDelayedGaugeRight) {
  q.AddAfter("c", absl::Seconds(5));  // the fixture's queue: same gauge
  {
    DelayingQueue<std::string> other(
        {.metrics = &provider, .clock = &clock, .timers = timers.get()});
    other.AddAfter("a", absl::Seconds(1));
    other.AddAfter("b", absl::Seconds(2));
    clock.Advance(absl::Seconds(1));  // "a" comes due
    EXPECT_EQ(rec.Get("delayed"), 2);
  }                                  // destroyed with "b" waiting
  EXPECT_EQ(rec.Get("delayed"), 1);  // "c"
}

// Found by a mutation audit. Coalescing: after a firing the timer fires no sooner than 50 us
// later while no Get sleeps, so delays that end inside that window share one firing
// ("a stream of short delays costs one timer firing per window"). Pins Fire's quiet window.
TEST_F(DelayingQueueTest, DelaysEndingInsideTheCoalescingWindowShareOneFiring) {
  q_.AddAfter("a", absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));  // fires: the next firing no sooner than 50 us on
  ASSERT_EQ(q_.Len(), 1u);
  q_.AddAfter("b", absl::Microseconds(10));
  q_.AddAfter("c", absl::Microseconds(30));
  clock_.Advance(absl::Microseconds(30));
  EXPECT_EQ(q_.Waiting(), 2u) << "a firing for b alone, inside the coalescing window";
  clock_.Advance(absl::Microseconds(20));  // the window's end: one firing moves both
  EXPECT_EQ(q_.Waiting(), 0u);
  EXPECT_EQ(q_.Len(), 3u);
}

// Found by a mutation audit. A rate-limited add with no delay (the limiter says 0) that has
// to make the timer (a firing's clock threw, and none is left) arms it for the items
// already waiting, as AddAfter does: they would wait on a timer parked at the end of time.
TEST_F(DelayingQueueClockTest, AZeroDelayRateLimitedAddThatMakesTheTimerArmsItForTheItemsWaiting) {
  RateLimitingQueue<std::string> q(
      *ExponentialFailureRateLimiter<std::string>::Create(
          {.base = absl::ZeroDuration(), .max = absl::ZeroDuration(), .clock = &clock_}),
      {.clock = &clock_, .timers = timers_.get()});
  q.AddAfter("a", absl::Milliseconds(1));
  q.AddAfter("b", absl::Milliseconds(5));
  clock_.ThrowNext(1);  // the firing's first reading: it ends with no timer
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  q.AddRateLimited("c");   // delay 0: queued now, and makes the timer
  EXPECT_EQ(q.Len(), 2u);  // "c", and "a" moved along the way
  fake_.Advance(absl::Milliseconds(4));
  EXPECT_EQ(q.Waiting(), 0u) << "no timer moved b";
  EXPECT_EQ(q.Len(), 3u);
}

// The same when the add's limiter throws: nothing is added, but the timer the add made
// is still armed for the items already waiting (AddAfterFailure's catch).
TEST_F(DelayingQueueClockTest, ARateLimitedAddWhoseLimiterThrowsStillArmsTheTimerItMade) {
  auto owned = std::make_unique<testing::CountedLimiter>(&clock_, absl::ZeroDuration());
  testing::CountedLimiter* limiter = owned.get();
  RateLimitingQueue<std::string> q(std::move(owned), {.clock = &clock_, .timers = timers_.get()});
  q.AddAfter("a", absl::Milliseconds(1));
  q.AddAfter("b", absl::Milliseconds(5));
  clock_.ThrowNext(1);  // the firing's first reading: it ends with no timer
  EXPECT_THROW(fake_.Advance(absl::Milliseconds(2)), std::runtime_error);
  limiter->throw_next = true;
  EXPECT_THROW(q.AddRateLimited("c"), std::runtime_error);  // makes the timer, adds nothing
  EXPECT_EQ(q.Waiting(), 1u);                               // "b" ("a", due, moved along the way)
  fake_.Advance(absl::Milliseconds(4));
  EXPECT_EQ(q.Waiting(), 0u) << "the timer the throwing add made was left parked";
  EXPECT_EQ(q.Len(), 2u);
}

// The heap keys of kwq/internal/time_key.h: a current time rounds down, a ready time up
// (so an item is never ready before its time), both saturate, and the end of time is
// never ready.
TEST(TimeKeyTest, RoundsReadyTimesUpAndCurrentTimesDownAndSaturates) {
  using internal::kNeverKey;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const absl::Time t = absl::FromUnixNanos(1'000);
  const absl::Time fraction = t + absl::Nanoseconds(1) / 4;  // between two nanoseconds
  EXPECT_EQ(internal::NowKey(t), 1'000);
  EXPECT_EQ(internal::ReadyKey(t), 1'000);
  EXPECT_EQ(internal::NowKey(fraction), 1'000);
  EXPECT_EQ(internal::ReadyKey(fraction), 1'001);
  EXPECT_EQ(internal::NowKey(absl::InfiniteFuture()), kNeverKey);
  EXPECT_EQ(internal::ReadyKey(absl::InfiniteFuture()), kNeverKey);
  EXPECT_EQ(internal::ReadyKey(absl::FromUnixSeconds(int64_t{1} << 40)), kNeverKey);  // > 2262
  EXPECT_EQ(internal::NowKey(absl::InfinitePast()), kMin);
  EXPECT_EQ(internal::ReadyKey(absl::InfinitePast()), kMin + 1);  // not due at INT64_MIN
  EXPECT_EQ(internal::ReadyKey(absl::FromUnixSeconds(-(int64_t{1} << 40))), kMin + 1);
  EXPECT_EQ(internal::TimeOfKey(kNeverKey), absl::InfiniteFuture());
  EXPECT_EQ(internal::TimeOfKey(1'000), t);
}

TEST(TimeKeyTest, SpansRoundUpSaturateAndCompareAcrossTheWholeRange) {
  using internal::AtLeastApart;
  using internal::kNeverSpan;
  using internal::SpanNanos;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(SpanNanos(absl::ZeroDuration()), 0u);
  EXPECT_EQ(SpanNanos(-absl::Seconds(1)), 0u);
  EXPECT_EQ(SpanNanos(absl::Nanoseconds(1) / 4), 1u);  // rounds up
  EXPECT_EQ(SpanNanos(absl::Seconds(3) + absl::Nanoseconds(7)), 3'000'000'007u);
  EXPECT_EQ(SpanNanos(absl::Seconds(2) + absl::Nanoseconds(1) / 2), 2'000'000'001u);
  EXPECT_EQ(SpanNanos(absl::InfiniteDuration()), kNeverSpan);
  // 2^64 ns is 18,446,744,073.709551616 s: the last span below it, and just past it.
  EXPECT_EQ(SpanNanos(absl::Seconds(18'446'744'073) + absl::Nanoseconds(709'551'614)),
            kNeverSpan - 1);
  EXPECT_EQ(SpanNanos(absl::Seconds(18'446'744'073) + absl::Nanoseconds(800'000'000)), kNeverSpan);
  EXPECT_EQ(SpanNanos(absl::Seconds(18'446'744'074)), kNeverSpan);
  EXPECT_EQ(SpanNanos(absl::Seconds(int64_t{1} << 40)), kNeverSpan);
  EXPECT_TRUE(AtLeastApart(100, 150, 50));
  EXPECT_FALSE(AtLeastApart(100, 149, 50));
  EXPECT_FALSE(AtLeastApart(150, 100, 0));  // later before earlier
  EXPECT_TRUE(AtLeastApart(100, 100, 0));
  EXPECT_TRUE(AtLeastApart(kMin, kMax, kNeverSpan - 1));  // the whole range, no overflow
  EXPECT_FALSE(AtLeastApart(kMin, kMax, kNeverSpan));     // never
}

}  // namespace
}  // namespace kwq
