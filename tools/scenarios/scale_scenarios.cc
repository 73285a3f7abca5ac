// Scaling scenarios (not in SCENARIOS.md): how one Queue and a ShardedQueue behave as
// threads are added. Each uses the CPUs of the process's affinity mask, so
// `taskset -c 0-7 kwq-scenarios --scenario=mpmc_sharded` runs it on 8 CPUs.
//
//   pc_nw         1 producer Adds n distinct keys, cpus-1 workers Get+Done one Queue
//   mpmc_queue    cpus/2 producers Add their slice of n keys, cpus/2 workers, one Queue
//   mpmc_sharded  the same on a ShardedQueue with one shard per worker (Get(w))
//
// Threads are pinned, one per CPU (producers first), the same way in every scenario, so
// the figures compare the queues and not the scheduler's placement.

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "kwq/queue.h"
#include "kwq/sharded_queue.h"
#include "scenario.h"

namespace kwq::scenarios {
namespace {

std::string Result(absl::Duration d, int64_t n, int64_t got, int producers, int workers) {
  Check(got == n, "handed_out != n");
  return absl::StrFormat("ns_per_item=%.1f n=%d handed_out=%d producers=%d workers=%d",
                         absl::ToDoubleNanoseconds(d) / n, n, got, producers, workers);
}

// One producer, cpus-1 workers on one Queue (at least one worker).
std::string PcNw(int64_t n) {
  const std::vector<int> cpus = CpuList();
  const int workers = std::max(1, static_cast<int>(cpus.size()) - 1);
  std::vector<std::string> keys = MakeKeys(n);
  Queue<std::string> q({.polling_workers = PollingWorkersFlag()});
  std::atomic<int64_t> got{0};
  Stopwatch sw;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      PinTo(cpus, 1 + w);
      int64_t mine = 0;
      while (auto lease = q.Get()) ++mine;
      got.fetch_add(mine, std::memory_order_relaxed);
    });
  }
  PinTo(cpus, 0);
  for (auto& k : keys) q.Add(std::move(k));
  q.ShutDownWithDrain();
  for (auto& t : threads) t.join();
  return Result(sw.Elapsed(), n, got.load(), 1, workers);
}

// Producers and workers of the mpmc scenarios: half of the CPUs each (at least one).
int HalfOfCpus() { return std::max(1, AllowedCpus() / 2); }

// `Q` is Queue or ShardedQueue; `get(q, w)` takes worker w's next lease.
template <typename Q, typename GetFn>
std::string Mpmc(int64_t n, Q& q, GetFn get) {
  const std::vector<int> cpus = CpuList();
  const int half = HalfOfCpus();
  std::vector<std::string> keys = MakeKeys(n);
  std::atomic<int64_t> got{0};
  Stopwatch sw;
  std::vector<std::thread> workers;
  for (int w = 0; w < half; ++w) {
    workers.emplace_back([&, w] {
      PinTo(cpus, half + w);
      int64_t mine = 0;
      while (auto lease = get(q, w)) ++mine;
      got.fetch_add(mine, std::memory_order_relaxed);
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < half; ++p) {
    producers.emplace_back([&, p] {
      PinTo(cpus, p);
      for (int64_t i = p; i < n; i += half) q.Add(std::move(keys[i]));
    });
  }
  for (auto& t : producers) t.join();
  q.ShutDownWithDrain();
  for (auto& t : workers) t.join();
  return Result(sw.Elapsed(), n, got.load(), half, half);
}

std::string MpmcQueue(int64_t n) {
  Queue<std::string> q({.polling_workers = PollingWorkersFlag()});
  return Mpmc(n, q, [](Queue<std::string>& queue, int) { return queue.Get(); });
}

std::string MpmcSharded(int64_t n) {
  auto q =
      *ShardedQueue<std::string>::Create(HalfOfCpus(), {.polling_workers = PollingWorkersFlag()});
  return Mpmc(n, *q, [](ShardedQueue<std::string>& queue, int w) { return queue.Get(w); });
}

}  // namespace

std::vector<Scenario> ScaleScenarios() {
  return {
      {"pc_nw", 1'000'000, PcNw},
      {"mpmc_queue", 2'000'000, MpmcQueue},
      {"mpmc_sharded", 2'000'000, MpmcSharded},
  };
}

}  // namespace kwq::scenarios
