// The queue scenarios of SCENARIOS.md (fifo_1t, pc_2w, dedup_hot, mem), written as the Go
// peer wrote them against client-go's workqueue. Keys are std::string
// "default/object-<i>", made before timing starts and moved into the queue (the
// equivalent of Go handing over a string header without copying its bytes).

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kwq/delaying_queue.h"
#include "kwq/priority_queue.h"
#include "kwq/queue.h"
#include "scenario.h"

namespace kwq::scenarios {

std::vector<std::string> MakeKeys(int64_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (int64_t i = 0; i < n; ++i) keys.push_back(absl::StrCat("default/object-", i));
  return keys;
}

std::vector<int> CpuList() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

int AllowedCpus() { return std::max<int>(1, CpuList().size()); }

void PinTo(const std::vector<int>& cpus, int index) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpus[index % cpus.size()], &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

namespace {

// One thread: Add n distinct keys, then Get+Done until empty.
std::string Fifo1T(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  Queue<std::string> q;
  Stopwatch sw;
  for (auto& k : keys) q.Add(std::move(k));
  int64_t got = 0;
  while (auto lease = q.TryGet()) ++got;
  const absl::Duration d = sw.Elapsed();
  Check(got == n, "handed_out != n");
  return absl::StrFormat("ns_per_item=%.1f n=%d handed_out=%d", absl::ToDoubleNanoseconds(d) / n, n,
                         got);
}

// 2 workers Get+Done; the main thread Adds n distinct keys, then ShutDownWithDrain.
std::string Pc2W(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  Queue<std::string> q({.polling_workers = PollingWorkersFlag()});
  std::atomic<int64_t> got{0};
  Stopwatch sw;
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&] {
      while (auto lease = q.Get()) got.fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (auto& k : keys) q.Add(std::move(k));
  const bool drained = q.ShutDownWithDrain();
  for (auto& w : workers) w.join();
  const absl::Duration d = sw.Elapsed();
  Check(drained && got.load() == n, "not drained, or handed_out != n");
  return absl::StrFormat("ns_per_item=%.1f n=%d handed_out=%d", absl::ToDoubleNanoseconds(d) / n, n,
                         got.load());
}

// 2 workers Get+Done; the main thread Adds 10n times cycling over 1000 keys.
std::string DedupHot(int64_t n) {
  const std::vector<std::string> keys = MakeKeys(1000);
  Queue<std::string> q({.polling_workers = PollingWorkersFlag()});
  std::atomic<int64_t> got{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&] {
      while (auto lease = q.Get()) got.fetch_add(1, std::memory_order_relaxed);
    });
  }
  const int64_t adds = 10 * n;
  Stopwatch sw;
  for (int64_t i = 0; i < adds; ++i) q.Add(keys[i % 1000]);
  const absl::Duration d = sw.Elapsed();
  const bool drained = q.ShutDownWithDrain();
  for (auto& w : workers) w.join();
  // Every key ran at least once (its last add was followed by a run); no more runs than
  // adds.
  Check(drained && got.load() >= 1000 && got.load() <= adds,
        "not drained, or handed_out outside [1000, adds]");
  return absl::StrFormat("ns_per_add=%.2f adds=%d handed_out=%d",
                         absl::ToDoubleNanoseconds(d) / adds, adds, got.load());
}

// RSS growth from Adding n keys (keys allocated before the baseline) / n.
std::string Mem(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  Queue<std::string> q;
  const int64_t before = ResidentBytes();
  for (auto& k : keys) q.Add(std::move(k));
  const int64_t after = ResidentBytes();
  Check(static_cast<int64_t>(q.Len()) == n, "len != n");
  return absl::StrFormat("bytes_per_queued_key=%.1f n=%d len=%d",
                         static_cast<double>(after - before) / n, n, q.Len());
}

// mem's measure for the other queues that hold many keys (not a SCENARIOS.md scenario:
// for choosing between them): the same keys waiting on a DelayingQueue (AddAfter one
// hour), and ready on a PriorityQueue (priorities i % 10).
std::string MemDelayed(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  DelayingQueue<std::string> q;
  const int64_t before = ResidentBytes();
  for (auto& k : keys) q.AddAfter(std::move(k), absl::Hours(1));
  const int64_t after = ResidentBytes();
  Check(q.Len() == 0, "a key an hour away is ready");
  return absl::StrFormat("bytes_per_waiting_key=%.1f n=%d", static_cast<double>(after - before) / n,
                         n);
}

std::string MemPriority(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  auto q = *PriorityQueue<std::string>::Create();
  const int64_t before = ResidentBytes();
  for (int64_t i = 0; i < n; ++i) {
    q->Add(std::move(keys[i]), {.priority = static_cast<int>(i % 10)});
  }
  const int64_t after = ResidentBytes();
  Check(static_cast<int64_t>(q->Len()) == n, "len != n");
  return absl::StrFormat("bytes_per_queued_key=%.1f n=%d len=%d",
                         static_cast<double>(after - before) / n, n, q->Len());
}

}  // namespace

std::vector<Scenario> QueueScenarios() {
  return {
      {"fifo_1t", 1'000'000, Fifo1T},         {"pc_2w", 1'000'000, Pc2W},
      {"dedup_hot", 1'000'000, DedupHot},     {"mem", 1'000'000, Mem},
      {"mem_delayed", 1'000'000, MemDelayed}, {"mem_priority", 1'000'000, MemPriority},
  };
}

}  // namespace kwq::scenarios
