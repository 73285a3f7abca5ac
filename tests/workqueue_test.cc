#include "kwq/workqueue.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/counting_clock.h"
#include "testing/eventually.h"
#include "testing/gate.h"
#include "testing/parked.h"
#include "testing/pause_points.h"
#include "testing/pool_workers.h"
#include "testing/two_socket_xml.h"
#include "workqueue/internal.h"

namespace kwq {
namespace {

using testing::Eventually;

using testing::Gate;

// A work held on a gate until the test opens it; `finished` once it ran to its end.
struct HeldWork {
  Gate gate;
  std::atomic<bool> finished{false};
  Work work{[this] {
    gate.Wait();
    finished = true;
  }};
};

class WorkqueueTest : public ::testing::Test {
 protected:
  std::unique_ptr<WorkqueueRuntime> runtime_ =
      *WorkqueueRuntime::Create({.idle_timeout = absl::Milliseconds(200),
                                 // No CPU-hog marking here (the FakeClock tests cover it).
                                 .cpu_intensive_threshold = absl::Seconds(30)});

  std::unique_ptr<Workqueue> Make(WorkqueueOptions o) {
    o.runtime = runtime_.get();
    if (o.name.empty()) o.name = "test";
    auto wq = Workqueue::Create(std::move(o));
    EXPECT_TRUE(wq.ok()) << wq.status();
    return std::move(*wq);
  }
};

TEST_F(WorkqueueTest, InvalidOptionsAreRejected) {
  EXPECT_EQ(Workqueue::Create({.name = ""}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Workqueue::Create({.name = "x", .max_active = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Workqueue::Create({.name = "x", .max_active = 5000}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Workqueue::Create({.name = "x", .min_active = -2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Workqueue::Create({.name = "x", .flags = kOrdered, .max_active = 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Flags beyond kMemReclaim name nothing (they were accepted and echoed by flags()).
  EXPECT_EQ(Workqueue::Create({.name = "x", .flags = kMemReclaim << 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Workqueue::Create({.name = "x", .flags = 0xFFFFFFC0u}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An out-of-range scope used to be accepted and crash the first Queue.
  EXPECT_EQ(Workqueue::Create({.name = "x", .affinity_scope = static_cast<AffinityScope>(99)})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkqueueRuntime::Create({.idle_timeout = absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      WorkqueueRuntime::Create({.cpu_intensive_threshold = absl::ZeroDuration()}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkqueueRuntime::Create({.stall_threshold = -absl::Seconds(1)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The bounds themselves are accepted.
  EXPECT_TRUE(Workqueue::Create({.name = "x", .max_active = 2048, .runtime = runtime_.get()}).ok());
  EXPECT_EQ(Workqueue::Create({.name = "x", .max_active = 2049}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// kHighPri works run on their own pools' workers (named kwq-worker-H, niced to -20 where
// allowed), bound or unbound, never on a normal pool's worker, as in the kernel.
TEST_F(WorkqueueTest, HighPriWorksRunOnHighPriPools) {
  auto thread_name = [] {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    return std::string(name);
  };
  for (uint32_t flags : {0u, static_cast<uint32_t>(kUnbound)}) {
    auto normal = Make({.flags = flags});
    auto high = Make({.flags = flags | kHighPri});
    std::string normal_name, high_name;
    Work on_normal([&] { normal_name = thread_name(); });
    Work on_high([&] { high_name = thread_name(); });
    ASSERT_TRUE(normal->Queue(&on_normal));
    ASSERT_TRUE(high->Queue(&on_high));
    normal->Flush();
    high->Flush();
    EXPECT_EQ(normal_name, "kwq-worker") << "flags " << flags;
    EXPECT_EQ(high_name, "kwq-worker-H") << "flags " << flags;
  }
}

TEST_F(WorkqueueTest, FlagsAndMaxActiveInForce) {
  auto ordered = Make({.flags = kOrdered});
  EXPECT_NE(ordered->flags() & kUnbound, 0u);  // kOrdered adds kUnbound
  EXPECT_EQ(ordered->max_active(), 1);
  EXPECT_EQ(Make({})->max_active(), 256);  // the default
  EXPECT_EQ(Make({.max_active = 3})->max_active(), 3);
}

// Destroying a pending Work fails a check with a message (its pool still links it).
TEST(WorkDeathTest, DestroyingAPendingWorkFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto wq = *Workqueue::Create({.name = "frozen", .flags = kUnbound | kFreezable});
        wq->Freeze();
        auto work = std::make_unique<Work>([] {});
        (void)wq->Queue(work.get());  // parked: the workqueue is frozen
        work.reset();
      },
      "destroyed while pending or running");
}

// So does destroying a running one (its worker still touches it when the function ends).
TEST(WorkDeathTest, DestroyingARunningWorkFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto wq = *Workqueue::Create({.name = "running", .flags = kUnbound});
        std::atomic<bool> entered{false};
        auto work = std::make_unique<Work>([&entered] {
          entered = true;
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        });
        (void)wq->Queue(work.get());
        while (!entered.load()) std::this_thread::yield();
        work.reset();
      },
      "destroyed while pending or running");
}

TEST(SystemWorkqueueTest, FlagsMatchTheirKernelNamesakes) {
  EXPECT_EQ(SystemWq().flags() & (kUnbound | kHighPri), 0u);
  EXPECT_NE(SystemHighPriWq().flags() & kHighPri, 0u);
  EXPECT_NE(SystemUnboundWq().flags() & kUnbound, 0u);
}

TEST_F(WorkqueueTest, QueueRunsWorkAndDedupsWhilePending) {
  const int cpu = runtime_->topology().cpus().front().cpu;
  for (uint32_t flags : {0u, static_cast<uint32_t>(kUnbound), static_cast<uint32_t>(kOrdered),
                         static_cast<uint32_t>(kHighPri)}) {
    auto wq = Make({.flags = flags, .max_active = 1});
    Gate gate;
    std::atomic<int> runs{0};
    Work blocker([&] { gate.Wait(); });
    Work work([&] { ++runs; });
    // `blocker` takes the one active slot of the CPU's pool workqueue, so `work` waits
    // there, pending.
    ASSERT_TRUE(wq->QueueOn(cpu, &blocker));
    EXPECT_TRUE(wq->QueueOn(cpu, &work)) << "flags " << flags;
    EXPECT_TRUE(work.pending());
    EXPECT_FALSE(wq->QueueOn(cpu, &work)) << "flags " << flags;  // already pending
    EXPECT_FALSE(wq->Queue(&work)) << "flags " << flags;
    gate.Open();
    wq->Flush();
    EXPECT_FALSE(work.pending());
    EXPECT_EQ(runs.load(), 1) << "flags " << flags;
    EXPECT_EQ(wq->stats().completed, 2u);
  }
}

TEST_F(WorkqueueTest, QueueDuringRunRunsAgainAfter) {
  auto wq = Make({});
  std::atomic<int> runs{0};
  Work* self = nullptr;
  Workqueue* q = wq.get();
  Work work([&] {
    if (runs.fetch_add(1) == 0) {
      EXPECT_FALSE(self->pending());  // cleared before the function runs
      EXPECT_TRUE(q->Queue(self));    // so queueing now succeeds
    }
  });
  self = &work;
  wq->Queue(&work);
  ASSERT_TRUE(Eventually([&] { return runs.load() == 2 && !work.pending(); }));
  wq->Flush(&work);
}

TEST_F(WorkqueueTest, StoresBeforeQueueAreVisible) {
  auto wq = Make({.flags = kUnbound});
  int plain = 0;  // not atomic: TSan checks the ordering
  int seen = -1;
  Work work([&] { seen = plain; });
  plain = 42;
  wq->Queue(&work);
  wq->Flush(&work);
  EXPECT_EQ(seen, 42);
}

TEST_F(WorkqueueTest, NeverRunsOnTwoWorkersAtOnce) {
  auto wq = Make({.flags = kUnbound, .affinity_scope = AffinityScope::kCpu});
  std::atomic<int> busy{0};
  std::atomic<bool> overlap{false};
  std::atomic<int> runs{0};
  Work work([&] {
    if (busy.fetch_add(1) != 0) overlap = true;
    for (int i = 0; i < 200; ++i) std::this_thread::yield();
    busy.fetch_sub(1);
    ++runs;
  });
  const int ncpu = runtime_->topology().num_cpus();
  std::vector<std::thread> queuers;
  for (int t = 0; t < 4; ++t) {
    queuers.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        wq->QueueOn(runtime_->topology().cpus()[(i + t) % ncpu].cpu, &work);
      }
    });
  }
  for (auto& t : queuers) t.join();
  wq->Flush();
  EXPECT_FALSE(overlap.load());
  EXPECT_GT(runs.load(), 0);
}

// The deterministic half of the above: a work queued on another pod while it runs goes
// to the pool where it runs (as the kernel's find_worker_executing_work), so it cannot
// start beside itself; it runs there after the running instance.
TEST_F(WorkqueueTest, RequeuedWhileRunningGoesToThePoolRunningIt) {
  const auto& cpus = runtime_->topology().cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  auto wq = Make({.flags = kUnbound, .affinity_scope = AffinityScope::kCpu});
  Gate gate;
  std::atomic<int> runs{0};
  Work work([&] {
    if (runs.fetch_add(1) == 0) gate.Wait();  // the first instance waits
  });
  ASSERT_TRUE(wq->QueueOn(cpus.front().cpu, &work));
  // Inside the function: its pool is recorded and its pending bit cleared by then.
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  internal::WorkerPool* const running = internal::WorkAccess::running_pool(&work).load();
  ASSERT_TRUE(wq->QueueOn(cpus.back().cpu, &work));  // another pod's pool
  internal::PoolWorkqueue* const pwq = internal::WorkAccess::pwq(&work).load();
  ASSERT_NE(pwq, nullptr);
  EXPECT_EQ(pwq->pool, running);
  EXPECT_EQ(runs.load(), 1);
  gate.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 2);
}

TEST_F(WorkqueueTest, BoundWorkRunsOnItsCpu) {
  auto wq = Make({});
  for (const CpuInfo& c : runtime_->topology().cpus()) {
    int ran_on = -2;
    Work work([&] { ran_on = CurrentCpu(); });
    ASSERT_TRUE(wq->QueueOn(c.cpu, &work));
    wq->Flush(&work);
    EXPECT_EQ(ran_on, c.cpu);
  }
  EXPECT_EQ(runtime_->bind_failures(), 0u);
}

// Queue on a bound workqueue uses the calling thread's CPU pool.
TEST_F(WorkqueueTest, QueueUsesTheCallersCpu) {
  auto wq = Make({});
  const int cpu = runtime_->topology().cpus().back().cpu;
  int ran_on = -2;
  Work work([&] { ran_on = CurrentCpu(); });
  std::thread caller([&] {
    ASSERT_TRUE(BindCurrentThread({cpu}).ok());
    ASSERT_TRUE(wq->Queue(&work));
  });
  caller.join();
  wq->Flush(&work);
  EXPECT_EQ(ran_on, cpu);
}

// queue_work_node: the caller's CPU when it is on that node, not the node's first CPU.
TEST_F(WorkqueueTest, QueueOnNodeUsesTheCallersCpuWhenItIsOnThatNode) {
  const auto& cpus = runtime_->topology().cpus();
  const CpuInfo last = cpus.back();
  int first_of_node = -1;
  for (const CpuInfo& c : cpus) {
    if (c.numa_node == last.numa_node) {
      first_of_node = c.cpu;
      break;
    }
  }
  if (first_of_node == last.cpu) GTEST_SKIP() << "needs two CPUs on one node";
  auto wq = Make({});
  std::atomic<int> ran_on{-2};
  Work work([&] { ran_on = CurrentCpu(); });
  std::thread caller([&] {
    ASSERT_TRUE(BindCurrentThread({last.cpu}).ok());
    ASSERT_TRUE(wq->QueueOnNode(last.numa_node, &work));
  });
  caller.join();
  wq->Flush(&work);
  EXPECT_EQ(ran_on.load(), last.cpu);
}

TEST_F(WorkqueueTest, StrictUnboundWorkRunsInsideItsPod) {
  auto wq =
      Make({.flags = kUnbound, .affinity_scope = AffinityScope::kCpu, .affinity_strict = true});
  for (const CpuInfo& c : runtime_->topology().cpus()) {
    int ran_on = -2;
    Work work([&] { ran_on = CurrentCpu(); });
    wq->QueueOn(c.cpu, &work);
    wq->Flush(&work);
    EXPECT_EQ(ran_on, c.cpu);  // the cpu scope's pod is that one CPU
  }
}

TEST_F(WorkqueueTest, NonStrictWorkerIsRepatriatedIntoItsPod) {
  const auto& cpus = runtime_->topology().cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  const int home = cpus.front().cpu, away = cpus.back().cpu;
  auto wq = Make({.flags = kUnbound, .affinity_scope = AffinityScope::kCpu});  // non-strict
  int ran_on = -1;
  Work wander([&] { ASSERT_TRUE(BindCurrentThread({away}).ok()); });  // leaves the pod
  Work check([&] { ran_on = CurrentCpu(); });
  // The worker's mask is widened again right after it is moved home, so the scheduler may
  // move it once more before `check` reads its CPU: it must have started at home at least
  // once in three tries, and been repatriated every time.
  bool started_home = false;
  for (int attempt = 0; attempt < 3 && !started_home; ++attempt) {
    wq->QueueOn(home, &wander);
    wq->Flush(&wander);
    // A new worker may itself have started outside the pod (and been moved): count from here.
    const uint64_t before = wq->stats().repatriations;
    wq->QueueOn(home, &check);
    wq->Flush(&check);
    EXPECT_EQ(wq->stats().repatriations, before + 1);
    started_home = ran_on == home;
  }
  EXPECT_TRUE(started_home) << "last ran on " << ran_on << ", home " << home;
}

TEST_F(WorkqueueTest, OrderedRunsOneAtATimeInQueueingOrder) {
  auto wq = Make({.flags = kOrdered});
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> busy{0};
  std::atomic<bool> overlap{false};
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 200; ++i) {
    works.push_back(std::make_unique<Work>([&, i] {
      if (busy.fetch_add(1) != 0) overlap = true;
      {
        std::lock_guard<std::mutex> l(mu);
        order.push_back(i);
      }
      busy.fetch_sub(1);
    }));
  }
  for (int i = 0; i < 200; ++i)
    wq->QueueOn(
        runtime_->topology().cpus()[i % 2 == 0 ? 0 : runtime_->topology().num_cpus() - 1].cpu,
        works[i].get());
  wq->Flush();
  EXPECT_FALSE(overlap.load());
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
}

// Works held on a gate until all that the limits allow run at once: exactly `expected`
// of them must be running, and no more start meanwhile. Returns the peak seen. With
// `blocking` they tell the pool they sleep (BlockingScope), so the limit, not the CPU,
// must stop the others; without, they count as CPU work while they run.
int HeldConcurrency(Workqueue* wq, int works_count, int expected,
                    const std::function<void(Work*, int)>& queue, bool blocking = true) {
  Gate gate;
  std::atomic<int> busy{0}, peak{0}, done{0};
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < works_count; ++i) {
    works.push_back(std::make_unique<Work>([&] {
      std::optional<BlockingScope> scope;
      if (blocking) scope.emplace();
      const int now = busy.fetch_add(1) + 1;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      gate.Wait();
      busy.fetch_sub(1);
      ++done;
    }));
  }
  for (int i = 0; i < works_count; ++i) queue(works[i].get(), i);
  EXPECT_TRUE(Eventually([&] { return busy.load() == expected; }))
      << "busy " << busy.load() << ", expected " << expected;
  // A negative check: more would start within this time if the limits allowed them.
  EXPECT_FALSE(Eventually([&] { return busy.load() > expected; }, absl::Milliseconds(50)));
  gate.Open();
  wq->Flush();
  EXPECT_EQ(done.load(), works_count);
  return peak.load();
}

TEST_F(WorkqueueTest, MaxActiveLimitsConcurrency) {
  auto wq = Make({.flags = kUnbound, .max_active = 2});
  EXPECT_EQ(HeldConcurrency(wq.get(), 12, 2, [&](Work* w, int) { wq->Queue(w); }), 2);
}

// 4 CPUs on 2 NUMA nodes (synthetic: pinning fails and workers run unpinned).
std::shared_ptr<const Topology> TwoNodes() {
  return *Topology::FromSynthetic("pack:1 numa:2 core:2 pu:1");
}

int PeakConcurrency(WorkqueueRuntime* rt, int max_active, int min_active, int expected) {
  auto wq = *Workqueue::Create({.name = "numa",
                                .flags = kUnbound,
                                .max_active = max_active,
                                .min_active = min_active,
                                .affinity_scope = AffinityScope::kNuma,
                                .runtime = rt});
  return HeldConcurrency(wq.get(), 16, expected,
                         [&](Work* w, int i) { wq->QueueOnNode(i % 2, w); });
}

// An unbound pool runs one counted worker per CPU it may run on: a strict pool's pod
// has 2 CPUs, a non-strict pool's workers may run on all 8. 8 CPUs in 4 cache pods of 2
// (synthetic).
TEST_F(WorkqueueTest, UnboundPoolRunsOneWorkPerCpuItMayRunOn) {
  auto rt =
      *WorkqueueRuntime::Create({.topology = *Topology::FromSynthetic("pack:1 l3:4 core:2 pu:1"),
                                 .cpu_intensive_threshold = absl::Seconds(30)});
  for (bool strict : {true, false}) {
    auto wq = *Workqueue::Create({.name = "pod",
                                  .flags = kUnbound,
                                  .affinity_scope = AffinityScope::kCache,
                                  .affinity_strict = strict,
                                  .runtime = rt.get()});
    const int expected = strict ? 2 : 8;  // all queued to CPU 0's pod {0, 1}
    EXPECT_EQ(HeldConcurrency(
                  wq.get(), 8, expected, [&](Work* w, int) { wq->QueueOn(0, w); },
                  /*blocking=*/false),
              expected)
        << "strict=" << strict;
  }
}

// The smt and system scopes: a strict pool's pod is CPU 0's core (its 2 SMT siblings)
// and the whole machine (4 CPUs); CPU works all queued to CPU 0 run that many at once.
// 2 cores of 2 hyper-threads (synthetic).
TEST_F(WorkqueueTest, SmtAndSystemScopesBoundAStrictPoolsConcurrency) {
  auto rt = *WorkqueueRuntime::Create({.topology = *Topology::FromSynthetic("pack:1 core:2 pu:2"),
                                       .cpu_intensive_threshold = absl::Seconds(30)});
  for (const std::pair<AffinityScope, int>& c :
       {std::pair{AffinityScope::kSmt, 2}, std::pair{AffinityScope::kSystem, 4}}) {
    auto wq = *Workqueue::Create({.name = "scope",
                                  .flags = kUnbound,
                                  .affinity_scope = c.first,
                                  .affinity_strict = true,
                                  .runtime = rt.get()});
    EXPECT_EQ(HeldConcurrency(
                  wq.get(), 6, c.second, [&](Work* w, int) { wq->QueueOn(0, w); },
                  /*blocking=*/false),
              c.second);
  }
}

TEST_F(WorkqueueTest, UnboundMaxActiveIsSplitPerNodeWithMinActiveFloor) {
  auto rt = *WorkqueueRuntime::Create({.topology = TwoNodes()});
  EXPECT_EQ(PeakConcurrency(rt.get(), 2, 1, 2), 2);  // 1 per node
  EXPECT_EQ(PeakConcurrency(rt.get(), 2, 2, 4), 4);  // the floor lifts each node to 2
  // Node 1's workers pin to CPUs 2 and 3, which fail where this process may not run on
  // them (a 2-CPU machine, or a cpuset without them); elsewhere they are pinned.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (!CPU_ISSET(2, &allowed) || !CPU_ISSET(3, &allowed)) {
    EXPECT_GT(rt->bind_failures(), 0u);
  }
}

// Each node's share rounds up, as in Linux 6.9+: 5 over three 1-CPU nodes is 2 each (it
// rounded down to 1 each, 3 in all, well under max_active).
TEST_F(WorkqueueTest, UnboundNodeSharesRoundUp) {
  auto rt = *WorkqueueRuntime::Create({.topology = *Topology::FromSynthetic("numa:3 core:1 pu:1")});
  auto wq = *Workqueue::Create({.name = "thirds",
                                .flags = kUnbound,
                                .max_active = 5,
                                .min_active = 1,
                                .affinity_scope = AffinityScope::kNuma,
                                .runtime = rt.get()});
  EXPECT_EQ(HeldConcurrency(wq.get(), 9, 6, [&](Work* w, int i) { wq->QueueOnNode(i % 3, w); }), 6);
}

// A pod whose CPUs span two nodes (the cache scope with no L3: one pod per package) is
// limited by max_active alone, as the kernel's NUMA_NO_NODE pods are; it was charged to
// its first CPU's node and capped at that node's half.
TEST_F(WorkqueueTest, APodSpanningNodesGetsAllOfMaxActive) {
  auto rt = *WorkqueueRuntime::Create({.topology = TwoNodes()});
  auto wq = *Workqueue::Create({.name = "span",
                                .flags = kUnbound,
                                .max_active = 4,
                                .min_active = 1,
                                .affinity_scope = AffinityScope::kCache,
                                .runtime = rt.get()});
  EXPECT_EQ(HeldConcurrency(wq.get(), 8, 4, [&](Work* w, int) { wq->QueueOn(0, w); }), 4);
}

// Per-CPU tables are indexed by CPU id: a huge id is refused, not an abort.
TEST(WorkqueueRuntimeTest, HugeCpuIdsAreRefused) {
  for (const char* synthetic : {"pack:1 pu:2(indexes=0,1000000)", "pack:1 pu:2(indexes=0,65536)"}) {
    auto topology = Topology::FromSynthetic(synthetic);
    ASSERT_TRUE(topology.ok()) << topology.status();
    EXPECT_EQ(WorkqueueRuntime::Create({.topology = *topology}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << synthetic;
  }
  EXPECT_TRUE(WorkqueueRuntime::Create(
                  {.topology = *Topology::FromSynthetic("pack:1 pu:2(indexes=0,65535)")})
                  .ok());
}

// A worker that could not be pinned is not repatriated before each work: that failed and
// counted a bind failure per work (101 after 100 works with one worker). 16 CPUs in two
// cache pods (synthetic: on a machine with fewer, the pod {8..15} cannot be pinned).
TEST(WorkqueueRuntimeTest, BindFailuresCountWorkersNotWorks) {
  auto rt =
      *WorkqueueRuntime::Create({.topology = *Topology::FromSynthetic("pack:1 l3:2 core:8 pu:1"),
                                 .cpu_intensive_threshold = absl::Seconds(30)});
  auto wq = *Workqueue::Create({.name = "far", .flags = kUnbound, .runtime = rt.get()});
  Work w([] {});
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(wq->QueueOn(15, &w));
    wq->Flush();
  }
  EXPECT_LE(rt->bind_failures(), 16u);  // at most one per worker
}

// A worker is created by whichever thread first needs it, and a new thread inherits its
// creator's nice value and CPU mask: a high-priority worker that queues to a normal pool
// with no worker yet made that pool's worker nice -20 for good, and a pinned thread that
// queued first pinned an unpinned pool's worker to its own CPU.
TEST_F(WorkqueueTest, WorkersDoNotInheritTheirCreatorsNiceValue) {
  auto hi = Make({.name = "hi", .flags = kHighPri | kUnbound});
  auto normal = Make({.name = "normal", .flags = kUnbound});
  std::atomic<int> hi_nice{100}, normal_nice{100};
  auto nice_here = [] {
    errno = 0;
    return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  };
  Work n([&] { normal_nice = nice_here(); });
  Work h([&] {
    hi_nice = nice_here();
    EXPECT_TRUE(normal->Queue(&n));  // the normal pool's first worker is made from here
  });
  ASSERT_TRUE(hi->Queue(&h));
  hi->Flush();
  normal->Flush();
  if (hi_nice.load() != -20) GTEST_SKIP() << "cannot raise a thread's priority here";
  errno = 0;
  const int process_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(getpid()));
  EXPECT_EQ(normal_nice.load(), process_nice);  // the process's, not its creator's -20
}

TEST(WorkqueueRuntimeTest, UnpinnedWorkersDoNotInheritTheirCreatorsCpus) {
  auto topology = Topology::DetectForProcess();
  ASSERT_TRUE(topology.ok()) << topology.status();
  if ((*topology)->num_cpus() < 2) GTEST_SKIP() << "needs two CPUs";
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  std::atomic<int> worker_cpus{-1};
  {
    auto rt = *WorkqueueRuntime::Create({.topology = *topology, .bind_workers = false});
    auto wq = *Workqueue::Create({.name = "unpinned", .flags = kUnbound, .runtime = rt.get()});
    Work w([&] {
      cpu_set_t set;
      if (sched_getaffinity(0, sizeof(set), &set) == 0) worker_cpus = CPU_COUNT(&set);
    });
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET((*topology)->cpus()[0].cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // this thread makes the worker
    EXPECT_TRUE(wq->Queue(&w));
    EXPECT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
    wq->Flush();
  }
  EXPECT_EQ(worker_cpus.load(), (*topology)->num_cpus());
}

// max_active is split over NUMA nodes by their CPU counts: 7 over a 4-CPU and a 3-CPU node
// gives 4 and 3 (min_active 1 lifts neither).
TEST_F(WorkqueueTest, UnboundMaxActiveIsSplitByNodeCpuCounts) {
  auto rt = *WorkqueueRuntime::Create({.topology = *Topology::FromXml(testing::kTwoSocketXml)});
  auto wq = *Workqueue::Create({.name = "asym",
                                .flags = kUnbound,
                                .max_active = 7,
                                .min_active = 1,
                                .affinity_scope = AffinityScope::kNuma,
                                .runtime = rt.get()});
  EXPECT_EQ(HeldConcurrency(wq.get(), 10, 4, [&](Work* w, int) { wq->QueueOnNode(0, w); }), 4);
  EXPECT_EQ(HeldConcurrency(wq.get(), 10, 3, [&](Work* w, int) { wq->QueueOnNode(1, w); }), 3);
}

TEST_F(WorkqueueTest, CancelRemovesPendingWork) {
  auto wq = Make({.flags = kOrdered});
  Gate gate;
  std::atomic<int> runs{0};
  Work blocker([&] { gate.Wait(); });
  Work victim([&] { ++runs; });
  wq->Queue(&blocker);
  wq->Queue(&victim);
  EXPECT_TRUE(wq->Cancel(&victim));
  EXPECT_FALSE(wq->Cancel(&victim));
  EXPECT_FALSE(victim.pending());
  gate.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);
}

// Works over max_active park in two lists (producers append to one, workers pop from the
// other and take the first one over whole when theirs is empty). Cancel finds a parked work
// at the head, middle or tail of either list, and the rest still run in queueing order.
TEST_F(WorkqueueTest, CancelParkedWorksInBothParkingLists) {
  auto wq = Make({.flags = kOrdered});
  Gate gate0, gate1;
  std::atomic<bool> w1_started{false};
  std::mutex mu;
  std::vector<int> order;
  auto record = [&](int i) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(i);
  };
  Work w0([&] { gate0.Wait(); });
  Work w1([&] {
    record(1);
    w1_started = true;
    gate1.Wait();
  });
  std::vector<std::unique_ptr<Work>> w;  // w[2..8]
  for (int i = 0; i < 9; ++i) w.push_back(std::make_unique<Work>([&record, i] { record(i); }));
  wq->Queue(&w0);
  wq->Queue(&w1);
  for (int i = 2; i <= 4; ++i) wq->Queue(w[i].get());  // parked behind w0 and w1
  gate0.Open();  // w0 ends: the workers take the parked list over and start w1
  ASSERT_TRUE(Eventually([&] { return w1_started.load(); }));
  for (int i = 5; i <= 7; ++i) wq->Queue(w[i].get());  // the producers' list again
  EXPECT_TRUE(wq->Cancel(w[3].get()));                 // middle of the taken-over list
  EXPECT_TRUE(wq->Cancel(w[4].get()));                 // its tail
  EXPECT_TRUE(wq->Cancel(w[6].get()));                 // middle of the producers' list
  EXPECT_TRUE(wq->Cancel(w[7].get()));                 // its tail
  EXPECT_FALSE(wq->Cancel(w[7].get()));
  wq->Queue(w[8].get());  // appended behind the new tail, not behind the removed one
  gate1.Open();
  wq->Flush();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 5, 8}));
  // Both lists still work after the removals.
  wq->Queue(w[3].get());
  wq->Queue(w[6].get());
  wq->Flush();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 5, 8, 3, 6}));
}

TEST_F(WorkqueueTest, CancelSyncStopsSelfRequeueingWork) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int> runs{0};
  Work* self = nullptr;
  Workqueue* q = wq.get();
  Work work([&] {
    ++runs;
    q->Queue(self);  // requeues itself forever
  });
  self = &work;
  wq->Queue(&work);
  ASSERT_TRUE(Eventually([&] { return runs.load() > 10; }));
  wq->CancelSync(&work);
  const int after = runs.load();
  EXPECT_FALSE(work.pending());
  wq->Flush();
  EXPECT_EQ(runs.load(), after);  // nothing ran after CancelSync returned
  EXPECT_FALSE(work.disabled());  // and it can be queued again
  EXPECT_TRUE(wq->Queue(&work));
  wq->CancelSync(&work);
}

TEST_F(WorkqueueTest, FlushWorkWaitsForTheInstance) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  EXPECT_FALSE(wq->Flush(&held.work));  // idle: nothing to wait for
  wq->Queue(&held.work);
  std::atomic<bool> returned{false}, waited{false};
  std::thread flusher([&] {
    waited = wq->Flush(&held.work);
    returned = true;
  });
  // A negative check (it can only miss a failure): the flush waits for the held work.
  EXPECT_FALSE(Eventually([&] { return returned.load(); }, absl::Milliseconds(20)));
  held.gate.Open();
  flusher.join();
  EXPECT_TRUE(waited.load());
  EXPECT_TRUE(held.finished.load());
}

TEST_F(WorkqueueTest, FlushIsNotLivelockedByNewArrivals) {
  auto wq = Make({.flags = kUnbound});
  Work* self = nullptr;
  Workqueue* q = wq.get();
  std::atomic<int> runs{0};
  Work work([&] {
    ++runs;
    q->Queue(self);  // an endless stream of new arrivals
  });
  self = &work;
  wq->Queue(&work);
  // Returns although the work keeps requeueing itself. Bounded: after 5 s the stream
  // stops, so a livelocked Flush fails the test instead of hanging it.
  std::atomic<bool> returned{false};
  std::thread flusher([&] {
    wq->Flush();
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return returned.load(); })) << "Flush livelocked";
  wq->CancelSync(&work);  // ends the stream
  flusher.join();
  EXPECT_GE(runs.load(), 1);
}

// Two flushes at once: each waits for every work queued before it began. The second
// used to bump the flush color while the first waited and then wait for the new color's
// (empty) bucket only, returning while the older work still ran.
TEST_F(WorkqueueTest, OverlappingFlushesEachWaitForOlderWorks) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  wq->Queue(&held.work);
  testing::PausePoints hooks;
  std::atomic<bool> first_returned{false};
  std::thread first([&] {
    wq->Flush();
    first_returned = true;
  });
  // The first flush waits (the failing interleaving) before the second begins.
  ASSERT_TRUE(
      hooks.WaitSeen(internal::HookPoint::kFlushAllWaits, internal::WorkAccess::core(wq.get())));
  std::atomic<bool> second_returned{false};
  std::thread second([&] {
    wq->Flush();
    second_returned = true;
    EXPECT_TRUE(held.finished.load()) << "the second flush returned before the older work ended";
  });
  EXPECT_FALSE(Eventually([&] { return second_returned.load(); }, absl::Milliseconds(50)));
  EXPECT_FALSE(first_returned.load());
  held.gate.Open();
  first.join();
  second.join();
  EXPECT_TRUE(held.finished.load());
}

// A Flush waits for every work queued before it was called, also one whose Queue read
// the flush color just before another Flush bumped it. That Queue counted its work in the
// old color's bucket, which the other Flush had found empty; the next Flush waited only
// for the new color's bucket and returned before the work ran. stats() counts the call
// once.
TEST_F(WorkqueueTest, AFlushAfterAQueueThatRacedAnotherFlushWaitsForItsWork) {
  auto wq = Make({.flags = kUnbound});
  internal::WorkqueueCore* core = internal::WorkAccess::core(wq.get());
  HeldWork held;
  testing::PausePoints hooks;
  auto& pause = hooks.Arm(internal::HookPoint::kEnqueueReadColor, core);
  std::thread producer([&] { EXPECT_TRUE(wq->Queue(&held.work)); });
  ASSERT_TRUE(pause.WaitPaused());  // the color read, not yet counted
  wq->Flush();                      // concurrent with that Queue: may return at once
  pause.Resume();
  producer.join();  // Queue returned: every later Flush must wait for the work
  auto flush = std::async(std::launch::async, [&] { wq->Flush(); });
  EXPECT_NE(flush.wait_for(std::chrono::milliseconds(100)), std::future_status::ready)
      << "Flush returned before a work queued before it ran";
  held.gate.Open();
  flush.get();
  EXPECT_TRUE(held.finished.load());
  // One call, counted once, although its count moved to the newer color's bucket (it
  // read 2 for good).
  EXPECT_EQ(wq->stats().queued, 1u);
  EXPECT_EQ(wq->stats().completed, 1u);
}

TEST_F(WorkqueueTest, DrainAllowsChainingAndRefusesOutsiders) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int> chain{0};
  Work* self = nullptr;
  Workqueue* q = wq.get();
  Gate gate;
  Work work([&] {
    gate.Wait();
    if (++chain < 5) {
      EXPECT_TRUE(q->Queue(self));  // chained queueing is allowed
    }
  });
  self = &work;
  std::atomic<int> outsider_runs{0};
  Work outsider([&] { ++outsider_runs; });
  DelayedWork delayed_outsider([&] { ++outsider_runs; });
  Work probe([] {});  // may be queued (and run) before the drain begins
  wq->Queue(&work);
  std::thread drainer([&] { wq->Drain(); });
  // Not pending first: only this thread queues `probe`, so a refusal then means draining
  // (the other order could see a refusal for pending and then a worker clearing it).
  ASSERT_TRUE(Eventually([&] { return !probe.pending() && !wq->Queue(&probe); }));
  // Refused, not merely pending: nothing was queued.
  EXPECT_FALSE(wq->Queue(&outsider));
  EXPECT_FALSE(outsider.pending());
  // Delayed queueing from outside is refused too, with or without a delay.
  EXPECT_FALSE(wq->QueueDelayed(&delayed_outsider, absl::ZeroDuration()));
  EXPECT_FALSE(wq->QueueDelayed(&delayed_outsider, absl::Hours(1)));
  EXPECT_FALSE(wq->ModDelayed(&delayed_outsider, absl::Hours(1)));
  EXPECT_FALSE(delayed_outsider.pending());
  gate.Open();
  drainer.join();
  EXPECT_EQ(chain.load(), 5);
  EXPECT_EQ(outsider_runs.load(), 0);
  EXPECT_TRUE(wq->Queue(&outsider));  // accepted again after the drain
  wq->Flush();
  EXPECT_EQ(outsider_runs.load(), 1);
}

// Post runs a function once in a work the workqueue owns, destroys its captures after
// the run (before Flush returns) and frees the work (LeakSanitizer checks that).
TEST_F(WorkqueueTest, PostRunsOnceAndFreesItsWork) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int> runs{0};
  auto alive = std::make_shared<int>(0);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(wq->Post([&runs, alive] { runs.fetch_add(1); }));
  }
  wq->Flush();
  EXPECT_EQ(runs.load(), 1000);
  EXPECT_EQ(alive.use_count(), 1) << "a posted function's captures outlived its run";
}

