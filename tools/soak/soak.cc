// kwq-soak: multi-threaded soak of the queues and workqueues with an invariant checker.
//
//   kwq-soak --seconds=60 [--keys=512] [--producers=3] [--workers=4] [--shards=9]
//
// Runs, for the given time, producers that Add / AddAfter / AddRateLimited random keys
// to a RateLimitingQueue and Add / AddAll them to a ShardedQueue, workers that process
// them, and a workqueue whose works requeue each other, and checks, continuously and at
// the end:
//   - no key is ever held by two workers at once (per queue);
//   - nothing is lost: after the producers stop, every key's last add is followed by a
//     run that started after it (level-triggered), and ShutDownWithDrain completes;
//   - no worker sleeps while work waits: the ShardedQueue, with more shards than
//     workers by default (so workers steal, park and are kicked), must run every key's
//     last add before anything shuts it down, and then, once its workers have had time
//     to fall asleep, a key added to each shard without a worker (only a kick wakes one
//     for those);
//   - no thread leaks: the process's thread count returns to its start value exactly
//     (the default timer service's thread is started before the first count; the
//     workqueue runs on a runtime of the soak's own, destroyed before the last).
// Prints one line `soak key=value ...` and exits non-zero on any violation.

#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kwq/rate_limiting_queue.h"
#include "kwq/sharded_queue.h"
#include "kwq/workqueue.h"
#include "testing/thread_count.h"

ABSL_FLAG(double, seconds, 10, "how long to run");
ABSL_FLAG(int, keys, 512, "distinct keys");
ABSL_FLAG(int, producers, 3, "producer threads");
ABSL_FLAG(int, workers, 4, "worker threads per queue");
ABSL_FLAG(int, shards, 0,
          "ShardedQueue shards (0: 2 * workers + 1, so that some shards have no worker)");

namespace {

using kwq::testing::ThreadCount;

// Per-key bookkeeping shared by producers and workers of one queue.
struct Ledger {
  explicit Ledger(int keys) : busy(keys), added(keys), seen(keys) {}
  std::vector<std::atomic<int>> busy;
  std::vector<std::atomic<uint64_t>> added;  // generation of the newest add
  std::vector<std::atomic<uint64_t>> seen;   // newest generation a run started after
  std::atomic<uint64_t> runs{0};
  std::atomic<uint64_t> violations{0};

