#include "kwq/queue.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kwq/internal/key_table.h"
#include "kwq/internal/range_items.h"
#include "kwq/internal/spread_hash.h"
#include "kwq/metrics.h"
#include "testing/async_get.h"
#include "testing/cancel_check.h"
#include "testing/counting_clock.h"
#include "testing/drain_check.h"
#include "testing/eventually.h"
#include "testing/fragile_key.h"
#include "testing/queue_peer.h"
#include "testing/ranges.h"
#include "testing/recording_metrics.h"
#include "testing/stress_check.h"
#include "testing/uniform_metrics.h"

namespace kwq {

namespace {

using StringQueue = Queue<std::string>;

std::vector<std::string> Drain(StringQueue& q) {
  std::vector<std::string> out;
  while (auto lease = q.TryGet()) out.push_back(lease->item());
  return out;
}

TEST(QueueTest, AddedItemIsQueuedOnce) {
  StringQueue q;
  EXPECT_TRUE(q.Add("a"));
  EXPECT_FALSE(q.Add("a"));
  EXPECT_TRUE(q.Add("b"));
  EXPECT_FALSE(q.Add(std::string("a")));
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(q.Depth(), 2u);
  EXPECT_EQ(Drain(q), (std::vector<std::string>{"a", "b"}));
}

TEST(QueueTest, HandsOutInFifoOrder) {
  Queue<int> q;
  for (int i = 0; i < 100; ++i) q.Add(i);
  for (int i = 0; i < 100; ++i) {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(**lease, i);
  }
  EXPECT_FALSE(q.TryGet().has_value());
}

TEST(QueueTest, AddWhileProcessingRunsAgainAfterDone) {
  StringQueue q;
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_TRUE(q.Add("a"));   // marked to run again
  EXPECT_FALSE(q.Add("a"));  // once
  EXPECT_EQ(q.Len(), 0u);    // not handed to a second worker while in flight
  EXPECT_EQ(q.Depth(), 1u);
  EXPECT_FALSE(q.TryGet().has_value());
  lease->Done();
  EXPECT_EQ(q.Len(), 1u);
  auto again = q.TryGet();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(**again, "a");
}

// Writes made before an Add are visible to the processing of the item that follows it,
// whatever the Add returns: a merged add (the item already queued) and one refused
// because the queue is shutting down (the item queued before is still handed out). The
// refused one published nothing: the worker takes the item through the ring, without the
// table lock (TSan reported the race). Meaningful under TSan.
TEST(QueueTest, WritesBeforeAnAddAreVisibleToTheProcessingThatFollows) {
  for (const bool shut_down : {false, true}) {
    SCOPED_TRACE(shut_down ? "refused" : "merged");
    Queue<std::string> q;
    q.Add("x");
    if (shut_down) q.ShutDown();
    int payload = 0;
    std::atomic<bool> added{false};  // relaxed: no synchronisation of its own
    std::thread worker([&] {
      while (!added.load(std::memory_order_relaxed)) std::this_thread::yield();
      auto lease = q.Get();
      ASSERT_TRUE(lease.has_value());
      EXPECT_EQ(payload, 42);
    });
    payload = 42;
    EXPECT_FALSE(q.Add("x"));
    added.store(true, std::memory_order_relaxed);
    worker.join();
  }
}

TEST(QueueTest, LeaseDestructorCallsDone) {
  StringQueue q;
  q.Add("a");
  {
    auto lease = q.TryGet();
    EXPECT_EQ(q.InFlight(), 1u);
    q.Add("a");
  }
  EXPECT_EQ(q.InFlight(), 0u);
  EXPECT_EQ(q.Len(), 1u);
}

TEST(QueueTest, LeaseDoneIsIdempotentAndMoveTransfersIt) {
  StringQueue q;
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  StringQueue::Lease moved = std::move(*lease);
  EXPECT_FALSE(lease->active());
  EXPECT_TRUE(moved.active());
  moved.Done();
  moved.Done();
  EXPECT_FALSE(moved.active());
  EXPECT_EQ(q.InFlight(), 0u);
  // The one run ended once: "a" is idle, so an add queues it again, once (a Done that
  // counted twice or left it in flight would break one of these).
  EXPECT_TRUE(q.Add("a"));
  EXPECT_FALSE(q.Add("a"));
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.InFlight(), 0u);
}

TEST(QueueTest, AddAllQueuesDistinctItems) {
  StringQueue q;
  std::vector<std::string> items{"a", "b", "a", "c"};
  EXPECT_EQ(q.AddAll(items), 3u);
  EXPECT_EQ(Drain(q), (std::vector<std::string>{"a", "b", "c"}));
}

// The add comes once the Get sleeps (not before it looked), and wakes it.
TEST(QueueTest, GetBlocksUntilAdd) {
  StringQueue q;
  std::atomic<bool> got{false};
  std::thread worker([&] {
    auto lease = q.Get();
    got = lease.has_value() && **lease == "x";
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; }));
  q.Add("x");
  EXPECT_TRUE(testing::Eventually([&] { return got.load(); })) << "the add did not wake the Get";
  q.ShutDown();  // releases the worker should the check above have failed
  worker.join();
}

TEST(QueueTest, ShutDownIgnoresAddsButHandsOutQueuedItems) {
  StringQueue q;
  q.Add("a");
  q.Add("b");
  q.ShutDown();
  EXPECT_TRUE(q.ShuttingDown());
  EXPECT_FALSE(q.Add("c"));
  EXPECT_EQ(**q.Get(), "a");
  EXPECT_EQ(**q.Get(), "b");
  EXPECT_FALSE(q.Get().has_value());
}

TEST(QueueTest, ShutDownWakesEveryBlockedGet) {
  StringQueue q;
  std::atomic<int> returned{0};
  std::vector<std::thread> workers;
  std::latch started(4);
  for (int i = 0; i < 4; ++i) {
    workers.emplace_back([&] {
      started.count_down();
      EXPECT_FALSE(q.Get().has_value());
      ++returned;
    });
  }
  started.wait();
  // All four asleep (the one that polls at length too), so ShutDown has to wake them.
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) >= 4; }));
  q.ShutDown();
  // A Get left asleep cannot be released once the queue is shut down: fail (and abort
  // at the joinable threads) in 5 s instead of hanging until the ctest timeout.
  ASSERT_TRUE(testing::Eventually([&] { return returned.load() == 4; }))
      << returned.load() << " of 4 Gets woke";
  for (auto& w : workers) w.join();
}