// A Work made with an empty function, and a Post of one, run nothing: they were called
// (at address 0) on a worker thread.
TEST_F(WorkqueueTest, AnEmptyFunctionRunsNothing) {
  auto wq = Make({.flags = kUnbound});
  Work empty(nullptr);
  DelayedWork delayed(absl::AnyInvocable<void()>{});
  ASSERT_TRUE(wq->Queue(&empty));
  ASSERT_TRUE(wq->Post(absl::AnyInvocable<void()>()));
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::ZeroDuration()));
  wq->Flush(&delayed);
  wq->Flush();
  EXPECT_FALSE(delayed.pending());
  EXPECT_FALSE(empty.pending());
  EXPECT_EQ(wq->stats().exceptions, 0u);
}

// A posted function's captures are destroyed outside the pool's lock: a destructor that
// posts again (user code may do anything there) must not deadlock on that lock.
TEST_F(WorkqueueTest, APostedFunctionsCapturesMayPostFromTheirDestructor) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int> runs{0};
  struct PostOnDestroy {
    Workqueue* wq;
    std::atomic<int>* runs;
    PostOnDestroy(Workqueue* w, std::atomic<int>* r) : wq(w), runs(r) {}
    PostOnDestroy(PostOnDestroy&& o) noexcept : wq(std::exchange(o.wq, nullptr)), runs(o.runs) {}
    ~PostOnDestroy() {
      if (wq != nullptr) wq->Post([r = runs] { r->fetch_add(1); });
    }
  };
  ASSERT_TRUE(wq->Post([guard = PostOnDestroy(wq.get(), &runs)] {}));
  EXPECT_TRUE(testing::ReturnsInTime([&] {
    wq->Flush();
    wq->Flush();  // the one posted by the destructor
  }));
  EXPECT_EQ(runs.load(), 1);
}

