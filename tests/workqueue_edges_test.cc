// Workqueue promises at the edges of activation, concurrency and the rescuer, which a
// mutation audit of src/workqueue found that workqueue_test.cc left unpinned: each test
// here failed on a mutant of the code that passed the rest of the suite. Built like
// tests/workqueue_test.cc (hook points from workqueue/internal.h).
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/workqueue.h"
#include "testing/eventually.h"
#include "testing/gate.h"
#include "testing/parked.h"
#include "testing/pause_points.h"
#include "testing/pool_workers.h"
#include "workqueue/internal.h"

namespace kwq {
namespace {

using internal::HookPoint;
using internal::WorkAccess;
using testing::Eventually;
using testing::PausePoints;

using testing::Gate;

using testing::Parked;

class WorkqueueEdgeTest : public ::testing::Test {
 protected:
  std::unique_ptr<WorkqueueRuntime> runtime_ = *WorkqueueRuntime::Create(
      {.idle_timeout = absl::Milliseconds(200), .cpu_intensive_threshold = absl::Seconds(30)});
  std::unique_ptr<Workqueue> Make(WorkqueueOptions o) {
    o.runtime = runtime_.get();
    if (o.name.empty()) o.name = "edge";
    auto wq = Workqueue::Create(std::move(o));
    EXPECT_TRUE(wq.ok()) << wq.status();
    return std::move(*wq);
  }
  int Cpu() const { return runtime_->topology().cpus()[0].cpu; }
};

// kOrdered: queueing order. A work queued while Thaw is about to activate the parked ones
// must not overtake them.
TEST_F(WorkqueueEdgeTest, OrderedWorkQueuedDuringThawDoesNotOvertakeParkedWorks) {
  auto wq = Make({.flags = kOrdered | kFreezable});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  std::mutex mu;
  std::vector<char> order;
  auto rec = [&](char c) {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(c);
  };
  Work a([&] { rec('A'); }), b([&] { rec('B'); }), c([&] { rec('C'); });
  wq->Freeze();
  ASSERT_TRUE(wq->Queue(&a));
  ASSERT_TRUE(wq->Queue(&b));
  ASSERT_TRUE(Parked(&a) && Parked(&b));
  PausePoints hooks;
  PausePoints::Pause& thawing = hooks.Arm(HookPoint::kActivateWillReserve, core);
  std::thread thawer([&] { wq->Thaw(); });
  ASSERT_TRUE(thawing.WaitPaused());  // not frozen any more, no slot reserved yet
  ASSERT_TRUE(wq->Queue(&c));         // queued third
  thawing.Resume();
  thawer.join();
  wq->Flush();
  EXPECT_EQ(std::string(order.begin(), order.end()), "ABC");
}

// Cancel of a work that is active in a pool's worklist frees its max_active slot and
// hands it to a parked work.
TEST_F(WorkqueueEdgeTest, CancelOfAnActiveWorkActivatesAParkedOne) {
  auto wq = Make({.max_active = 1});
  auto other = Make({.name = "blocker"});
  const int cpu = Cpu();
  Gate gate;
  std::atomic<bool> holding{false};
  Work blocker([&] {
    holding = true;
    gate.Wait();  // counted: the CPU pool runs nothing else
  });
  ASSERT_TRUE(other->QueueOn(cpu, &blocker));
  ASSERT_TRUE(Eventually([&] { return holding.load(); }));
  std::atomic<int> a_runs{0}, b_runs{0};
  Work a([&] { ++a_runs; }), b([&] { ++b_runs; });
  ASSERT_TRUE(wq->QueueOn(cpu, &a));  // takes the slot, waits in the pool's worklist
  ASSERT_TRUE(wq->QueueOn(cpu, &b));  // over max_active: parked
  ASSERT_FALSE(Parked(&a));
  ASSERT_TRUE(Parked(&b));
  EXPECT_TRUE(wq->Cancel(&a));
  EXPECT_FALSE(Parked(&b)) << "the cancelled work's slot was not handed to the parked one";
  gate.Open();
  EXPECT_TRUE(Eventually([&] { return b_runs.load() == 1; }));
  EXPECT_EQ(a_runs.load(), 0);
  wq->Cancel(&b);  // a mutant leaves it parked: let it go
  other->Flush();
}

// Drain flushes until the workqueue is empty: a chained instance queued after the
// drain's first flush began is waited for too.
TEST_F(WorkqueueEdgeTest, DrainWaitsForAnInstanceChainedAfterItsFirstFlush) {
  auto wq = Make({.flags = kUnbound});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  Workqueue* q = wq.get();
  Gate first, second;
  std::atomic<int> runs{0};
  Work* self = nullptr;
  Work work([&] {
    const int n = ++runs;
    if (n == 1) {
      first.Wait();
      EXPECT_TRUE(q->Queue(self));  // chained
    } else {
      second.Wait();
    }
  });
  self = &work;
  ASSERT_TRUE(wq->Queue(&work));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  PausePoints hooks;
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    wq->Drain();
    drained = true;
  });
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFlushAllWaits, core));  // color bumped, waiting
  first.Open();
  ASSERT_TRUE(Eventually([&] { return runs.load() == 2; }));  // the chained one runs
  EXPECT_FALSE(Eventually([&] { return drained.load(); }, absl::Milliseconds(300)))
      << "Drain returned while a chained instance was still running";
  second.Open();
  drainer.join();
  wq->Flush();  // a mutant's early return leaves the chained instance running
  EXPECT_TRUE(drained.load());
}

