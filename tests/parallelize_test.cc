#include "kwq/parallelize.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace kwq {
namespace {

TEST(ParallelizeUntilTest, RunsEveryPieceOnce) {
  for (int chunk : {1, 3, 100}) {
    std::vector<std::atomic<int>> hits(1000);
    ASSERT_TRUE(
        ParallelizeUntil(Background(), 4, 1000, [&](int i) { ++hits[i]; }, {.chunk_size = chunk})
            .ok());
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << "piece " << i;
  }
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
