// Queue microbenchmarks: per-operation costs, the cost of metrics (none vs a provider
// whose metrics do nothing vs one that counts), and sharded vs single queues.
// Results and the command that produced them: docs/benchmarks.md.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kwq/delaying_queue.h"
#include "kwq/internal/indexed_heap.h"
#include "kwq/queue.h"
#include "kwq/rate_limiting_queue.h"
#include "kwq/sharded_queue.h"
#include "nop_metrics.h"
#include "testing/not_counting.h"

namespace kwq {
namespace {

std::vector<std::string> Keys(int n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (int i = 0; i < n; ++i) keys.push_back(absl::StrCat("default/object-", i));
  return keys;
}

// fifo_1t's loop as a microbenchmark: Add 100,000 distinct keys, then Get+Done each.
// Arg: 0 = no MetricsProvider (the default), 1 = a provider whose metrics do nothing.
void BM_Fifo100k(benchmark::State& state) {
  const std::vector<std::string> keys = Keys(100'000);
  NopProvider provider;
  QueueOptions options;
  if (state.range(0) == 1) options.metrics = &provider;
  for (auto _ : state) {
    Queue<std::string> q(options);
    for (const auto& k : keys) q.Add(k);
    while (auto lease = q.TryGet()) {
    }
  }
  state.SetItemsProcessed(state.iterations() * keys.size());
  state.SetLabel(state.range(0) == 0 ? "no metrics" : "nop metrics provider");
}
BENCHMARK(BM_Fifo100k)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// One key, Add + TryGet + Done: the per-item cost without cache misses. Through a
// DelayingQueue with nothing waiting too (a controller's Add path: the delaying queue
// first checks for a waiting entry to remove, under its lock).
template <typename Q>
void AddGetDoneHot(benchmark::State& state) {
  Q q;
  const std::string key = "default/object-1";
  for (auto _ : state) {
    q.Add(key);
    q.TryGet();
  }
}
void BM_AddGetDoneHot(benchmark::State& state) { AddGetDoneHot<Queue<std::string>>(state); }
BENCHMARK(BM_AddGetDoneHot);
void BM_DelayingAddGetDoneHot(benchmark::State& state) {
  AddGetDoneHot<DelayingQueue<std::string>>(state);
}
BENCHMARK(BM_DelayingAddGetDoneHot);

// A reconcile that fails and retries at once, on one key: Get, NumRequeues,
// AddRateLimited(lease->item()) with a zero delay (ExponentialFailure(0, 0)), Done.
// Arg: 1 = the queue keeps the failure count (the built-in limiters), 0 = the limiter
// does, called with the item (testing::NotCounting, as for a user limiter).
void BM_RetryLeasedItemHot(benchmark::State& state) {
  std::unique_ptr<RateLimiter<std::string>> limiter =
      std::move(*ExponentialFailureRateLimiter<std::string>::Create(
          {.base = absl::ZeroDuration(), .max = absl::ZeroDuration()}));
  if (state.range(0) == 0) {
    limiter = std::make_unique<testing::NotCounting<std::string>>(std::move(limiter));
  }
  RateLimitingQueue<std::string> q(std::move(limiter));
  q.Add("default/object-1");
  int64_t requeues = 0;
  for (auto _ : state) {
    auto lease = q.TryGet();
    requeues += q.NumRequeues(lease->item());
    q.AddRateLimited(lease->item());
  }
  benchmark::DoNotOptimize(requeues);
}
BENCHMARK(BM_RetryLeasedItemHot)->Arg(1)->Arg(0);

// A deduplicated Add (the key is already waiting).
void BM_AddDuplicate(benchmark::State& state) {
  Queue<std::string> q;
  const std::string key = "default/object-1";
  q.Add(key);
  for (auto _ : state) benchmark::DoNotOptimize(q.Add(key));
}
BENCHMARK(BM_AddDuplicate);

void BM_AddAfterCancelAfter(benchmark::State& state) {
  DelayingQueue<std::string> q;
  const std::string key = "default/object-1";
  for (auto _ : state) {
    q.AddAfter(key, absl::Hours(1));
    q.CancelAfter(key);
  }
}
BENCHMARK(BM_AddAfterCancelAfter);

// The real clock's time, as a manual clock that takes observers without ever telling
// them of a move: a timer service on it has no thread and never fires.
class RealTimeUnheardClock final : public Clock {
 public:
  absl::Time Now() const override { return RealClock::Default()->Now(); }
  void SleepUntil(absl::Time) override {}
  bool is_manual() const override { return true; }
  bool AddObserver(ClockObserver*) override { return true; }
  void RemoveObserver(ClockObserver*) override {}
};

// The delay scenario's producer alone: AddAfter of 200,000 distinct keys with delays
// spread over [1 s, 2 s), no consumer and no timer firing (the timer service never
// fires: RealTimeUnheardClock). What is left of `delay`'s ns_per_addafter once the other
// threads are taken away.
void BM_AddAfterDistinct(benchmark::State& state) {
  const std::vector<std::string> keys = Keys(200'000);
  RealTimeUnheardClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<std::string> copy = keys;
    auto q = std::make_unique<DelayingQueue<std::string>>(
        QueueOptions{.clock = &clock, .timers = timers.get()});
    state.ResumeTiming();
    uint64_t x = 88172645463325252ull;
    for (auto& k : copy) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      q->AddAfter(std::move(k), absl::Seconds(1) + absl::Microseconds(x % 1'000'000));
    }
    state.PauseTiming();
    q.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * keys.size());
}
BENCHMARK(BM_AddAfterDistinct)->Unit(benchmark::kMillisecond);

// Destroying a DelayingQueue with 1,000,000 keys waiting an hour, and shutting one down
// (range(0) = 1: ShutDown first, which evicts the dropped keys beyond the idle allowance;
// the destructor frees the table whole instead).
void BM_DelayingQueueDropsWaitingKeys(benchmark::State& state) {
  const std::vector<std::string> keys = Keys(1'000'000);
  for (auto _ : state) {
    state.PauseTiming();
    auto q = std::make_unique<DelayingQueue<std::string>>();
    for (const auto& k : keys) q->AddAfter(k, absl::Hours(1));
    state.ResumeTiming();
    if (state.range(0) == 1) q->ShutDown();
    q.reset();
  }
  state.SetLabel(state.range(0) == 1 ? "ShutDown, then destroy" : "destroy");
}
BENCHMARK(BM_DelayingQueueDropsWaitingKeys)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// One worker whose home shard is empty steals 20,000 items that all sit in the shard its
// scan reaches last (range(0) shards): the scan looks at every other shard per item.
void BM_ShardedStealFromTheFarShard(benchmark::State& state) {
  const int shards = static_cast<int>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    auto q = *ShardedQueue<int>::Create(shards);
    int target = -1;
    for (int key = 0, added = 0; added < 20'000; ++key) {
      const int s = q->ShardOf(key);
      if (target < 0) target = s;
      if (s == target) added += q->Add(key) ? 1 : 0;
    }
    state.ResumeTiming();
    while (auto lease = q->TryGet((target + 1) % shards)) {
    }
  }
  state.SetItemsProcessed(state.iterations() * 20'000);
}
BENCHMARK(BM_ShardedStealFromTheFarShard)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);

// AddAll of a batch of range(1) keys into a ShardedQueue of range(0) shards, taken out
// again after each call (outside the timing): grouping the batch by shard cost O(shards)
// per call (a vector per shard) until the batch's shard numbers were sorted instead.
void BM_ShardedAddAll(benchmark::State& state) {
  const int shards = static_cast<int>(state.range(0));
  const int batch = static_cast<int>(state.range(1));
  auto q = *ShardedQueue<std::string>::Create(shards);
  const std::vector<std::string> keys = Keys(batch);
  for (auto _ : state) {
    q->AddAll(keys);
    state.PauseTiming();
    while (auto lease = q->TryGet(0)) {
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_ShardedAddAll)
    ->Args({16, 2})
    ->Args({256, 2})
    ->Args({4096, 2})
    ->Args({16, 10'000})
    ->Args({4096, 10'000});

// Two workers drain 200,000 keys added up front: one shared Queue vs a 2-shard
// ShardedQueue (each worker owns a shard and steals when it runs dry).
void BM_TwoWorkersDrain(benchmark::State& state) {
  const std::vector<std::string> keys = Keys(200'000);
  const bool sharded = state.range(0) == 1;
  for (auto _ : state) {
    state.PauseTiming();
    Queue<std::string> single;
    auto multi = *ShardedQueue<std::string>::Create(2);
    for (const auto& k : keys) sharded ? multi->Add(k) : single.Add(k);
    state.ResumeTiming();
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&, w] {
        if (sharded) {
          while (auto lease = multi->TryGet(w)) {
          }
        } else {
          while (auto lease = single.TryGet()) {
          }
        }
      });
    }
    for (auto& t : workers) t.join();
  }
  state.SetItemsProcessed(state.iterations() * keys.size());
  state.SetLabel(sharded ? "ShardedQueue(2)" : "Queue");
}
BENCHMARK(BM_TwoWorkersDrain)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// One key through a 4-shard ShardedQueue, Add + TryGet(worker) + Done: the per-item cost
// of the shard choice on top of Queue's (BM_AddGetDoneHot), worker 0 taking from the key's
// own shard or stealing it.
void BM_ShardedAddGetDoneHot(benchmark::State& state) {
  auto q = *ShardedQueue<std::string>::Create(4);
  const std::string key = "default/object-1";
  const int worker = state.range(0) == 0 ? q->ShardOf(key) : (q->ShardOf(key) + 1) % 4;
  for (auto _ : state) {
    q->Add(key);
    q->TryGet(worker);
  }
  state.SetLabel(state.range(0) == 0 ? "own shard" : "stolen");
}
BENCHMARK(BM_ShardedAddGetDoneHot)->Arg(0)->Arg(1);

// The delay scenario's waiting heap alone: 200,000 pushes of random ready times into a
// fresh IndexedHeap, which grows (and first touches its pages) on the way; the heap is
// destroyed outside the timing. How fast it grows is what PodVector's realloc changed
// (docs/design.md, "Waiting items' heap grows with realloc").
void BM_IndexedHeapPushFresh(benchmark::State& state) {
  constexpr uint32_t kN = 200'000;
  std::vector<int64_t> keys(kN);
  uint64_t x = 88172645463325252ull;
  for (auto& k : keys) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    k = int64_t{1'700'000'000} * 1'000'000'000 + static_cast<int64_t>(x % 1'000'000'000);
  }
  for (auto _ : state) {
    auto heap = std::make_unique<internal::IndexedHeap>();
    for (uint32_t i = 0; i < kN; ++i) heap->Push(i, keys[i]);
    benchmark::DoNotOptimize(heap->TopKey());
    state.PauseTiming();
    heap.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kN);
}
BENCHMARK(BM_IndexedHeapPushFresh)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kwq
