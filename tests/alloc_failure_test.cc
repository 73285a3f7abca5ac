// Running out of memory: ParallelizeUntil when making a helper fails, how often Post
// allocates, and queues whose allocations fail part-way through an add. A binary of its
// own: it replaces the global operator new (testing/failing_new.h), so that chosen
// allocations throw std::bad_alloc once armed.

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/context_node.h"
#include "internal/timer_heap.h"
#include "kwq/clock.h"
#include "kwq/context.h"
#include "kwq/delaying_queue.h"
#include "kwq/internal/failure_counts.h"
#include "kwq/internal/queue_metrics.h"
#include "kwq/internal/ready_levels.h"
#include "kwq/parallelize.h"
#include "kwq/priority_queue.h"
#include "kwq/queue.h"
#include "kwq/rate_limiter.h"
#include "kwq/sharded_queue.h"
#include "kwq/stop_token.h"
#include "kwq/timer.h"
#include "kwq/topology.h"
#include "kwq/workqueue.h"
#include "testing/async_get.h"
#include "testing/counting_clock.h"
#include "testing/eventually.h"
#include "testing/failing_new.h"
#include "testing/pool_workers.h"
#include "testing/queue_peer.h"
#include "testing/recording_metrics.h"
#include "testing/two_socket_xml.h"
#include "workqueue/internal.h"

namespace {
using kwq::testing::OnThreadNamed;
// Allocations of sizeof(kwq::Work) bytes seen since arming; -1: disarmed.
std::atomic<int> work_allocations{-1};
// Allocations of a worker (sizeof(internal::Worker)) seen since arming; -1: disarmed.
std::atomic<int> worker_allocations{-1};
// Allocations of sizeof(kwq::Work) bytes, counted while `count_works` is set.
std::atomic<bool> count_works{false};
std::atomic<int> work_news{0};
// While set, every allocation of this many bytes on a kwq worker thread throws.
std::atomic<size_t> fail_on_workers_size{0};
std::atomic<int> worker_failures{0};
// While set, every allocation of this many bytes on a kwq rescuer thread throws.
std::atomic<size_t> fail_on_rescuers_size{0};
std::atomic<int> rescuer_failures{0};
// While set, every allocation on a thread named "getter" throws.
std::atomic<bool> fail_on_getters{false};
std::atomic<int> getter_failures{0};

// This binary's failures besides testing/failing_new.h's (its extra_failure).
bool WorkqueueFailures(std::size_t n) {
  if (fail_on_workers_size.load() == n && OnThreadNamed("kwq-worker")) {
    worker_failures.fetch_add(1);
    return true;
  }
  if (fail_on_rescuers_size.load() == n && OnThreadNamed("kwq-rescuer")) {
    rescuer_failures.fetch_add(1);
    return true;
  }
  if (fail_on_getters.load() && OnThreadNamed("getter")) {
    getter_failures.fetch_add(1);
    return true;
  }
  if (n == sizeof(kwq::Work) && count_works.load()) work_news.fetch_add(1);
  if (n == sizeof(kwq::Work) && work_allocations.load() >= 0 &&
      work_allocations.fetch_add(1) == 1) {
    return true;
  }
  return n == sizeof(kwq::internal::Worker) && worker_allocations.load() >= 0 &&
         worker_allocations.fetch_add(1) == 0;
}
[[maybe_unused]] const bool installed = (kwq::testing::extra_failure = &WorkqueueFailures, true);
}  // namespace

namespace kwq {

namespace {

// The first helper was queued before the second's allocation threw, and the unwinding
// destroyed it while pending or running, which fails Work's check: the process aborted.
// Now bad_alloc reaches the caller with no helper queued, and nothing runs afterwards.
TEST(ParallelizeUntilAllocTest, AHelperThatCannotBeMadeThrowsBadAllocAndQueuesNothing) {
  auto wq = *Workqueue::Create({.name = "alloc", .flags = kUnbound});
  std::atomic<int> ran{0};
  work_allocations = 0;
  EXPECT_THROW((void)ParallelizeUntil(Background(), 4, 1000, [&](int) { ran.fetch_add(1); },
                                      {.workqueue = wq.get()}),
               std::bad_alloc);
  work_allocations = -1;
  EXPECT_EQ(ran.load(), 0);
  wq->Drain();  // nothing was queued, so nothing runs and nothing touches the gone call
  EXPECT_EQ(ran.load(), 0);
}

// A worker thread that cannot be made for lack of memory is a spawn failure, as one the
// system refuses: the bad_alloc used to leave Queue (the helper already inserted, so
// ParallelizeUntil's unwinding aborted on it). Now the caller runs the pieces itself.
TEST(ParallelizeUntilAllocTest, AWorkerThatCannotBeMadeLeavesThePiecesToTheCaller) {
  static_assert(sizeof(internal::Worker) != sizeof(Work));
  auto runtime = *WorkqueueRuntime::Create({});  // no worker made yet
  auto wq = *Workqueue::Create({.name = "no-worker", .flags = kUnbound, .runtime = runtime.get()});
  std::vector<std::atomic<int>> hits(100);
  worker_allocations = 0;
  const absl::Status status = ParallelizeUntil(
      Background(), 4, 100, [&](int i) { hits[i].fetch_add(1); }, {.workqueue = wq.get()});
  worker_allocations = -1;
  EXPECT_TRUE(status.ok()) << status;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(hits[i].load(), 1) << "piece " << i;
}

// Throws an exception whose message ParallelizeUntil cannot copy: the next allocation of
// this thread fails (libstdc++ copies a runtime_error's message by reference count).
[[noreturn]] void ThrowWithAMessageThatCannotBeCopied() {
  std::runtime_error error(std::string(200, 'x'));
  testing::FailAllocation(1);
  throw error;
}

// Copying the message of a piece's exception ran out of memory inside the catch block:
// the bad_alloc left ParallelizeUntil (on the calling thread) instead of its status. Now
// the failure is reported, without the message.
TEST(ParallelizeUntilAllocTest, AMessageThatCannotBeCopiedStillReportsTheFailure) {
  absl::Status status;
  EXPECT_NO_THROW(status = ParallelizeUntil(Background(), 1, 10, [](int i) {
                    if (i == 3) ThrowWithAMessageThatCannotBeCopied();
                  }));
  EXPECT_TRUE(testing::FailureUsed());
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("out of memory"));
}

// The same on a helper: its workqueue caught the bad_alloc, nothing recorded the failure,
// and the call returned OK with the helper's other pieces never run.
TEST(ParallelizeUntilAllocTest, AHelperWhoseMessageCannotBeCopiedIsNotReadAsSuccess) {
  auto wq = *Workqueue::Create({.name = "alloc-msg", .flags = kUnbound});
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> helper_threw{false};
  const absl::Status status =
      ParallelizeUntil(Background(), 2, 2,
                       [&](int) {
                         if (std::this_thread::get_id() != caller) {
                           helper_threw = true;
                           ThrowWithAMessageThatCannotBeCopied();
                         }
                         // The caller's piece: wait for the helper's (a helper that never starts
                         // leaves its piece to the caller, which then passes this way and gives up
                         // waiting).
                         testing::Eventually([&] { return helper_threw.load(); }, absl::Seconds(2));
                       },
                       {.workqueue = wq.get()});
  wq->Drain();
  ASSERT_TRUE(helper_threw.load()) << "no helper ran a piece";
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_EQ(wq->stats().exceptions, 0u) << "the failure escaped to the workqueue";
}

// Post's Works come from recycled blocks (src/workqueue/post_blocks.h): posting waves of
// works allocates for the first waves only. Before, every Post allocated one.
TEST(PostAllocTest, PostReusesTheMemoryOfWorksThatRan) {
  auto wq = *Workqueue::Create({.name = "post", .flags = kUnbound});
  // A new block is made only when the producer's cache and the depot are empty: all blocks
  // then are in flight (at most a wave) or in the caches of the workers that ran posted
  // works (fewer than 2 * 64 each). Nothing blocks, so the unbound pool runs one worker
  // per CPU; twice that allows for idle workers left by earlier tests.
  const int workers = 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  constexpr int kWave = 128;
  const int bound = kWave + 2 * 64 * workers;
  const int waves = 4 * bound / kWave;
  std::atomic<int> ran{0};
  count_works = true;
  for (int wave = 0; wave < waves; ++wave) {
    for (int i = 0; i < kWave; ++i) ASSERT_TRUE(wq->Post([&ran] { ran.fetch_add(1); }));
    wq->Flush();
  }
  count_works = false;
  EXPECT_EQ(ran.load(), waves * kWave);
  EXPECT_LE(work_news.load(), bound) << "of " << waves * kWave << " posts";
}

// An idle worker that times out hands itself over to be joined, which allocates; without
// memory it stays, idle, and goes when memory is back. The bad_alloc used to leave the
// worker's thread function: std::terminate.
TEST(WorkerAllocTest, AnIdleWorkerThatCannotBeReapedStays) {
  auto runtime = *WorkqueueRuntime::Create({.idle_timeout = absl::Milliseconds(20)});
  auto wq = *Workqueue::Create({.name = "reap", .runtime = runtime.get()});
  const int cpu = runtime->topology().cpus()[0].cpu;
  std::atomic<bool> open{false};
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 5; ++i) {
    works.push_back(std::make_unique<Work>([&open] {
      BlockingScope blocking;  // each blocked work makes the pool wake another worker
      while (!open.load()) std::this_thread::yield();
    }));
    wq->QueueOn(cpu, works.back().get());
  }
  auto workers = [&] { return testing::PoolWorkers(*runtime, cpu); };
  ASSERT_TRUE(testing::Eventually([&] { return workers() >= 5; }));
  // The hand-over's first allocation: room for one pointer.
  fail_on_workers_size = sizeof(std::unique_ptr<internal::Worker>);
  open = true;
  wq->Flush();
  EXPECT_TRUE(testing::Eventually([&] { return worker_failures.load() > 0; }));
  EXPECT_GE(workers(), 3);  // none could go
  fail_on_workers_size = 0;
  EXPECT_TRUE(testing::Eventually([&] { return workers() <= 2; }));
}