TEST(QueueTest, ShutDownWithDrainWaitsForQueuedAndInFlight) {
  StringQueue q;
  q.Add("queued");
  auto in_flight = q.TryGet();  // "queued" is now in flight
  q.Add("waiting");
  q.Add("queued");  // and marked to run again
  const std::vector<std::string> seen = testing::DrainWhileTaking(
      q, [](auto& queue) { return internal::QueuePeer::Draining(queue); }, 1, in_flight);
  EXPECT_EQ(seen, (std::vector<std::string>{"waiting", "queued"}));
  EXPECT_EQ(q.Depth(), 0u);
}

TEST(QueueTest, ShutDownWithDrainDoesNotReturnBeforeLeaseEnds) {
  StringQueue q;
  q.Add("a");
  auto lease = q.TryGet();
  std::atomic<bool> returned{false};
  std::thread drainer([&] {
    q.ShutDownWithDrain();
    returned = true;
  });
  // Once the drainer waits (or wrongly returned), give it every chance to (wrongly)
  // return: a negative check, which can only miss a failure.
  EXPECT_TRUE(
      testing::Eventually([&] { return internal::QueuePeer::Draining(q) > 0 || returned.load(); }));
  EXPECT_FALSE(testing::Eventually([&] { return returned.load(); }, absl::Milliseconds(20)));
  lease->Done();
  drainer.join();
  EXPECT_TRUE(returned.load());
}

TEST(QueueTest, ShutDownAbortsDrainWait) {
  StringQueue q;
  q.Add("a");
  auto lease = q.TryGet();
  std::atomic<int> result{-1};
  std::thread drainer([&] { result = q.ShutDownWithDrain(); });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Draining(q) > 0; }));
  q.ShutDown();
  EXPECT_TRUE(testing::Eventually([&] { return result.load() != -1; }))
      << "ShutDown did not end the drain";
  lease->Done();  // releases the drainer should the check above have failed
  drainer.join();
  EXPECT_EQ(result.load(), 0);  // aborted, not drained
}

// A ShutDown ends every drain in progress, not only one of them.
TEST(QueueTest, ShutDownAbortsEveryDrainWait) {
  StringQueue q;
  q.Add("a");
  testing::ExpectShutDownAbortsEveryDrain(
      q, [](auto& queue) { return internal::QueuePeer::Draining(queue); });
}

TEST(QueueTest, SeveralDrainersAllReturn) {
  StringQueue q;
  q.Add("a");
  auto lease = q.TryGet();
  std::vector<std::thread> drainers;
  std::atomic<int> drained{0};
  for (int i = 0; i < 3; ++i) drainers.emplace_back([&] { drained += q.ShutDownWithDrain(); });
  EXPECT_TRUE(testing::Eventually(
      [&] { return internal::QueuePeer::Draining(q) >= 3; }));  // all three wait
  lease->Done();
  for (auto& d : drainers) d.join();
  EXPECT_EQ(drained.load(), 3);
}

// ShutDownWithDrain(ctx): a done context ends the wait, undrained, whether it is done
// while the drain waits or before the call (a deadline bounds a graceful shutdown).
TEST(QueueTest, AContextEndsADrain) {
  StringQueue q;
  testing::ExpectContextEndsADrain(
      q, [](auto& queue) { return internal::QueuePeer::Draining(queue); },
      /*done_first=*/false);
}
TEST(QueueTest, AContextDoneBeforeTheDrainEndsItAtOnce) {
  StringQueue q;
  testing::ExpectContextEndsADrain(
      q, [](auto& queue) { return internal::QueuePeer::Draining(queue); },
      /*done_first=*/true);
}

// A drain bounded by a context that stays live waits for the work and returns true; one
// with a done context on a queue with nothing queued or in flight is drained too. Its
// wake-up on the context goes with it: a cancel after the queue is gone touches nothing
// (ASan).
TEST(QueueTest, ADrainBoundedByAContextReturnsTrueWhenDrained) {
  auto [ctx, cancel] = WithCancel(Background());
  {
    StringQueue q;
    q.Add("a");
    auto lease = q.TryGet();
    std::atomic<int> drained{-1};
    std::thread drainer([&q, &drained, c = ctx] { drained = q.ShutDownWithDrain(c) ? 1 : 0; });
    EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Draining(q) > 0; }));
    lease->Done();
    drainer.join();
    EXPECT_EQ(drained.load(), 1);
  }
  cancel();
  StringQueue empty;
  EXPECT_TRUE(empty.ShutDownWithDrain(ctx));
}

TEST(QueueTest, GetWithContextReturnsOnCancel) {
  StringQueue q;
  auto [ctx, cancel] = WithCancel(Background());
  std::thread canceller([c = cancel] { c(); });
  EXPECT_FALSE(q.Get(ctx).has_value());
  EXPECT_TRUE(ctx.IsCancelled());
  canceller.join();
  q.Add("a");
  auto [live, cancel_live] = WithCancel(Background());
  auto lease = q.Get(live);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(**lease, "a");
}

// The cancel comes while the Get sleeps (not before it looked): it must wake it.
TEST(QueueTest, GetWithContextAsleepIsWokenByTheCancel) {
  StringQueue q;
  testing::ExpectCancelWakesASleepingGet(
      q, [](auto& queue) { return internal::QueuePeer::Sleepers(queue); });
}

TEST(QueueTest, GetWithContextReturnsItemsAddedLater) {
  StringQueue q;
  auto [ctx, cancel] = WithCancel(Background());
  // The Add comes once the Get sleeps (after its polling), so the Add must wake it.
  bool slept = false;
  std::thread producer([&] {
    slept = testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; });
    q.Add("later");
  });
  auto lease = q.Get(ctx);
  producer.join();
  EXPECT_TRUE(slept);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(**lease, "later");
}

TEST(QueueTest, CancelledContextStillGetsReadyItem) {
  StringQueue q;
  q.Add("a");
  auto [ctx, cancel] = WithCancel(Background());
  cancel();
  EXPECT_TRUE(q.Get(ctx).has_value());  // ready items win over a done context
  EXPECT_FALSE(q.Get(ctx).has_value());
}

struct Key {
  int id;
  bool operator==(const Key&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const Key& k) {
    return H::combine(std::move(h), k.id);
  }
};

TEST(QueueTest, MoveOnlyAndCustomHashItems) {
  Queue<Key> q;
  q.Add(Key{1});
  q.Add(Key{1});
  q.Add(Key{2});
  EXPECT_EQ(q.Len(), 2u);
  Queue<std::unique_ptr<int>> ptrs;  // move-only items are accepted
  ptrs.Add(std::make_unique<int>(5));
  auto lease = ptrs.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(*lease->item(), 5);
}