// ModDelayed returns whether the work was pending before the call, also with no delay.
TEST_F(WorkqueueEdgeTest, ModDelayedWithNoDelayOfAnIdleWorkReturnsFalse) {
  auto wq = Make({});
  std::atomic<int> runs{0};
  DelayedWork d([&] { ++runs; });
  EXPECT_FALSE(wq->ModDelayed(&d, absl::ZeroDuration()));
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_FALSE(wq->ModDelayed(&d, absl::Hours(1)));       // idle again: false
  EXPECT_TRUE(wq->ModDelayed(&d, absl::ZeroDuration()));  // was pending on its timer
  wq->Flush();
  EXPECT_EQ(runs.load(), 2);
}

// Drain refuses queueing from works of other workqueues (only chained queueing, from a
// work of the draining workqueue itself, is allowed).
TEST_F(WorkqueueEdgeTest, DrainRefusesQueueingFromAnotherWorkqueuesWork) {
  auto wq = Make({.flags = kUnbound});
  auto other = Make({.name = "other", .flags = kUnbound});
  Gate gate;
  Work holder([&] { gate.Wait(); });
  ASSERT_TRUE(wq->Queue(&holder));
  std::thread drainer([&] { wq->Drain(); });
  Work probe([] {});
  ASSERT_TRUE(Eventually([&] { return !probe.pending() && !wq->Queue(&probe); }));
  std::atomic<int> outsider_runs{0};
  Work outsider([&] { ++outsider_runs; });
  std::atomic<int> result{-1};
  Work from_other([&] { result = wq->Queue(&outsider) ? 1 : 0; });
  ASSERT_TRUE(other->Queue(&from_other));
  other->Flush();
  EXPECT_EQ(result.load(), 0) << "a work of another workqueue queued to a draining one";
  gate.Open();
  drainer.join();
  wq->Flush();
  EXPECT_EQ(outsider_runs.load(), result.load() == 1 ? 1 : 0);
}