  void Run(int k) {
    if (busy[k].fetch_add(1) != 0) violations.fetch_add(1);
    // Everything added before this run started is handled by it.
    const uint64_t gen = added[k].load();
    uint64_t s = seen[k].load();
    while (gen > s && !seen[k].compare_exchange_weak(s, gen)) {
    }
    busy[k].fetch_sub(1);
    runs.fetch_add(1, std::memory_order_relaxed);
  }
  // Keys whose newest add no run has seen.
  int Lost() const {
    int lost = 0;
    for (size_t k = 0; k < added.size(); ++k) lost += seen[k].load() < added[k].load();
    return lost;
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int keys = absl::GetFlag(FLAGS_keys);
  const int producers = absl::GetFlag(FLAGS_producers);
  const int workers = absl::GetFlag(FLAGS_workers);
  // Checked before anything runs: no keys divided by zero, no workers never drained.
  if (!(absl::GetFlag(FLAGS_seconds) >= 0) || keys < 1 || producers < 1 || workers < 1 ||
      workers > 1024 || absl::GetFlag(FLAGS_shards) < 0 || absl::GetFlag(FLAGS_shards) > 4096) {
    std::fprintf(stderr,
                 "kwq-soak: need --seconds >= 0, --keys >= 1, --producers >= 1, "
                 "1 <= --workers <= 1024, 0 <= --shards <= 4096 (0: 2 * workers + 1)\n");
    return 2;
  }
  const absl::Duration run_for = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const int shards =
      absl::GetFlag(FLAGS_shards) > 0 ? absl::GetFlag(FLAGS_shards) : 2 * workers + 1;
  kwq::TimerService::Default();  // its thread is process-wide: started before counting
  const int threads_before = ThreadCount();
  uint64_t wq_runs = 0;
  bool sh_settled = true;
  int threads_during = 0;
  Ledger rl(keys), sh(keys);
  {
    // A runtime of the soak's own, destroyed (every worker joined) before the threads are
    // counted again: the default runtime's workers are process-wide and reaped only
    // after an idle timeout, and how many it had spawned depended on the machine's load
    // (7 threads for the 6 allowed, under two busy loops), which failed the soak.
    auto runtime = *kwq::WorkqueueRuntime::Create({});
    kwq::RateLimitingQueue<int> rlq(*kwq::ExponentialFailureRateLimiter<int>::Create(
        {.base = absl::Microseconds(1), .max = absl::Milliseconds(2)}));
    auto shq = *kwq::ShardedQueue<int>::Create(shards);
    auto wq = *kwq::Workqueue::Create(
        {.name = "soak", .flags = kwq::kUnbound, .max_active = 4, .runtime = runtime.get()});
    std::atomic<bool> stop{false};
    std::atomic<bool> no_retries{false};  // set once the producers stopped
    std::atomic<uint64_t> wq_count{0};
    // Works that requeue a neighbour until told to stop (chained queueing).
    std::vector<std::unique_ptr<kwq::Work>> works;
    for (int i = 0; i < 16; ++i) {
      works.push_back(std::make_unique<kwq::Work>([&, i] {
        wq_count.fetch_add(1, std::memory_order_relaxed);
        if (!stop.load()) wq->Queue(works[(i + 1) % 16].get());
      }));
    }
    for (auto& w : works) wq->Queue(w.get());

    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&] {
        while (auto lease = rlq.Get()) {
          const int k = **lease;
          rl.Run(k);
          if (!no_retries.load() && rlq.NumRequeues(k) < 2 && (k & 3) == 0) {
            rl.added[k].fetch_add(1);
            rlq.AddRateLimited(k);  // retry a few keys
          } else {
            rlq.Forget(k);
          }
        }
      });
      threads.emplace_back([&, w] {
        while (auto lease = shq->Get(w)) sh.Run(**lease);
      });
    }
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        std::mt19937 rng(p);
        for (uint64_t op = 1; !stop.load(std::memory_order_relaxed); ++op) {
          // Now and then a pause long enough for idle workers to fall asleep, so that the
          // adds after it must wake them (on the ShardedQueue, often from a shard
          // without a worker of its own).
          if (op % 2048 == 0) absl::SleepFor(absl::Milliseconds(3));
          const int k = static_cast<int>(rng() % keys);
          switch (rng() % 4) {
            case 0:
              rl.added[k].fetch_add(1);
              rlq.Add(k);
              break;
            case 1:
              rl.added[k].fetch_add(1);
              rlq.AddAfter(k, absl::Microseconds(rng() % 500));
              break;
            case 2:
              sh.added[k].fetch_add(1);
              shq->Add(k);
              break;
            default: {  // a batch over several shards, duplicates allowed
              int batch[4];
              for (int& b : batch) {
                b = static_cast<int>(rng() % keys);
                sh.added[b].fetch_add(1);
              }
              shq->AddAll(batch);
            }
          }
        }
      });
    }
    absl::SleepFor(run_for);
    threads_during = ThreadCount();
    stop = true;
    for (size_t i = workers * 2; i < threads.size(); ++i) threads[i].join();  // producers
    // Let delayed and rate-limited retries come due, then drain everything. A retry is
    // made only under a lease, and none after no_retries: so once no lease is active
    // (read first), nothing waits and nothing is ready, no retry can come any more, and
    // the drain (which drops waiting items) loses none.
    no_retries = true;
    while (rlq.InFlight() != 0 || rlq.Waiting() != 0 || rlq.Depth() != 0) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    // The sharded queue's items run with nothing shut down: a worker asleep while a shard
    // without a worker holds an item would leave it there.
    auto settles = [&] {
      const absl::Time settle_by = absl::Now() + absl::Seconds(10);
      while (!(sh.Lost() == 0 && shq->Depth() == 0 && shq->InFlight() == 0)) {
        if (absl::Now() > settle_by) return false;
        absl::SleepFor(absl::Milliseconds(1));
      }
      return true;
    };
    sh_settled = settles();
    // Then, with the workers given time to fall asleep (they poll for about half a
    // millisecond first), one key on each shard that has no worker: only a kick wakes a
    // worker for it. (Should a worker still be awake, the check passes without testing.)
    absl::SleepFor(absl::Milliseconds(20));
    for (int k = 0; k < keys && sh_settled; ++k) {
      if (shq->ShardOf(k) < workers) continue;
      sh.added[k].fetch_add(1);
      shq->Add(k);
    }
    if (sh_settled) sh_settled = settles();
    if (!sh_settled) sh.violations.fetch_add(1);
    const bool rl_drained = rlq.ShutDownWithDrain();
    const bool sh_drained = shq->ShutDownWithDrain();
    for (int i = 0; i < workers * 2; ++i) threads[i].join();
    wq->Flush();
    for (auto& w : works) wq->CancelSync(w.get());
    wq_runs = wq_count.load();
    if (!rl_drained || !sh_drained) rl.violations.fetch_add(1);
  }
  // Every thread the run started (queues' workers, the runtime's pools) is joined by now.
  const int threads_after = ThreadCount();
  const int lost = rl.Lost() + sh.Lost();
  const uint64_t violations = rl.violations.load() + sh.violations.load();
  const bool leaked = threads_after != threads_before;
  std::printf(
      "soak seconds=%.1f shards=%d rl_runs=%llu sharded_runs=%llu wq_runs=%llu "
      "sharded_settled=%d violations=%llu lost=%d threads_before=%d threads_during=%d "
      "threads_after=%d\n",
      absl::ToDoubleSeconds(run_for), shards, (unsigned long long)rl.runs.load(),
      (unsigned long long)sh.runs.load(), (unsigned long long)wq_runs, sh_settled ? 1 : 0,
      (unsigned long long)violations, lost, threads_before, threads_during, threads_after);
  return violations == 0 && lost == 0 && !leaked && wq_runs > 0 ? 0 : 1;
}
