#include "kwq/stop_token.h"

#include <latch>
#include <thread>

#include "gtest/gtest.h"

namespace kwq {
namespace {

TEST(StopTokenTest, ContextCancelRequestsStop) {
  auto [ctx, cancel] = WithCancel(Background());
  std::stop_token token = ToStopToken(ctx);
  EXPECT_FALSE(token.stop_requested());
  cancel();
  EXPECT_TRUE(token.stop_requested());
}

TEST(StopTokenTest, TokenOfCancelledContextIsStopped) {
  auto [ctx, cancel] = WithCancel(Background());
  cancel();
  EXPECT_TRUE(ToStopToken(ctx).stop_requested());
}

TEST(StopTokenTest, TokenOfBackgroundNeverStops) {
  std::stop_token token = ToStopToken(Background());
  EXPECT_FALSE(token.stop_possible() && token.stop_requested());
}

TEST(StopTokenTest, RequestStopCancelsContext) {
  std::stop_source source;
  auto [ctx, cancel] = WithStopToken(Background(), source.get_token());
  EXPECT_FALSE(ctx.IsCancelled());
  source.request_stop();
  EXPECT_TRUE(ctx.IsCancelled());
  EXPECT_EQ(ctx.Err().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ctx.Cause(), absl::CancelledError("stop requested"));
}

TEST(StopTokenTest, AlreadyStoppedTokenCancelsAtOnce) {
  std::stop_source source;
  source.request_stop();
  auto [ctx, cancel] = WithStopToken(Background(), source.get_token());
  EXPECT_TRUE(ctx.IsCancelled());
}

TEST(StopTokenTest, ContextDroppedBeforeStopIsSafe) {
  std::stop_source source;
  { auto [ctx, cancel] = WithStopToken(Background(), source.get_token()); }
  source.request_stop();  // the callback was deregistered with the context
}

TEST(StopTokenTest, JthreadStopCancelsWorkerContext) {
  std::latch running(1);
  absl::Status seen;
  {
    std::jthread worker([&](std::stop_token st) {
      auto [ctx, cancel] = WithStopToken(Background(), st);
      running.count_down();
      ctx.Done().Wait();
      seen = ctx.Cause();
    });
    running.wait();
  }  // ~jthread requests stop and joins
  EXPECT_EQ(seen, absl::CancelledError("stop requested"));
}

TEST(StopTokenTest, StopAndDropRace) {
  for (int i = 0; i < 300; ++i) {
    std::stop_source source;
    auto child = WithStopToken(Background(), source.get_token());
    std::thread stopper([&] { source.request_stop(); });
    child = CancelableContext{};
    stopper.join();
  }
}

}  // namespace
}  // namespace kwq