// A rescuer joins the list of rescuers at work in a pool without allocating on its
// thread: the list was a vector, whose first push_back could throw there
// (std::terminate).
TEST(WorkerAllocTest, ARescuerAllocatesNothingToJoinAPool) {
  std::atomic<bool> fail_spawn{false};
  auto runtime =
      *WorkqueueRuntime::Create({.fail_thread_creation = [&] { return fail_spawn.load(); }});
  auto wq = *Workqueue::Create(
      {.name = "reclaim", .flags = kUnbound | kMemReclaim, .runtime = runtime.get()});
  fail_spawn = true;  // no worker can be made: the rescuer runs the work
  fail_on_rescuers_size = sizeof(internal::Worker*);
  std::atomic<bool> ran{false};
  Work work([&ran] { ran = true; });
  wq->Queue(&work);
  EXPECT_TRUE(testing::Eventually([&] { return ran.load(); }));
  wq->Flush();
  fail_on_rescuers_size = 0;
  fail_spawn = false;
  EXPECT_EQ(rescuer_failures.load(), 0);
  EXPECT_TRUE(testing::Eventually([&] { return wq->stats().rescued == 1u; }));
}

// ---- queues ----

using testing::AllocationsOf;
using testing::FailAllocation;
using testing::FailureUsed;

// Queueing on a NUMA node allocates nothing once the work's pending bit is taken (it may
// make a worker, which copes with a failed allocation itself): it copied the node's CPU
// list there, and a failure left the work pending for ever (never run, and its
// destructor's check failed).
TEST(WorkerAllocTest, QueueOnNodeCopesWithAFailedAllocation) {
  auto rt = *WorkqueueRuntime::Create({.topology = *Topology::FromXml(testing::kTwoSocketXml)});
  auto wq = *Workqueue::Create({.name = "numa",
                                .flags = kUnbound,
                                .affinity_scope = AffinityScope::kNuma,
                                .runtime = rt.get()});
  std::atomic<int> ran{0};
  Work work([&ran] { ran.fetch_add(1); });
  for (int node : {0, 1, 0, 1}) {
    FailAllocation(1);
    bool queued = false;
    EXPECT_NO_THROW(queued = wq->QueueOnNode(node, &work)) << "node " << node;
    FailureUsed();
    EXPECT_TRUE(queued);
    wq->Flush(&work);
  }
  EXPECT_EQ(ran.load(), 4);
}

// A delayed work whose timer cannot be made is left as it was. QueueDelayed claimed the
// work and then grew its set of timed works and made the timer, and ModDelayed took the
// work from where it was pending first: a failure of either left it pending on no list,
// for ever (never run; Cancel and Flush hung, and so did the workqueue's destructor).
// Every allocation of each call is failed in turn, with the timer service's slots grown
// by one each round so that some calls must grow them.
TEST(WorkerAllocTest, ADelayedWorkWhoseTimerCannotBeMadeIsLeftAsItWas) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  auto rt = *WorkqueueRuntime::Create({.clock = &clock, .timers = timers.get()});
  // One work at a time, so works queued behind a blocked one wait pending (parked).
  // Ordered: a bound workqueue's max_active is per CPU, and a work queued from another CPU
  // than the blocker's ran at once.
  auto wq = *Workqueue::Create({.name = "delayed", .flags = kOrdered, .runtime = rt.get()});
  std::atomic<bool> open{false};
  Work blocker([&open] {
    while (!open.load()) std::this_thread::yield();
  });
  ASSERT_TRUE(wq->Queue(&blocker));
  constexpr int kWorks = 24;
  std::atomic<int> ran{0};
  std::vector<std::unique_ptr<DelayedWork>> works;
  std::vector<TimerId> fillers;
  for (int i = 0; i < 2 * kWorks; ++i) {
    works.push_back(std::make_unique<DelayedWork>([&ran] { ran.fetch_add(1); }));
  }
  // Tries `call` with its 1st, 2nd, ... allocation failing until it goes through;
  // `check_failed` runs after each failure. Returns the failures seen.
  auto each_failure = [](auto call, auto check_failed) {
    int failures = 0;
    for (int k = 1;; ++k) {
      FailAllocation(k);
      try {
        call();
      } catch (const std::bad_alloc&) {
        ++failures;
        check_failed();
        continue;
      }
      EXPECT_FALSE(FailureUsed());
      return failures;
    }
  };
  int queue_failures = 0, mod_failures = 0;
  for (int i = 0; i < kWorks; ++i) {
    fillers.push_back(timers->ScheduleAfter(absl::Hours(5), [] {}));
    // Not pending: a failure leaves it not pending.
    DelayedWork* d = works[i].get();
    queue_failures += each_failure([&] { EXPECT_TRUE(wq->QueueDelayed(d, absl::Hours(1))); },
                                   [&] { ASSERT_FALSE(d->pending()); });
    // Pending behind the blocker: a failure leaves it pending there.
    DelayedWork* parked = works[kWorks + i].get();
    ASSERT_TRUE(wq->QueueDelayed(parked, absl::ZeroDuration()));
    fillers.push_back(timers->ScheduleAfter(absl::Hours(5), [] {}));
    mod_failures += each_failure([&] { EXPECT_TRUE(wq->ModDelayed(parked, absl::Hours(2))); },
                                 [&] { ASSERT_TRUE(parked->pending()); });
  }
  EXPECT_GT(queue_failures, 0);
  EXPECT_GT(mod_failures, 0);
  for (TimerId id : fillers) timers->Cancel(id);
  open = true;
  clock.Advance(absl::Hours(3));
  wq->Flush();
  // Each ran once: none was lost, none was left on two lists.
  EXPECT_EQ(ran.load(), 2 * kWorks);
  for (const auto& d : works) EXPECT_FALSE(d->pending());
}

