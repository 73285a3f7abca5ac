// Shutting down with work in flight and timers armed, and destroying objects in the
// orders the API allows. Each test must finish (no hang), leak nothing (LSan) and race
// nothing (TSan).

#include <atomic>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/context.h"
#include "kwq/delaying_queue.h"
#include "kwq/priority_queue.h"
#include "kwq/rate_limiting_queue.h"
#include "kwq/sharded_queue.h"
#include "kwq/timer.h"
#include "kwq/workqueue.h"
#include "testing/eventually.h"
#include "testing/thread_count.h"
#include "testing/thread_state.h"

namespace kwq {
namespace {

TEST(ShutdownTest, WorkqueueDestroyedWhileWorksRunAndTimersAreArmed) {
  auto runtime = *WorkqueueRuntime::Create({.idle_timeout = absl::Seconds(1)});
  std::atomic<int> ran{0};
  std::vector<std::unique_ptr<Work>> works;
  DelayedWork delayed([&] { ++ran; });
  {
    auto wq = *Workqueue::Create({.name = "dying", .flags = kUnbound, .runtime = runtime.get()});
    for (int i = 0; i < 64; ++i) {
      works.push_back(std::make_unique<Work>([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++ran;
      }));
      wq->Queue(works.back().get());
    }
    wq->QueueDelayed(&delayed, absl::Hours(1));
  }  // drains the 64 works, cancels the delayed one
  EXPECT_EQ(ran.load(), 64);
  EXPECT_FALSE(delayed.pending());
}

using kwq::testing::Eventually;
using kwq::testing::ThreadCount;

TEST(ShutdownTest, RuntimeDestroyedAfterItsWorkqueuesJoinsEveryWorker) {
  TimerService::Default();  // its thread lives for the process: start it before counting
  const int before = ThreadCount();
  for (int round = 0; round < 5; ++round) {
    auto runtime = *WorkqueueRuntime::Create({});
    auto bound = *Workqueue::Create({.name = "b", .runtime = runtime.get()});
    auto unbound = *Workqueue::Create({.name = "u", .flags = kUnbound, .runtime = runtime.get()});
    Work a([] {});
    Work b([] {});
    bound->Queue(&a);
    unbound->Queue(&b);
    bound->Flush();
    unbound->Flush();
    EXPECT_GT(ThreadCount(), before);  // the runtime started workers
    bound.reset();
    unbound.reset();
  }  // the runtime joins its workers each round
  // A joined thread leaves /proc/self/task a little after pthread_join returns.
  EXPECT_TRUE(Eventually([&] { return ThreadCount() == before; })) << ThreadCount();
}

TEST(ShutdownTest, TimerServiceDestroyedWithTimersArmedAndOneRunning) {
  std::latch running(1);
  std::atomic<bool> release{false}, finished{false};
  std::atomic<int> ran{0};
  std::thread releaser;
  {
    auto timers = *TimerService::Create();
    for (int i = 0; i < 100; ++i) timers->ScheduleAfter(absl::Hours(1), [&] { ++ran; });
    timers->Schedule(absl::InfinitePast(), [&] {
      running.count_down();
      while (!release.load()) std::this_thread::yield();
      finished = true;
    });
    running.wait();
    // The callback is released only once this thread sleeps in the destructor (or after
    // 2 s, also where /proc cannot be read): a destructor that did not wait would find it
    // unfinished.
    const pid_t destroyer = testing::CurrentTid();
    releaser = std::thread([&release, destroyer] {
      (void)testing::Eventually([&] { return testing::ThreadState(destroyer) == 'S'; },
                                absl::Seconds(2));
      release = true;
    });
  }  // waits for the running callback, drops the rest
  EXPECT_TRUE(finished.load()) << "the destructor returned before the running callback";
  releaser.join();
  EXPECT_EQ(ran.load(), 0);
}

TEST(ShutdownTest, QueuesDestroyedWithItemsQueuedAndWaiting) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  {
    RateLimitingQueue<int> q({.clock = &clock, .timers = timers.get()});
    for (int i = 0; i < 100; ++i) q.AddRateLimited(i);
    for (int i = 100; i < 200; ++i) q.Add(i);
  }
  {
    PriorityQueue<int>::Options o;
    o.clock = &clock;
    o.timers = timers.get();
    auto pq = *PriorityQueue<int>::Create(std::move(o));
    for (int i = 0; i < 100; ++i) pq->Add(i, {.priority = i % 3, .after = absl::Seconds(i % 2)});
  }
  {
    auto sq = *ShardedQueue<int>::Create(3);
    for (int i = 0; i < 100; ++i) sq->Add(i);
  }
  EXPECT_EQ(timers->Pending(), 0u);  // every queue cancelled its timer
}

TEST(ShutdownTest, ContextsOutliveTheirCancelFunctionsAndDeadlines) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  std::vector<Context> keep;
  {
    Context root = BackgroundWithTimers(timers.get());
    for (int i = 0; i < 50; ++i) {
      auto [ctx, cancel] = WithTimeout(root, absl::Seconds(1 + i % 3));
      keep.push_back(ctx);
    }  // cancel functions dropped: the contexts stay alive with their timers
  }
  clock.Advance(absl::Seconds(5));
  for (const Context& c : keep) EXPECT_EQ(c.Err().code(), absl::StatusCode::kDeadlineExceeded);
  keep.clear();
  EXPECT_EQ(timers->Pending(), 0u);
}

TEST(ShutdownTest, DrainWithWorkersStillGetting) {
  DelayingQueue<int> q;
  std::vector<std::thread> workers;
  std::atomic<int> seen{0};
  // Workers hold their first lease until the drain has begun (the queue shuts down first),
  // so the drain must wait for them and for the items still queued.
  std::atomic<bool> go{false};
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&] {
      while (auto lease = q.Get()) {
        while (!go.load()) std::this_thread::yield();
        ++seen;
      }
    });
  }
  for (int i = 0; i < 1000; ++i) q.Add(i);
  q.AddAfter(5000, absl::Hours(1));  // waiting items are dropped by the drain
  std::thread releaser([&] {
    while (!q.ShuttingDown()) std::this_thread::yield();
    go = true;
  });
  EXPECT_TRUE(q.ShutDownWithDrain());
  // A drain returns once every queued item has been handed out and its lease ended; each
  // worker counts its item before that lease ends.
  const int seen_at_return = seen.load();
  const size_t left_at_return = q.Len() + q.InFlight();
  releaser.join();
  for (auto& t : workers) t.join();
  EXPECT_EQ(seen_at_return, 1000);
  EXPECT_EQ(left_at_return, 0u);
  EXPECT_EQ(seen.load(), 1000);
}

}  // namespace
}  // namespace kwq