TEST(QueueTest, SlotsAreReusedAfterDone) {
  // 50 rounds of 1,000 new keys, each round run and done before the next: the slots of
  // done keys are evicted and reused, so the table never holds many more slots than one
  // round plus the keys kept for a quick re-add (it reached 5,217; 50,000 without reuse).
  Queue<int> q;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 1000; ++i) q.Add(round * 1000 + i);
    while (auto lease = q.TryGet()) {
    }
  }
  EXPECT_EQ(q.Depth(), 0u);
  EXPECT_LT(internal::QueuePeer::SlotLimit(q), 8192u);
}

// ---- metrics ----

// A queue reporting to `rec` on a fake clock.
class QueueMetricsTest : public ::testing::Test {
 protected:
  StringQueue& MakeQueue(bool refresh_gauges = true) {
    provider_ = std::make_unique<testing::RecordingProvider>(&rec, refresh_gauges);
    queue_ = std::make_unique<StringQueue>(StringQueue::Options{
        .name = "q", .metrics = provider_.get(), .clock = &clock, .timers = timers_.get()});
    return *queue_;
  }
  void DestroyQueue() { queue_.reset(); }

  FakeClock clock;
  testing::RecordedMetrics rec;

 private:
  std::unique_ptr<TimerService> timers_ = *TimerService::Create({.clock = &clock});
  std::unique_ptr<testing::RecordingProvider> provider_;
  std::unique_ptr<StringQueue> queue_;  // destroyed first
};

TEST_F(QueueMetricsTest, RecordsClientGoMetricSet) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  q.Add("a");  // deduplicated: not counted
  q.Add("b");
  EXPECT_EQ(rec.Get("adds"), 2);
  EXPECT_EQ(rec.Get("depth"), 2);
  clock.Advance(absl::Seconds(2));
  auto lease = q.TryGet();
  EXPECT_EQ(rec.Get("depth"), 1);
  EXPECT_DOUBLE_EQ(rec.Get("latency"), 2.0);
  clock.Advance(absl::Seconds(3));  // the 500 ms refresh runs inside Advance
  EXPECT_NEAR(rec.Get("unfinished"), 3.0, 0.5);
  EXPECT_NEAR(rec.Get("longest"), 3.0, 0.5);
  lease->Done();
  EXPECT_DOUBLE_EQ(rec.Get("work"), 3.0);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(rec.Get("unfinished"), 0);
}

// A clock set back between an add and its hand-out, or between the hand-out and Done,
// records 0 s, not a negative duration (it recorded -3600 s); the in-flight gauges too.
TEST_F(QueueMetricsTest, DurationsAreNotNegativeWhenTheClockGoesBack) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  clock.SetTime(clock.Now() - absl::Hours(1));
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(rec.Observations("latency"), 1);
  EXPECT_EQ(rec.Get("latency"), 0.0);
  clock.SetTime(clock.Now() - absl::Hours(1));
  clock.Advance(absl::ZeroDuration());  // the gauges' refresh runs inside a move
  EXPECT_GE(rec.Get("unfinished"), 0.0);
  EXPECT_GE(rec.Get("longest"), 0.0);
  lease->Done();
  EXPECT_EQ(rec.Observations("work"), 1);
  EXPECT_EQ(rec.Get("work"), 0.0);
}

// unfinished work is the sum of the in-flight items' ages, longest running the oldest one
// (with one item in flight the two are equal, so this needs two).
TEST_F(QueueMetricsTest, UnfinishedIsTheSumAndLongestTheMaxOverLeases) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  q.Add("b");
  auto first = q.TryGet();
  clock.Advance(absl::Seconds(2));
  auto second = q.TryGet();
  clock.Advance(absl::Seconds(1));  // ages 3 s and 1 s; the 500 ms refresh runs inside Advance
  EXPECT_NEAR(rec.Get("unfinished"), 4.0, 0.01);
  EXPECT_NEAR(rec.Get("longest"), 3.0, 0.01);
}

// A lease ending in the middle of the in-flight set leaves the others counted.
TEST_F(QueueMetricsTest, UnfinishedCountsTheLeasesStillInFlight) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  q.Add("b");
  q.Add("c");
  auto first = q.TryGet();
  clock.Advance(absl::Seconds(1));
  auto second = q.TryGet();
  clock.Advance(absl::Seconds(1));
  auto third = q.TryGet();
  second->Done();                   // ages now: a 2 s, c 0 s
  clock.Advance(absl::Seconds(1));  // a 3 s, c 1 s; the 500 ms refresh runs inside Advance
  EXPECT_NEAR(rec.Get("unfinished"), 4.0, 0.01);
  EXPECT_NEAR(rec.Get("longest"), 3.0, 0.01);
  first->Done();
  clock.Advance(absl::Seconds(1));  // c 2 s
  EXPECT_NEAR(rec.Get("unfinished"), 2.0, 0.01);
  EXPECT_NEAR(rec.Get("longest"), 2.0, 0.01);
}

// A destroyed queue sets its in-flight gauges to zero: the last refresh's value would
// otherwise stay exported (with keep_series, for good) for a queue that is gone.
TEST_F(QueueMetricsTest, DestroyedQueueZeroesItsInFlightGauges) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  {
    auto lease = q.TryGet();
    clock.Advance(absl::Seconds(2));  // the refreshes see it 2 s in flight
  }
  EXPECT_NEAR(rec.Get("unfinished"), 2.0, 0.01);
  EXPECT_NEAR(rec.Get("longest"), 2.0, 0.01);
  DestroyQueue();  // before the next refresh
  EXPECT_EQ(rec.Get("unfinished"), 0);
  EXPECT_EQ(rec.Get("longest"), 0);
}

// A metric that throws loses that one update: the recorder's own bookkeeping and the
// other metrics go on. One try around each whole call used to skip the rest: a throwing
// work histogram left the lease counted in flight for good, a throwing latency histogram
// or depth gauge left a stale time behind (the next work duration or latency measured
// from it), and a throwing unfinished gauge at destruction left the queue's depth behind.
TEST_F(QueueMetricsTest, AMetricThatThrowsDropsOnlyItsOwnUpdate) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  rec.ThrowNext("work", 1);
  {
    auto lease = q.TryGet();
    clock.Advance(absl::Seconds(1));
  }                                  // Done: the work histogram throws
  clock.Advance(absl::Seconds(10));  // refreshes
  EXPECT_EQ(rec.Get("unfinished"), 0) << "the lease still counted in flight";
  EXPECT_EQ(rec.Get("longest"), 0);

  q.Add("b");
  rec.ThrowNext("latency", 1);
  {
    auto lease = q.TryGet();  // the latency histogram throws
    clock.Advance(absl::Seconds(2));
  }
  EXPECT_EQ(rec.Observations("work"), 1);
  EXPECT_DOUBLE_EQ(rec.Get("work"), 2.0) << "work measured from a stale start";

  rec.ThrowNext("depth", 1);
  q.Add("c");  // the depth gauge throws
  EXPECT_EQ(rec.Get("adds"), 3);
  clock.Advance(absl::Seconds(3));
  { auto lease = q.TryGet(); }
  EXPECT_EQ(rec.Observations("latency"), 2);  // a's and c's
  EXPECT_DOUBLE_EQ(rec.Get("latency"), 3.0) << "latency measured from a stale add";

  q.Add("d");
  q.Add("e");
  EXPECT_EQ(rec.Get("depth"), 1);  // -1 after c's lost Inc, +2
  rec.ThrowNext("unfinished", 1);
  DestroyQueue();  // its unfinished gauge throws
  EXPECT_EQ(rec.Get("depth"), -1) << "the destroyed queue's depth left on the gauge";
  EXPECT_EQ(rec.Get("longest"), 0);
}