// The failure counts grow by chunks and a directory of them as the key table does, and
// a failed growth changes nothing: the directory's capacity was doubled before its
// allocation, so after a failed one the next chunk was read past the old directory's end
// (a heap overflow under ASan).
TEST(QueueAllocTest, FailureCountsThatCannotGrowAreUnchanged) {
  FakeClock clock;
  internal::FailureCounts counts(absl::InfiniteDuration(), &clock);
  constexpr uint32_t kChunk = 4096;  // FailureCounts' entries per chunk
  counts.Reserve(4 * kChunk);        // fills the first directory
  counts.Record(4 * kChunk - 1, counts.Now(), /*busy=*/true);
  int failures = 0;
  for (int k = 1;; ++k) {
    FailAllocation(k);
    try {
      counts.Reserve(5 * kChunk);
    } catch (const std::bad_alloc&) {
      ++failures;
      continue;
    }
    ASSERT_FALSE(FailureUsed());
    break;
  }
  EXPECT_GE(failures, 2);  // the chunk and the directory
  counts.Reset(5 * kChunk - 1);
  EXPECT_EQ(counts.Record(5 * kChunk - 1, counts.Now(), /*busy=*/true), 0);
  EXPECT_EQ(counts.Record(4 * kChunk - 1, counts.Now(), /*busy=*/true), 1);
}

// The key table adds a chunk and grows its directory in one strongly exception-safe
// step: whichever allocation fails, the table is as before. The directory's capacity was
// doubled before its allocation, so after a failed one the next chunk was written past
// the old directory's end (a heap overflow under ASan, lost keys otherwise).
TEST(QueueAllocTest, AKeyTableThatCannotGrowIsUnchanged) {
  internal::KeyTable<uint32_t, absl::Hash<uint32_t>, std::equal_to<uint32_t>> table;
  constexpr uint32_t kChunk = 4096;  // KeyTable's slots per chunk
  uint32_t next = 0;
  for (; next < 4 * kChunk; ++next) table.Insert(next, 0);  // fills the first directory
  int failures = 0;
  for (int k = 1;; ++k) {  // fail the 1st, 2nd, ... allocation of the next insert
    FailAllocation(k);
    try {
      table.Insert(next, 0);
    } catch (const std::bad_alloc&) {
      ++failures;
      ASSERT_EQ(table.size(), next);
      ASSERT_EQ(table.Find(next), decltype(table)::kNone);
      continue;
    }
    const bool used = FailureUsed();
    ASSERT_FALSE(used);
    ++next;
    break;
  }
  EXPECT_GE(failures, 2);  // at least the chunk and the directory
  for (; next < 9 * kChunk; ++next) table.Insert(next, 0);
  for (uint32_t key = 0; key < next; ++key) {
    ASSERT_NE(table.Find(key), decltype(table)::kNone) << key;
  }
}

// Calls `op` (which may throw std::bad_alloc) until it succeeds, failing its first, then
// its second, ... allocation in turn, so every allocation point is made to fail once.
// Returns how many attempts failed.
template <typename Op>
int FailEachAllocationOnce(Op op) {
  for (int k = 1;; ++k) {
    FailAllocation(k);
    try {
      op();
    } catch (const std::bad_alloc&) {
      continue;
    }
    EXPECT_FALSE(FailureUsed());
    return k - 1;
  }
}

// Every allocation of an insert, the index's growth included, fails whole. Debian's
// Abseil sets a set's new capacity before it allocates, so a failed growth left the
// index corrupt (a heap overflow under ASan on the next lookup): the block the growth
// takes is now set aside first (kwq/internal/safe_growth.h).
TEST(QueueAllocTest, EveryAllocationOfAnInsertFailsWhole) {
  internal::KeyTable<uint32_t, absl::Hash<uint32_t>, std::equal_to<uint32_t>> table;
  int failures = 0;
  for (uint32_t key = 0; key < 20000; ++key) {
    failures += FailEachAllocationOnce([&] { table.Insert(key, 0); });
    ASSERT_EQ(table.size(), key + 1);
  }
  EXPECT_GT(failures, 10);  // chunks, the free list's room, the index's reserve
  for (uint32_t key = 0; key < 20000; ++key) {
    ASSERT_NE(table.Find(key), decltype(table)::kNone) << key;
  }
  // Through a queue: each key added once, handed out once, in order.
  Queue<int> q;
  for (int key = 0; key < 20000; ++key) {
    bool added = false;
    FailEachAllocationOnce([&] { added = q.Add(key); });
    ASSERT_TRUE(added) << key;
  }
  for (int key = 0; key < 20000; ++key) {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    ASSERT_EQ(**lease, key);
  }
}

// The same for a limiter's failure table (ExponentialFailure keeps one).
TEST(QueueAllocTest, EveryAllocationOfAFailureTableInsertFailsWhole) {
  auto limiter = *ExponentialFailureRateLimiter<int>::Create({});
  for (int item = 0; item < 5000; ++item) {
    FailEachAllocationOnce([&] { limiter->When(item); });
  }
  EXPECT_EQ(limiter->TrackedItems(), 5000u);
  for (int item = 0; item < 5000; ++item) ASSERT_EQ(limiter->NumRequeues(item), 1) << item;
}

