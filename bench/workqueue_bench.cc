// Workqueue costs that kwq-scenarios' wq_* scenarios (the peers' comparison) do not show.

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "benchmark/benchmark.h"
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

}  // namespace
}  // namespace kwq