// A CPU pool runs one counted worker at a time: a work that left its BlockingScope counts
// again, so a work queued behind waits for it even when the extra worker woken for the
// blocked work becomes free.
TEST_F(WorkqueueEdgeTest, AWorkLeavingItsBlockingScopeCountsAgain) {
  auto wq = Make({});
  const int cpu = Cpu();
  Gate gate_a, gate_a2, gate_b;
  std::atomic<bool> a_unblocked{false}, b_started{false}, c_ran{false}, a_done{false};
  Work a([&] {
    {
      BlockingScope blocking;
      gate_a.Wait();
    }
    a_unblocked = true;
    gate_a2.Wait();  // CPU work again, counted
    a_done = true;
  });
  Work b([&] {
    b_started = true;
    gate_b.Wait();
  });
  Work c([&] { c_ran = true; });
  ASSERT_TRUE(wq->QueueOn(cpu, &a));
  ASSERT_TRUE(wq->QueueOn(cpu, &b));
  ASSERT_TRUE(wq->QueueOn(cpu, &c));
  ASSERT_TRUE(Eventually([&] { return b_started.load(); }));  // woken for blocked `a`
  gate_a.Open();
  ASSERT_TRUE(Eventually([&] { return a_unblocked.load(); }));
  gate_b.Open();  // b ends; `a` counts again, so `c` must wait for it
  EXPECT_FALSE(Eventually([&] { return c_ran.load(); }, absl::Milliseconds(300)))
      << "two counted works ran at once on one CPU pool";
  gate_a2.Open();
  wq->Flush();
  EXPECT_TRUE(c_ran.load());
}

// A work activated by a completion goes behind the works already waiting in its pool's
// worklist (FIFO; runtime.cc Execute's comment).
TEST_F(WorkqueueEdgeTest, AnActivatedWorkQueuesBehindThePoolsWorklist) {
  auto wq = Make({.max_active = 1});
  auto other = Make({.name = "other"});
  const int cpu = Cpu();
  std::mutex mu;
  std::string order;
  auto rec = [&](char ch) {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(ch);
  };
  Gate gate;
  std::atomic<bool> a_running{false};
  Work a([&] {
    a_running = true;
    gate.Wait();
    rec('A');
  });
  Work b([&] { rec('B'); });
  Work x([&] { rec('X'); });
  ASSERT_TRUE(wq->QueueOn(cpu, &a));
  ASSERT_TRUE(Eventually([&] { return a_running.load(); }));
  ASSERT_TRUE(wq->QueueOn(cpu, &b));  // parked behind max_active
  ASSERT_TRUE(Parked(&b));
  ASSERT_TRUE(other->QueueOn(cpu, &x));  // waits in the pool's worklist
  gate.Open();
  wq->Flush();
  other->Flush();
  EXPECT_EQ(order, "AXB");
}

