#include "kwq/parallelize.h"

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
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

// An exception that reports its own destruction. ParallelizeUntil catches by reference,
// so the thrown object dies at the end of its catch block, after the failure is recorded.
class RecordedError : public std::runtime_error {
 public:
  RecordedError(const char* what, std::atomic<bool>* destroyed)
      : std::runtime_error(what), destroyed_(destroyed) {}
  // A copy takes the signal over, so only the last object alive reports.
  RecordedError(const RecordedError& other)
      : std::runtime_error(other), destroyed_(std::exchange(other.destroyed_, nullptr)) {}
  ~RecordedError() override {
    if (destroyed_ != nullptr) destroyed_->store(true);
  }

 private:
  mutable std::atomic<bool>* destroyed_;
};

// Two runners, one chunk of kChunk pieces each. Piece 0 waits until piece kChunk has
// started on the other runner, then throws "first"; piece kChunk waits until that
// exception has been recorded, then calls `after_first` (which may throw). Returns the
// status; *ran_after counts the pieces after kChunk that ran (that runner's later ones).
constexpr int kChunk = 100;
template <typename AfterFirst>
absl::Status RunWithFirstExceptionOnOtherRunner(AfterFirst after_first,
                                                std::atomic<int>* ran_after) {
  auto wq = *Workqueue::Create({.name = "throwing", .flags = kUnbound});
  std::atomic<bool> second_started{false}, first_recorded{false};
  absl::Status s =
      ParallelizeUntil(Background(), 2, 2 * kChunk,
                       [&](int i) {
                         if (i == 0) {
                           EXPECT_TRUE(testing::Eventually([&] { return second_started.load(); }))
                               << "the two chunks never ran side by side";
                           throw RecordedError("first", &first_recorded);
                         }
                         if (i == kChunk) {
                           second_started = true;
                           EXPECT_TRUE(testing::Eventually([&] { return first_recorded.load(); }));
                           after_first();
                         } else if (i > kChunk) {
                           ++*ran_after;
                         }
                       },
                       {.chunk_size = kChunk, .workqueue = wq.get()});
  return s;
}

// The first exception stops the hand-out for every runner, like a cancel: the other
// runner, whose piece was running when it was thrown, starts no further piece.
TEST(ParallelizeUntilTest, FirstExceptionStopsTheOtherRunners) {
  std::atomic<int> ran_after{0};
  absl::Status s = RunWithFirstExceptionOnOtherRunner([] {}, &ran_after);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("first"), std::string::npos) << s;
  EXPECT_EQ(ran_after.load(), 0);
}

// A piece that was already running throws after the first exception was recorded: the
// first one is reported, not the last.
TEST(ParallelizeUntilTest, FirstExceptionMessageWins) {
  std::atomic<int> ran_after{0};
  absl::Status s =
      RunWithFirstExceptionOnOtherRunner([] { throw std::runtime_error("second"); }, &ran_after);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("first"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("second"), std::string::npos) << s;
  EXPECT_EQ(ran_after.load(), 0);
}

// Called from a work item of a bound workqueue, the helpers skip the caller's own CPU
// pool (busy with the caller, which does not block, it would start a helper only after
// the caller's pieces): the first helper goes to the CPU after the caller's.
TEST(ParallelizeUntilTest, NestedCallOnABoundWorkqueueSkipsTheCallersCpu) {
  auto rt = *WorkqueueRuntime::Create({.topology = *Topology::FromSynthetic("pack:1 core:2 pu:1"),
                                       .cpu_intensive_threshold = absl::Hours(1),
                                       .stall_threshold = absl::Hours(1)});
  auto wq = *Workqueue::Create({.name = "bound-nested", .runtime = rt.get()});
  int caller_cpu = -1;
  int met_all = 0;
  absl::Status s;
  Work outer([&] {
    caller_cpu = CurrentCpu();
    if (caller_cpu != 0) return;  // CPU 0's worker is not on CPU 0 here: nothing to check
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    // Each piece waits (no BlockingScope) until both runners hold a piece at once, or
    // gives up at one shared deadline.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    s = ParallelizeUntil(Background(), 2, 2,
                         [&](int) {
                           std::unique_lock<std::mutex> lock(mu);
                           ++arrived;
                           cv.notify_all();
                           if (cv.wait_until(lock, deadline, [&] { return arrived == 2; })) {
                             ++met_all;
                           }
                         },
                         {.workqueue = wq.get()});
  });
  ASSERT_TRUE(wq->QueueOn(0, &outer));
  wq->Flush(&outer);
  if (caller_cpu != 0) GTEST_SKIP() << "CPU 0's worker ran on CPU " << caller_cpu;
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(met_all, 2) << "the helper was queued behind the caller, on the caller's CPU";
}

}  // namespace
}  // namespace kwq
