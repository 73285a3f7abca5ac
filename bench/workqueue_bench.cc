// Workqueue costs that kwq-scenarios' wq_* scenarios (the peers' comparison) do not show.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "benchmark/benchmark.h"
#include "kwq/topology.h"
#include "kwq/workqueue.h"

namespace kwq {
namespace {

// Queue + Flush of one short work, while range(0) other threads wait in Flush of a long
// work on the same workqueue. Every completion used to wake every waiter of the
// workqueue (each then took the workqueue's lock again to find the instance was not
// its own): about 250 us per short work with 32 waiters against 20 with none.
void BM_FlushWithOtherFlushersWaiting(benchmark::State& state) {
  auto wq = *Workqueue::Create({.name = "flush_bench", .flags = kUnbound});
  std::atomic<bool> release{false};
  absl::Notification started;
  Work long_work([&] {
    BlockingScope blocking;
    started.Notify();
    while (!release.load(std::memory_order_acquire)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  wq->Queue(&long_work);
  started.WaitForNotification();
  std::vector<std::thread> waiters;
  for (int64_t i = 0; i < state.range(0); ++i) {
    waiters.emplace_back([&] { wq->Flush(&long_work); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let them wait
  Work short_work([] {});
  for (auto _ : state) {
    wq->Queue(&short_work);
    wq->Flush(&short_work);
  }
  release.store(true, std::memory_order_release);
  for (auto& t : waiters) t.join();
  wq->Flush(&long_work);
}
BENCHMARK(BM_FlushWithOtherFlushersWaiting)
    ->Arg(0)
    ->Arg(8)
    ->Arg(32)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Queue of one short work, then Flush() of the whole workqueue, on one worker of an
// unbound pool. The worker counted the instance gone after reading the waiter count, so a
// Flush that listed itself in between missed the count and slept to its 1 ms poll; now
// finding no waiter and counting are one compare-and-swap (docs/workqueues.md).
// Counter slow_per_1000: the rounds of 900 us or more (a missed count, or the machine
// stopping a thread), per 1,000.
void BM_QueueThenFlushAll(benchmark::State& state) {
  auto wq = *Workqueue::Create({.name = "flush_all_bench", .flags = kUnbound});
  Work work([] {});
  int64_t slow = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    wq->Queue(&work);
    wq->Flush();
    slow += std::chrono::steady_clock::now() - start >= std::chrono::microseconds(900);
  }
  state.counters["slow_per_1000"] = 1000.0 * static_cast<double>(slow) /
                                    static_cast<double>(std::max<int64_t>(state.iterations(), 1));
}
BENCHMARK(BM_QueueThenFlushAll)->UseRealTime()->Unit(benchmark::kMicrosecond);

// A runtime on `topology` whose worker threads cannot be made until Finish.
struct SpawnFailing {
  explicit SpawnFailing(std::shared_ptr<const Topology> topology)
      : runtime(
            *WorkqueueRuntime::Create({.topology = std::move(topology),
                                       .bind_workers = false,
                                       .fail_thread_creation = [this] { return fail.load(); }})) {}
  // Lets workers be made again, runs what `wqs` (made on `runtime`, in its one pool) hold,
  // and destroys them and the runtime.
  void Finish(std::vector<std::unique_ptr<Workqueue>>* wqs) {
    fail = false;
    Work kick([] {});  // its Queue makes a worker now, not at the watchdog's next pass
    wqs->front()->Queue(&kick);
    for (auto& wq : *wqs) wq->Flush();
    wqs->clear();
    runtime.reset();
  }

  std::atomic<bool> fail{true};
  std::unique_ptr<WorkqueueRuntime> runtime;
};

// Queue of 2,048 works on each of range(0) workqueues sharing one pool (their max_active,
// so all of them go to the pool's worklist) while no worker thread can be made (the
// runtime's fail_thread_creation), with no kMemReclaim workqueue to ask for rescue. Each
// Queue walked the pool's whole worklist looking for rescuers to ask: O(pending) per
// Queue. The works run once spawning works again (not timed).
void BM_QueueWhileSpawningFails(benchmark::State& state) {
  constexpr int kPerWorkqueue = 2048;
  auto topology = *Topology::FromSynthetic("core:1 pu:1");
  std::vector<std::unique_ptr<Work>> works;
  for (int64_t i = 0; i < kPerWorkqueue * state.range(0); ++i) {
    works.push_back(std::make_unique<Work>([] {}));
  }
  for (auto _ : state) {
    state.PauseTiming();
    SpawnFailing spawning(topology);  // a runtime with no worker yet, each time
    std::vector<std::unique_ptr<Workqueue>> wqs;
    for (int64_t i = 0; i < state.range(0); ++i) {
      wqs.push_back(*Workqueue::Create({.name = "spawn_fails",
                                        .flags = kUnbound,
                                        .max_active = kPerWorkqueue,
                                        .runtime = spawning.runtime.get()}));
    }
    state.ResumeTiming();
    for (size_t i = 0; i < works.size(); ++i) wqs[i % wqs.size()]->Queue(works[i].get());
    state.PauseTiming();
    spawning.Finish(&wqs);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * works.size());
}
BENCHMARK(BM_QueueWhileSpawningFails)
    ->Arg(1)
    ->Arg(4)
    ->Iterations(200)  // each sets up a runtime, untimed
    ->Unit(benchmark::kMillisecond);

// Queue of 2,048 works while no worker thread can be made, with range(0) works of other
// workqueues already pending ahead of one work of a kMemReclaim workqueue whose rescuer is
// held (every workqueue at 2,048 works, its max_active, so that all are in the pool's
// worklist). Each Queue's failed spawn walked the worklist up to that work to find the
// rescuers to ask (O(pending)); the pool now lists the workqueues to ask.
void BM_QueueWhileSpawningFailsBehindARescuersWork(benchmark::State& state) {
  constexpr int kPerWorkqueue = 2048;
  const int64_t ahead = state.range(0);
  auto topology = *Topology::FromSynthetic("core:1 pu:1");
  std::vector<std::unique_ptr<Work>> works;
  for (int64_t i = 0; i < ahead + kPerWorkqueue; ++i) {
    works.push_back(std::make_unique<Work>([] {}));
  }
  for (auto _ : state) {
    state.PauseTiming();
    SpawnFailing spawning(topology);
    std::vector<std::unique_ptr<Workqueue>> plain;
    for (int64_t i = 0; i < ahead / kPerWorkqueue + 1; ++i) {
      plain.push_back(*Workqueue::Create({.name = "plain",
                                          .flags = kUnbound,
                                          .max_active = kPerWorkqueue,
                                          .runtime = spawning.runtime.get()}));
    }
    auto reclaim = *Workqueue::Create(
        {.name = "reclaim", .flags = kUnbound | kMemReclaim, .runtime = spawning.runtime.get()});
    std::atomic<bool> go{false}, held{false};
    Work gate([&] {  // holds the rescuer
      held = true;
      while (!go.load()) std::this_thread::yield();
    });
    Work last([] {});
    reclaim->Queue(&gate);
    while (!held.load()) std::this_thread::yield();
    for (int64_t i = 0; i < ahead; ++i) plain[i / kPerWorkqueue]->Queue(works[i].get());
    reclaim->Queue(&last);  // waits behind them while the rescuer is held
    state.ResumeTiming();
    for (int64_t i = ahead; i < ahead + kPerWorkqueue; ++i) plain.back()->Queue(works[i].get());
    state.PauseTiming();
    go = true;
    plain.push_back(std::move(reclaim));
    spawning.Finish(&plain);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kPerWorkqueue);
}
BENCHMARK(BM_QueueWhileSpawningFailsBehindARescuersWork)
    ->Arg(2048)
    ->Arg(8192)
    ->Iterations(100)  // each sets up a runtime, untimed
    ->Unit(benchmark::kMillisecond);

// While no worker thread can be made, a kMemReclaim workqueue's rescuer runs 1,000 of its
// works queued behind range(0) works of other workqueues that cannot run (one pool). It
// looked for each of its works from the worklist's front, passing the stuck ones every
// time. Timed from the first rescued work's release to the last one's end.
void BM_RescueBehindStuckWorks(benchmark::State& state) {
  constexpr int kRescued = 1000;
  constexpr int kPerWorkqueue = 2048;
  auto topology = *Topology::FromSynthetic("core:1 pu:1");
  for (auto _ : state) {
    state.PauseTiming();
    SpawnFailing spawning(topology);
    std::vector<std::unique_ptr<Workqueue>> plain;
    std::vector<std::unique_ptr<Work>> stuck;
    for (int64_t i = 0; i < state.range(0); ++i) {
      if (i % kPerWorkqueue == 0) {
        plain.push_back(*Workqueue::Create({.name = "stuck",
                                            .flags = kUnbound,
                                            .max_active = kPerWorkqueue,
                                            .runtime = spawning.runtime.get()}));
      }
      stuck.push_back(std::make_unique<Work>([] {}));
      plain.back()->Queue(stuck.back().get());
    }
    auto reclaim = *Workqueue::Create({.name = "reclaim",
                                       .flags = kUnbound | kMemReclaim,
                                       .max_active = kPerWorkqueue,
                                       .runtime = spawning.runtime.get()});
    std::atomic<int> ran{0};
    std::atomic<bool> go{false};
    Work gate([&] {  // holds the rescuer until all are queued
      while (!go.load()) std::this_thread::yield();
      ran.fetch_add(1);
    });
    reclaim->Queue(&gate);
    std::vector<std::unique_ptr<Work>> rescued;
    for (int i = 1; i < kRescued; ++i) {
      rescued.push_back(std::make_unique<Work>([&ran] { ran.fetch_add(1); }));
      reclaim->Queue(rescued.back().get());
    }
    state.ResumeTiming();
    go = true;
    while (ran.load() < kRescued) std::this_thread::yield();
    state.PauseTiming();
    plain.push_back(std::move(reclaim));
    spawning.Finish(&plain);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kRescued);
}
BENCHMARK(BM_RescueBehindStuckWorks)
    ->Arg(2048)
    ->Arg(8192)
    ->Iterations(50)  // each sets up a runtime, untimed
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kwq