// Every allocation of a ShardedQueue::AddAll may fail: each shard then holds a prefix of
// its share of the batch (in batch order), and nothing is queued twice. When the batch is
// taken but cannot be put in shard order (the order, and the sort's or the count's
// room), every item is still added, one at a time: the batch was dropped, its items with
// it. Both ways of ordering: a batch far smaller than the shard count, and not.
TEST(ShardedQueueAllocTest, AnAddAllThatCannotOrderItsBatchStillAddsIt) {
  for (const auto& [shards, batch] : {std::pair{256, 8}, std::pair{4, 200}}) {
    std::vector<int> items(batch);
    for (int i = 0; i < batch; ++i) items[i] = 1000 + i;
    int all_added_after_a_throw = 0;
    for (int k = 1;; ++k) {
      auto q = *ShardedQueue<int>::Create(shards);
      FailAllocation(k);
      bool threw = false;
      try {
        q->AddAll(items);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      if (!FailureUsed()) {
        ASSERT_FALSE(threw);
        ASSERT_EQ(q->Len(), items.size());
        break;
      }
      ASSERT_TRUE(threw) << "allocation " << k;
      all_added_after_a_throw += q->Len() == items.size();
      for (int s = 0; s < shards; ++s) {
        std::vector<int> share, got;
        for (int item : items) {
          if (q->ShardOf(item) == s) share.push_back(item);
        }
        while (auto lease = q->shard(s).TryGet()) got.push_back(lease->item());
        ASSERT_LE(got.size(), share.size()) << "shard " << s << ", allocation " << k;
        share.resize(got.size());
        EXPECT_EQ(got, share) << "shard " << s << ", allocation " << k;
      }
    }
    EXPECT_EQ(all_added_after_a_throw, 2) << shards << " shards: the order, and its room";
  }
}

// A drain bounded by a context whose wake-up cannot be registered throws std::bad_alloc:
// a Queue's before anything changes (not even shut down), a ShardedQueue's with every
// shard shut down and no drain left counted (one left counted kept every Done on its
// slow path, and Gets after a ShutDown waiting for owed runs, for good).
TEST(QueueAllocTest, ADrainWhoseWakeUpCannotBeMadeChangesNothing) {
  auto [ctx, cancel] = WithCancel(Background());
  Queue<int> q;
  FailAllocation(1);
  EXPECT_THROW(q.ShutDownWithDrain(ctx), std::bad_alloc);
  ASSERT_TRUE(FailureUsed());
  EXPECT_FALSE(q.ShuttingDown());
  EXPECT_EQ(internal::QueuePeer::Draining(q), 0);
  EXPECT_TRUE(q.Add(1));
}
TEST(ShardedQueueAllocTest, ADrainWhoseWakeUpCannotBeMadeLeavesNoDrainCounted) {
  auto [ctx, cancel] = WithCancel(Background());
  auto q = *ShardedQueue<int>::Create(3);
  FailAllocation(1);
  EXPECT_THROW(q->ShutDownWithDrain(ctx), std::bad_alloc);
  ASSERT_TRUE(FailureUsed());
  EXPECT_TRUE(q->ShuttingDown());
  for (int s = 0; s < q->shards(); ++s) {
    EXPECT_EQ(internal::QueuePeer::Draining(q->shard(s)), 0) << "shard " << s;
  }
}

// A Get(ctx) whose wake-up on ctx cannot be made for want of memory does not throw: it
// sleeps in steps of a millisecond, and returns once ctx is done, or with an item added
// meanwhile. It threw std::bad_alloc out of the worker's loop. `get(ctx)` returns the
// item or "none"; `waiters()` counts Gets asleep; `add()` adds "item".
void ExpectAGetWhoseWakeUpCannotBeMadeStillWaits(
    const std::function<std::string(const Context&)>& get, const std::function<int()>& waiters,
    const std::function<void()>& add) {
  for (const bool by_cancel : {true, false}) {
    SCOPED_TRACE(by_cancel ? "ended by a cancel" : "ended by an add");
    auto [ctx, cancel] = WithCancel(Background());
    std::string outcome;
    std::atomic<bool> done{false};
    bool used = false;
    std::thread getter([&, c = ctx] {
      testing::FailAllocation(1);  // the wake-up's registration on c, before it sleeps
      try {
        outcome = get(c);
      } catch (const std::bad_alloc&) {
        outcome = "threw";
      }
      used = testing::FailureUsed();
      done = true;
    });
    EXPECT_TRUE(testing::Eventually([&] { return waiters() > 0 || done.load(); }));
    if (by_cancel) {
      cancel();
    } else {
      add();
    }
    EXPECT_TRUE(testing::Eventually([&] { return done.load(); }));
    if (!done) cancel();  // releases the Get, so the test fails instead of hanging
    getter.join();
    EXPECT_TRUE(used);
    EXPECT_EQ(outcome, by_cancel ? "none" : "item");
  }
}

TEST(QueueAllocTest, AGetWhoseWakeUpCannotBeMadeStillWaits) {
  Queue<std::string> q;
  ExpectAGetWhoseWakeUpCannotBeMadeStillWaits(
      [&](const Context& ctx) {
        auto lease = q.Get(ctx);
        return lease ? lease->item() : std::string("none");
      },
      [&] { return internal::QueuePeer::Waiters(q); }, [&] { q.Add(std::string("item")); });
}
TEST(PriorityQueueAllocTest, AGetWhoseWakeUpCannotBeMadeStillWaits) {
  auto q = *PriorityQueue<std::string>::Create();
  ExpectAGetWhoseWakeUpCannotBeMadeStillWaits(
      [&](const Context& ctx) {
        auto lease = q->Get(ctx);
        return lease ? lease->item() : std::string("none");
      },
      [&] { return internal::QueuePeer::Waiters(*q); }, [&] { q->Add(std::string("item")); });
}
TEST(ShardedQueueAllocTest, AGetWhoseWakeUpCannotBeMadeStillWaits) {
  auto q = *ShardedQueue<std::string>::Create(2);
  ExpectAGetWhoseWakeUpCannotBeMadeStillWaits(
      [&](const Context& ctx) {
        auto lease = q->Get(0, ctx);
        return lease ? lease->item() : std::string("none");
      },
      [&] { return internal::QueuePeer::Waiters(q->shard(0)); },
      [&] { q->Add(std::string("item")); });
}

// An add of a new key that fails for memory has not taken the caller's item: the key is
// moved in only once the room the add needs next (the ready list's push, the failure
// count) is made. It was moved into the key table first, and the overflow list's growth
// then threw.
TEST(QueueAllocTest, AFailedAddLeavesTheCallersItem) {
  Queue<std::string> q;
  constexpr int kNew = 1500;
  constexpr int kOld = 2 * kNew;  // idle keys, re-added two before each new one
  for (int i = 0; i < kOld; ++i) q.Add("old" + std::to_string(i));
  while (auto lease = q.TryGet()) {
  }
  int failures = 0;
  for (int i = 0; i < kNew; ++i) {  // past the ring (1,024): the overflow list grows
    // Two old keys' slots (descending) before each new one (ascending): no two slots in a
    // row are consecutive, so each takes a word of the overflow list, and the list's
    // doublings fall on new keys' adds too.
    q.Add("old" + std::to_string(kOld - 1 - 2 * i));
    q.Add("old" + std::to_string(kOld - 2 - 2 * i));
    for (int k = 1;; ++k) {
      std::string item = std::string(40, 'k') + std::to_string(i);  // not a short string
      const std::string copy = item;
      FailAllocation(k);
      try {
        q.Add(std::move(item));
      } catch (const std::bad_alloc&) {
        ++failures;
        ASSERT_EQ(item, copy) << "allocation " << k << " of key " << i;
        continue;
      }
      FailureUsed();
      break;
    }
  }
  EXPECT_GT(failures, 0);
  EXPECT_EQ(q.Len(), static_cast<size_t>(kOld + kNew));
}

// An add that cannot allocate room in the ready order throws before it changes
// anything: the key is not marked queued, and adding it again later works. The overflow
// list's size was counted before its allocation, so the list handed out a slot it did
// not hold, and the key stayed marked queued in no list: never handed out. Also, a Get
// that cannot allocate hands out all the same.
TEST(QueueAllocTest, AnAddThatCannotAllocateChangesNothing) {
  Queue<int> q;
  constexpr int kKeys = 3000;  // past the ring (1,024), under the idle keys kept (4,096)
  std::vector<int> keys(kKeys);
  for (int i = 0; i < kKeys; ++i) keys[i] = i;
  ASSERT_EQ(q.AddAll(keys), static_cast<size_t>(kKeys));
  while (auto lease = q.TryGet()) {
  }
  // Added again newest first, the keys' slots descend: one word each in the overflow list,
  // which then allocates every so often.
  int failures = 0;
  for (int i = kKeys - 1; i >= 0; --i) {
    FailAllocation(1);
    try {
      ASSERT_TRUE(q.Add(i));
    } catch (const std::bad_alloc&) {
      ++failures;
      ASSERT_TRUE(q.Add(i)) << "key " << i << " was left marked queued";
    }
    FailureUsed();
  }
  EXPECT_GT(failures, 0);
  EXPECT_EQ(q.Len(), static_cast<size_t>(kKeys));
  for (int i = kKeys - 1; i >= 0; --i) {
    FailAllocation(1);
    auto lease = q.TryGet();
    FailureUsed();
    ASSERT_TRUE(lease.has_value()) << "at " << i;
    ASSERT_EQ(**lease, i);
  }
  EXPECT_FALSE(q.TryGet().has_value());
}

// Due items whose push cannot get room stay waiting for a later pass (the timer's, or a
// Get's), and the pass returns normally: it runs in the timer's callback and in Get. It
// used to throw out of them (the timer callback then left the queue's lock held).
TEST(QueueAllocTest, DueItemsWithoutRoomWaitForALaterPass) {
  Queue<int> q;
  for (int i = 0; i < 1024; ++i) q.Add(100000 + i);  // fills the ring
  // Due newest key first: descending slots, one word each in the overflow list.
  constexpr int kWaiting = 3000;
  for (int i = 0; i < kWaiting; ++i) internal::QueuePeer::AddWaiting(q, i, kWaiting - i);
  size_t promoted = 0;
  int short_passes = 0;
  for (int pass = 0; promoted < kWaiting; ++pass) {
    ASSERT_LT(pass, 100);
    if (pass % 2 == 0) FailAllocation(1);  // every other pass: the next growth fails
    const size_t n = internal::QueuePeer::PromoteDue(q, kWaiting + 1);
    if (FailureUsed()) ++short_passes;
    promoted += n;
  }
  EXPECT_GT(short_passes, 0);
  EXPECT_EQ(q.Len(), static_cast<size_t>(1024 + kWaiting));
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(**q.TryGet(), 100000 + i);
  for (int i = kWaiting - 1; i >= 0; --i) ASSERT_EQ(**q.TryGet(), i);
}

// A timer firing whose due items find no memory to be queued tries again a millisecond
// later, not at once: it re-armed for their (past) ready time and fired again at once,
// over and over, for as long as memory lacked (a spin that starved the timer service's
// other timers). Here each firing's try is one failed array allocation (the overflow
// list's growth), with at most 1,000 failures before memory "comes back".
TEST(QueueAllocTest, DueItemsWithoutRoomAreRetriedLaterNotAtOnce) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  DelayingQueue<int> q({.clock = &clock, .timers = timers.get()});
  for (int i = 0; i < 1024; ++i) q.Add(100000 + i);  // fills the ring
  constexpr int kWaiting = 3000;
  // Due newest key first: descending slots, one word each in the overflow list.
  for (int i = 0; i < kWaiting; ++i) q.AddAfter(i, absl::Milliseconds(1 + kWaiting - i));
  testing::array_failures_left = 1000;
  clock.Advance(absl::Seconds(4));
  const int failed = 1000 - std::max(0, testing::array_failures_left.exchange(0));
  EXPECT_GE(failed, 1);
  EXPECT_LE(failed, 3) << "the timer fired again at once after each failure";
  EXPECT_LT(q.Len(), static_cast<size_t>(1024 + kWaiting));
  clock.Advance(absl::Milliseconds(1));  // the retry, with memory
  EXPECT_EQ(q.Len(), static_cast<size_t>(1024 + kWaiting));
}