// A user's clock that throws when a lease is handed out: the depth gauge still drops, and
// the unknown start time gives no work duration and no age in the in-flight gauges (the
// depth update came after the clock read and was skipped; a stale start was used).
TEST(QueueMetricsClockTest, AClockThatThrowsLeavesTheOtherMetricsRight) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider(&rec);
  StringQueue q({.name = "q", .metrics = &provider, .clock = &clock, .timers = timers.get()});
  q.Add("a");
  {
    clock.ThrowNext(1);
    auto lease = q.TryGet();  // its clock read throws
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(rec.Get("depth"), 0);
    fake.Advance(absl::Seconds(2));  // the in-flight gauges refresh
    EXPECT_EQ(rec.Get("unfinished"), 0);
    EXPECT_EQ(rec.Get("longest"), 0);
  }
  EXPECT_EQ(rec.Observations("work"), 0);
  EXPECT_EQ(rec.Observations("latency"), 0);
  q.Add("b");  // and the next item is measured again
  fake.Advance(absl::Seconds(1));
  {
    auto lease = q.TryGet();
    fake.Advance(absl::Seconds(3));
  }
  EXPECT_EQ(rec.Observations("latency"), 1);
  EXPECT_DOUBLE_EQ(rec.Get("latency"), 1.0);
  EXPECT_EQ(rec.Observations("work"), 1);
  EXPECT_DOUBLE_EQ(rec.Get("work"), 3.0);
}

// depth counts what client-go's does: queued items plus in-flight ones added again.
TEST_F(QueueMetricsTest, DepthCountsAnInFlightItemAddedAgain) {
  StringQueue& q = MakeQueue(/*refresh_gauges=*/false);
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(rec.Get("depth"), 0);
  q.Add("a");  // in flight: queued again after its Done
  EXPECT_EQ(rec.Get("depth"), 1);
  EXPECT_EQ(rec.Get("adds"), 2);
  q.Add("a");  // already marked: merges
  EXPECT_EQ(rec.Get("depth"), 1);
  lease->Done();
  EXPECT_EQ(rec.Get("depth"), 1);
  auto again = q.TryGet();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(rec.Get("depth"), 0);
}

// ---- concurrency (TSan) ----

// `polling_workers` > 1 lets several idle Gets poll at once; a producer skips the wake-up
// while any Get polls (Queue::NeedWakeLocked) and workers wake sleepers instead. Checks
// exclusivity, that every add is followed by a run that saw it, that the queue settles
// with nothing ready or in flight before shutdown wakes anyone (no lost wake-up), and
// that no key runs more often than it was queued.
void ExpectNoOverlapAndNoneLost(int polling_workers) {
  Queue<int> q({.polling_workers = polling_workers});
  constexpr int kKeys = 64, kProducers = 2, kAddsPerProducer = 20000, kWorkers = 4;
  constexpr int kRounds = 8;
  testing::KeyRunLedger ledger(kKeys);
  testing::RunStressRounds(
      ledger, kWorkers, kProducers, kRounds,
      [&](int) {
        while (auto lease = q.Get()) ledger.Run(**lease);
      },
      [&](int p, int round) {
        for (int i = round * kAddsPerProducer / kRounds;
             i < (round + 1) * kAddsPerProducer / kRounds; ++i) {
          const int k = (i * 7 + p) % kKeys;
          ledger.Add(k, [&] { return q.Add(k); });
        }
      },
      [&] { return q.Depth() == 0 && q.InFlight() == 0; },
      [&] { return internal::QueuePeer::Sleepers(q); }, [&] { return q.ShutDownWithDrain(); });
}

TEST(QueueStressTest, NoItemHandedToTwoWorkersAndNoneLost) { ExpectNoOverlapAndNoneLost(0); }

TEST(QueueStressTest, NoItemHandedToTwoWorkersAndNoneLostWithThreePollers) {
  ExpectNoOverlapAndNoneLost(3);
}

// client-go's drain waits only for in-flight items; this one also waits for queued ones.
TEST(QueueTest, ShutDownWithDrainWaitsForAQueuedItemWithNoLeaseActive) {
  StringQueue q;
  q.Add("a");
  testing::ExpectDrainWaitsForQueuedItem(
      q, [](auto& queue) { return internal::QueuePeer::Draining(queue); });
}

// While a Get polls, Add leaves waking sleepers to the workers: one that takes an item
// while more are ready wakes a sleeper. With a poller simulated (it never takes
// anything), only that wake can reach the sleeper; without it the sleeper stays asleep
// and the wait below gives up after 5 s.
TEST(QueueTest, WorkerWakesASleeperWhenMoreItemsAreReady) {
  Queue<int> q;
  auto [ctx, cancel] = WithCancel(Background());
  std::promise<int> got;
  std::thread sleeper([&, c = ctx] {  // polls briefly, then sleeps
    auto lease = q.Get(c);
    got.set_value(lease ? **lease : -1);
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; }));
  internal::QueuePeer::SetPolling(q, 1);
  q.Add(1);
  q.Add(2);
  auto lease = q.TryGet();  // takes 1, sees 2 ready and a sleeper
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(**lease, 1);
  std::future<int> woken = got.get_future();
  const bool in_time = woken.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  cancel();  // lets a sleeper that was never woken return
  sleeper.join();
  internal::QueuePeer::SetPolling(q, 0);
  EXPECT_TRUE(in_time) << "the sleeper was not woken";
  EXPECT_EQ(woken.get(), 2);
}

