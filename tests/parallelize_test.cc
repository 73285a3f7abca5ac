#include "kwq/parallelize.h"

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/eventually.h"

namespace kwq {
namespace {

// ParallelizeUntil on 4 workers returns OK and ran each of `pieces` pieces exactly once.
void ExpectEveryPieceRunsOnce(int pieces, int chunk) {
  std::vector<std::atomic<int>> hits(pieces);
  ASSERT_TRUE(
      ParallelizeUntil(Background(), 4, pieces, [&](int i) { ++hits[i]; }, {.chunk_size = chunk})
          .ok());
  for (int i = 0; i < pieces; ++i) ASSERT_EQ(hits[i].load(), 1) << "piece " << i;
}

TEST(ParallelizeUntilTest, RunsEveryPieceOnce) {
  for (int chunk : {1, 3, 100}) ExpectEveryPieceRunsOnce(1000, chunk);
}

TEST(ParallelizeUntilTest, RespectsTheWorkerLimit) {
  auto wq = *Workqueue::Create({.name = "par", .flags = kUnbound});
  std::atomic<int> busy{0}, peak{0};
  ASSERT_TRUE(ParallelizeUntil(Background(), 2, 64,
                               [&](int) {
                                 BlockingScope blocking;
                                 const int now = busy.fetch_add(1) + 1;
                                 int p = peak.load();
                                 while (now > p && !peak.compare_exchange_weak(p, now)) {
                                 }
                                 std::this_thread::sleep_for(std::chrono::microseconds(200));
                                 busy.fetch_sub(1);
                               },
                               {.workqueue = wq.get()})
                  .ok());
  EXPECT_LE(peak.load(), 2);
}

TEST(ParallelizeUntilTest, StopsHandingOutPiecesWhenCancelled) {
  auto [ctx, cancel] = WithCancel(Background());
  std::atomic<int> ran{0};
  absl::Status s = ParallelizeUntil(ctx, 2, 100000, [&, c = cancel](int i) {
    ++ran;
    if (i == 10) c();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(ran.load(), 100000);
}

TEST(ParallelizeUntilTest, ThrowingPieceIsReported) {
  absl::Status s = ParallelizeUntil(Background(), 3, 100, [](int i) {
    if (i == 42) throw std::runtime_error("piece 42");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("piece 42"), std::string::npos);
}

// With one worker every piece runs on the calling thread, in order.
TEST(ParallelizeUntilTest, OneWorkerRunsEveryPieceOnTheCaller) {
  std::vector<int> order;
  bool elsewhere = false;
  const std::thread::id caller = std::this_thread::get_id();
  ASSERT_TRUE(ParallelizeUntil(Background(), 1, 50, [&](int i) {
                elsewhere |= std::this_thread::get_id() != caller;
                order.push_back(i);
              }).ok());
  EXPECT_FALSE(elsewhere);
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

// The first exception stops the hand-out, like a cancel (one runner, so nothing else
// could have taken a piece: none after the throwing one runs).
TEST(ParallelizeUntilTest, ThrowStopsTheHandOut) {
  int ran = 0;
  absl::Status s = ParallelizeUntil(Background(), 1, 1000,
                                    [&](int i) {
                                      ++ran;
                                      if (i == 3) throw std::runtime_error("stop here");
                                    },
                                    {.chunk_size = 100});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(ran, 4);
}

// A context already past its deadline: DeadlineExceeded, no piece runs.
TEST(ParallelizeUntilTest, ExpiredDeadlineReturnsDeadlineExceeded) {
  auto [ctx, cancel] = WithTimeout(Background(), -absl::Seconds(1));
  int ran = 0;
  absl::Status s = ParallelizeUntil(ctx, 2, 100, [&](int) { ++ran; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ran, 0);
}

using testing::Eventually;
using testing::ReturnsInTime;

// A chunk size near INT_MAX used to overflow the chunk count: OK came back with nothing run.
TEST(ParallelizeUntilTest, HugeChunkSizeRunsEveryPiece) { ExpectEveryPieceRunsOnce(10, INT_MAX); }

// Once ctx is done no piece starts, inside a chunk too (client-go checks before each).
TEST(ParallelizeUntilTest, CancelStopsInsideAChunk) {
  auto [ctx, cancel] = WithCancel(Background());
  std::atomic<int> ran{0};
  absl::Status s = ParallelizeUntil(ctx, 2, 1000,
                                    [&, c = cancel](int) {
                                      ++ran;
                                      c();
                                    },
                                    {.chunk_size = 1000});
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ran.load(), 1);  // one chunk, one runner: it stops after its first piece
}

// A call from a work item of a workqueue with no free slot: its helpers cannot start,
// and it used to wait for them for ever.
TEST(ParallelizeUntilTest, NestedCallsOnAFullWorkqueueFinish) {
  auto wq = *Workqueue::Create({.name = "nested", .flags = kUnbound, .max_active = 1});
  std::atomic<int> inner{0};
  absl::Status outer;
  ASSERT_TRUE(ReturnsInTime([&] {
    outer =
        ParallelizeUntil(Background(), 2, 4,
                         [&](int) {
                           EXPECT_TRUE(ParallelizeUntil(Background(), 2, 3, [&](int) { ++inner; },
                                                        {.workqueue = wq.get()})
                                           .ok());
                         },
                         {.workqueue = wq.get()});
  })) << "nested ParallelizeUntil hangs";
  EXPECT_TRUE(outer.ok()) << outer;
  EXPECT_EQ(inner.load(), 12);
}

// No more helpers are queued than the workqueue could run at once (max_active): a huge
// `workers` does not allocate and queue a work item per worker.
TEST(ParallelizeUntilTest, HelpersAreCappedAtMaxActive) {
  auto wq = *Workqueue::Create({.name = "capped", .flags = kUnbound, .max_active = 3});
  std::atomic<int> ran{0};
  EXPECT_TRUE(ParallelizeUntil(Background(), 1'000'000, 100'000, [&](int) { ++ran; },
                               {.workqueue = wq.get()})
                  .ok());
  EXPECT_EQ(ran.load(), 100'000);
  EXPECT_LE(wq->stats().queued, 3u);
}

// A frozen workqueue holds the helpers; the caller runs every piece.
TEST(ParallelizeUntilTest, FrozenWorkqueueStillFinishes) {
  auto wq = *Workqueue::Create({.name = "frozen", .flags = kUnbound | kFreezable});
  wq->Freeze();
  std::atomic<int> ran{0};
  absl::Status s;
  ASSERT_TRUE(ReturnsInTime([&] {
    s = ParallelizeUntil(Background(), 4, 100, [&](int) { ++ran; }, {.workqueue = wq.get()});
  })) << "ParallelizeUntil on a frozen workqueue hangs";
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ran.load(), 100);
  wq->Thaw();
}

// While the workqueue drains, its Queue refuses the helpers; that used to end the call
// with OK and nothing run.
TEST(ParallelizeUntilTest, DrainingWorkqueueStillRunsEveryPiece) {
  auto wq = *Workqueue::Create({.name = "draining", .flags = kUnbound});
  std::atomic<bool> release{false};
  Work blocker([&] {
    while (!release.load()) std::this_thread::yield();
  });
  wq->Queue(&blocker);
  std::thread drainer([&] { wq->Drain(); });
  Work probe([] {});
  // Not pending first: a refusal of an idle probe means draining, not "still pending".
  ASSERT_TRUE(Eventually([&] { return !probe.pending() && !wq->Queue(&probe); }));
  std::atomic<int> ran{0};
  absl::Status s;
  const bool returned = ReturnsInTime([&] {
    s = ParallelizeUntil(Background(), 4, 100, [&](int) { ++ran; }, {.workqueue = wq.get()});
  });
  release = true;
  drainer.join();
  ASSERT_TRUE(returned) << "ParallelizeUntil on a draining workqueue hangs";
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ran.load(), 100);
}

// A bound workqueue's per-CPU pool runs one work at a time while it does not block (and
// the CPU-hog threshold is far away here), so helpers queued on the caller's CPU ran one
// after another: with 4 workers only 2 runners ever met. They are spread over the CPUs.
// Also with max_active = 1: that limit is per CPU pool on a bound workqueue, so it does
// not cap the helpers at one (it used to).
TEST(ParallelizeUntilTest, BoundWorkqueueRunsHelpersSideBySide) {
  auto rt = *WorkqueueRuntime::Create({.topology = *Topology::FromSynthetic("pack:1 core:4 pu:1"),
                                       .cpu_intensive_threshold = absl::Hours(1),
                                       .stall_threshold = absl::Hours(1)});
  for (int max_active : {0, 1}) {
    SCOPED_TRACE(max_active);
    auto wq = *Workqueue::Create({.name = "bound", .max_active = max_active, .runtime = rt.get()});
    constexpr int kRunners = 4;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    std::atomic<int> met_all{0};
    // Each piece waits (without telling the pool: no BlockingScope) until all 4 runners
    // hold a piece at once, or gives up at one shared deadline (so pieces run one after
    // another fail in 5 s, not 5 s each).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ASSERT_TRUE(
        ParallelizeUntil(Background(), kRunners, kRunners,
                         [&](int) {
                           std::unique_lock<std::mutex> lock(mu);
                           ++arrived;
                           cv.notify_all();
                           if (cv.wait_until(lock, deadline, [&] { return arrived == kRunners; })) {
                             ++met_all;
                           }
                         },
                         {.workqueue = wq.get()})
            .ok());
    EXPECT_EQ(met_all.load(), kRunners) << "the runners never all ran at once";
  }
}

TEST(ParallelizeUntilTest, BadArgumentsAreRejected) {
  auto fn = [](int) {};
  EXPECT_EQ(ParallelizeUntil(Background(), 0, 1, fn).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParallelizeUntil(Background(), 1, -1, fn).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParallelizeUntil(Background(), 1, 1, fn, {.chunk_size = 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ParallelizeUntil(Background(), 1, 0, fn).ok());
}

}  // namespace
}  // namespace kwq