// Arming the runtime's watchdog may throw (here the clock; an allocation of the timer
// heap in practice) after the work was queued: the throw reached Post, whose Work was
// then freed while queued (a failed check), and left the watchdog marked armed for good.
TEST(WorkqueuePostTest, AWatchdogThatCannotBeArmedLosesNoPost) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  auto runtime = *WorkqueueRuntime::Create({.clock = &clock, .timers = timers.get()});
  auto wq = *Workqueue::Create({.name = "post", .flags = kUnbound, .runtime = runtime.get()});
  std::atomic<int> runs{0};
  clock.ThrowNext(1);
  EXPECT_TRUE(wq->Post([&runs] { runs.fetch_add(1); }));
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_TRUE(wq->Post([&runs] { runs.fetch_add(1); }));  // arms the watchdog this time
  wq->Flush();
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(timers->Pending(), 1u) << "the watchdog was not armed again";
}

// Several threads post, and posted functions post more (chains); all run once each and
// nothing is left (TSan, LSan).
TEST_F(WorkqueueTest, PostFromManyThreadsAndFromPostedWork) {
  auto wq = Make({.flags = kUnbound, .max_active = 4});
  constexpr int kThreads = 3, kPerThread = 2000, kChain = 3;
  std::atomic<int> runs{0};
  std::function<void(int)> post = [&](int left) {
    ASSERT_TRUE(wq->Post([&, left] {
      runs.fetch_add(1);
      if (left > 0) post(left - 1);
    }));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) post(i % 4 == 0 ? kChain : 0);
    });
  }
  for (auto& t : threads) t.join();
  wq->Drain();  // waits for the chains too
  int expected = 0;
  for (int i = 0; i < kPerThread; ++i) expected += 1 + (i % 4 == 0 ? kChain : 0);
  EXPECT_EQ(runs.load(), kThreads * expected);
}

// A workqueue that refuses works (a Drain in progress) refuses a Post from outside: false,
// and the function is destroyed without running.
TEST_F(WorkqueueTest, PostRefusedWhileDrainingDropsTheFunction) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  std::thread drainer([&] { wq->Drain(); });
  Work probe([] {});
  ASSERT_TRUE(Eventually([&] { return !probe.pending() && !wq->Queue(&probe); }));
  std::atomic<int> runs{0};
  auto alive = std::make_shared<int>(0);
  EXPECT_FALSE(wq->Post([&runs, alive] { runs.fetch_add(1); }));
  EXPECT_EQ(alive.use_count(), 1) << "a refused function was kept";
  held.gate.Open();
  drainer.join();
  EXPECT_EQ(runs.load(), 0);
}

// Destroying a workqueue runs what was posted to it first.
TEST_F(WorkqueueTest, DestroyingAWorkqueueRunsItsPostedWork) {
  std::atomic<int> runs{0};
  {
    auto wq = Make({.flags = kUnbound | kFreezable});
    wq->Freeze();  // held pending until the destruction thaws it
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(wq->Post([&runs] { runs.fetch_add(1); }));
    EXPECT_EQ(runs.load(), 0);
  }
  EXPECT_EQ(runs.load(), 100);
}

// A CancelSync in progress holds the work (refuses queueing) without disabling it: an
// Enable cannot take that hold away, and disabled() reports Disable alone. (They once
// shared one count: Enable during CancelSync returned true and let the work be queued
// mid-cancel, and CancelSync's release then wrapped the count, refusing the work for ever.)
TEST_F(WorkqueueTest, EnableDuringCancelSyncLeavesItsHold) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  ASSERT_TRUE(
      Eventually([&] { return internal::WorkAccess::running_pool(&held.work).load() != nullptr; }));
  std::thread canceller([&] { wq->CancelSync(&held.work); });
  ASSERT_TRUE(Eventually([&] {
    return (internal::WorkAccess::state(&held.work).load() & ~internal::kPendingBit) !=
           0;  // its hold
  }));
  EXPECT_FALSE(held.work.disabled());
  EXPECT_FALSE(wq->Enable(&held.work));  // never disabled: nothing to undo
  EXPECT_FALSE(wq->Queue(&held.work));   // refused while CancelSync waits
  // A Disable meanwhile outlasts the CancelSync.
  EXPECT_FALSE(wq->Disable(&held.work));
  held.gate.Open();
  canceller.join();
  EXPECT_TRUE(held.work.disabled());
  EXPECT_FALSE(wq->Queue(&held.work));
  EXPECT_TRUE(wq->Enable(&held.work));
  EXPECT_FALSE(held.work.disabled());
  EXPECT_TRUE(wq->Queue(&held.work));  // accepted again
  wq->Flush();
}

// Cancel takes a pending instance only: it neither waits for nor stops a running one.
TEST_F(WorkqueueTest, CancelDoesNotWaitForTheRunningInstance) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  ASSERT_TRUE(
      Eventually([&] { return internal::WorkAccess::running_pool(&held.work).load() != nullptr; }));
  std::atomic<int> cancelled{-1};
  std::thread canceller([&] { cancelled = wq->Cancel(&held.work); });
  EXPECT_TRUE(Eventually([&] { return cancelled.load() != -1; }))
      << "Cancel waited for the running instance";
  EXPECT_FALSE(held.finished.load());
  held.gate.Open();  // releases a Cancel that waited, so the test fails instead of hanging
  canceller.join();
  EXPECT_EQ(cancelled.load(), 0);
  wq->Flush();
  EXPECT_TRUE(held.finished.load());
}