// Idle workers beyond two per pool exit; two stay.
TEST_F(WorkqueueEdgeTest, TwoIdleWorkersStay) {
  auto wq = Make({});
  const int cpu = Cpu();
  ASSERT_TRUE(testing::GrowPool(*wq, *runtime_, cpu, 5));
  auto workers = [&] { return testing::PoolWorkers(*runtime_, cpu); };
  ASSERT_TRUE(Eventually([&] { return workers() <= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // 3 idle timeouts: none exits
  EXPECT_EQ(workers(), 2);
}

// A stall is reported once, not at every watchdog pass while it lasts.
TEST(WorkqueueEdgeFakeTimeTest, AStallIsReportedOnce) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  std::atomic<bool> fail_spawn{true};
  std::atomic<int> reports{0};
  auto runtime = *WorkqueueRuntime::Create(
      {.clock = &clock,
       .timers = timers.get(),
       .stall_threshold = absl::Seconds(2),
       .stall_reporter = [&](const std::string&) { reports.fetch_add(1); },
       .fail_thread_creation = [&] { return fail_spawn.load(); }});
  auto wq = *Workqueue::Create({.name = "stall", .flags = kUnbound, .runtime = runtime.get()});
  std::atomic<bool> ran{false};
  Work work([&] { ran = true; });
  wq->Queue(&work);
  clock.Advance(absl::Milliseconds(10));
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(reports.load(), 1);
  for (int i = 0; i < 5; ++i) clock.Advance(absl::Milliseconds(10));  // five more passes
  EXPECT_EQ(reports.load(), 1);
  EXPECT_EQ(runtime->stalls(), 1u);
  fail_spawn = false;
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(Eventually([&] { return ran.load(); }));
  wq->Flush();
}

// A fail_thread_creation hook that throws refuses the worker: the exception does not
// leave Queue, which had inserted the work already, and the work runs once workers can
// be made (the watchdog's next pass).
TEST(WorkqueueEdgeFakeTimeTest, ASpawnHookThatThrowsRefusesTheWorker) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  std::atomic<bool> throwing{true};
  auto runtime = *WorkqueueRuntime::Create(
      {.clock = &clock, .timers = timers.get(), .fail_thread_creation = [&]() -> bool {
         if (throwing.load()) throw std::runtime_error("spawn hook");
         return false;
       }});
  auto wq = *Workqueue::Create({.name = "hook", .flags = kUnbound, .runtime = runtime.get()});
  std::atomic<bool> ran{false};
  Work work([&] { ran = true; });
  EXPECT_NO_THROW(wq->Queue(&work));
  throwing = false;
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(Eventually([&] { return ran.load(); }));
  wq->Flush();
}

// Flush(DelayedWork*) of a work on its timer queues it and is true even when the work
// finished before the wait began. The flusher runs SCHED_IDLE on the CPU of
// the bound pool, so the woken worker preempts it and finishes the work first.
TEST(WorkqueueEdgeFakeTimeTest, FlushOfADelayedWorkIsTrueEvenWhenItFinishedFirst) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  auto runtime = *WorkqueueRuntime::Create({.clock = &clock, .timers = timers.get()});
  auto wq = *Workqueue::Create({.name = "flushd", .runtime = runtime.get()});
  const int cpu = runtime->topology().cpus()[0].cpu;
  int falses = 0;
  std::thread flusher([&] {
    ASSERT_TRUE(BindCurrentThread({cpu}).ok());
    sched_param p{};
    ASSERT_EQ(pthread_setschedparam(pthread_self(), SCHED_IDLE, &p), 0);
    for (int i = 0; i < 50; ++i) {
      DelayedWork d([] {});
      ASSERT_TRUE(wq->QueueDelayed(&d, absl::Hours(1), cpu));
      if (!wq->Flush(&d)) ++falses;
      wq->CancelSync(&d);
    }
  });
  flusher.join();
  EXPECT_EQ(falses, 0);
}

// Non-reentrancy holds on the rescuer too: an instance queued while a worker of the pool
// runs the work goes to that worker, not to the rescuer that found it in the worklist.
TEST(WorkqueueEdgeRescuerTest, TheRescuerHandsAnInstanceOfARunningWorkToItsRunner) {
  std::atomic<bool> fail_spawn{false};
  auto runtime =
      *WorkqueueRuntime::Create({.cpu_intensive_threshold = absl::Seconds(30),
                                 .fail_thread_creation = [&] { return fail_spawn.load(); }});
  auto wq = *Workqueue::Create({.name = "reclaim", .flags = kMemReclaim, .runtime = runtime.get()});
  const int cpu = runtime->topology().cpus()[0].cpu;
  Gate gate1, gate2;
  std::atomic<int> runs{0}, inside{0}, max_inside{0};
  Work work([&] {
    const int in = ++inside;
    if (in > max_inside.load()) max_inside = in;
    if (++runs == 1) {
      gate1.Wait();            // counted: the requeued instance waits in the worklist
      BlockingScope blocking;  // the pool wants another worker, cannot make one: mayday
      gate2.Wait();
    }
    --inside;
  });
  ASSERT_TRUE(wq->QueueOn(cpu, &work));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  fail_spawn = true;
  ASSERT_TRUE(wq->QueueOn(cpu, &work));  // a second instance while the first runs
  gate1.Open();
  // The rescuer comes, finds the instance and must leave it to the running worker.
  EXPECT_FALSE(Eventually([&] { return runs.load() == 2; }, absl::Milliseconds(300)))
      << "the second instance started while the first ran";
  gate2.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(max_inside.load(), 1);
  fail_spawn = false;
}

