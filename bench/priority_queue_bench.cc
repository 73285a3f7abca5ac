// PriorityQueue microbenchmarks: a backlog of 1,000,000 items with random priorities in
// [0, 10) drained by two workers (ns per item, the add and drain phases apart), and the
// single-thread Add + Get + Done cycle, on an otherwise empty queue and behind a backlog
// of 1,000,000 ready items. The FIFO Queue runs the same backlog for comparison. Adds
// whose priorities are all distinct (a level and group each). And pc_2w's shape: a
// producer adding while two workers take, with one or two of them polling at length.

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kwq/priority_queue.h"
#include "kwq/queue.h"
#include "kwq/rate_limiter.h"

namespace kwq {
namespace {

constexpr int64_t kItems = 1'000'000;

std::vector<int> RandomPriorities(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> priority(0, 9);
  std::vector<int> out(n);
  for (int& p : out) p = priority(rng);
  return out;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

void ReportPerItem(benchmark::State& state, double add_s, double drain_s) {
  const double items = static_cast<double>(state.iterations()) * kItems;
  state.counters["add_ns/item"] = add_s * 1e9 / items;
  state.counters["drain_ns/item"] = drain_s * 1e9 / items;
  state.counters["ns/item"] = (add_s + drain_s) * 1e9 / items;
  state.SetItemsProcessed(static_cast<int64_t>(items));
}

// Adds kItems items with `add(q, i)`, then two workers Get + Done until the queue is
// empty (ShutDownWithDrain returns). Manual time: add + drain.
template <typename MakeQueue, typename AddItem>
void AddAllThenDrain2Workers(benchmark::State& state, MakeQueue make_queue, AddItem add) {
  double add_s = 0, drain_s = 0;
  for (auto _ : state) {
    auto q = make_queue();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kItems; ++i) add(*q, i);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&] {
        while (auto lease = q->Get()) benchmark::DoNotOptimize(lease->item());
      });
    }
    q->ShutDownWithDrain();
    const auto t2 = std::chrono::steady_clock::now();
    for (auto& w : workers) w.join();
    add_s += Seconds(t1 - t0);
    drain_s += Seconds(t2 - t1);
    state.SetIterationTime(Seconds(t2 - t0));
  }
  ReportPerItem(state, add_s, drain_s);
}

// 1,000,000 items with random priorities.
void BM_PriorityQueue_AddAllThenDrain2Workers(benchmark::State& state) {
  const std::vector<int> priorities = RandomPriorities(kItems, 1);
  AddAllThenDrain2Workers(
      state, [] { return *PriorityQueue<int64_t>::Create(); },
      [&](PriorityQueue<int64_t>& q, int64_t i) { q.Add(i, {.priority = priorities[i]}); });
}
BENCHMARK(BM_PriorityQueue_AddAllThenDrain2Workers)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

// The same with the FIFO Queue (no priorities), for comparison.
void BM_Queue_AddAllThenDrain2Workers(benchmark::State& state) {
  AddAllThenDrain2Workers(
      state, [] { return std::make_unique<Queue<int64_t>>(); },
      [](Queue<int64_t>& q, int64_t i) { q.Add(i); });
}
BENCHMARK(BM_Queue_AddAllThenDrain2Workers)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

// pc_2w on a PriorityQueue: two workers Get + Done while the main thread adds 200,000
// items (random priorities in [0, 10)), then ShutDownWithDrain. The argument is
// QueueOptions::polling_workers: how many idle Gets poll at length before they sleep.
void BM_PriorityQueue_ProducerTwoWorkers(benchmark::State& state) {
  constexpr int64_t kAdds = 200'000;
  const std::vector<int> priorities = RandomPriorities(kAdds, 2);
  for (auto _ : state) {
    PriorityQueue<int64_t>::Options options;
    options.polling_workers = static_cast<int>(state.range(0));
    auto q = *PriorityQueue<int64_t>::Create(std::move(options));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&] {
        while (auto lease = q->Get()) benchmark::DoNotOptimize(lease->item());
      });
    }
    for (int64_t i = 0; i < kAdds; ++i) q->Add(i, {.priority = priorities[i]});
    q->ShutDownWithDrain();
    for (auto& w : workers) w.join();
    state.SetIterationTime(Seconds(std::chrono::steady_clock::now() - t0));
  }
  state.counters["ns/item"] =
      benchmark::Counter(static_cast<double>(kAdds), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}
BENCHMARK(BM_PriorityQueue_ProducerTwoWorkers)
    ->ArgName("polling_workers")
    ->Arg(1)
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Options for the single-thread cycles: 0 plain, 1 with 16 fairness groups, 2 with aging.
PriorityQueue<int64_t>::Options CycleOptions(int64_t mode) {
  PriorityQueue<int64_t>::Options options;
  if (mode == 1) options.group = [](const int64_t& k) { return static_cast<uint64_t>(k % 16); };
  if (mode == 2) options.aging = absl::Seconds(1);
  return options;
}