// The metrics recorder's count of items by priority grows through a reserve too: an
// allocation that fails there is caught (a metric update is lost) and the map must stay
// whole for the next call. A failed growth used to leave it corrupt, and its next use (at
// the latest the recorder's destructor, which walks it) read past its arrays.
TEST(QueueAllocTest, TheDepthByPriorityStaysWholeWhenItCannotGrow) {
  testing::RecordedMetrics recorded;
  testing::RecordingProvider provider(&recorded, /*refresh_gauges=*/false, /*by_priority=*/true);
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  {
    internal::QueueMetricsRecorder recorder(&provider, "q", &clock, timers.get(), true);
    for (int p = 0; p < 2000; ++p) {
      FailAllocation(1);
      recorder.OnAdd(static_cast<uint32_t>(p), p);
      FailureUsed();
      recorder.OnAdd(static_cast<uint32_t>(p), p);  // counted this time
    }
    for (int p = 0; p < 2000; p += 2) recorder.OnReprioritize(p, p + 1);
  }  // the destructor takes every count it holds off the gauges
}

// A Done whose item was added again while in flight queues it without allocating (room
// was made by the add), so a lease's destructor cannot fail. It used to allocate in the
// overflow list, and an allocation failure there ended the process (std::terminate).
TEST(QueueAllocTest, ADoneNeverAllocates) {
  Queue<int> q;
  constexpr int kLeased = 300;
  for (int i = 0; i < kLeased; ++i) q.Add(i);
  std::vector<Queue<int>::Lease> leases;
  while (auto lease = q.TryGet()) leases.push_back(std::move(*lease));
  ASSERT_EQ(leases.size(), static_cast<size_t>(kLeased));
  for (int i = 0; i < kLeased; ++i) ASSERT_TRUE(q.Add(i));  // owed a run after Done
  for (int i = 0; i < 1024; ++i) q.Add(1000 + i);           // fills the ring
  // Done newest first: descending slots, one word each in the overflow list.
  for (int i = kLeased - 1; i >= 0; --i) {
    FailAllocation(1);
    leases[i].Done();
    ASSERT_FALSE(FailureUsed()) << "Done of " << i << " allocated";
  }
  EXPECT_EQ(q.Len(), static_cast<size_t>(kLeased + 1024));
}

// ---- priority queue ----

using StringPQ = PriorityQueue<std::string>;

// A queue on `clock` whose items fall into groups by their first letter.
std::unique_ptr<StringPQ> GroupedQueue(FakeClock& clock) {
  StringPQ::Options options;
  options.clock = &clock;
  options.group = [](const std::string& s) { return s.empty() ? 0 : uint64_t(s[0]); };
  return *StringPQ::Create(std::move(options));
}

// What a queue holds, as its counts and, with the clock moved an hour on, its items in
// hand-out order (which takes them all out).
struct Contents {
  size_t len, depth, waiting;
  std::vector<std::string> order;
  bool operator==(const Contents&) const = default;
};
Contents Take(StringPQ& q, FakeClock& clock) {
  Contents c{q.Len(), q.Depth(), q.Waiting(), {}};
  clock.Advance(absl::Hours(1));
  while (auto lease = q.TryGet()) c.order.push_back(lease->item());
  return c;
}