// CancelSync returns only once the running instance has finished.
TEST_F(WorkqueueTest, CancelSyncWaitsForTheRunningInstance) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  ASSERT_TRUE(
      Eventually([&] { return internal::WorkAccess::running_pool(&held.work).load() != nullptr; }));
  std::atomic<bool> returned{false};
  std::atomic<bool> finished_at_return{false};
  std::thread canceller([&] {
    wq->CancelSync(&held.work);
    finished_at_return = held.finished.load();
    returned = true;
  });
  // A negative check (short): it must still be waiting while the work is held.
  EXPECT_FALSE(Eventually([&] { return returned.load(); }, absl::Milliseconds(20)));
  held.gate.Open();
  canceller.join();
  EXPECT_TRUE(finished_at_return.load());
}

// Disable of a pending work cancels it (returns true) and it never runs.
TEST_F(WorkqueueTest, DisableCancelsAPendingInstance) {
  auto wq = Make({.flags = kOrdered});
  HeldWork held;
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  ASSERT_TRUE(wq->Queue(&held.work));
  ASSERT_TRUE(wq->Queue(&work));  // behind the held one: pending
  EXPECT_TRUE(wq->Disable(&work));
  EXPECT_FALSE(work.pending());
  held.gate.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);
  EXPECT_TRUE(wq->Enable(&work));
}

// Flush(work) waits for the instance pending or running at the call, not until the work
// is idle: a work that queues itself again would keep it waiting for ever.
TEST_F(WorkqueueTest, FlushOfASelfRequeueingWorkReturns) {
  auto wq = Make({.flags = kUnbound});
  Work* self = nullptr;
  Workqueue* q = wq.get();
  Work work([&] { q->Queue(self); });
  self = &work;
  ASSERT_TRUE(wq->Queue(&work));
  EXPECT_TRUE(testing::ReturnsInTime([&] { wq->Flush(&work); }));
  wq->CancelSync(&work);
}

// Without kFreezable, Freeze does nothing.
TEST_F(WorkqueueTest, FreezeIsANoOpWithoutFreezable) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  wq->Freeze();
  ASSERT_TRUE(wq->Queue(&work));
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// stats() counts a running work as started and in flight.
TEST_F(WorkqueueTest, StatsCountARunningWork) {
  auto wq = Make({.flags = kUnbound});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  ASSERT_TRUE(Eventually([&] { return wq->stats().started == 1; }));
  EXPECT_EQ(wq->stats().in_flight, 1);
  held.gate.Open();
  wq->Flush();
  EXPECT_EQ(wq->stats().in_flight, 0);
}

// A CPU or node the topology does not have falls back to Queue's choice.
TEST_F(WorkqueueTest, UnknownCpuOrNodeFallsBack) {
  auto wq = Make({});
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  EXPECT_TRUE(wq->QueueOn(100000, &work));
  wq->Flush();
  EXPECT_TRUE(wq->QueueOn(-7, &work));
  wq->Flush();
  EXPECT_TRUE(wq->QueueOnNode(99, &work));
  wq->Flush();
  EXPECT_EQ(runs.load(), 3);
}

// kCpuIntensive works do not count for the CPU pool's concurrency: two that do not
// block (no BlockingScope) run side by side on one CPU's pool, which would otherwise run
// one at a time.
TEST_F(WorkqueueTest, CpuIntensiveWorksDoNotHoldUpTheirPool) {
  auto wq = Make({.flags = kCpuIntensive});
  const int cpu = runtime_->topology().cpus()[0].cpu;
  Gate gate;
  std::atomic<int> running{0};
  Work a([&] {
    ++running;
    gate.Wait();
  });
  Work b([&] {
    ++running;
    gate.Wait();
  });
  ASSERT_TRUE(wq->QueueOn(cpu, &a));
  ASSERT_TRUE(wq->QueueOn(cpu, &b));
  EXPECT_TRUE(Eventually([&] { return running.load() == 2; }));
  gate.Open();
  wq->Flush();
}

// max_active applies per CPU on a bound workqueue.
TEST_F(WorkqueueTest, BoundMaxActiveIsPerCpu) {
  auto wq = Make({.max_active = 2});
  const int cpu = runtime_->topology().cpus()[0].cpu;
  EXPECT_EQ(HeldConcurrency(wq.get(), 6, 2, [&](Work* w, int) { wq->QueueOn(cpu, w); }), 2);
  if (runtime_->topology().num_cpus() >= 2) {
    const int cpu1 = runtime_->topology().cpus()[1].cpu;
    EXPECT_EQ(HeldConcurrency(wq.get(), 8, 4,
                              [&](Work* w, int i) { wq->QueueOn(i % 2 ? cpu1 : cpu, w); }),
              4);
  }
}

TEST_F(WorkqueueTest, DisableRefusesQueueingUntilEnabled) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  EXPECT_FALSE(wq->Disable(&work));
  EXPECT_TRUE(work.disabled());
  EXPECT_FALSE(wq->Queue(&work));
  EXPECT_FALSE(wq->Disable(&work));  // nested
  EXPECT_FALSE(wq->Enable(&work));   // one level still held
  EXPECT_TRUE(wq->Enable(&work));
  EXPECT_FALSE(wq->Enable(&work));  // not disabled: no-op
  EXPECT_TRUE(wq->Queue(&work));
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

TEST_F(WorkqueueTest, FreezeHoldsWorkUntilThaw) {
  auto wq = Make({.flags = kUnbound | kFreezable});
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  wq->Freeze();
  EXPECT_TRUE(wq->Queue(&work));
  // A negative check (it can only miss a failure): it would have run by now.
  EXPECT_FALSE(Eventually([&] { return runs.load() != 0; }, absl::Milliseconds(20)));
  wq->Thaw();
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// Destroying a frozen workqueue thaws it and runs what it held (it used to wait for ever).
TEST_F(WorkqueueTest, DestroyingAFrozenWorkqueueRunsItsWorks) {
  auto wq = Make({.flags = kUnbound | kFreezable});
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  wq->Freeze();
  EXPECT_TRUE(wq->Queue(&work));
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    wq.reset();
    destroyed = true;
  });
  const bool returned = Eventually([&] { return destroyed.load(); });
  EXPECT_TRUE(returned) << "~Workqueue hangs on a frozen workqueue";
  if (!returned) {
    destroyer.detach();  // the process is failing anyway; do not hang it
    return;
  }
  destroyer.join();
  EXPECT_EQ(runs.load(), 1);
}

TEST_F(WorkqueueTest, BlockingScopeLetsTheCpuPoolRunOtherWork) {
  auto wq = Make({});
  const int cpu = runtime_->topology().cpus()[0].cpu;
  Gate may_block, done;
  std::atomic<bool> started{false}, second_ran{false};
  Work sleeper([&] {
    started = true;
    may_block.Wait();        // running (counted): the pool runs nothing else on this CPU
    BlockingScope blocking;  // now it "sleeps": the pool wakes a worker for `second`
    done.Wait();
  });
  Work second([&] { second_ran = true; });
  wq->QueueOn(cpu, &sleeper);
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  wq->QueueOn(cpu, &second);
  // Concurrency 1 while the sleeper counts as running (a negative check: it can only miss
  // a failure).
  EXPECT_FALSE(Eventually([&] { return second_ran.load(); }, absl::Milliseconds(5)));
  may_block.Open();
  EXPECT_TRUE(Eventually([&] { return second_ran.load(); }));
  done.Open();
  wq->Flush();
  EXPECT_EQ(wq->stats().concurrency_wakeups, 1u);
}

TEST_F(WorkqueueTest, ExceptionsAreCaughtAndCounted) {
  auto wq = Make({.flags = kUnbound});
  Work bad([] { throw std::runtime_error("boom"); });
  std::atomic<bool> good_ran{false};
  Work good([&] { good_ran = true; });
  wq->Queue(&bad);
  wq->Flush();
  wq->Queue(&good);
  wq->Flush();
  EXPECT_TRUE(good_ran.load());
  EXPECT_EQ(wq->stats().exceptions, 1u);
  EXPECT_EQ(wq->stats().completed, 2u);
  EXPECT_EQ(wq->stats().queued, 2u);
  EXPECT_EQ(wq->stats().in_flight, 0);
}

// run_time sums the executions' wall time: at least what the works themselves measured.
TEST_F(WorkqueueTest, RunTimeCoversTheExecutions) {
  auto wq = Make({.flags = kUnbound});
  std::atomic<int64_t> measured_ns{0};
  auto busy = [&] {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2)) {
    }
    measured_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  };
  Work a(busy), b(busy);
  EXPECT_EQ(wq->stats().run_time, absl::ZeroDuration());
  wq->Queue(&a);
  wq->Queue(&b);
  wq->Flush();
  // The TSC's rate is calibrated against the clock over a short window, which a
  // preemption can skew by several percent on a loaded machine: allow a quarter. A sum
  // that left out one of the two executions would be at most about half.
  EXPECT_GE(wq->stats().run_time, absl::Nanoseconds(measured_ns.load()) * 0.75);
}

TEST_F(WorkqueueTest, IdleWorkersAreReaped) {
  auto wq = Make({});
  const int cpu = runtime_->topology().cpus()[0].cpu;
  ASSERT_TRUE(testing::GrowPool(*wq, *runtime_, cpu, 5));
  EXPECT_TRUE(Eventually([&] { return testing::PoolWorkers(*runtime_, cpu) <= 2; }))
      << "idle_timeout is 200 ms";
}

TEST_F(WorkqueueTest, DumpNamesPoolsAndWorkqueues) {
  auto wq = Make({.name = "dump-me", .flags = kUnbound});
  Work work([] {});
  wq->Queue(&work);
  wq->Flush();
  const std::string dump = runtime_->Dump();
  EXPECT_NE(dump.find("dump-me: unbound"), std::string::npos) << dump;
  EXPECT_NE(dump.find("Pools ("), std::string::npos);
  EXPECT_NE(dump.find("pods cache"), std::string::npos);
}

// The dump's counts: an ordered workqueue running one work with two more over its
// max_active shows them inactive, and its pool one busy worker.
TEST_F(WorkqueueTest, DumpShowsTheCounts) {
  auto wq = Make({.name = "counted", .flags = kOrdered});
  HeldWork held;
  Work second([] {}), third([] {});
  ASSERT_TRUE(wq->Queue(&held.work));
  ASSERT_TRUE(wq->Queue(&second));
  ASSERT_TRUE(wq->Queue(&third));
  ASSERT_TRUE(
      Eventually([&] { return internal::WorkAccess::running_pool(&held.work).load() != nullptr; }));
  const std::string dump = runtime_->Dump();
  EXPECT_NE(dump.find("counted: ordered"), std::string::npos) << dump;
  EXPECT_NE(dump.find("max_active=1 queued=3 inactive=2"), std::string::npos) << dump;
  EXPECT_NE(dump.find("busy=1"), std::string::npos) << dump;
  held.gate.Open();
  wq->Flush();
  EXPECT_NE(runtime_->Dump().find("max_active=1 queued=0 inactive=0"), std::string::npos);
}

// Runs in a child process: without the right to raise priority (not root), high-priority
// pools run at normal priority, say so, and still run work.
void HighPriFallsBackWithoutPermission() {
  if (getuid() == 0 && setuid(65534) != 0) _exit(3);  // drop root (and CAP_SYS_NICE)
  auto rt = WorkqueueRuntime::Create({});
  if (!rt.ok()) _exit(4);
  auto wq = Workqueue::Create({.name = "hp", .flags = kHighPri, .runtime = rt->get()});
  if (!wq.ok()) _exit(5);
  std::atomic<bool> ran{false};
  Work work([&] { ran = true; });
  (*wq)->Queue(&work);
  (*wq)->Flush(&work);
  if (!ran.load()) _exit(6);
  _exit((*rt)->highpri_raised() ? 7 : 0);
}

TEST_F(WorkqueueTest, HighPriorityFallsBackWhenPriorityCannotBeRaised) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(HighPriFallsBackWithoutPermission(), ::testing::ExitedWithCode(0), "");
}

TEST_F(WorkqueueTest, UnboundWorkqueuesWithEqualAttributesSharePools) {
  auto a = Make({.name = "share-a", .flags = kUnbound});  // non-strict, cache scope
  auto b = Make({.name = "share-b", .flags = kUnbound});
  auto pools_of = [&](const std::string& name) {
    const std::string dump = runtime_->Dump();
    const size_t at = dump.find(name + ": ");
    const size_t open = dump.find("pools=[", at);
    return dump.substr(open, dump.find(']', open) - open);
  };
  EXPECT_EQ(pools_of("share-a"), pools_of("share-b"));
}

TEST_F(WorkqueueTest, SystemWorkqueuesRunWork) {
  for (Workqueue* wq : {&SystemWq(), &SystemHighPriWq(), &SystemLongWq(), &SystemUnboundWq()}) {
    std::atomic<bool> ran{false};
    Work work([&] { ran = true; });
    wq->Queue(&work);
    wq->Flush(&work);
    EXPECT_TRUE(ran.load()) << wq->name();
  }
}

// ---- delayed work and the watchdog, on a FakeClock ----

class FakeTimeWorkqueueTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  std::unique_ptr<TimerService> timers_ = *TimerService::Create({.clock = &clock_});
  std::vector<std::string> stalls_;
  std::mutex stall_mu_;
  std::atomic<bool> fail_spawn_{false};
  std::unique_ptr<WorkqueueRuntime> runtime_ =
      *WorkqueueRuntime::Create({.clock = &clock_,
                                 .timers = timers_.get(),
                                 .stall_threshold = absl::Seconds(2),
                                 .stall_reporter =
                                     [this](const std::string& r) {
                                       std::lock_guard<std::mutex> l(stall_mu_);
                                       stalls_.push_back(r);
                                     },
                                 .fail_thread_creation = [this] { return fail_spawn_.load(); }});
};

// QueueDelayed with a CPU runs the work on that CPU's pool once the delay has passed.
TEST_F(FakeTimeWorkqueueTest, DelayedWorkRunsOnTheCpuItWasQueuedFor) {
  const auto& cpus = runtime_->topology().cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  auto wq = *Workqueue::Create({.name = "on-cpu", .runtime = runtime_.get()});
  const int cpu = cpus.back().cpu;
  std::atomic<int> ran_on{-2};
  DelayedWork delayed([&] { ran_on = CurrentCpu(); });
  // The timer fires inside Advance, on the thread that moves the clock: pinned to another
  // CPU, so a timer that queued on its own thread's CPU instead of `cpu` would be seen.
  std::thread mover([&] {
    ASSERT_TRUE(BindCurrentThread({cpus.front().cpu}).ok());
    ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Seconds(1), cpu));
    clock_.Advance(absl::Seconds(1));
  });
  mover.join();
  wq->Flush(&delayed);
  EXPECT_EQ(ran_on.load(), cpu);
}