// One thread: Add (random priority, 1024 distinct keys), Get, Done, on an empty queue.
void BM_PriorityQueue_AddGetDone(benchmark::State& state) {
  auto q = *PriorityQueue<int64_t>::Create(CycleOptions(state.range(0)));
  const std::vector<int> priorities = RandomPriorities(1 << 16, 2);
  size_t i = 0;
  for (auto _ : state) {
    q->Add(static_cast<int64_t>(i & 1023), {.priority = priorities[i & 0xffff]});
    q->Get()->Done();
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PriorityQueue_AddGetDone)->ArgName("mode")->Arg(0)->Arg(1)->Arg(2);

// The same behind a backlog of 1,000,000 ready items: every op adds a new key and hands
// out the best one, so the queue stays at 1,000,000 (the O(log n) cost).
void BM_PriorityQueue_AddGetDone_Backlog1M(benchmark::State& state) {
  auto q = *PriorityQueue<int64_t>::Create(CycleOptions(state.range(0)));
  const std::vector<int> priorities = RandomPriorities(1 << 20, 3);
  for (int64_t i = 0; i < kItems; ++i) q->Add(i, {.priority = priorities[i & 0xfffff]});
  int64_t next = kItems;
  for (auto _ : state) {
    q->Add(next, {.priority = priorities[next & 0xfffff]});
    q->Get()->Done();
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PriorityQueue_AddGetDone_Backlog1M)->ArgName("mode")->Arg(0)->Arg(1)->Arg(2);

// The ratelimited scenario's loop on a PriorityQueue: 1,000,000 string keys, one thread
// Gets each, retries it (AddRateLimited, ExponentialFailure(1 us, 1 ms)) until it has
// failed three times, then Forgets it. ns per reconcile (4 per key).
void BM_PriorityQueue_RateLimitedReconcile1M(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<std::string> keys;
    keys.reserve(kItems);
    for (int64_t i = 0; i < kItems; ++i) keys.push_back(absl::StrCat("default/object-", i));
    PriorityQueue<std::string>::Options options;
    options.rate_limiter = *ExponentialFailureRateLimiter<std::string>::Create(
        {.base = absl::Microseconds(1), .max = absl::Milliseconds(1)});
    auto q = *PriorityQueue<std::string>::Create(std::move(options));
    state.ResumeTiming();
    q->AddAll(std::move(keys));
    int64_t forgotten = 0;
    while (forgotten < kItems) {
      auto lease = q->Get();
      const std::string& key = lease->item();
      if (q->NumRequeues(key) < 3) {
        q->AddRateLimited(key);
      } else {
        q->Forget(key);
        ++forgotten;
      }
    }
  }
  state.counters["ns/reconcile"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 4 * kItems,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PriorityQueue_RateLimitedReconcile1M)->Unit(benchmark::kMillisecond)->Iterations(1);

// Items with a priority each (timestamps, hashes as priorities): `n` adds, each to a
// level and group of its own, ready (mode 0) or delayed an hour (mode 1, each pinning
// its group until due), then dropped by a shutdown. ns per add: should not grow with n
// (a review found both cases quadratic: exact vector reserves, and sweeps that rescanned
// the pinned groups on every new group).
void BM_PriorityQueue_DistinctPriorities(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool delayed = state.range(1) != 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto q = *PriorityQueue<int64_t>::Create();
    state.ResumeTiming();
    for (int64_t i = 0; i < n; ++i) {
      q->Add(i, {.priority = static_cast<int>(i),
                 .after = delayed ? absl::Hours(1) : absl::ZeroDuration()});
    }
    state.PauseTiming();
    q.reset();
    state.ResumeTiming();
  }
  state.counters["ns/add"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PriorityQueue_DistinctPriorities)
    ->ArgNames({"n", "delayed"})
    ->ArgsProduct({{10'000, 80'000}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// Destroying a PriorityQueue with 1,000,000 keys delayed an hour, and shutting one down
// (range(0) = 1: ShutDown first, which lists the dropped keys idle and evicts those beyond
// the idle allowance; the destructor frees the table whole instead, as a DelayingQueue's
// does: queue_bench's BM_DelayingQueueDropsWaitingKeys).
void BM_PriorityQueue_DestroyWithDelayed1M(benchmark::State& state) {
  std::vector<std::string> keys;
  for (int i = 0; i < 1'000'000; ++i) keys.push_back(absl::StrCat("default/object-", i));
  for (auto _ : state) {
    state.PauseTiming();
    auto q = *kwq::PriorityQueue<std::string>::Create();
    for (const auto& k : keys) q->AddAfter(k, absl::Hours(1));
    state.ResumeTiming();
    if (state.range(0) == 1) q->ShutDown();
    q.reset();
  }
  state.SetLabel(state.range(0) == 1 ? "ShutDown, then destroy" : "destroy");
}
BENCHMARK(BM_PriorityQueue_DestroyWithDelayed1M)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kwq