// A worker the watchdog marked a CPU hog stays uncounted after a BlockingScope ends, so
// the pool's other works still run.
TEST(WorkqueueEdgeFakeTimeTest, AHogLeavingABlockingScopeStaysUncounted) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  auto runtime = *WorkqueueRuntime::Create({.clock = &clock, .timers = timers.get()});
  auto wq = *Workqueue::Create({.name = "hog", .runtime = runtime.get()});
  const int cpu = runtime->topology().cpus()[0].cpu;
  Gate gate1, gate2;
  std::atomic<bool> started{false}, past_scope{false}, y_ran{false};
  Work hog([&] {
    started = true;
    gate1.Wait();
    { BlockingScope blocking; }
    past_scope = true;
    gate2.Wait();
  });
  Work y([&] { y_ran = true; });
  ASSERT_TRUE(wq->QueueOn(cpu, &hog));
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  clock.Advance(absl::Milliseconds(10));  // first look
  clock.Advance(absl::Milliseconds(10));  // a hog now
  ASSERT_TRUE(Eventually([&] { return wq->stats().cpu_hogs == 1u; }));
  gate1.Open();
  ASSERT_TRUE(Eventually([&] { return past_scope.load(); }));
  ASSERT_TRUE(wq->QueueOn(cpu, &y));
  EXPECT_TRUE(Eventually([&] { return y_ran.load(); }, absl::Seconds(2)))
      << "the hog counted again after its BlockingScope";
  gate2.Open();
  wq->Flush();
  EXPECT_EQ(wq->stats().cpu_hogs, 1u);
}

// A Flush waiter is woken by its own work's instances going, and not by other works'.
// Every completion used to wake every waiter of the workqueue (each then took its lock
// again to find the instance was not its own): 32 threads flushing on one workqueue made
// each work cost 250 us instead of 20. Each round here, the short work finishes only
// once the main thread's Flush of it waits, so that wait ends by a signal (unless the
// worker was held up past the 1 ms poll) while the long work's flusher sleeps on.
TEST_F(WorkqueueEdgeTest, AFlushWaiterIsSignalledByItsOwnWorkOnly) {
  auto wq = Make({.flags = kUnbound});
  PausePoints hooks;
  Gate long_gate;
  Work long_work([&] {
    BlockingScope blocking;
    long_gate.Wait();
  });
  ASSERT_TRUE(wq->Queue(&long_work));
  std::thread long_flusher([&] { wq->Flush(&long_work); });
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFlushWorkWaits, &long_work));
  const int long_signals_before = hooks.Seen(HookPoint::kWaitSignalled, &long_work);
  std::atomic<int> target{0};
  Work short_work([&] {  // finishes once its flusher waits (bounded: a failure must not hang)
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (hooks.Seen(HookPoint::kFlushWorkWaits, &short_work) < target.load() &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
  });
  constexpr int kRounds = 50;
  for (int i = 0; i < kRounds; ++i) {
    target = hooks.Seen(HookPoint::kFlushWorkWaits, &short_work) + 1;
    ASSERT_TRUE(wq->Queue(&short_work));
    ASSERT_TRUE(wq->Flush(&short_work));
  }
  EXPECT_GE(hooks.Seen(HookPoint::kWaitSignalled, &short_work), 1)
      << "a Flush waiter was never woken by its own work, only by its poll";
  EXPECT_LT(hooks.Seen(HookPoint::kWaitSignalled, &long_work) - long_signals_before, kRounds / 5)
      << "the long work's flusher was woken by the short work's completions";
  long_gate.Open();
  long_flusher.join();
}

// A work that finishes only once `waits` was reached with `subject` more often than
// `*target` says (bounded, so that a failure does not hang).
Work FinishWhenWaited(PausePoints& hooks, HookPoint waits, const void* subject,
                      const std::atomic<int>* target) {
  return Work([&hooks, waits, subject, target] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (hooks.Seen(waits, subject) < target->load() &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
  });
}