// mod_delayed_work_on: ModDelayed of a delayed work still on this workqueue's timer moves
// that timer (the shortcut) and also the CPU it was queued for: it runs on the CPU the
// ModDelayed named, not on the one the first QueueDelayed did.
TEST_F(FakeTimeWorkqueueTest, ModDelayedOfAWorkOnItsTimerRunsItOnTheNewCpu) {
  const auto& cpus = runtime_->topology().cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  auto wq = *Workqueue::Create({.name = "mod-cpu", .runtime = runtime_.get()});
  const int first = cpus.front().cpu;
  const int last = cpus.back().cpu;
  std::atomic<int> ran_on{-2};
  DelayedWork delayed([&] { ran_on = CurrentCpu(); });
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Seconds(10), first));
  const size_t timers = timers_->Pending();
  EXPECT_TRUE(wq->ModDelayed(&delayed, absl::Seconds(1), last));
  EXPECT_EQ(timers_->Pending(), timers);  // its own timer moved, no new one
  // The timer fires inside Advance, on a thread pinned to `first`: a work queued for the
  // caller's CPU, or for `first`, would be seen.
  std::thread mover([&] {
    ASSERT_TRUE(BindCurrentThread({first}).ok());
    clock_.Advance(absl::Seconds(1));
  });
  mover.join();
  wq->Flush(&delayed);
  EXPECT_EQ(ran_on.load(), last);
}

// flush_work of a work that waits on its delay timer (not yet queued, not running) has
// nothing to wait for: false at once (it used to say true); flush_delayed_work queues it
// now and waits.
TEST_F(FakeTimeWorkqueueTest, FlushOfAWorkOnItsTimerDoesNotWait) {
  auto wq = *Workqueue::Create({.name = "timer-flush", .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork delayed([&] { ++runs; });
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Hours(1)));
  EXPECT_FALSE(wq->Flush(&delayed.work()));
  EXPECT_TRUE(delayed.pending());
  EXPECT_EQ(runs.load(), 0);
  EXPECT_TRUE(wq->Flush(&delayed));
  EXPECT_EQ(runs.load(), 1);
}

// An instance that ModDelayed took back to a timer while an earlier one ran: once the
// earlier one finished, Flush(work) returns false at once (nothing queued or running).
// The finishing worker stored its own instance number over the taken-back one's, and
// Flush waited for the timer (here: for ever, the clock does not move).
TEST_F(FakeTimeWorkqueueTest, FlushAfterAnInstanceWasTakenBackBehindARunningOneDoesNotWait) {
  auto wq = *Workqueue::Create({.name = "taken-back", .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  std::atomic<bool> gate{false};
  DelayedWork delayed([&] {
    if (runs.fetch_add(1) == 0) {
      while (!gate.load()) std::this_thread::yield();
    }
  });
  ASSERT_TRUE(wq->Queue(&delayed.work()));  // instance 1 runs and holds
  ASSERT_TRUE(testing::Eventually([&] { return runs.load() == 1; }));
  ASSERT_TRUE(wq->Queue(&delayed.work()));                // instance 2 pending behind it
  ASSERT_TRUE(wq->ModDelayed(&delayed, absl::Hours(1)));  // instance 2 back on a timer
  gate = true;
  ASSERT_TRUE(testing::Eventually([&] { return wq->stats().completed == 1; }));
  auto flush = std::async(std::launch::async, [&] { return wq->Flush(&delayed.work()); });
  const bool returned = flush.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!returned) clock_.Advance(absl::Hours(1));  // the timer runs it: the Flush ends
  EXPECT_TRUE(returned) << "Flush waited for the timer";
  EXPECT_FALSE(flush.get() && returned);
  EXPECT_EQ(wq->Cancel(&delayed), returned);  // still on its timer, unless it ran
}

// A Flush(work) waiting for a pending instance returns once ModDelayed takes that
// instance back to a timer: it is gone, as if cancelled. Flush used to wait for the
// re-armed timer to fire and the work to run (here: never, the clock does not move).
TEST_F(FakeTimeWorkqueueTest, FlushReturnsWhenModDelayedTakesTheInstanceBack) {
  auto wq = *Workqueue::Create({.name = "ordered", .flags = kOrdered, .runtime = runtime_.get()});
  HeldWork blocker;
  std::atomic<int> runs{0};
  DelayedWork delayed([&] { ++runs; });
  ASSERT_TRUE(wq->Queue(&blocker.work));
  ASSERT_TRUE(wq->Queue(&delayed.work()));  // parked behind the blocker
  testing::PausePoints hooks;
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    EXPECT_TRUE(wq->Flush(&delayed.work()));
    flushed = true;
  });
  ASSERT_TRUE(hooks.WaitSeen(internal::HookPoint::kFlushWorkWaits, &delayed.work()));
  EXPECT_TRUE(wq->ModDelayed(&delayed, absl::Hours(1)));  // it was pending: true
  const bool returned = Eventually([&] { return flushed.load(); });
  EXPECT_TRUE(returned) << "Flush(work) waited for the instance ModDelayed took back";
  if (!returned) wq->Cancel(&delayed);  // ends the wait
  flusher.join();
  EXPECT_EQ(runs.load(), 0);
  blocker.gate.Open();
  EXPECT_TRUE(wq->CancelSync(&delayed));
  wq->Flush();
}

// A delayed work can be cancelled through a workqueue of another runtime: its timer is
// cancelled on the service it was armed on. It was cancelled on the caller's, which did
// not know the id, and Cancel spun for ever (or could have cancelled an unrelated timer).
TEST_F(FakeTimeWorkqueueTest, CancelThroughAnotherRuntimesWorkqueue) {
  auto wq = *Workqueue::Create({.name = "owner", .runtime = runtime_.get()});
  struct Other {  // on the heap: a Cancel that hangs keeps using it
    std::unique_ptr<Workqueue> wq =
        *Workqueue::Create({.name = "other", .runtime = &WorkqueueRuntime::Default()});
    DelayedWork delayed{[] {}};
  };
  auto other = std::make_shared<Other>();
  ASSERT_TRUE(wq->QueueDelayed(&other->delayed, absl::Seconds(1)));
  const bool returned =
      testing::ReturnsInTime([other] { EXPECT_TRUE(other->wq->Cancel(&other->delayed)); });
  if (!returned) {
    new std::shared_ptr<Other>(other);  // the spinning thread keeps using it: never freed
    FAIL() << "Cancel through another runtime's workqueue did not return";
  }
  EXPECT_FALSE(other->delayed.pending());
  EXPECT_EQ(timers_->Pending(), 0u);
}

// A delayed work flushed through another workqueue runs on the one whose timer it was on,
// as its timer would have queued it (it ran on the flusher's: its pools, its max_active,
// its stats, beside an ordered owner's running work).
TEST_F(FakeTimeWorkqueueTest, FlushThroughAnotherWorkqueueRunsTheDelayedWorkOnItsOwn) {
  auto owner = *Workqueue::Create({.name = "owner", .flags = kOrdered, .runtime = runtime_.get()});
  auto other = *Workqueue::Create({.name = "other", .flags = kUnbound, .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork delayed([&] { ++runs; });
  ASSERT_TRUE(owner->QueueDelayed(&delayed, absl::Hours(1)));
  EXPECT_TRUE(other->Flush(&delayed));
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(owner->stats().started, 1u);
  EXPECT_EQ(owner->stats().completed, 1u);
  EXPECT_EQ(other->stats().started, 0u);
  EXPECT_FALSE(delayed.pending());
}

// Drain does not wait for delayed works still on their timers.
TEST_F(FakeTimeWorkqueueTest, DrainDoesNotWaitForTimers) {
  auto wq = *Workqueue::Create({.name = "d", .flags = kUnbound, .runtime = runtime_.get()});
  DelayedWork delayed([] {});
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Hours(1)));
  EXPECT_TRUE(testing::ReturnsInTime([&] { wq->Drain(); }));
  EXPECT_TRUE(delayed.pending());
  EXPECT_TRUE(wq->Cancel(&delayed));
}