// One producer, one worker: hand-out order stays FIFO while ready items move through the
// lock-free ring and, when the producer runs ahead by more than the ring holds, through the
// overflow list.
TEST(QueueStressTest, FifoAcrossRingAndOverflow) {
  Queue<int> q;
  constexpr int kItems = 60000;
  std::vector<int> seen;
  seen.reserve(kItems);
  // Three times the ring's capacity before the worker starts: the rest is sure to go to
  // the overflow list, and the worker to take it from there in order.
  constexpr int kBeforeWorker = 3 * static_cast<int>(internal::SlotRing::kCapacity);
  for (int i = 0; i < kBeforeWorker; ++i) q.Add(i);
  std::thread worker([&] {
    while (auto lease = q.Get()) seen.push_back(**lease);
  });
  for (int i = kBeforeWorker; i < kItems; ++i) {
    q.Add(i);
    if (i % 5000 == 0) std::this_thread::yield();  // let the worker catch up now and then
  }
  EXPECT_TRUE(q.ShutDownWithDrain());
  worker.join();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kItems));
  for (int i = 0; i < kItems; ++i) ASSERT_EQ(seen[i], i) << "at " << i;
}

// The same on one thread, without timing: once items wait in the overflow list, an add
// goes behind them even when a hand-out has freed a cell of the ring. (The stress test
// above catches a push into the ring then only when its timing lets it.) And Len counts
// the overflow list's items too.
TEST(QueueTest, FifoAndLenAcrossRingAndOverflow) {
  Queue<int> q;
  const int cap = static_cast<int>(internal::SlotRing::kCapacity);
  for (int i = 0; i < 3 * cap; ++i) q.Add(i);
  EXPECT_EQ(q.Len(), static_cast<size_t>(3 * cap));
  {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(**lease, 0);
  }
  q.Add(3 * cap);  // the ring has a free cell; the overflow list has items
  std::vector<int> out;
  while (auto lease = q.TryGet()) out.push_back(**lease);
  ASSERT_EQ(out.size(), static_cast<size_t>(3 * cap));
  for (int i = 0; i < 3 * cap; ++i) ASSERT_EQ(out[i], i + 1) << "at " << i;
}

// Many distinct keys, so idle keys are erased (by workers and producers) while others are
// added and processed: every key added once is handed out exactly once.
TEST(QueueStressTest, IdleKeyEvictionLosesNothing) {
  Queue<int> q;
  constexpr int kProducers = 2, kPerProducer = 15000, kWorkers = 3;
  std::vector<std::atomic<int>> runs(kProducers * kPerProducer);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&] {
      while (auto lease = q.Get()) runs[**lease].fetch_add(1);
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) q.Add(p * kPerProducer + i);
    });
  }
  for (auto& t : producers) t.join();
  EXPECT_TRUE(q.ShutDownWithDrain());
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < runs.size(); ++k) ASSERT_EQ(runs[k].load(), 1) << "key " << k;
}

// The queue is destroyed as soon as ShutDownWithDrain returns, while workers end their
// leases without a lock: no Done may touch the queue after the drain saw the last lease
// end (ASan and TSan report it if one does). Each worker takes one lease and never calls
// into the queue again, so the threads are joined only after the queue is gone.
TEST(QueueStressTest, DestroyRightAfterDrainWhileLeasesEnd) {
  constexpr int kWorkers = 4;
  for (int round = 0; round < 100; ++round) {
    auto q = std::make_unique<Queue<int>>();
    for (int i = 0; i < kWorkers; ++i) q->Add(i);
    std::latch all_taken(kWorkers);
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&all_taken, queue = q.get()] {
        auto lease = queue->Get();
        all_taken.count_down();
        std::this_thread::yield();
        lease->Done();
      });
    }
    all_taken.wait();
    EXPECT_TRUE(q->ShutDownWithDrain());
    q.reset();
    for (auto& t : workers) t.join();
  }
}

// A drain ended by its context may destroy the queue as soon as it returns, while the
// cancel that ended it may still be running the drain's wake-up on another thread, and
// while a Done races the cancel (ASan, TSan).
TEST(QueueStressTest, DestroyRightAfterADrainEndedByItsContext) {
  for (int round = 0; round < 200; ++round) {
    auto q = std::make_unique<Queue<int>>();
    q->Add(1);
    auto lease = q->TryGet();
    ASSERT_TRUE(lease.has_value());
    auto [ctx, cancel] = WithCancel(Background());
    std::latch go(2);
    std::thread canceller([&go, cancel = cancel] {
      go.arrive_and_wait();
      cancel();
    });
    std::thread finisher([&go, &lease] {
      go.arrive_and_wait();
      lease->Done();
    });
    q->ShutDownWithDrain(ctx);  // either way: drained, or ended by the cancel
    finisher.join();            // the lease ends before the queue goes
    q.reset();
    canceller.join();
  }
}

// ---- found by an audit of the core queues ----

// Past about 2^25 keys the index's probes started only in part of the table (absl takes
// the start from bits 7 and up, and only 32 bits were given): adds slowed about 200-fold.
// The stored hash is spread over 64 bits first.
TEST(SpreadHashTest, UsesBitsAboveThirtyTwo) {
  uint64_t high = 0;
  for (uint32_t h : {1u, 2u, 12345u, 0xFFFFFFFFu}) high |= internal::SpreadHash(h) >> 32;
  EXPECT_NE(high, 0u);
  // absl's tag is the low 7 bits: still a bijection of the hash's own.
  std::set<size_t> tags;
  for (uint32_t h = 0; h < 128; ++h) tags.insert(internal::SpreadHash(h) & 127);
  EXPECT_EQ(tags.size(), 128u);
}

// AddAll of a view (a temporary span over the caller's vector) copies; only a range
// that owns its items and is an rvalue is moved from. A span used to be moved out of.
TEST(QueueTest, AddAllOfAViewLeavesTheCallersItems) {
  StringQueue q;
  std::vector<std::string> mine = {"a-rather-long-key-0", "a-rather-long-key-1"};
  EXPECT_EQ(q.AddAll(std::span<std::string>(mine)), 2u);
  EXPECT_EQ(mine, (std::vector<std::string>{"a-rather-long-key-0", "a-rather-long-key-1"}));
  EXPECT_EQ(q.AddAll(std::vector<std::string>{"a-rather-long-key-2"}), 1u);  // owned: moved
  EXPECT_EQ(q.Len(), 3u);
}

// Any view passed as an rvalue keeps the caller's items, not only a borrowed one (a span):
// one that is not borrowed (as a filter or take_while over a vector) was moved out of,
// leaving the caller's strings empty.
TEST(QueueTest, AddAllOfAnyViewLeavesTheCallersItems) {
  StringQueue q;
  std::vector<std::string> mine = {"a-rather-long-key-0", "a-rather-long-key-1"};
  const std::vector<std::string> before = mine;
  EXPECT_EQ(q.AddAll(testing::RefView(mine)), 2u);
  EXPECT_EQ(mine, before);
  EXPECT_FALSE(q.Add(mine[0]));  // waiting already, as the same key
}