// Flush() (FlushAll) and Freeze are woken by the instances they wait for going, not only
// by their poll.
TEST_F(WorkqueueEdgeTest, FlushAllAndFreezeAreSignalledByTheInstancesTheyWaitFor) {
  auto wq = Make({.flags = kUnbound | kFreezable});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  PausePoints hooks;
  std::atomic<int> target{0};
  constexpr int kRounds = 20;
  Work flushed = FinishWhenWaited(hooks, HookPoint::kFlushAllWaits, core, &target);
  for (int i = 0; i < kRounds; ++i) {
    target = hooks.Seen(HookPoint::kFlushAllWaits, core) + 1;
    ASSERT_TRUE(wq->Queue(&flushed));
    wq->Flush();
  }
  const int flush_signals = hooks.Seen(HookPoint::kWaitSignalled, core);
  EXPECT_GE(flush_signals, 1) << "Flush() was never woken by the instance it waited for";
  Work frozen = FinishWhenWaited(hooks, HookPoint::kFreezeWaits, core, &target);
  for (int i = 0; i < kRounds; ++i) {
    target = hooks.Seen(HookPoint::kFreezeWaits, core) + 1;
    ASSERT_TRUE(wq->Queue(&frozen));
    wq->Freeze();
    wq->Thaw();
  }
  EXPECT_GE(hooks.Seen(HookPoint::kWaitSignalled, core) - flush_signals, 1)
      << "Freeze was never woken by the instance it waited for";
  wq->Flush();
}

// A Flush() listed while the counter of the instance it waits for is between finding no
// waiter and counting is woken by that count, not by its poll: finding no waiter and
// counting are one compare-and-swap, which fails once a waiter has set the bucket's bit,
// and the counter then counts and signals under mu_ (kInstanceGoneWillLock; the flush
// holds mu_ from its check to its wait, so that signal reaches it). The counter used to
// read a waiter count and then count with a plain increment, so a flush listed in between
// slept to its next poll (1 ms). (Not asserted through kWaitSignalled: a poll that times
// out while the counter holds mu_ misses the signal and ends the wait all the same.)
TEST_F(WorkqueueEdgeTest, AFlushListedWhileItsInstanceIsBeingCountedIsSignalled) {
  auto wq = Make({.flags = kUnbound});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  PausePoints hooks;
  PausePoints::Pause& counting = hooks.Arm(HookPoint::kInstanceGoneWillCount, core);
  Work work([] {});
  ASSERT_TRUE(wq->Queue(&work));
  ASSERT_TRUE(counting.WaitPaused());  // ran; found no waiter and is about to count
  std::thread flusher([&] { wq->Flush(); });
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFlushAllWaits, core));
  counting.Resume();
  flusher.join();
  EXPECT_GE(hooks.Seen(HookPoint::kInstanceGoneWillLock, core), 1)
      << "the count slipped past the listed flush (which slept to its poll)";
}

// Two Flush(work) waiters list themselves for every color; when one leaves, the other
// still gets its work's completion signalled: the colors' waited-on bits stay set while
// any waiter is listed for them, so the counter takes mu_ (kInstanceGoneWillLock) and
// signals. Found by mutating the clearing to ignore the count.
TEST_F(WorkqueueEdgeTest, AWaiterStillListedIsSignalledAfterAnotherLeaves) {
  auto wq = Make({.flags = kUnbound});
  PausePoints hooks;
  Gate gate_a, gate_b;
  Work a([&] {
    BlockingScope blocking;
    gate_a.Wait();
  });
  Work b([&] {
    BlockingScope blocking;
    gate_b.Wait();
  });
  ASSERT_TRUE(wq->Queue(&a));
  ASSERT_TRUE(wq->Queue(&b));
  std::thread flush_a([&] { wq->Flush(&a); });
  std::thread flush_b([&] { wq->Flush(&b); });
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFlushWorkWaits, &a));
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFlushWorkWaits, &b));
  gate_b.Open();
  flush_b.join();  // its waiter left; a's is still listed
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  const int locked_before = hooks.Seen(HookPoint::kInstanceGoneWillLock, core);
  gate_a.Open();
  flush_a.join();
  EXPECT_GT(hooks.Seen(HookPoint::kInstanceGoneWillLock, core), locked_before)
      << "a's completion slipped past its listed waiter into the poll";
}