TEST_F(FakeTimeWorkqueueTest, DelayedWorkRunsAfterItsDelay) {
  auto wq = *Workqueue::Create({.name = "delayed", .flags = kUnbound, .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  EXPECT_TRUE(wq->QueueDelayed(&dwork, absl::Seconds(10)));
  EXPECT_FALSE(wq->QueueDelayed(&dwork, absl::Seconds(1)));  // already pending
  EXPECT_TRUE(dwork.pending());
  EXPECT_EQ(wq->stats().queued, 1u);  // counted while it waits on its timer
  clock_.Advance(absl::Seconds(9));
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  wq->Flush(&dwork);
  EXPECT_EQ(wq->stats().queued, 1u);  // and once after it ran
}

TEST_F(FakeTimeWorkqueueTest, ModDelayedMovesTheTimer) {
  auto wq = *Workqueue::Create({.name = "mod", .flags = kUnbound, .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  EXPECT_FALSE(wq->ModDelayed(&dwork, absl::Seconds(10)));  // was not pending
  EXPECT_TRUE(wq->ModDelayed(&dwork, absl::Seconds(2)));    // was pending: moved
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  clock_.Advance(absl::Seconds(10));
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);  // the first timer was replaced, not kept
}

// ModDelayed of a work on its own workqueue's timer moves that timer (the kernel's
// mod_timer), later as well as earlier: one timer throughout, none parked or left behind,
// and the work runs once, at the last time set. Counted as a queueing each time, as when
// the timer was replaced.
TEST_F(FakeTimeWorkqueueTest, ModDelayedOfAWorkOnItsTimerMovesThatTimer) {
  auto wq = *Workqueue::Create({.name = "mod-own", .flags = kUnbound, .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  ASSERT_TRUE(wq->QueueDelayed(&dwork, absl::Seconds(2)));
  const size_t timers = timers_->Pending();
  EXPECT_TRUE(wq->ModDelayed(&dwork, absl::Seconds(10)));  // later
  EXPECT_EQ(timers_->Pending(), timers);
  clock_.Advance(absl::Seconds(5));
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);
  EXPECT_TRUE(wq->ModDelayed(&dwork, absl::Seconds(1)));  // earlier
  EXPECT_EQ(timers_->Pending(), timers);
  EXPECT_EQ(wq->stats().queued, 3u);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  clock_.Advance(absl::Seconds(10));
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_FALSE(dwork.pending());
}

// ModDelayed of a delayed work already queued (its timer fired, or it was queued with no
// delay) takes it out and puts it back on a timer with the new delay, from both places it
// can wait: parked over max_active (ordered) and in a busy CPU pool's worklist (bound).
TEST_F(FakeTimeWorkqueueTest, ModDelayedMovesAParkedWorkBackToATimer) {
  auto wq =
      *Workqueue::Create({.name = "mod-parked", .flags = kOrdered, .runtime = runtime_.get()});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  ASSERT_TRUE(wq->QueueDelayed(&dwork, absl::ZeroDuration()));  // parked: `held` has the slot
  EXPECT_TRUE(wq->ModDelayed(&dwork, absl::Seconds(5)));        // was pending: moved
  held.gate.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);  // waits for its new delay
  EXPECT_TRUE(dwork.pending());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  wq->Flush(&dwork);  // `runs` is seen before the worker lets go of the work
}

TEST_F(FakeTimeWorkqueueTest, ModDelayedMovesAWorkInAPoolsWorklistBackToATimer) {
  auto wq = *Workqueue::Create({.name = "mod-pool", .runtime = runtime_.get()});  // bound
  const int cpu = runtime_->topology().cpus()[0].cpu;
  HeldWork held;  // runs without a BlockingScope: the CPU pool starts nothing else
  ASSERT_TRUE(wq->QueueOn(cpu, &held.work));
  ASSERT_TRUE(
      Eventually([&] { return internal::WorkAccess::running_pool(&held.work).load() != nullptr; }));
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  ASSERT_TRUE(wq->QueueDelayed(&dwork, absl::ZeroDuration(), cpu));  // the pool's worklist
  EXPECT_EQ(internal::WorkAccess::where(&dwork.work()).load(),
            static_cast<uint8_t>(internal::WorkWhere::kPool));
  EXPECT_TRUE(wq->ModDelayed(&dwork, absl::Seconds(5), cpu));  // was pending: moved
  held.gate.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);
  EXPECT_TRUE(dwork.pending());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  wq->Flush(&dwork);  // `runs` is seen before the worker lets go of the work
}

// stats().queued counts successful calls: a cancelled timer still counts, a timer that
// fires counts once, and each ModDelayed is one more call.
TEST_F(FakeTimeWorkqueueTest, QueuedStatCountsCallsAndNeverGoesDown) {
  auto wq = *Workqueue::Create({.name = "stats", .flags = kUnbound, .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  EXPECT_TRUE(wq->QueueDelayed(&dwork, absl::Seconds(1)));
  EXPECT_EQ(wq->stats().queued, 1u);
  EXPECT_TRUE(wq->Cancel(&dwork));
  EXPECT_EQ(wq->stats().queued, 1u);  // used to drop to 0
  EXPECT_TRUE(wq->QueueDelayed(&dwork, absl::Seconds(1)));
  EXPECT_TRUE(wq->ModDelayed(&dwork, absl::Seconds(2)));
  EXPECT_EQ(wq->stats().queued, 3u);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  wq->Flush(&dwork);
  EXPECT_EQ(wq->stats().queued, 3u);
  EXPECT_TRUE(wq->QueueDelayed(&dwork, absl::Hours(1)));
  EXPECT_TRUE(wq->Flush(&dwork));  // flush_delayed_work: off its timer into a pool
  EXPECT_EQ(wq->stats().queued, 4u);
}

// A delayed work that puts itself on a timer again while the destructor drains it
// (chained queueing, allowed) is cancelled before the workqueue is freed. It used to stay
// on its timer, which later ran into the freed workqueue.
TEST_F(FakeTimeWorkqueueTest, DestroyCancelsADelayedWorkRearmedWhileDraining) {
  auto wq = *Workqueue::Create({.name = "rearm", .flags = kUnbound, .runtime = runtime_.get()});
  Workqueue* q = wq.get();
  Gate gate;
  std::atomic<bool> started{false};
  std::atomic<int> rearmed{0};
  DelayedWork* self = nullptr;
  DelayedWork dwork([&] {
    started = true;
    gate.Wait();
    if (q->QueueDelayed(self, absl::Seconds(1))) ++rearmed;
  });
  self = &dwork;
  ASSERT_TRUE(wq->QueueDelayed(&dwork, absl::ZeroDuration()));
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  testing::PausePoints hooks;
  internal::WorkqueueCore* core = internal::WorkAccess::core(q);
  std::thread destroyer([&] { wq.reset(); });
  // The destructor passed its timer cancellation and drains (the failing interleaving).
  ASSERT_TRUE(hooks.WaitSeen(internal::HookPoint::kFlushAllWaits, core));
  gate.Open();
  destroyer.join();
  EXPECT_EQ(rearmed.load(), 1);
  EXPECT_FALSE(dwork.pending());
  clock_.Advance(absl::Seconds(2));  // nothing may fire into the freed workqueue
}

TEST_F(FakeTimeWorkqueueTest, CancelAndFlushDelayedWork) {
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });  // outlives the workqueue (see the last line)
  auto wq = *Workqueue::Create({.name = "cancel", .flags = kUnbound, .runtime = runtime_.get()});
  wq->QueueDelayed(&dwork, absl::Seconds(5));
  EXPECT_TRUE(wq->Cancel(&dwork));
  EXPECT_FALSE(dwork.pending());
  clock_.Advance(absl::Seconds(10));
  wq->Flush();
  EXPECT_EQ(runs.load(), 0);
  wq->QueueDelayed(&dwork, absl::Hours(1));
  EXPECT_TRUE(wq->Flush(&dwork));  // flush_delayed_work runs it now
  EXPECT_EQ(runs.load(), 1);
  wq->QueueDelayed(&dwork, absl::Hours(1));  // destroyed with the timer armed: cancelled
}

TEST_F(FakeTimeWorkqueueTest, WatchdogMarksCpuHogAndLetsOthersRun) {
  auto wq = *Workqueue::Create({.name = "hog", .runtime = runtime_.get()});
  const int cpu = runtime_->topology().cpus()[0].cpu;
  Gate gate;
  std::atomic<bool> hog_started{false}, second_ran{false};
  Work hog([&] {
    hog_started = true;
    gate.Wait();  // CPU work as far as the pool can tell: no BlockingScope
  });
  Work second([&] { second_ran = true; });
  wq->QueueOn(cpu, &hog);
  ASSERT_TRUE(Eventually([&] { return hog_started.load(); }));
  wq->QueueOn(cpu, &second);
  // One runner per CPU pool (negative checks: they can only miss a failure).
  EXPECT_FALSE(Eventually([&] { return second_ran.load(); }, absl::Milliseconds(20)));
  clock_.Advance(absl::Milliseconds(10));  // first watchdog look: running since now
  EXPECT_FALSE(Eventually([&] { return second_ran.load(); }, absl::Milliseconds(5)));
  clock_.Advance(absl::Milliseconds(10));  // 10 ms later, still the same execution: a hog
  ASSERT_TRUE(Eventually([&] { return second_ran.load(); }));
  EXPECT_EQ(wq->stats().cpu_hogs, 1u);
  gate.Open();
  wq->Flush();
}

// The watchdog marks a hog that is not its pool's last worker and creates a worker for
// the pending work: creating it grew the worker list under the watchdog's loop, which
// then read freed memory (ASan: heap-use-after-free; this test under make asan).
TEST_F(FakeTimeWorkqueueTest, WatchdogCreatingAWorkerMidScanIsSafe) {
  auto wq = *Workqueue::Create({.name = "hog2", .runtime = runtime_.get()});
  const int cpu = runtime_->topology().cpus()[0].cpu;
  Gate leave_blocking, hog_done, sleeper_done;
  std::atomic<bool> in_blocking{false}, sleeping{false}, spinning{false}, pending_ran{false};
  Work hog([&] {  // the first worker: blocks for a while, then turns into a CPU hog
    {
      BlockingScope blocking;
      in_blocking = true;
      leave_blocking.Wait();
    }
    spinning = true;
    hog_done.Wait();
  });
  Work sleeper([&] {  // the second worker, created while the first blocks; stays blocked
    BlockingScope blocking;
    sleeping = true;
    sleeper_done.Wait();
  });
  Work pending([&] { pending_ran = true; });
  wq->QueueOn(cpu, &hog);
  ASSERT_TRUE(Eventually([&] { return in_blocking.load(); }));
  wq->QueueOn(cpu, &sleeper);
  ASSERT_TRUE(Eventually([&] { return sleeping.load(); }));
  leave_blocking.Open();
  ASSERT_TRUE(Eventually([&] { return spinning.load(); }));
  wq->QueueOn(cpu, &pending);              // waits: the hog is the pool's counted runner
  clock_.Advance(absl::Milliseconds(10));  // first watchdog look
  clock_.Advance(absl::Milliseconds(10));  // a hog now: a third worker is created
  ASSERT_TRUE(Eventually([&] { return pending_ran.load(); }));
  hog_done.Open();
  sleeper_done.Open();
  wq->Flush();
}

TEST_F(FakeTimeWorkqueueTest, StallIsReportedWhenNoWorkerCanStart) {
  auto wq = *Workqueue::Create({.name = "stall", .flags = kUnbound, .runtime = runtime_.get()});
  fail_spawn_ = true;
  std::atomic<bool> ran{false};
  Work work([&] { ran = true; });
  wq->Queue(&work);
  clock_.Advance(absl::Milliseconds(10));  // the watchdog's first look
  clock_.Advance(absl::Seconds(3));        // no progress since
  {
    std::lock_guard<std::mutex> l(stall_mu_);
    ASSERT_EQ(stalls_.size(), 1u);
    EXPECT_NE(stalls_[0].find("worker creation failing"), std::string::npos) << stalls_[0];
  }
  EXPECT_EQ(runtime_->stalls(), 1u);
  fail_spawn_ = false;
  clock_.Advance(absl::Milliseconds(10));  // the watchdog retries creating a worker
  ASSERT_TRUE(Eventually([&] { return ran.load(); }));
  wq->Flush();
}

// A watchdog pass that throws (here the stall reporter; an allocation in practice) is cut
// short and the watchdog keeps running: the exception left the timer callback (which
// ends the process on a real clock's service) before the watchdog was re-armed, so
// nothing retried creating the worker and the work never ran.
TEST(WorkqueueWatchdogTest, APassThatThrowsIsCutShortAndTheWatchdogRunsOn) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  std::atomic<bool> fail_spawn{true};
  std::atomic<int> reports{0};
  auto runtime =
      *WorkqueueRuntime::Create({.clock = &clock,
                                 .timers = timers.get(),
                                 .stall_threshold = absl::Seconds(2),
                                 .stall_reporter =
                                     [&](const std::string&) {
                                       reports.fetch_add(1);
                                       throw std::runtime_error("reporter failed");
                                     },
                                 .fail_thread_creation = [&] { return fail_spawn.load(); }});
  auto wq = *Workqueue::Create({.name = "stall", .flags = kUnbound, .runtime = runtime.get()});
  std::atomic<bool> ran{false};
  Work work([&] { ran = true; });
  wq->Queue(&work);
  EXPECT_NO_THROW(clock.Advance(absl::Milliseconds(10)));
  EXPECT_NO_THROW(clock.Advance(absl::Seconds(3)));
  EXPECT_EQ(reports.load(), 1);
  fail_spawn = false;
  EXPECT_NO_THROW(clock.Advance(absl::Milliseconds(10)));  // retries creating a worker
  ASSERT_TRUE(Eventually([&] { return ran.load(); }));
  wq->Flush();
}

TEST_F(FakeTimeWorkqueueTest, RescuerRunsAWorkQueuedAgainWhileItRanIt) {
  auto wq = *Workqueue::Create(
      {.name = "reclaim2", .flags = kUnbound | kMemReclaim, .runtime = runtime_.get()});
  fail_spawn_ = true;
  std::atomic<int> runs{0};
  Work* self = nullptr;
  Workqueue* q = wq.get();
  Work work([&] {
    if (runs.fetch_add(1) == 0) q->Queue(self);  // queued again while the rescuer runs it
  });
  self = &work;
  wq->Queue(&work);
  ASSERT_TRUE(Eventually([&] { return runs.load() == 2 && !work.pending(); }));
  wq->Flush();
  EXPECT_EQ(wq->stats().rescued, 2u);  // no worker could be made: both ran on the rescuer
  fail_spawn_ = false;
}

// An instance a worker handed to the rescuer (it was running the work) can be cancelled;
// Cancel used to spin until the rescuer ran it, here for ever (the rescuer is held).
TEST_F(FakeTimeWorkqueueTest, InstanceScheduledToTheRescuerCanBeCancelled) {
  auto wq = *Workqueue::Create(
      {.name = "reclaim3", .flags = kUnbound | kMemReclaim, .runtime = runtime_.get()});
  fail_spawn_ = true;
  Gate gate;
  std::atomic<int> runs{0};
  Work work([&] {
    if (runs.fetch_add(1) == 0) gate.Wait();
  });
  wq->Queue(&work);
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));  // on the rescuer
  fail_spawn_ = false;
  ASSERT_TRUE(wq->Queue(&work));  // a new worker hands this instance to the rescuer
  ASSERT_TRUE(Eventually([&] { return !absl::StrContains(runtime_->Dump(), " pending=1 "); }));
  std::atomic<bool> returned{false}, cancelled{false};
  std::thread canceller([&] {
    cancelled = wq->Cancel(&work);
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return returned.load(); }));
  gate.Open();
  canceller.join();
  EXPECT_TRUE(cancelled.load());
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// The rescuer takes every work of its workqueue waiting in the worklist at once, onto its
// own list (it looked for each from the worklist's front, O(pending) per rescued work);
// one it holds but has not run yet can still be cancelled, and never runs.
TEST_F(FakeTimeWorkqueueTest, TheRescuerTakesItsWorksAtOnceAndOneItHoldsCanBeCancelled) {
  auto wq = *Workqueue::Create(
      {.name = "reclaim5", .flags = kUnbound | kMemReclaim, .runtime = runtime_.get()});
  fail_spawn_ = true;
  Gate blocker_gate, first_gate;
  std::atomic<bool> blocker_started{false}, first_started{false};
  std::atomic<int> second_runs{0};
  Work blocker([&] {
    blocker_started = true;
    blocker_gate.Wait();
  });
  Work first([&] {
    first_started = true;
    first_gate.Wait();
  });
  Work second([&] { second_runs.fetch_add(1); });
  wq->Queue(&blocker);
  ASSERT_TRUE(Eventually([&] { return blocker_started.load(); }));  // on the rescuer
  wq->Queue(&first);  // both wait in the worklist while the rescuer is held
  wq->Queue(&second);
  blocker_gate.Open();
  ASSERT_TRUE(Eventually([&] { return first_started.load(); }));
  EXPECT_TRUE(Eventually([&] { return !absl::StrContains(runtime_->Dump(), " pending=1 "); }))
      << "the rescuer left `second` in the worklist";
  std::atomic<bool> returned{false}, cancelled{false};
  std::thread canceller([&] {
    cancelled = wq->Cancel(&second);
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return returned.load(); }));
  first_gate.Open();
  canceller.join();
  EXPECT_TRUE(cancelled.load());
  fail_spawn_ = false;
  wq->Flush();
  EXPECT_EQ(second_runs.load(), 0);
}

// A work the rescuer runs may queue itself again during a drain (chained queueing), as
// on any worker; it used to be refused as an outsider.
TEST_F(FakeTimeWorkqueueTest, RescuedWorkMayChainDuringDrain) {
  auto wq = *Workqueue::Create(
      {.name = "reclaim4", .flags = kUnbound | kMemReclaim, .runtime = runtime_.get()});
  fail_spawn_ = true;
  Gate gate;
  std::atomic<int> runs{0};
  std::atomic<bool> chained{false};
  Work* self = nullptr;
  Workqueue* q = wq.get();
  Work work([&] {
    if (runs.fetch_add(1) == 0) {
      gate.Wait();
      chained = q->Queue(self);
    }
  });
  self = &work;
  wq->Queue(&work);
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  std::thread drainer([&] { wq->Drain(); });
  // Fresh probes until one is refused: the drain has begun. (One queued before it waits
  // for the rescuer, which is held, and the drain runs it.)
  std::vector<std::unique_ptr<Work>> probes;
  ASSERT_TRUE(Eventually([&] {
    probes.push_back(std::make_unique<Work>([] {}));
    return !wq->Queue(probes.back().get());
  }));
  gate.Open();
  drainer.join();
  EXPECT_TRUE(chained.load());
  EXPECT_EQ(runs.load(), 2);
  fail_spawn_ = false;
}

TEST_F(FakeTimeWorkqueueTest, RescuerRunsMemReclaimWorkWhenThreadsCannotBeCreated) {
  auto wq = *Workqueue::Create(
      {.name = "reclaim", .flags = kUnbound | kMemReclaim, .runtime = runtime_.get()});
  fail_spawn_ = true;
  std::atomic<bool> ran{false};
  Work work([&] { ran = true; });
  wq->Queue(&work);
  ASSERT_TRUE(Eventually([&] { return ran.load(); }));
  wq->Flush();
  // The rescuer counts the rescue after the work has finished (and Flush may return).
  EXPECT_TRUE(Eventually([&] { return wq->stats().rescued == 1u; }));
  fail_spawn_ = false;
}

// ---- races pinned with the implementation's test hooks (include/kwq/internal/test_hooks.h) ----
// Each window below is a few instructions wide: the test stops one thread inside it at a
// named hook point and runs the other side through it.

using internal::HookPoint;
using internal::WorkAccess;
using testing::PausePoints;

using testing::Parked;