// A range passed as an rvalue is moved from only when it provably owns its items. A
// non-owning range that is neither a view nor borrowed (absl::Span in Debian's Abseil, a
// range of the user's own) was moved out of, leaving the caller's strings empty.
TEST(QueueTest, AddAllOfANonOwningRangeLeavesTheCallersItems) {
  using S = std::string;
  static_assert(internal::MovesItems<std::vector<S>>());
  static_assert(internal::MovesItems<std::array<S, 2>>());
  static_assert(internal::MovesItems<S[2]>());
  static_assert(internal::MovesItems<testing::KeyValues>());
  static_assert(internal::MovesItems<testing::KeyValues&>());
  static_assert(!internal::MovesItems<std::vector<S>&>());
  static_assert(!internal::MovesItems<std::span<S>>());
  static_assert(!internal::MovesItems<absl::Span<S>>());
  static_assert(!internal::MovesItems<testing::PlainRef<std::vector<S>>>());
  StringQueue q;
  std::vector<S> mine = {"a-rather-long-key-0", "a-rather-long-key-1"};
  const std::vector<S> before = mine;
  EXPECT_EQ(q.AddAll(absl::MakeSpan(mine)), 2u);
  EXPECT_EQ(mine, before);
  std::vector<S> more = {"a-rather-long-key-2"};
  EXPECT_EQ(q.AddAll(testing::PlainRef(more)), 1u);
  EXPECT_EQ(more, (std::vector<S>{"a-rather-long-key-2"}));
  EXPECT_EQ(q.AddAll(std::array<S, 1>{"a-rather-long-key-3"}), 1u);  // owned: moved
  EXPECT_EQ(q.Len(), 4u);
  EXPECT_FALSE(q.Add(mine[0]));  // waiting already, as the same key
}

// A range that yields values (a transform) is accepted, and its items moved in.
TEST(QueueTest, AddAllTakesARangeThatYieldsValues) {
  StringQueue q;
  EXPECT_EQ(q.AddAll(testing::KeyValues(3)), 3u);
  EXPECT_FALSE(q.Add("key-2"));
  EXPECT_EQ(q.Len(), 3u);
}

// The table keeps 32 bits of a key's hash: all of the hash counts, not just its low half.
// Keys whose std::hash differs only above bit 31 all had the table hash 0, so every add
// probed past all the others (quadratic).
TEST(KeyTableTest, EveryBitOfTheHashCounts) {
  using Table = internal::KeyTable<uint64_t, std::hash<uint64_t>, std::equal_to<uint64_t>>;
  // Distinct, and spread over the low bits too (absl's tag and probe start are made of
  // them): the top half of a 64-bit product left keys i << 52 with low bits of zero.
  for (int shift : {0, 32, 40, 48, 52, 54}) {
    std::set<uint32_t> hashes, tags;
    for (uint64_t i = 0; i < 1000; ++i) {
      const uint32_t h = Table::HashOf(i << shift);
      hashes.insert(h);
      tags.insert(h & 127);
    }
    EXPECT_EQ(hashes.size(), 1000u) << "keys i << " << shift;
    EXPECT_GT(tags.size(), 100u) << "keys i << " << shift;
  }
  // Keys whose two 32-bit halves are equal: about as few collisions as random keys (1.2
  // expected among 100,000); a fold that xor-ed the halves again collided thousands.
  std::set<uint32_t> halves;
  for (uint64_t x = 1; x <= 100000; ++x)
    halves.insert(Table::HashOf(x * ((uint64_t{1} << 32) + 1)));
  EXPECT_GE(halves.size(), 100000u - 10);
  Queue<uint64_t, std::hash<uint64_t>> q;
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_TRUE(q.Add(i << 32));
  EXPECT_EQ(q.Len(), 1000u);
}

// A queue destroyed while a lease is active fails loudly, in every build: the lease's
// Done would touch the freed queue (release builds went on to a use-after-free).
TEST(QueueDeathTest, DestroyedWithALeaseActiveFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto q = std::make_unique<StringQueue>();
        q->Add("a");
        auto lease = q->TryGet();
        q.reset();
      },
      "destroyed while a Lease is active");
}

using testing::FragileKey;  // its copy throws for the value 7

// A key whose constructor throws in the table gives its slot back: each such add used to
// take a slot for good (the table grew by one per failed add).
TEST(KeyTableTest, AKeyThatThrowsGivesItsSlotBack) {
  internal::KeyTable<FragileKey, absl::Hash<FragileKey>, std::equal_to<FragileKey>> table;
  const FragileKey bad(7), good(8);
  for (int i = 0; i < 5; ++i) EXPECT_THROW(table.Insert(bad, 0), std::runtime_error);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.Insert(good, 0), 0u);  // the first slot, not the sixth
  Queue<FragileKey> q;
  EXPECT_THROW(q.Add(bad), std::runtime_error);
  EXPECT_TRUE(q.Add(good));
  EXPECT_EQ(q.Len(), 1u);
}

// A hash that throws for one key.
struct ThrowOnSeven {
  size_t operator()(int v) const {
    if (v == 7) throw std::runtime_error("bad hash");
    return absl::Hash<int>{}(v);
  }
};

// An item that throws part-way through AddAll ends the batch; those before it stay
// added, and a sleeping Get is woken for them (it slept on until the next Add).
TEST(QueueTest, AddAllThatThrowsStillWakesForWhatItAdded) {
  Queue<int, ThrowOnSeven> q;
  std::atomic<int> got{-1};
  std::thread worker([&] {
    if (auto lease = q.Get()) got = **lease;
  });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; }));
  EXPECT_THROW(q.AddAll(std::vector<int>{1, 2, 7, 8}), std::runtime_error);
  EXPECT_TRUE(testing::Eventually([&] { return got.load() == 1; }))
      << "the sleeping Get was not woken";
  q.ShutDown();  // releases the worker should the check above have failed
  worker.join();
  EXPECT_EQ(q.Len(), 1u);  // 2 waits; 7 and 8 were never added
}

// Metric objects that throw on every call: the queue stays whole (the updates are
// dropped). OnAdd threw after the item was counted but before it was queued, so later
// adds merged into an item nobody could get, and drains hung.
class ThrowingMetric final : public CounterMetric,
                             public GaugeMetric,
                             public SettableGaugeMetric,
                             public HistogramMetric {
 public:
  void Inc() override { throw std::runtime_error("metric"); }
  void Dec() override { throw std::runtime_error("metric"); }
  void Set(double) override { throw std::runtime_error("metric"); }
  void Observe(double) override { throw std::runtime_error("metric"); }
};
TEST(QueueTest, ThrowingMetricsLeaveTheQueueWhole) {
  testing::UniformProvider<ThrowingMetric> provider;  // the refresh gauges throw too
  StringQueue q({.name = "throwing", .metrics = &provider});
  EXPECT_TRUE(q.Add("a"));
  EXPECT_FALSE(q.Add("a"));
  {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    EXPECT_TRUE(q.Add("a"));  // runs again after this lease
  }
  auto again = q.TryGet();
  ASSERT_TRUE(again.has_value());
  again->Done();
  EXPECT_TRUE(testing::ReturnsInTime([&q] { EXPECT_TRUE(q.ShutDownWithDrain()); }));
}