// Create refuses kOrdered with any max_active above 1 (the header's promise), not only
// far above it; 0 (the default) and 1 are accepted and run with max_active 1.
TEST_F(WorkqueueEdgeTest, OrderedRefusesMaxActiveTwo) {
  EXPECT_EQ(Workqueue::Create(
                {.name = "x", .flags = kOrdered, .max_active = 2, .runtime = runtime_.get()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Make({.flags = kOrdered, .max_active = 1})->max_active(), 1);
  EXPECT_EQ(Make({.flags = kOrdered})->max_active(), 1);
}

// Non-reentrancy when a completion hands its max_active slot to a parked instance of a
// work that another worker of the same pool is still running: that instance goes to the
// running worker (it runs after), never on the completing worker beside it.
TEST_F(WorkqueueEdgeTest, AnActivatedInstanceOfARunningWorkWaitsForItsRunner) {
  if (runtime_->topology().cpus().size() < 2) GTEST_SKIP() << "needs two CPUs";
  // One unbound pool over every CPU: room for two workers to run at once.
  auto wq = Make({.flags = kUnbound, .max_active = 2, .affinity_scope = AffinityScope::kSystem});
  Gate gate_a, gate_x;
  std::atomic<bool> a_started{false}, x_started{false};
  std::atomic<int> inside{0}, max_inside{0}, x_runs{0};
  Work a([&] {
    a_started = true;
    gate_a.Wait();
  });
  Work x([&] {
    const int n = ++inside;
    int m = max_inside.load();
    while (n > m && !max_inside.compare_exchange_weak(m, n)) {
    }
    if (++x_runs == 1) {
      x_started = true;
      gate_x.Wait();
    }
    --inside;
  });
  ASSERT_TRUE(wq->Queue(&a));
  ASSERT_TRUE(Eventually([&] { return a_started.load(); }));
  ASSERT_TRUE(wq->Queue(&x));
  ASSERT_TRUE(Eventually([&] { return x_started.load(); }));
  ASSERT_TRUE(wq->Queue(&x));  // both slots taken: parked
  ASSERT_TRUE(Parked(&x));
  gate_a.Open();  // a's completion activates x's second instance
  auto where = [&] { return static_cast<internal::WorkWhere>(WorkAccess::where(&x).load()); };
  // Either handed to the worker running x (right), or run at once beside it (wrong).
  ASSERT_TRUE(
      Eventually([&] { return x_runs.load() == 2 || where() == internal::WorkWhere::kScheduled; }));
  EXPECT_EQ(x_runs.load(), 1);
  gate_x.Open();
  wq->Flush();
  EXPECT_EQ(x_runs.load(), 2);
  EXPECT_EQ(max_inside.load(), 1);
}

// cancel_work_sync is true only when an instance was pending: false for a work never
// queued, for one that already ran, and for one only running (it still waits for it).
TEST_F(WorkqueueEdgeTest, CancelSyncOfAWorkNotPendingIsFalse) {
  auto wq = Make({});
  Gate gate;
  std::atomic<bool> started{false};
  std::atomic<int> runs{0};
  Work w([&] {
    started = true;
    gate.Wait();
    ++runs;
  });
  EXPECT_FALSE(wq->CancelSync(&w));  // never queued
  ASSERT_TRUE(wq->Queue(&w));
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  std::thread opener([&] { gate.Open(); });
  EXPECT_FALSE(wq->CancelSync(&w));  // running, not pending
  opener.join();
  EXPECT_EQ(runs.load(), 1);         // it waited for the run
  EXPECT_FALSE(wq->CancelSync(&w));  // finished
}

}  // namespace
}  // namespace kwq