// ModDelayed reads the clock before it takes the work from where it waits: a clock that
// throws (a user's) leaves the work as it was. The clock was read after the work was
// taken, and the throw left it pending on no list (Cancel, Flush and the destructor then
// spun), with a parked timer leaked.
TEST(WorkqueueDelayedTest, AModDelayedWhoseClockThrowsLeavesTheWorkAsItWas) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  auto runtime = *WorkqueueRuntime::Create({.clock = &clock, .timers = timers.get()});
  auto wq = *Workqueue::Create({.name = "mod-clock", .flags = kOrdered, .runtime = runtime.get()});
  HeldWork held;
  ASSERT_TRUE(wq->Queue(&held.work));
  std::atomic<int> runs{0};
  DelayedWork dwork([&] { ++runs; });
  ASSERT_TRUE(wq->QueueDelayed(&dwork, absl::ZeroDuration()));  // parked behind `held`
  ASSERT_TRUE(Parked(&dwork.work()));
  const size_t pending_timers = timers->Pending();
  clock.ThrowNext(1);
  EXPECT_THROW(wq->ModDelayed(&dwork, absl::Seconds(5)), std::runtime_error);
  EXPECT_TRUE(Parked(&dwork.work()));  // still waiting where it was
  EXPECT_EQ(timers->Pending(), pending_timers);
  held.gate.Open();
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// The rescuer tests' runtime: one unbound pool (a 1-CPU topology, every workqueue of
// system scope), whose worker threads cannot be made while `fail_spawn` is set.
struct OnePoolRuntime {
  explicit OnePoolRuntime(Clock* clock = nullptr, TimerService* timers = nullptr)
      : rt(*WorkqueueRuntime::Create(
            {.topology = *Topology::FromSynthetic("pack:1 core:1 pu:1"),
             .clock = clock,
             .timers = timers,
             .cpu_intensive_threshold = absl::Seconds(30),
             .fail_thread_creation = [this] { return fail_spawn.load(); }})) {}
  std::unique_ptr<Workqueue> Make(const char* name, uint32_t flags) {
    return *Workqueue::Create({.name = name,
                               .flags = kUnbound | flags,
                               .affinity_scope = AffinityScope::kSystem,
                               .runtime = rt.get()});
  }
  // Gives the pool its one worker (while spawning works).
  static void Warm(Workqueue* wq) {
    Work warm([] {});
    ASSERT_TRUE(wq->Queue(&warm));
    wq->Flush();
  }

  std::atomic<bool> fail_spawn{false};
  std::unique_ptr<WorkqueueRuntime> rt;
};

// Two kMemReclaim workqueues rescuing one pool at once: an instance scheduled to the first
// rescuer (queued while that rescuer ran it) stays cancellable while the second rescuer
// is in the pool. The pool kept only the latest rescuer, so Cancel could not find the
// instance and spun until the first rescuer ran it, "cancelled" work and all.
TEST(WorkqueueRescuerTest, AnInstanceScheduledToOneOfTwoRescuersIsCancelled) {
  OnePoolRuntime pool;
  auto plain = pool.Make("plain", 0), a = pool.Make("a", kMemReclaim),
       b = pool.Make("b", kMemReclaim);
  OnePoolRuntime::Warm(plain.get());
  pool.fail_spawn = true;
  Gate blocker_gate, blocker2_gate, a_gate, b_gate;
  std::atomic<bool> blocker_in{false}, blocker2_in{false}, b_in{false};
  std::atomic<int> a_runs{0};
  Work blocker([&] {
    BlockingScope blocking;
    blocker_in = true;
    blocker_gate.Wait();
  });
  Work blocker2([&] {
    BlockingScope blocking;
    blocker2_in = true;
    blocker2_gate.Wait();
  });
  Work wa([&] {
    if (a_runs.fetch_add(1) == 0) a_gate.Wait();
  });
  Work wb([&] {
    b_in = true;
    b_gate.Wait();
  });
  auto where = [](Work* w) {
    return static_cast<internal::WorkWhere>(WorkAccess::where(w).load());
  };
  ASSERT_TRUE(plain->Queue(&blocker));
  ASSERT_TRUE(Eventually([&] { return blocker_in.load(); }));  // the worker blocks
  ASSERT_TRUE(a->Queue(&wa));  // no worker can be made: a's rescuer runs it
  ASSERT_TRUE(Eventually([&] { return a_runs.load() == 1; }));
  ASSERT_TRUE(a->Queue(&wa));  // queued while it runs
  blocker_gate.Open();         // the worker hands that instance to a's rescuer, running wa
  ASSERT_TRUE(Eventually([&] { return where(&wa) == internal::WorkWhere::kScheduled; }));
  ASSERT_TRUE(plain->Queue(&blocker2));
  ASSERT_TRUE(Eventually([&] { return blocker2_in.load(); }));  // the worker blocks again
  ASSERT_TRUE(b->Queue(&wb));                                   // b's rescuer enters the same pool
  ASSERT_TRUE(Eventually([&] { return b_in.load(); }));
  std::atomic<int> cancelled{-1};
  std::thread canceller([&] { cancelled = a->Cancel(&wa); });
  const bool returned = Eventually([&] { return cancelled.load() != -1; }, absl::Seconds(2));
  EXPECT_TRUE(returned) << "Cancel could not find the instance scheduled to a's rescuer";
  a_gate.Open();
  canceller.join();
  EXPECT_EQ(cancelled.load(), 1);
  b_gate.Open();
  blocker2_gate.Open();
  a->Flush();
  b->Flush();
  plain->Flush();
  EXPECT_EQ(a_runs.load(), 1);  // the cancelled instance never ran
  pool.fail_spawn = false;
}

// A pool lists the kMemReclaim workqueues with works in its worklist, for a failed spawn
// to ask their rescuers (it walked the worklist for them, on every Queue): works leave
// the list's middle, tail and head, each rescuer is asked again from the rebuilt list,
// and a workqueue with no work left is off it (destroyed, it would be read by the next
// failed spawn's walk: ASan).
TEST(WorkqueueRescuerTest, EveryRescuerWithWorksWaitingIsAskedAndNoneAfter) {
  OnePoolRuntime pool;
  pool.fail_spawn = true;
  constexpr int kQueues = 3;
  auto plain = pool.Make("plain", 0);
  std::vector<std::unique_ptr<Workqueue>> reclaim;
  Gate gates[kQueues];
  std::atomic<bool> in[kQueues] = {};
  std::atomic<int> runs[kQueues] = {};
  std::vector<std::unique_ptr<Work>> held, waiting;
  for (int i = 0; i < kQueues; ++i) {
    reclaim.push_back(pool.Make(absl::StrCat("reclaim", i).c_str(), kMemReclaim));
    held.push_back(std::make_unique<Work>([&, i] {
      in[i] = true;
      gates[i].Wait();
    }));
    waiting.push_back(std::make_unique<Work>([&, i] { runs[i].fetch_add(1); }));
    ASSERT_TRUE(reclaim[i]->Queue(held[i].get()));
    ASSERT_TRUE(Eventually([&] { return in[i].load(); }));  // on its rescuer, held
  }
  // Each waits in the worklist while its rescuer is held; listed 2, 1, 0.
  for (int i = 0; i < kQueues; ++i) ASSERT_TRUE(reclaim[i]->Queue(waiting[i].get()));
  for (int i : {1, 0, 2}) {  // the middle, the tail, the head
    gates[i].Open();
    ASSERT_TRUE(Eventually([&] { return runs[i].load() == 1; })) << i;
  }
  for (int i = 0; i < kQueues; ++i) {  // idle rescuers, asked by each Queue's failed spawn
    ASSERT_TRUE(reclaim[i]->Queue(waiting[i].get()));
    ASSERT_TRUE(Eventually([&] { return runs[i].load() == 2; })) << i;
  }
  for (auto& wq : reclaim) wq->Flush();
  reclaim.clear();
  Work orphan([] {});
  ASSERT_TRUE(plain->Queue(&orphan));  // a failed spawn walks the pool's list
  pool.fail_spawn = false;
  Work kick([] {});
  ASSERT_TRUE(plain->Queue(&kick));  // makes a worker, which runs both
  plain->Flush();
  EXPECT_FALSE(orphan.pending());
}

// Works of two kMemReclaim workqueues wait while the pool's one worker runs a counted
// work (no spawn is tried); then that work blocks, the spawn fails, and both rescuers run
// their works, the second while the first one's work still holds its rescuer. (Fake
// time: no watchdog pass tries again. A failed spawn that asked only the first listed
// rescuer would pass too: the rescuer's start of a work tries to spawn again, and asks
// the next.)
TEST(WorkqueueRescuerTest, ABlockedWorkersFailedSpawnGetsEveryWaitingReclaimWorkRescued) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  OnePoolRuntime pool(&clock, timers.get());
  auto plain = pool.Make("plain", 0), a = pool.Make("a", kMemReclaim),
       b = pool.Make("b", kMemReclaim);
  OnePoolRuntime::Warm(plain.get());
  Gate block, release, b_gate;
  std::atomic<bool> running{false}, a_ran{false}, b_ran{false};
  Work busy([&] {
    running = true;
    block.Wait();
    BlockingScope blocking;
    release.Wait();
  });
  Work wa([&] { a_ran = true; });
  Work wb([&] {  // holds b's rescuer
    b_ran = true;
    b_gate.Wait();
  });
  ASSERT_TRUE(plain->Queue(&busy));
  ASSERT_TRUE(Eventually([&] { return running.load(); }));
  pool.fail_spawn = true;
  ASSERT_TRUE(a->Queue(&wa));  // the worker counts as running: no spawn is tried
  ASSERT_TRUE(b->Queue(&wb));
  EXPECT_FALSE(a_ran.load() || b_ran.load());
  block.Open();  // the worker blocks: one spawn, which fails
  EXPECT_TRUE(Eventually([&] { return a_ran.load() && b_ran.load(); }, absl::Seconds(2)))
      << "a ran: " << a_ran.load() << ", b ran: " << b_ran.load();
  b_gate.Open();
  release.Open();
  pool.fail_spawn = false;
  plain->Flush();
  a->Flush();
  b->Flush();
}

// A completion that finds no work waiting releases its slot and then activates a work
// parked meanwhile by a producer that found the slot taken: at each of the two moments
// a worker holds the slot believing nothing waits (Completed's look, before its release;
// ActivateWaiting's, which reserves the slot again, finds none and releases it), a Queue
// parks its work, and the worker must then activate it. Without Completed's call to
// ActivateWaiting, or without ActivateWaiting's second look, the work waited for the next
// completion: here, for ever.
TEST_F(WorkqueueTest, AWorkParkedWhileACompletionHoldsTheSlotIsActivated) {
  for (HookPoint point :
       {HookPoint::kCompletedFoundNoneWaiting, HookPoint::kActivateFoundNoneWaiting}) {
    SCOPED_TRACE(static_cast<int>(point));
    auto wq = Make({.flags = kOrdered});  // one active slot
    internal::WorkqueueCore* core = WorkAccess::core(wq.get());
    Gate gate;
    std::atomic<bool> running{false};
    std::atomic<int> second_runs{0};
    Work first([&] {
      running = true;
      gate.Wait();
    });
    Work second([&] { ++second_runs; });
    ASSERT_TRUE(wq->Queue(&first));
    ASSERT_TRUE(Eventually([&] { return running.load(); }));
    PausePoints hooks;
    PausePoints::Pause& found_none = hooks.Arm(point, core);
    gate.Open();  // `first` completes; its worker holds the slot, nothing waiting
    ASSERT_TRUE(found_none.WaitPaused());
    ASSERT_TRUE(wq->Queue(&second));
    EXPECT_TRUE(Parked(&second)) << "queued while the slot was held, yet not parked";
    found_none.Resume();
    EXPECT_TRUE(Eventually([&] { return second_runs.load() == 1; }, absl::Seconds(2)))
        << "the parked work was left waiting";
    wq->Cancel(&second);  // a work left waiting would hold up the Flush for ever
    wq->Flush();
  }
}

// Freeze stores frozen_ and then counts the taken slots; a queuer that found the workqueue
// not frozen takes its slot after that count must see the freeze and park the work (it
// used to insert it, and the work started after Freeze had returned).
TEST_F(WorkqueueTest, QueueRacingFreezeParksItsWork) {
  auto wq = Make({.flags = kFreezable});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  PausePoints hooks;
  PausePoints::Pause& reserving = hooks.Arm(HookPoint::kEnqueueWillReserve, core);
  std::thread queuer([&] { EXPECT_TRUE(wq->Queue(&work)); });
  ASSERT_TRUE(reserving.WaitPaused());  // saw the workqueue not frozen, holds no slot yet
  wq->Freeze();                         // no slot taken: returns at once
  reserving.Resume();
  queuer.join();
  EXPECT_TRUE(Parked(&work)) << "a work entered a pool after Freeze returned";
  wq->Thaw();
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// A Queue that took a slot and then saw a Freeze come in between gives the slot back; a
// Freeze waiting for that slot (the last one taken) is signalled then, not left to its
// 1 ms poll: no instance leaves to signal it. Here the Freeze waits for a running work
// and for the transient slot, and the work's completion signals it while the slot is
// still taken.
TEST_F(WorkqueueTest, AFreezeWaitingForASlotGivenBackIsSignalled) {
  auto wq = Make({.flags = kFreezable | kUnbound});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  Gate gate;
  std::atomic<bool> holding{false};
  Work holder([&] {
    BlockingScope blocking;
    holding = true;
    gate.Wait();
  });
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  ASSERT_TRUE(wq->Queue(&holder));
  ASSERT_TRUE(Eventually([&] { return holding.load(); }));
  PausePoints hooks;
  PausePoints::Pause& reserving = hooks.Arm(HookPoint::kEnqueueWillReserve, core);
  std::thread queuer([&] { EXPECT_TRUE(wq->Queue(&work)); });
  ASSERT_TRUE(reserving.WaitPaused());  // saw the workqueue not frozen
  std::thread freezer([&] { wq->Freeze(); });
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFreezeWaits, core));  // for the holder's slot
  PausePoints::Pause& giving_back = hooks.Arm(HookPoint::kReleaseRacingFreeze, core);
  reserving.Resume();
  ASSERT_TRUE(giving_back.WaitPaused());  // took a slot, saw the freeze: about to give it
  gate.Open();
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kInstanceGoneCounted, core));  // the holder is gone
  giving_back.Resume();
  queuer.join();
  freezer.join();
  EXPECT_GE(hooks.Seen(HookPoint::kReleaseRacingFreezeWillSignal, core), 1)
      << "the slot given back did not signal the Freeze waiting for it";
  EXPECT_TRUE(Parked(&work));
  wq->Thaw();
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// The same for a waiting work activated by the producer that parked it: the activation
// reserves its slot after Freeze counted none, and must leave the work parked.
TEST_F(WorkqueueTest, ActivationRacingFreezeLeavesTheWorkParked) {
  auto wq = Make({.flags = kOrdered | kFreezable});  // one slot
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  Gate gate;
  Work holder([&] { gate.Wait(); });
  std::atomic<int> runs{0};
  Work work([&] { ++runs; });
  ASSERT_TRUE(wq->Queue(&holder));  // takes the slot
  PausePoints hooks;
  PausePoints::Pause& activating = hooks.Arm(HookPoint::kActivateWillReserve, core);
  // `work` finds the slot taken, parks, and stops in ActivateWaiting, which saw the
  // workqueue not frozen.
  std::thread queuer([&] { EXPECT_TRUE(wq->Queue(&work)); });
  ASSERT_TRUE(activating.WaitPaused());
  std::thread freezer([&] { wq->Freeze(); });
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFreezeWaits, core));  // frozen; waits for `holder`
  gate.Open();
  freezer.join();  // `holder` finished while frozen: its slot is free and nothing took it
  activating.Resume();
  queuer.join();
  EXPECT_TRUE(Parked(&work)) << "a waiting work was activated after Freeze returned";
  EXPECT_EQ(runs.load(), 0);
  wq->Thaw();
  wq->Flush();
  EXPECT_EQ(runs.load(), 1);
}