// During a drain a Get waits for a run owed by a lease in flight (the item was added
// again while it ran), also when that lease ends on another thread (a dispatcher that
// hands leases to a pool): it used to return nullopt, so the owed run found no Get and
// the drain waited for ever.
TEST(QueueTest, GetDuringADrainWaitsForARunOwedByALeaseInFlight) {
  StringQueue q;
  testing::ExpectGetWaitsForAnOwedRun(
      q, [](auto& queue) { return internal::QueuePeer::Draining(queue); });
}

// After a plain ShutDown a Get ends once nothing is ready (client-go's); only a drain
// makes it wait for a run owed by a lease in flight.
TEST(QueueTest, GetAfterAPlainShutDownDoesNotWaitForARunOwed) {
  StringQueue q;
  q.Add("x");
  auto in_flight = q.TryGet();
  ASSERT_TRUE(in_flight.has_value());
  EXPECT_TRUE(q.Add("x"));  // owed a run after this lease
  q.ShutDown();
  testing::AsyncGet getter([&] { return q.Get() ? "x" : "none"; });
  EXPECT_TRUE(getter.Await([&] { in_flight->Done(); }))
      << "after a plain ShutDown a Get waited for a run owed by a lease in flight";
  EXPECT_EQ(getter.outcome(), "none");
  in_flight->Done();
  auto owed = q.TryGet();  // the owed run is still handed out
  ASSERT_TRUE(owed.has_value());
  EXPECT_EQ(**owed, "x");
}

// During a drain a Get waits only for runs owed by leases in flight: with a lease in
// flight that owes none, it returns nullopt at once instead of waiting for the lease.
TEST(QueueTest, GetDuringADrainDoesNotWaitForALeaseThatOwesNoRun) {
  StringQueue q;
  q.Add("x");
  auto in_flight = q.TryGet();
  ASSERT_TRUE(in_flight.has_value());
  std::atomic<int> drained{-1};
  std::thread drainer([&] { drained = q.ShutDownWithDrain(); });
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Draining(q) > 0; }));
  testing::AsyncGet getter([&] { return q.Get() ? "x" : "none"; });
  EXPECT_TRUE(getter.Await([&] { in_flight->Done(); }))
      << "a Get during a drain waited for a lease that owes no run";
  EXPECT_EQ(getter.outcome(), "none");
  in_flight->Done();
  drainer.join();
  EXPECT_EQ(drained.load(), 1);
}

// AddAll wakes as many sleeping Gets as it queued items for (they were all counted as
// signalled; waking only one left the other asleep with an item ready).
TEST(QueueTest, AddAllWakesEverySleepingGetItHasItemsFor) {
  StringQueue q;
  const auto get = [&] { return q.Get() ? "item" : "none"; };
  testing::AsyncGet first(get), second(get);
  ASSERT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) >= 2; }));
  EXPECT_EQ(q.AddAll(std::vector<std::string>{"a", "b"}), 2u);
  EXPECT_TRUE(first.Await([&] { q.ShutDown(); })) << "a sleeping Get was not woken";
  EXPECT_TRUE(second.Await([&] { q.ShutDown(); })) << "a sleeping Get was not woken";
  EXPECT_EQ(first.outcome(), "item");
  EXPECT_EQ(second.outcome(), "item");
}

// The in-flight gauges are refreshed every 500 ms (kwq/metrics.h): not sooner, not later.
TEST_F(QueueMetricsTest, InFlightGaugesAreRefreshedEvery500Ms) {
  StringQueue& q = MakeQueue();
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  clock.Advance(absl::Milliseconds(500));  // the first refresh
  EXPECT_NEAR(rec.Get("unfinished"), 0.5, 1e-6);
  EXPECT_NEAR(rec.Get("longest"), 0.5, 1e-6);
  clock.Advance(absl::Milliseconds(499));
  EXPECT_NEAR(rec.Get("unfinished"), 0.5, 1e-6);  // not refreshed in between
  clock.Advance(absl::Milliseconds(1));
  EXPECT_NEAR(rec.Get("unfinished"), 1.0, 1e-6);
  EXPECT_NEAR(rec.Get("longest"), 1.0, 1e-6);
}

// Leases ending in any order: the one moved into an ended lease's place is still found.
TEST_F(QueueMetricsTest, InFlightGaugesFollowLeasesEndingInAnyOrder) {
  StringQueue& q = MakeQueue();
  for (const char* key : {"a", "b", "c", "d", "e"}) q.Add(key);
  auto a = q.TryGet();
  auto b = q.TryGet();
  auto c = q.TryGet();
  auto d = q.TryGet();
  b->Done();  // d takes b's place
  clock.Advance(absl::Seconds(1));
  auto e = q.TryGet();
  d->Done();
  clock.Advance(absl::Seconds(1));  // a 2 s, c 2 s, e 1 s
  EXPECT_NEAR(rec.Get("unfinished"), 5.0, 0.01);
  EXPECT_NEAR(rec.Get("longest"), 2.0, 0.01);
}

// An infinite span (a FakeClock at the infinite future) is not observed.
TEST_F(QueueMetricsTest, AnInfiniteSpanIsNotObserved) {
  StringQueue& q = MakeQueue(/*refresh_gauges=*/false);
  q.Add("a");
  clock.SetTime(absl::InfiniteFuture());
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(rec.Observations("latency"), 0);
}

// A provider may leave metrics out (nullptr): the unfinished gauge alone, without the
// longest-running gauge and the work histogram, is still refreshed and still exact.
TEST(QueueMetricsPartialTest, AProviderMayLeaveMetricsOut) {
  struct Partial : testing::RecordingProvider {
    using RecordingProvider::RecordingProvider;
    std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view) override {
      return nullptr;
    }
    std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
        std::string_view) override {
      return nullptr;
    }
  };
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  testing::RecordedMetrics rec;
  Partial provider(&rec);
  StringQueue q({.name = "q", .metrics = &provider, .clock = &clock, .timers = timers.get()});
  q.Add("a");
  {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    clock.Advance(absl::Seconds(1));
    EXPECT_NEAR(rec.Get("unfinished"), 1.0, 0.01) << "not refreshed without a longest gauge";
  }
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(rec.Get("unfinished"), 0) << "the ended lease still counted in flight";
}