// Every allocation of an add fails in turn, on a queue set up afresh each time: an add
// that throws leaves the queue as it was (the same counts and the same items in the
// same order as a queue that never saw it), and one that goes through leaves it as an
// add without failures does. Before, the slot information, ready levels, groups and
// heaps allocated after the add had marked the item waiting.
TEST(PriorityQueueAllocTest, EveryAllocationOfAnAddFailsWhole) {
  struct Case {
    const char* name;
    std::function<void(StringPQ&)> setup, op;
  };
  auto add = [](const char* item, AddOpts opts = {}) {
    return [=](StringPQ& q) { q.Add(std::string(item), opts); };
  };
  auto both = [](std::function<void(StringPQ&)> a, std::function<void(StringPQ&)> b) {
    return [=](StringPQ& q) {
      a(q);
      b(q);
    };
  };
  auto many = [](StringPQ& q) {  // a full first chunk of the key table (4096 slots)
    for (int i = 0; i < 4096; ++i) q.Add("m" + std::to_string(i));
  };
  const std::vector<Case> cases = {
      {"new key, new priority and group", both(add("a1"), add("b1")), add("c1", {.priority = 7})},
      {"raise of a ready item", both(both(add("a1"), add("a2")), add("b1")),
       add("a2", {.priority = 5})},
      {"delayed new key", add("a1"), add("z1", {.after = absl::Seconds(1)})},
      {"delayed item made ready", add("a1", {.after = absl::Seconds(5)}),
       add("a1", {.priority = 2})},
      {"first rate-limited add", add("a1"), add("r1", {.rate_limited = true})},
      {"new key past a full chunk", many, add("x1", {.priority = 1})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeClock ref_clock;
    auto before = GroupedQueue(ref_clock);
    c.setup(*before);
    const Contents without = Take(*before, ref_clock);
    FakeClock ref_clock2;
    auto after = GroupedQueue(ref_clock2);
    c.setup(*after);
    c.op(*after);
    const Contents with = Take(*after, ref_clock2);
    int failures = 0;
    for (int k = 1;; ++k) {
      FakeClock clock;
      auto q = GroupedQueue(clock);
      c.setup(*q);
      FailAllocation(k);
      bool threw = false;
      try {
        c.op(*q);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      const bool used = FailureUsed();
      const Contents got = Take(*q, clock);
      if (threw) {
        ++failures;
        ASSERT_EQ(got, without) << "allocation " << k << " failed";
      } else {
        ASSERT_EQ(got, with) << "allocation " << k << " failed";
        if (!used) break;  // past the add's last allocation
      }
    }
    EXPECT_GT(failures, 0);
  }
}

// An add that fails for memory does not take the caller's item: the key is moved in only
// once nothing else can fail. It was moved into the key table first, and erased with the
// add.
TEST(PriorityQueueAllocTest, AFailedAddLeavesTheCallersItem) {
  FakeClock clock;
  auto q = GroupedQueue(clock);
  int failures = 0;
  for (int k = 1;; ++k) {
    std::string item(40, 'x');  // longer than the short-string buffer: a move takes it
    FailAllocation(k);
    try {
      q->Add(std::move(item), {.priority = 3});
    } catch (const std::bad_alloc&) {
      ++failures;
      ASSERT_EQ(item, std::string(40, 'x')) << "allocation " << k;
      continue;
    }
    if (!FailureUsed()) break;
  }
  EXPECT_GT(failures, 0);
  EXPECT_EQ(q->Len(), 1u);
}

// A delayed item makes its group only when it comes due; when the group cannot be made
// the item stays waiting (not lost) and the timer tries again a millisecond later, not at
// once (a timer re-armed in the past would fire again in the same clock move, and spin
// for as long as memory lacks). A Get that moves due items copes the same way.
TEST(PriorityQueueAllocTest, DueItemsWithoutRoomWaitAndAreRetriedLater) {
  FakeClock clock;
  auto q = GroupedQueue(clock);
  ASSERT_TRUE(q->Add(std::string("z1"), {.priority = 7, .after = absl::Seconds(1)}));
  FailAllocation(1);                // the group's: the timer fires on this thread
  clock.Advance(absl::Seconds(1));  // due
  EXPECT_TRUE(FailureUsed());
  EXPECT_EQ(q->Waiting(), 1u);
  EXPECT_EQ(q->Len(), 0u);
  FailAllocation(1);
  EXPECT_FALSE(q->TryGet().has_value());  // a Get that cannot make it ready either
  EXPECT_TRUE(FailureUsed());
  EXPECT_EQ(q->Waiting(), 1u);
  clock.Advance(absl::Milliseconds(1));  // the timer's retry
  EXPECT_EQ(q->Len(), 1u);
  auto lease = q->TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->item(), "z1");
  EXPECT_EQ(lease->priority(), 7);
}

// The same past about the year 2262, where the clock reads the largest time key: the
// retry's time saturates (it overflowed: undefined behaviour, and a retry armed in the
// past), and the item waits for a Get.
TEST(PriorityQueueAllocTest, DueItemsWithoutRoomPastTheKeyRangeWaitForAGet) {
  FakeClock clock;
  auto q = GroupedQueue(clock);
  ASSERT_TRUE(q->Add(std::string("z1"), {.priority = 7, .after = absl::Seconds(1)}));
  FailAllocation(1);                                              // the group's, in the firing
  clock.SetTime(absl::FromUnixSeconds(int64_t{20'000'000'000}));  // year 2603
  EXPECT_TRUE(FailureUsed());
  EXPECT_EQ(q->Waiting(), 1u);
  auto lease = q->TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->item(), "z1");
}

// A DelayingQueue's AddAfter makes its timer before it changes anything: one whose timer
// cannot be made throws with the caller's item untouched and nothing waiting. The timer
// was made last, after the item was taken and marked waiting.
TEST(DelayingQueueAllocTest, AnAddAfterWhoseTimerCannotBeMadeChangesNothing) {
  int failures = 0;
  for (int k = 1;; ++k) {
    FakeClock clock;
    auto timers = *TimerService::Create({.clock = &clock});
    DelayingQueue<std::string> q({.clock = &clock, .timers = timers.get()});
    std::string item(40, 'd');
    FailAllocation(k);
    try {
      q.AddAfter(std::move(item), absl::Seconds(1));
    } catch (const std::bad_alloc&) {
      ++failures;
      ASSERT_EQ(item, std::string(40, 'd')) << "allocation " << k;
      ASSERT_EQ(q.Waiting(), 0u) << "allocation " << k;
      continue;
    }
    const bool used = FailureUsed();
    ASSERT_EQ(q.Waiting(), 1u);
    clock.Advance(absl::Seconds(1));
    ASSERT_EQ(q.Len(), 1u) << "allocation " << k << ": no timer moved it";
    if (!used) break;
  }
  EXPECT_GT(failures, 0);
}

// A retry of the item being processed (AddAfter of the lease's own item, found by address)
// makes room in the waiting heap before it marks the item waiting. It marked it first: a
// failed growth left it marked waiting outside the heap, and the next add of it crashed.
// Each allocation of such retries fails in turn (the heap grows as more items wait).
TEST(DelayingQueueAllocTest, ARetryOfTheLeasedItemThatCannotAllocateChangesNothing) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  DelayingQueue<std::string> q({.clock = &clock, .timers = timers.get()});
  constexpr int kItems = 100;
  for (int i = 0; i < kItems; ++i) q.Add("i" + std::to_string(i));
  int failures = 0;
  for (int i = 0; i < kItems; ++i) {
    auto lease = q.TryGet();
    ASSERT_TRUE(lease.has_value());
    for (int k = 1;; ++k) {
      const size_t waiting = q.Waiting();
      FailAllocation(k);
      try {
        q.AddAfter(lease->item(), absl::Hours(1));
      } catch (const std::bad_alloc&) {
        ++failures;
        ASSERT_EQ(q.Waiting(), waiting) << "item " << i << ", allocation " << k;
        continue;
      }
      FailureUsed();
      break;
    }
  }
  EXPECT_GT(failures, 0);
  EXPECT_EQ(q.Waiting(), static_cast<size_t>(kItems));
  for (int i = 0; i < kItems; ++i) q.Add("i" + std::to_string(i));  // each now: once
  EXPECT_EQ(q.Waiting(), 0u);
  EXPECT_EQ(q.Len(), static_cast<size_t>(kItems));
}

// Schedules idle timers on `timers` until the next one would need an allocation (they
// take the slots freed before, then the room its vectors have).
void FillTimerService(TimerService& timers) {
  for (;;) {
    FailAllocation(1);
    try {
      timers.Schedule(absl::InfiniteFuture(), [] {});
    } catch (const std::bad_alloc&) {
      return;
    }
    FailureUsed();
  }
}

// A Get about to sleep arms the timer for the next ready time. When no timer is left (a
// firing's clock threw) and a new one cannot be made, the Get does not throw: its
// arming threw std::bad_alloc out of Get with the queue's lock held, and every later
// call deadlocked. A Get that cannot make it sleeps in steps, and moves the item itself
// once it is due.
TEST(DelayingQueueAllocTest, AGetThatCannotMakeTheTimerSleepsInSteps) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto timers = *TimerService::Create({.clock = &clock});
  auto q = std::make_unique<DelayingQueue<std::string>>(
      DelayingQueue<std::string>::Options{.clock = &clock, .timers = timers.get()});
  q->AddAfter(std::string("a"), absl::Milliseconds(1));
  q->AddAfter(std::string("b"), absl::Hours(1));
  clock.ThrowNext(1);  // the firing's first reading: it ends with no timer
  EXPECT_THROW(fake.Advance(absl::Milliseconds(2)), std::runtime_error);
  auto first = q->TryGet();  // moves "a" itself
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->item(), "a");
  first->Done();
  FillTimerService(*timers);
  auto [ctx, cancel] = WithCancel(Background());
  cancel();  // the Get returns once it has tried to arm the timer for "b"
  FailAllocation(1);
  bool threw = false;
  try {
    EXPECT_FALSE(q->Get(ctx).has_value());
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  EXPECT_TRUE(FailureUsed());
  EXPECT_FALSE(threw);
  if (threw) {  // the queue's lock is held for ever: leave the queue be
    q.release();
    timers.release();
    return;
  }
  // A worker whose allocations all fail cannot arm the timer either: it sleeps in steps.
  getter_failures = 0;
  fail_on_getters = true;
  testing::AsyncGet getter([&q] {
    pthread_setname_np(pthread_self(), "getter");
    auto lease = q->Get();
    return lease ? lease->item() : "none";
  });
  EXPECT_TRUE(testing::Eventually([&] { return getter_failures.load() > 0; }));
  fake.Advance(absl::Hours(1));  // "b" is due; no timer fires
  // A release lets a sleeping Get end (it then finds "b" due).
  const bool in_time = getter.Await([&] {
    fail_on_getters = false;
    q->ShutDown();
  });
  fail_on_getters = false;
  EXPECT_TRUE(in_time) << "the sleeping Get did not look for the due item";
  EXPECT_EQ(getter.outcome(), "b");
}

// Ending a lease and handing an item out allocate nothing, also when the lease's item
// was added again meanwhile (at a new priority, in a group that did not exist): its
// place was set aside by that add. Before, a Done could allocate in its lease's
// destructor (std::terminate on failure). A delayed re-add may make the queue's timer;
// that failure is borne, and the item still comes due (its group is made then, by the
// timer's firing: see DueItemsWithoutRoomWaitAndAreRetriedLater).
TEST(PriorityQueueAllocTest, NeitherGetNorDoneAllocates) {
  FakeClock clock;
  auto q = GroupedQueue(clock);
  constexpr int kItems = 200;
  for (int i = 0; i < kItems; ++i) q->Add("i" + std::to_string(i));
  std::vector<StringPQ::Lease> leases;
  for (int i = 0; i < kItems; ++i) {
    FailAllocation(1);
    auto lease = q->TryGet();
    ASSERT_FALSE(FailureUsed()) << "Get " << i << " allocated";
    ASSERT_TRUE(lease.has_value());
    leases.push_back(std::move(*lease));
  }
  for (int i = 0; i < kItems; ++i) {  // owed runs, each at a priority of its own
    const absl::Duration after = i % 2 == 0 ? absl::ZeroDuration() : absl::Seconds(i);
    ASSERT_TRUE(q->Add("i" + std::to_string(i), {.priority = i, .after = after}));
  }
  for (size_t i = 0; i < leases.size(); ++i) {
    FailAllocation(1);
    leases[i].Done();  // a throw here would end the process
    // A delayed re-add may make the queue's timer, whose failure is borne (see
    // ADelayedItemWithoutATimerIsStillHandedOut); an immediate one allocates nothing.
    const bool used = FailureUsed();
    if (i % 2 == 0) {
      ASSERT_FALSE(used) << "Done " << i << " allocated";
    }
  }
  clock.Advance(absl::Hours(1));
  int handed_out = 0;
  for (;;) {
    FailAllocation(1);
    auto lease = q->TryGet();
    ASSERT_FALSE(FailureUsed()) << "Get allocated";
    if (!lease) break;
    ++handed_out;
    FailAllocation(1);
    lease->Done();  // the key goes idle: listed among the idle keys
    ASSERT_FALSE(FailureUsed()) << "Done of " << handed_out << " allocated";
  }
  EXPECT_EQ(handed_out, kItems);
}

// A delayed add whose timer cannot be made still goes through (the item waits), and a Get
// asleep meanwhile hands it out once due: without a timer, sleeping Gets look for due
// items themselves. Before, the add threw after marking the item delayed, and nothing
// made it ready: the Get slept for ever.
TEST(PriorityQueueAllocTest, ADelayedItemWithoutATimerIsStillHandedOut) {
  FakeClock ref_clock;
  auto ref = GroupedQueue(ref_clock);
  const int allocations =
      AllocationsOf([&] { ref->Add(std::string("a1"), {.after = absl::Seconds(1)}); });
  FakeClock clock;
  auto q = GroupedQueue(clock);
  std::atomic<bool> got{false};
  std::thread worker([&] {
    if (auto lease = q->Get()) got = true;
  });
  FailAllocation(allocations);  // the last one: the timer's (a new timer service's first)
  bool threw = false;
  try {
    q->Add(std::string("a1"), {.after = absl::Seconds(1)});
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  EXPECT_TRUE(FailureUsed());
  EXPECT_FALSE(threw);
  EXPECT_EQ(q->Waiting(), 1u);
  clock.Advance(absl::Seconds(1));  // no timer fires
  EXPECT_TRUE(testing::Eventually([&] { return got.load(); }));
  q->ShutDown();
  worker.join();
}
// As Queue's (ADrainWhoseWakeUpCannotBeMadeChangesNothing above).
TEST(PriorityQueueAllocTest, ADrainWhoseWakeUpCannotBeMadeChangesNothing) {
  auto [ctx, cancel] = WithCancel(Background());
  auto q = *StringPQ::Create();
  FailAllocation(1);
  EXPECT_THROW(q->ShutDownWithDrain(ctx), std::bad_alloc);
  ASSERT_TRUE(FailureUsed());
  EXPECT_FALSE(q->ShuttingDown());
  EXPECT_EQ(internal::QueuePeer::Draining(*q), 0);
  EXPECT_TRUE(q->Add(std::string("a")));
}

// A PriorityQueue Get(ctx) registers a wake-up on ctx that points into its frame. While a
// delayed item has no timer, the sleeping Get looks for due items itself and reads the
// clock; a throw there removes the wake-up first. It was left on ctx, and cancelling ctx
// then ran it on the dead frame (the scribbled stack makes that crash).
TEST(PriorityQueueAllocTest, AGetWithAContextWhoseClockThrowsLeavesNoWakeUpOnIt) {
  FakeClock fake;
  testing::CountingClock clock(&fake);
  const auto make = [&clock] {
    StringPQ::Options options;
    options.clock = &clock;
    return *StringPQ::Create(std::move(options));
  };
  auto ref = make();  // how many allocations and clock readings a delayed add makes
  const int reads_before = clock.reads();
  const int allocations =
      AllocationsOf([&] { ref->Add(std::string("a1"), {.after = absl::Seconds(1)}); });
  const int add_reads = clock.reads() - reads_before;
  auto q = make();
  auto [ctx, cancel] = WithCancel(Background());
  testing::AsyncGet getter(
      [&, c = ctx] {
        auto lease = q->Get(c);
        return lease ? lease->item() : "none";
      },
      testing::AsyncGet::kScribbleAndStay);
  EXPECT_TRUE(testing::Eventually([&] { return internal::QueuePeer::Waiters(*q) > 0; }));
  // The add's readings pass; the next one, the woken Get's, throws.
  clock.ThrowNext(1, /*after=*/add_reads);
  FailAllocation(allocations);  // the last one: the timer's (a new timer service's first)
  q->Add(std::string("a1"), {.after = absl::Seconds(1)});
  EXPECT_TRUE(FailureUsed());
  const bool returned = getter.ReturnsWithin(absl::Seconds(5));
  if (returned) cancel();  // runs nothing of the Get's now
  EXPECT_TRUE(getter.Await([&] { q->ShutDown(); }, absl::ZeroDuration()));
  EXPECT_EQ(getter.outcome(), "threw");
}

// A timer heap insert that cannot allocate changes nothing: each allocation of an insert
// that grows the heap fails in turn, and the next insert gets the slot the failed one
// would have had. The slot was appended before the heap's growth, which then threw, and
// was lost for good (the next insert took the one after it).
TEST(TimerHeapAllocTest, AnInsertThatCannotAllocateLosesNoSlot) {
  for (int k = 1; k <= 3; ++k) {
    SCOPED_TRACE(k);
    internal::TimerHeap heap;
    for (int i = 0; i < 16; ++i) heap.Insert(absl::UnixEpoch() + absl::Seconds(i), [] {});
    FailAllocation(k);  // the 17th insert grows the heap and the slot array
    bool threw = false;
    try {
      heap.Insert(absl::UnixEpoch() + absl::Seconds(16), [] {});
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool used = FailureUsed();
    EXPECT_EQ(threw, used);
    EXPECT_EQ(heap.size(), threw ? 16u : 17u);
    const uint64_t id = heap.Insert(absl::UnixEpoch() + absl::Seconds(17), [] {});
    EXPECT_EQ(id & 0xffff'ffffu, threw ? 16u : 17u) << "the slot of the failed insert was lost";
  }
}

// Two late pins (raised items' places) held at once on one group: each reserved room in
// the group's heap for one more id than it had, so together they reserved for one, and
// the second Link (documented to allocate nothing: it runs where nothing may throw) grew
// the heap. A pin now reserves for every pin outstanding.
TEST(ReadyLevelsAllocTest, LatePinsHeldAtOnceLinkWithoutAllocating) {
  internal::ReadyLevels levels;
  levels.ReserveSlots(64);
  for (uint32_t s = 0; s < 9; ++s) levels.Link(s, levels.Pin(0, 0), s);
  levels.Link(20, levels.Pin(5, 0), 100);  // the group's newest sequence: 100
  for (uint32_t s = 0; s < 7; ++s) {       // raised: older sequences, into the group's heap
    const uint32_t g = levels.Pin(5, 0, /*late=*/true);
    levels.Link(s, g, levels.Unlink(s));
  }
  const uint32_t g1 = levels.Pin(5, 0, /*late=*/true);
  const uint32_t g2 = levels.Pin(5, 0, /*late=*/true);
  EXPECT_EQ(AllocationsOf([&] { levels.Link(7, g1, levels.Unlink(7)); }), 0);
  EXPECT_EQ(AllocationsOf([&] { levels.Link(8, g2, levels.Unlink(8)); }), 0);
  std::vector<uint32_t> order;
  while (!levels.empty()) order.push_back(levels.PopNext());
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 20}));
}

// ---- contexts ----

// A WithTimeout that cannot allocate (its node, or its timer in a full timer service)
// throws std::bad_alloc and leaves nothing behind; so do WithValue and WithoutCancel.
// They leaked the node and a reference to the parent, so the parent was never freed
// (LeakSanitizer reports it at exit in make test's ASan build).

TEST(ContextAllocTest, ContextsThatCannotAllocateLeaveNothingBehind) {
  FakeClock clock;
  auto timers = *TimerService::Create({.clock = &clock});
  auto [parent, cancel] = WithCancel(BackgroundWithTimers(timers.get()));
  FillTimerService(*timers);
  // Fails each allocation of `make` in turn; returns how many failed.
  const auto each_allocation = [](const std::function<void()>& make) {
    int failures = 0;
    for (int k = 1;; ++k) {
      FailAllocation(k);
      try {
        make();
      } catch (const std::bad_alloc&) {
        ++failures;
        continue;
      }
      if (!FailureUsed()) return failures;
    }
  };
  // The node's, then the timer's.
  const Context& p = parent;  // lambdas cannot capture a structured binding (clang 14)
  EXPECT_GE(each_allocation([&] { (void)WithTimeout(p, absl::Hours(1)); }), 2);
  static constexpr ContextKey<std::string> kKey{"key"};
  EXPECT_GE(each_allocation([&] { (void)WithValue(p, kKey, std::string(40, 'v')); }), 1);
  EXPECT_GE(each_allocation([&] { (void)WithoutCancel(p); }), 1);
  auto [child, cancel_child] = WithTimeout(parent, absl::Hours(1));
  cancel();
  EXPECT_TRUE(child.IsCancelled());
}

// A cancellation allocates nothing, however many children it marks: it runs from
// destructors and timer callbacks, where a std::bad_alloc cannot be reported. Its work
// list was a vector of 16 inline slots; the 17th child grew it, and a failure there left
// the parent's child list half detached and the references taken leaked.
TEST(ContextAllocTest, ACancellationAllocatesNothing) {
  WithCancel(Background()).cancel();  // the process's first makes the error statuses, once
  auto [parent, cancel] = WithCancel(Background());
  std::vector<CancelableContext> children;
  std::vector<CancelableContext> grandchildren;
  std::vector<AfterFuncHandle> funcs;
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) {
    children.push_back(WithCancel(parent));
    grandchildren.push_back(WithCancel(children.back().context));
    funcs.push_back(AfterFunc(grandchildren.back().context, [&ran] { ++ran; }));
  }
  const CancelFunc& c = cancel;  // lambdas cannot capture a structured binding (clang 14)
  EXPECT_EQ(testing::AllocationsOf([&] { c(); }), 0);
  EXPECT_EQ(ran.load(), 100);
  for (const CancelableContext& g : grandchildren) EXPECT_TRUE(g.context.IsCancelled());
}

