// Kernel-style workqueues on kwq: the machine's topology, a per-CPU (bound) workqueue, an
// ordered one, a delayed work re-armed like a periodic kernel job, ParallelizeUntil, and
// the wq_monitor-like counters. Prints what happened; exits non-zero on a surprise.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "kwq/parallelize.h"
#include "kwq/workqueue.h"

int main() {
  kwq::WorkqueueRuntime& runtime = kwq::WorkqueueRuntime::Default();
  std::printf("topology: %s\n", runtime.topology().Describe().c_str());

  // A bound workqueue: one pool per CPU; QueueOn picks the CPU (queue_work_on).
  auto bound = *kwq::Workqueue::Create({.name = "example_bound"});
  std::atomic<int> ran_bound{0};
  std::vector<std::unique_ptr<kwq::Work>> per_cpu;
  for (const kwq::CpuInfo& cpu : bound->topology().cpus()) {
    per_cpu.push_back(std::make_unique<kwq::Work>([&] { ++ran_bound; }));
    bound->QueueOn(cpu.cpu, per_cpu.back().get());
  }
  bound->Flush();  // flush_workqueue: everything queued before it has run
  std::printf("bound: one work per CPU, %d ran\n", ran_bound.load());

  // An ordered workqueue runs one work at a time, in queueing order.
  auto ordered = *kwq::Workqueue::Create({.name = "example_ordered", .flags = kwq::kOrdered});
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::unique_ptr<kwq::Work>> steps;
  for (int i = 0; i < 5; ++i) {
    steps.push_back(std::make_unique<kwq::Work>([&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    }));
    ordered->Queue(steps.back().get());
  }
  ordered->Flush();
  std::printf("ordered: ran in order %s\n", absl::StrJoin(order, " ").c_str());

  // A delayed work that re-arms itself three times, 1 ms apart (a periodic job), then
  // CancelSync (cancel_delayed_work_sync) makes sure it is neither queued nor running.
  auto unbound = *kwq::Workqueue::Create({.name = "example_unbound", .flags = kwq::kUnbound});
  std::atomic<int> ticks{0};
  kwq::DelayedWork* self = nullptr;
  kwq::DelayedWork periodic([&] {
    if (++ticks < 3) unbound->QueueDelayed(self, absl::Milliseconds(1));
  });
  self = &periodic;
  unbound->QueueDelayed(&periodic, absl::Milliseconds(1));
  while (ticks.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  unbound->CancelSync(&periodic);
  std::printf("delayed: ticked %d times, pending now: %s\n", ticks.load(),
              periodic.pending() ? "yes" : "no");

  // ParallelizeUntil (client-go's) on the unbound system workqueue: the caller is one of
  // the runners.
  std::vector<int> squares(1000);
  const absl::Status s =
      kwq::ParallelizeUntil(kwq::Background(), /*workers=*/4, static_cast<int>(squares.size()),
                            [&](int i) { squares[i] = i * i; });
  std::printf("parallelize: %s, squares[999] = %d\n", s.ToString().c_str(), squares[999]);

  const kwq::WorkqueueStats stats = unbound->stats();
  std::printf("stats(example_unbound): queued %llu, started %llu, completed %llu\n",
              static_cast<unsigned long long>(stats.queued),
              static_cast<unsigned long long>(stats.started),
              static_cast<unsigned long long>(stats.completed));

  const bool ok = ran_bound.load() == static_cast<int>(per_cpu.size()) &&
                  order == std::vector<int>{0, 1, 2, 3, 4} && ticks.load() == 3 &&
                  !periodic.pending() && s.ok() && squares[999] == 999 * 999;
  return ok ? 0 : 1;
}