// A refresh whose clock read throws leaves the in-flight gauges at their last values.
TEST(QueueMetricsClockTest, ARefreshWhoseClockThrowsKeepsTheLastValues) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &fake});  // only the recorder reads `clock`
  testing::RecordedMetrics rec;
  testing::RecordingProvider provider(&rec);
  StringQueue q({.name = "q", .metrics = &provider, .clock = &clock, .timers = timers.get()});
  q.Add("a");
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  fake.Advance(absl::Seconds(1));
  ASSERT_NEAR(rec.Get("unfinished"), 1.0, 0.01);
  clock.ThrowNext(1);
  fake.Advance(absl::Milliseconds(500));  // this refresh's clock read throws
  EXPECT_NEAR(rec.Get("unfinished"), 1.0, 0.01);
  EXPECT_NEAR(rec.Get("longest"), 1.0, 0.01);
  fake.Advance(absl::Milliseconds(500));
  EXPECT_NEAR(rec.Get("unfinished"), 2.0, 0.01);
}

// ---- found by a mutation audit of queue.h, key_table.h and lease.h ----

// Idle-key eviction skips a key in flight. The eviction hand starts at slot 0, the key
// held here; once enough idle keys pile up a worker's hand-out evicts. Erasing the
// in-flight key made the re-add below insert it afresh and hand it to a second worker.
TEST(QueueTest, EvictionKeepsAKeyThatIsInFlight) {
  Queue<int> q;
  q.Add(-1);
  auto held = q.TryGet();  // slot 0, in flight throughout
  ASSERT_TRUE(held.has_value());
  for (int i = 0; i < 5000; ++i) q.Add(i);  // > 4096 + 64 keys go idle below
  while (auto lease = q.TryGet()) {
  }
  EXPECT_TRUE(q.Add(-1));  // owed a run after `held`, not ready now
  EXPECT_FALSE(q.TryGet().has_value()) << "a key in flight was handed to a second worker";
  EXPECT_EQ(q.Depth(), 1u);
}

// A Done that queues its item again (it was added while in flight) wakes a sleeping Get.
TEST(QueueTest, ADoneThatQueuesItsItemAgainWakesASleepingGet) {
  StringQueue q;
  q.Add("x");
  auto in_flight = q.TryGet();
  ASSERT_TRUE(in_flight.has_value());
  EXPECT_TRUE(q.Add("x"));  // owed a run after this lease
  testing::AsyncGet getter([&] { return q.Get() ? "x" : "none"; });
  ASSERT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; }));
  in_flight->Done();
  EXPECT_TRUE(getter.Await([&] { q.ShutDown(); })) << "the Done queued x and woke no one";
  EXPECT_EQ(getter.outcome(), "x");
}

// A drain ended by its context no longer counts as in progress: a Get after it ends as
// after a plain ShutDown, without waiting for a run owed by a lease in flight.
TEST(QueueTest, AfterADrainEndedByItsContextGetDoesNotWaitForARunOwed) {
  StringQueue q;
  q.Add("x");
  auto in_flight = q.TryGet();
  ASSERT_TRUE(in_flight.has_value());
  EXPECT_TRUE(q.Add("x"));  // owed a run after this lease
  auto [ctx, cancel] = WithCancel(Background());
  cancel();
  EXPECT_FALSE(q.ShutDownWithDrain(ctx));
  testing::AsyncGet getter([&] { return q.Get() ? "x" : "none"; });
  EXPECT_TRUE(getter.Await([&] { in_flight->Done(); }))
      << "a Get waited for a run owed although no drain is in progress";
  EXPECT_EQ(getter.outcome(), "none");
}

// An AddAll that queues a single item wakes a sleeping Get.
TEST(QueueTest, AnAddAllOfOneItemWakesASleepingGet) {
  StringQueue q;
  testing::AsyncGet getter([&] { return q.Get() ? "item" : "none"; });
  ASSERT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Sleepers(q) > 0; }));
  EXPECT_EQ(q.AddAll(std::vector<std::string>{"a"}), 1u);
  EXPECT_TRUE(getter.Await([&] { q.ShutDown(); })) << "the sleeping Get was not woken";
  EXPECT_EQ(getter.outcome(), "item");
}

// Move-assigning a lease ends the lease it replaces (as Done): its item is no longer in
// flight, and a run owed by it is queued.
TEST(QueueTest, MoveAssigningALeaseEndsTheLeaseItReplaces) {
  StringQueue q;
  q.Add("a");
  q.Add("b");
  auto a = q.TryGet();
  auto b = q.TryGet();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_TRUE(q.Add("a"));  // owed a run after a's lease
  *a = std::move(*b);
  EXPECT_EQ(**a, "b");
  EXPECT_EQ(q.InFlight(), 1u);
  auto again = q.TryGet();
  ASSERT_TRUE(again.has_value()) << "the replaced lease did not end";
  EXPECT_EQ(**again, "a");
}

// Idle keys that no hand-out will evict (their leases ended after the last hand-out) are
// erased by the producer's later inserts, so the table stays bounded without workers.
TEST(QueueTest, InsertsEvictIdleKeysThatNoHandOutWillEvict) {
  Queue<int> q;
  constexpr int kKeys = 10000;
  std::vector<Queue<int>::Lease> leases;
  for (int i = 0; i < kKeys; ++i) q.Add(i);
  while (auto lease = q.TryGet()) leases.push_back(std::move(*lease));
  leases.clear();  // kKeys idle keys; no hand-out follows
  for (int i = kKeys; i < 2 * kKeys; ++i) q.Add(i);
  EXPECT_LT(internal::QueuePeer::SlotLimit(q), static_cast<uint32_t>(2 * kKeys - 1000));
}

// A run's writes are visible to the next run of its item on another worker: runs of an
// item are serialised (Done's release read-modify-write on the key's state, then the
// re-add's and the hand-out's). The Done is seen through a relaxed flag, which
// synchronises nothing by itself. Meaningful under TSan.
TEST(QueueTest, ARunsWritesAreVisibleToTheItemsNextRun) {
  StringQueue q;
  q.Add("k");
  int key_state = 0;              // the item's own data, written by each run
  std::atomic<bool> done{false};  // relaxed: no synchronisation of its own
  std::thread first([&] {
    auto lease = q.Get();
    ASSERT_TRUE(lease.has_value());
    key_state = 1;
    lease->Done();
    done.store(true, std::memory_order_relaxed);
  });
  while (!done.load(std::memory_order_relaxed)) std::this_thread::yield();
  EXPECT_TRUE(q.Add("k"));
  std::thread second([&] {
    auto lease = q.Get();
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(key_state, 1);
  });
  second.join();
  first.join();
}

}  // namespace
}  // namespace kwq