// ToStopToken of a value context registers on the value's cancellable ancestor and ties
// the registration to the value's node. When an allocation fails it throws and leaves no
// registration on the ancestor: one made before the tie's allocation failed stayed there,
// holding its std::stop_source, until the ancestor ended.
TEST(ContextAllocTest, AToStopTokenThatCannotAllocateLeavesNoRegistration) {
  auto [parent, cancel] = WithCancel(Background());
  static constexpr ContextKey<int> kKey{"key"};
  const Context value = WithValue(parent, kKey, 7);
  internal::ContextNode* const node = internal::NodeOf(parent);
  const auto registrations = [node]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    internal::SpinLockHolder lock(&node->mu);
    return node->after_funcs.size();
  };
  int failures = 0;
  for (int k = 1;; ++k) {
    FailAllocation(k);
    try {
      (void)ToStopToken(value);
    } catch (const std::bad_alloc&) {
      ++failures;
      EXPECT_EQ(registrations(), 0u) << "allocation " << k;
      continue;
    }
    if (!FailureUsed()) break;
  }
  EXPECT_GE(failures, 3);  // the record, and a list node for each of its two handles
  std::stop_token token = ToStopToken(value);
  EXPECT_EQ(registrations(), 2u);  // the loop's last one and this one
  cancel();
  EXPECT_TRUE(token.stop_requested());
}

}  // namespace
}  // namespace kwq
