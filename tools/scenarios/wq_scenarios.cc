// The kernel-style workqueue scenarios of SCENARIOS.md: wq_tiny and wq_latency on kwq,
// and wq_tiny through boost::asio::thread_pool and oneTBB task_arena when those optional
// packages were found at configure time (otherwise those scenarios print skipped=1).
// Also wq_percpu / wq_unbound_mp (one producer per CPU; not in SCENARIOS.md): how the
// pools scale with the CPU count (bench/scaling.sh); and wq_mod_delayed (not in
// SCENARIOS.md): the cost of mod_delayed_work on a pending work.

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kwq/workqueue.h"
#include "scenario.h"

#ifdef KWQ_HAVE_ASIO
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#endif
#ifdef KWQ_HAVE_TBB
#include <tbb/task_arena.h>
#endif

namespace kwq::scenarios {
namespace {

std::string PerItem(absl::Duration d, int64_t n, int threads) {
  return absl::StrFormat("ns_per_item=%.1f n=%d threads=%d", absl::ToDoubleNanoseconds(d) / n, n,
                         threads);
}

// n distinct work items (each bumps a counter) on an unbound workqueue with one worker
// per CPU; waits until all ran.
std::string WqTiny(int64_t n) {
  const int cpus = AllowedCpus();
  auto wq = *Workqueue::Create({.name = "wq_tiny",
                                .flags = kUnbound,
                                .max_active = cpus,
                                .affinity_scope = AffinityScope::kSystem});
  std::atomic<int64_t> count{0};
  std::vector<std::unique_ptr<Work>> works;
  works.reserve(n);
  // A kwq Work is the caller's object (like the kernel's work_struct, usually embedded in
  // the caller's own struct), made once and queued many times, so ns_per_item times the
  // queueing only. The peers' post/enqueue allocate a task per call inside their timing:
  // create_ns_per_item is what making the Work objects took here (fresh memory), and
  // with_create_ns_per_item the two together, the figure to set against the peers'
  // when a work is made per item.
  Stopwatch create_sw;
  for (int64_t i = 0; i < n; ++i) {
    works.push_back(
        std::make_unique<Work>([&count] { count.fetch_add(1, std::memory_order_relaxed); }));
  }
  const absl::Duration created = create_sw.Elapsed();
  Stopwatch sw;
  for (auto& w : works) wq->Queue(w.get());
  const absl::Duration queued = sw.Elapsed();
  while (count.load(std::memory_order_acquire) < n) std::this_thread::yield();
  const absl::Duration d = sw.Elapsed();
  wq->Flush();
  Check(count.load() == n, "works run != n");
  // made_in_loop_ns_per_item: each Work made and queued in the producer's loop, as the
  // peers make a task per post/enqueue inside their timing: the figure to set against
  // theirs. The first pass's works stay allocated, so these come from fresh memory, as
  // the peers' tasks do.
  std::atomic<int64_t> made_count{0};
  std::vector<std::unique_ptr<Work>> made;
  made.reserve(n);
  Stopwatch made_sw;
  for (int64_t i = 0; i < n; ++i) {
    made.push_back(std::make_unique<Work>(
        [&made_count] { made_count.fetch_add(1, std::memory_order_relaxed); }));
    wq->Queue(made.back().get());
  }
  while (made_count.load(std::memory_order_acquire) < n) std::this_thread::yield();
  const absl::Duration made_d = made_sw.Elapsed();
  wq->Flush();
  Check(made_count.load() == n, "works made in the loop run != n");
  // posted_ns_per_item: Post(fn) per item, a work the workqueue makes and frees after the
  // run: fire-and-forget, as asio's post and TBB's enqueue are.
  std::atomic<int64_t> posted_count{0};
  Stopwatch posted_sw;
  for (int64_t i = 0; i < n; ++i) {
    wq->Post([&posted_count] { posted_count.fetch_add(1, std::memory_order_relaxed); });
  }
  while (posted_count.load(std::memory_order_acquire) < n) std::this_thread::yield();
  const absl::Duration posted_d = posted_sw.Elapsed();
  wq->Flush();
  Check(posted_count.load() == n, "posted functions run != n");
  // queue_ns_per_item: the producer's loop alone (how long Queue takes, workers running).
  const auto per_item = [n](absl::Duration t) { return absl::ToDoubleNanoseconds(t) / n; };
  return absl::StrCat(PerItem(d, n, cpus),
                      absl::StrFormat(" queue_ns_per_item=%.1f create_ns_per_item=%.1f "
                                      "with_create_ns_per_item=%.1f made_in_loop_ns_per_item=%.1f "
                                      "posted_ns_per_item=%.1f",
                                      per_item(queued), per_item(created), per_item(created + d),
                                      per_item(made_d), per_item(posted_d)));
}

std::string WqTinyAsio(int64_t n) {
#ifdef KWQ_HAVE_ASIO
  const int cpus = AllowedCpus();
  boost::asio::thread_pool pool(cpus);
  std::atomic<int64_t> count{0};
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) {
    boost::asio::post(pool, [&count] { count.fetch_add(1, std::memory_order_relaxed); });
  }
  while (count.load(std::memory_order_acquire) < n) std::this_thread::yield();
  const absl::Duration d = sw.Elapsed();
  pool.join();
  Check(count.load() == n, "tasks run != n");
  return PerItem(d, n, cpus);
#else
  (void)n;
  return "skipped=1 reason=boost_asio_not_found";
#endif
}

std::string WqTinyTbb(int64_t n) {
#ifdef KWQ_HAVE_TBB
  const int cpus = AllowedCpus();
  // TBB's default: the arena keeps a slot for the main thread, which only enqueues here,
  // so cpus - 1 workers run the tasks. Giving TBB `cpus` workers (global_control
  // max_allowed_parallelism = cpus + 1, no reserved slot) measured slower on 2 CPUs:
  // medians about 198 against 165 ns/item in 6 interleaved runs (2026-11-30), so the
  // default is the fairer peer.
  tbb::task_arena arena(cpus);
  arena.initialize();  // its start-up outside the timing, as asio's threads are
  std::atomic<int64_t> count{0};
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) {
    arena.enqueue([&count] { count.fetch_add(1, std::memory_order_relaxed); });
  }
  while (count.load(std::memory_order_acquire) < n) std::this_thread::yield();
  const absl::Duration d = sw.Elapsed();
  Check(count.load() == n, "tasks run != n");
  // threads: the arena's size; workers: the threads that run tasks (see above).
  return absl::StrCat(PerItem(d, n, cpus), " workers=", std::max(1, cpus - 1));
#else
  (void)n;
  return "skipped=1 reason=tbb_not_found";
#endif
}