// Flush(work) must not return until the worker is done with the Work (clearing its
// running state is the worker's last touch), so that the caller may destroy it next. It
// used to return once done_seq was stored, while the worker was still to write the Work.
TEST_F(WorkqueueTest, FlushWorkWaitsForTheWorkersLastTouch) {
  auto wq = Make({});
  auto work = std::make_unique<Work>([] {});
  PausePoints hooks;
  PausePoints::Pause& releasing = hooks.Arm(HookPoint::kWorkerWillRelease, work.get());
  ASSERT_TRUE(wq->Queue(work.get()));
  ASSERT_TRUE(releasing.WaitPaused());  // the function ran and done_seq is stored
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    EXPECT_TRUE(wq->Flush(work.get()));
    flushed = true;
  });
  // Flush either returns or decides to wait: one of them soon (the limit only bounds a
  // failure).
  ASSERT_TRUE(Eventually(
      [&] { return flushed.load() || hooks.Seen(HookPoint::kFlushWorkWaits, work.get()) > 0; }));
  EXPECT_FALSE(flushed.load()) << "Flush(work) returned while the worker still touches the work";
  releasing.Resume();
  flusher.join();
  work.reset();  // safe now: under ASan a later touch by the worker is a use after free
}

// Dump lists the workqueues while others are created and destroyed: a workqueue listed
// is read before its destructor can free it (ASan checks; Dump used to read the list's
// workqueues after releasing the runtime's lock).
TEST_F(WorkqueueTest, DumpWhileWorkqueuesComeAndGo) {
  std::atomic<bool> stop{false};
  std::thread dumper([&] {
    while (!stop.load()) EXPECT_NE(runtime_->Dump().find("Workqueues"), std::string::npos);
  });
  for (int i = 0; i < 2000; ++i) {
    auto wq = Make({.name = absl::StrCat("come-and-go-", i), .flags = kUnbound});
  }
  stop = true;
  dumper.join();
}

// Drains in progress are counted: the first of two overlapping drains to end must not
// reopen queueing from outside while the other still drains (a flag used to).
TEST_F(WorkqueueTest, OverlappingDrainsRefuseOutsidersUntilTheLastEnds) {
  auto wq = Make({});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  Work outsider([] {});
  PausePoints hooks;
  PausePoints::Pause& first_flushed = hooks.Arm(HookPoint::kDrainFlushed, core);
  std::thread long_drain([&] { wq->Drain(); });
  ASSERT_TRUE(first_flushed.WaitPaused());  // still draining
  wq->Drain();                              // begins and ends inside the other
  EXPECT_FALSE(wq->Queue(&outsider)) << "accepted while a drain was still in progress";
  first_flushed.Resume();
  long_drain.join();
  EXPECT_TRUE(wq->Queue(&outsider));  // accepted once no drain is left
  wq->Flush();
}

// Flush(delayed work) from outside during a drain takes the work off its timer and queues
// it (the drain waits for it too), while a Queue from outside is refused: the kernel's
// flush_delayed_work there WARNs and leaves the work pending on no list, never to run.
TEST_F(WorkqueueTest, FlushOfADelayedWorkDuringADrainStillRunsIt) {
  auto wq = Make({});
  internal::WorkqueueCore* core = WorkAccess::core(wq.get());
  std::atomic<int> ran{0};
  DelayedWork delayed([&] { ran.fetch_add(1); });
  Work outsider([] {});
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Hours(1)));
  PausePoints hooks;
  PausePoints::Pause& flushed = hooks.Arm(HookPoint::kDrainFlushed, core);
  std::thread drain([&] { wq->Drain(); });
  ASSERT_TRUE(flushed.WaitPaused());  // draining
  EXPECT_FALSE(wq->Queue(&outsider));
  EXPECT_TRUE(wq->Flush(&delayed));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(delayed.pending());
  flushed.Resume();
  drain.join();
}

// ~Workqueue must not return while the worker that counted the last instance gone is
// still signalling and unlocking mu_ under the workqueue's lock (the memory goes next).
// A counter takes mu_ when a waiter is listed for its instance's flush color: here a work
// flushing another work (a waiter for every color) made the counter of a newer color's
// instance take that path; the destructor's flush of the older color then ended, the
// instance was counted under mu_, and the drain saw nothing queued without taking mu_.
TEST(WorkqueueHooksTest, DestroyWaitsForTheWorkerSignallingTheLastInstance) {
  // Three per-CPU pools, so the workers below hold different pool locks (the counting
  // worker holds its own across the hooks).
  auto runtime = *WorkqueueRuntime::Create(
      {.topology = *Topology::FromSynthetic("pack:1 core:3 pu:1"), .bind_workers = false});
  const int cpu0 = runtime->topology().cpus()[0].cpu;
  const int cpu1 = runtime->topology().cpus()[1].cpu;
  const int cpu2 = runtime->topology().cpus()[2].cpu;
  auto wq = *Workqueue::Create({.name = "destroy", .runtime = runtime.get()});
  Workqueue* q = wq.get();
  internal::WorkqueueCore* core = WorkAccess::core(q);
  PausePoints hooks;
  Gate chain, release_other;
  Work other([&] { release_other.Wait(); });
  Work last([&] {  // finishes once `first` waits in its Flush of `other` (bounded)
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (hooks.Seen(HookPoint::kFlushWorkWaits, &other) == 0 &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
  });
  Work first([&] {
    chain.Wait();
    EXPECT_TRUE(q->QueueOn(cpu1, &last));  // chained while draining: the newer color
    EXPECT_TRUE(q->Flush(&other));         // a waiter for every color meanwhile
  });
  PausePoints::Pause& will_lock = hooks.Arm(HookPoint::kInstanceGoneWillLock, core);
  PausePoints::Pause& flushed = hooks.Arm(HookPoint::kDrainFlushed, core);
  ASSERT_TRUE(q->QueueOn(cpu2, &other));
  ASSERT_TRUE(q->QueueOn(cpu0, &first));
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    wq.reset();
    destroyed = true;
  });
  // The drain's flush took the next color and waits for `first`'s and `other`'s.
  ASSERT_TRUE(hooks.WaitSeen(HookPoint::kFlushAllWaits, core));
  chain.Open();
  ASSERT_TRUE(will_lock.WaitPaused());  // `last` ran; its counter saw `first` waiting
  release_other.Open();
  ASSERT_TRUE(flushed.WaitPaused());  // `other` and `first` are gone: the flush ended
  PausePoints::Pause& counted = hooks.Arm(HookPoint::kInstanceGoneCounted, core);
  will_lock.Resume();
  ASSERT_TRUE(counted.WaitPaused());  // the last instance counted, mu_ held
  flushed.Resume();                   // the drain sees nothing queued
  // A negative check: the limit can only miss a failure, never report a false one.
  EXPECT_FALSE(Eventually([&] { return destroyed.load(); }, absl::Milliseconds(100)))
      << "~Workqueue returned while a worker still held its lock";
  counted.Resume();
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

// Flush(delayed work) takes the work off its timer and queues it now. A work whose timer
// fired meanwhile is queued already and keeps its place: it used to be taken out of its
// pool and queued again at the back, behind works queued after it.
TEST_F(FakeTimeWorkqueueTest, FlushDelayedRacingItsTimerKeepsTheWorksPlace) {
  auto wq = *Workqueue::Create({.name = "order", .flags = kOrdered, .runtime = runtime_.get()});
  Gate gate;
  std::mutex order_mu;
  std::vector<std::string> order;
  Work holder([&] { gate.Wait(); });
  DelayedWork delayed([&] {
    std::lock_guard<std::mutex> lock(order_mu);
    order.push_back("delayed");
  });
  Work later([&] {
    std::lock_guard<std::mutex> lock(order_mu);
    order.push_back("later");
  });
  ASSERT_TRUE(wq->Queue(&holder));  // takes the one slot
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Seconds(1)));
  PausePoints hooks;
  PausePoints::Pause& grabbing = hooks.Arm(HookPoint::kFlushDelayedWillGrab, &delayed.work());
  bool ran_by_flush_end = false;
  std::thread flusher([&] {
    wq->Flush(&delayed);  // false when the work ran before the flush began to wait
    std::lock_guard<std::mutex> lock(order_mu);
    ran_by_flush_end = !order.empty() && order.front() == "delayed";
  });
  ASSERT_TRUE(grabbing.WaitPaused());  // saw the work on its timer
  clock_.Advance(absl::Seconds(1));    // the timer fires: the work parks behind `holder`
  ASSERT_TRUE(Eventually([&] { return Parked(&delayed.work()); }));
  ASSERT_TRUE(wq->Queue(&later));  // parks behind it
  grabbing.Resume();
  gate.Open();
  flusher.join();
  EXPECT_TRUE(ran_by_flush_end);
  wq->Flush();
  EXPECT_EQ(order, (std::vector<std::string>{"delayed", "later"}));
}

// Flush(delayed work) called while its timer moves it into a pool (taken off the timer,
// not yet queued) waits for that instance to run. It used to read the instance number
// from before the queueing and return at once.
TEST_F(FakeTimeWorkqueueTest, FlushDelayedWhileItsTimerQueuesItWaitsForTheRun) {
  auto wq = *Workqueue::Create({.name = "fd", .flags = kUnbound, .runtime = runtime_.get()});
  std::atomic<int> runs{0};
  DelayedWork delayed([&] { runs.fetch_add(1); });
  ASSERT_TRUE(wq->QueueDelayed(&delayed, absl::Seconds(1)));
  PausePoints hooks;
  PausePoints::Pause& took = hooks.Arm(HookPoint::kTimerTookWork, &delayed.work());
  std::thread advancer([&] { clock_.Advance(absl::Seconds(1)); });
  EXPECT_TRUE(took.WaitPaused());
  std::atomic<bool> started{false}, returned{false};
  std::atomic<int> runs_at_return{-1};
  std::thread flusher([&] {
    started = true;
    wq->Flush(&delayed);
    runs_at_return = runs.load();
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return started.load(); }));
  // A negative check: it can only miss a failure.
  EXPECT_FALSE(Eventually([&] { return returned.load(); }, absl::Milliseconds(20)))
      << "Flush returned while the work was between its timer and its pool";
  took.Resume();
  flusher.join();
  advancer.join();
  EXPECT_EQ(runs_at_return.load(), 1) << "Flush returned before the instance had run";
}

// CancelSync and ModDelayed find a delayed work's timer firing: the service has let go of
// it and TimerFired has yet to queue the work. They must wait for the work to reach its
// pool and take it back there: CancelSync then reports it pending and it never runs;
// ModDelayed reports it pending and it runs once, at the new time. An ordered workqueue
// whose slot `holder` keeps parks the work where it lands, so no worker can run it first.
class TimerFiringRaceTest : public FakeTimeWorkqueueTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(wq_->Queue(&holder_));  // takes the one slot
    ASSERT_TRUE(wq_->QueueDelayed(&delayed_, absl::Seconds(1)));
  }
  void TearDown() override {
    gate_.Open();
    wq_->Flush();
  }
  // Fires the timer on its own thread and stops it before it queues the work; runs
  // `call` on another thread until it has found the timer firing; lets the call go on
  // until it returns or finds the timer firing once more (it must wait for the work to
  // leave the timer: a call that took the work from the firing timer and re-armed it
  // first would be queued by the old firing too); then lets the timer go and returns
  // what `call` returned.
  bool RaceTheFiring(const std::function<bool()>& call) {
    PausePoints hooks;
    Work* w = &delayed_.work();
    PausePoints::Pause& firing = hooks.Arm(HookPoint::kTimerWillQueue, w);
    PausePoints::Pause& found = hooks.Arm(HookPoint::kGrabFoundFiring, w);
    std::thread advancer([&] { clock_.Advance(absl::Seconds(1)); });
    EXPECT_TRUE(firing.WaitPaused());
    std::atomic<int> result{-1};
    std::thread caller([&] { result = call() ? 1 : 0; });
    EXPECT_TRUE(found.WaitPaused()) << "the call did not find the timer firing";
    found.Resume();
    EXPECT_TRUE(Eventually(
        [&] { return result.load() != -1 || hooks.Seen(HookPoint::kGrabFoundFiring, w) >= 2; }));
    firing.Resume();
    caller.join();
    advancer.join();
    return result.load() == 1;
  }

  std::unique_ptr<Workqueue> wq_ =
      *Workqueue::Create({.name = "fire", .flags = kOrdered, .runtime = runtime_.get()});
  Gate gate_;
  Work holder_{[this] { gate_.Wait(); }};
  std::atomic<int> runs_{0};
  DelayedWork delayed_{[this] { runs_.fetch_add(1); }};
};

TEST_F(TimerFiringRaceTest, CancelSyncTakesTheWorkBack) {
  EXPECT_TRUE(RaceTheFiring([&] { return wq_->CancelSync(&delayed_); }));
  EXPECT_FALSE(delayed_.work().pending());
  gate_.Open();
  wq_->Flush();
  EXPECT_EQ(runs_.load(), 0);
}

TEST_F(TimerFiringRaceTest, ModDelayedRunsTheWorkOnceAtTheNewTime) {
  EXPECT_TRUE(RaceTheFiring([&] { return wq_->ModDelayed(&delayed_, absl::Seconds(5)); }));
  EXPECT_TRUE(delayed_.work().pending());
  gate_.Open();
  wq_->Flush();
  EXPECT_EQ(runs_.load(), 0);  // not at the old time
  clock_.Advance(absl::Seconds(5) - absl::Nanoseconds(1));
  wq_->Flush();
  EXPECT_EQ(runs_.load(), 0);
  clock_.Advance(absl::Nanoseconds(1));
  ASSERT_TRUE(Eventually([&] { return runs_.load() == 1; }));
  wq_->Flush();
  EXPECT_EQ(runs_.load(), 1);
}

}  // namespace
}  // namespace kwq
