// ParallelizeUntil when making a helper runs out of memory, and how often Post allocates.
// A binary of its own: it replaces the global operator new, so that the allocation of the
// second helper's Work (and only that, once armed) throws std::bad_alloc.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/parallelize.h"
#include "kwq/workqueue.h"
#include "workqueue/internal.h"

namespace {
// Allocations of sizeof(kwq::Work) bytes seen since arming; -1: disarmed.
std::atomic<int> work_allocations{-1};
// Allocations of a worker (sizeof(internal::Worker)) seen since arming; -1: disarmed.
std::atomic<int> worker_allocations{-1};
// Allocations of sizeof(kwq::Work) bytes, counted while `count_works` is set.
std::atomic<bool> count_works{false};
std::atomic<int> work_news{0};
}  // namespace

void* operator new(std::size_t n) {
  if (n == sizeof(kwq::Work) && count_works.load()) work_news.fetch_add(1);
  if (n == sizeof(kwq::Work) && work_allocations.load() >= 0 &&
      work_allocations.fetch_add(1) == 1) {
    throw std::bad_alloc();
  }
  if (n == sizeof(kwq::internal::Worker) && worker_allocations.load() >= 0 &&
      worker_allocations.fetch_add(1) == 0) {
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

}  // namespace
}  // namespace kwq