// Every allowed CPU runs a producer thread pinned to it that queues its n/cpus works with
// Queue() (the calling CPU's pool for a bound workqueue, the system-wide pod for an
// unbound one); waits until all ran. Each producer's works bump that producer's own
// counter, so no shared counter limits the figure.
std::string WqManyProducers(int64_t n, uint32_t flags) {
  const std::vector<int> cpus = CpuList();
  const int k = std::max<int>(1, cpus.size());
  auto wq = *Workqueue::Create({.name = "wq_many_producers",
                                .flags = flags,
                                .max_active = (flags & kUnbound) != 0 ? k : 0,
                                .affinity_scope = AffinityScope::kSystem});
  struct alignas(64) Counter {
    std::atomic<int64_t> value{0};
  };
  std::vector<Counter> counters(k);
  std::vector<std::unique_ptr<Work>> works;
  works.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    std::atomic<int64_t>* c = &counters[i % k].value;
    works.push_back(std::make_unique<Work>([c] { c->fetch_add(1, std::memory_order_relaxed); }));
  }
  Stopwatch sw;
  std::vector<std::thread> producers;
  for (int p = 0; p < k; ++p) {
    producers.emplace_back([&, p] {
      PinTo(cpus, p);
      for (int64_t i = p; i < n; i += k) wq->Queue(works[i].get());
    });
  }
  for (auto& t : producers) t.join();
  for (;;) {
    int64_t done = 0;
    for (auto& c : counters) done += c.value.load(std::memory_order_acquire);
    if (done >= n) break;
    std::this_thread::yield();
  }
  const absl::Duration d = sw.Elapsed();
  wq->Flush();
  int64_t done = 0;
  for (auto& c : counters) done += c.value.load();
  Check(done == n, "works run != n");
  return absl::StrCat(PerItem(d, n, k), " producers=", k);
}

std::string WqPerCpu(int64_t n) { return WqManyProducers(n, 0); }
std::string WqUnboundMp(int64_t n) { return WqManyProducers(n, kUnbound); }

// Idle workqueue: queue one item, record enqueue -> start latency; n times, 100 us apart.
std::string WqLatency(int64_t n) {
  auto wq = *Workqueue::Create({.name = "wq_latency", .flags = kUnbound});
  Clock* clock = RealClock::Default();
  std::atomic<int64_t> started_ns{0};
  Work work([&] { started_ns.store(absl::ToUnixNanos(clock->Now()), std::memory_order_release); });
  std::vector<double> lat_us;
  lat_us.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    started_ns.store(0, std::memory_order_relaxed);
    const absl::Time queued = clock->Now();
    wq->Queue(&work);
    int64_t s;
    while ((s = started_ns.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
    lat_us.push_back(absl::ToDoubleMicroseconds(absl::FromUnixNanos(s) - queued));
    wq->Flush(&work);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::sort(lat_us.begin(), lat_us.end());
  return absl::StrFormat("lat_p50_us=%.1f lat_p99_us=%.1f lat_max_us=%.1f n=%d", lat_us[n / 2],
                         lat_us[n * 99 / 100], lat_us.back(), n);
}

// mod_delayed_work as a debounce: one thread moves the timers of 1,000 delayed works,
// pending an hour out, n times in turn (each call takes the work off its timer and puts
// it on a new one); then cancels them. ns per ModDelayed.
std::string WqModDelayed(int64_t n) {
  auto wq = *Workqueue::Create({.name = "wq_mod_delayed", .flags = kUnbound});
  constexpr int kWorks = 1000;
  std::vector<std::unique_ptr<DelayedWork>> works;
  for (int i = 0; i < kWorks; ++i) works.push_back(std::make_unique<DelayedWork>([] {}));
  for (auto& d : works) wq->QueueDelayed(d.get(), absl::Hours(1));
  int64_t moved = 0;
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) moved += wq->ModDelayed(works[i % kWorks].get(), absl::Hours(1));
  const absl::Duration d = sw.Elapsed();
  for (auto& w : works) wq->CancelSync(w.get());
  Check(moved == n, "a ModDelayed found its work not pending");
  return absl::StrFormat("ns_per_mod=%.1f n=%d", absl::ToDoubleNanoseconds(d) / n, n);
}

}  // namespace

std::vector<Scenario> WorkqueueScenarios() {
  return {
      {"wq_tiny", 1'000'000, WqTiny},
      {"wq_tiny_asio", 1'000'000, WqTinyAsio},
      {"wq_tiny_tbb", 1'000'000, WqTinyTbb},
      {"wq_latency", 10'000, WqLatency},
      {"wq_percpu", 4'000'000, WqPerCpu},
      {"wq_unbound_mp", 4'000'000, WqUnboundMp},
      {"wq_mod_delayed", 1'000'000, WqModDelayed},
  };
}

}  // namespace kwq::scenarios
