// DoneSignal::WaitFor times out on the monotonic clock: a step of the wall clock during
// the wait neither stretches nor cuts it. ctest runs this binary with
// tests/testing/realtime_step.cc preloaded, which steps CLOCK_REALTIME back an hour 100 ms
// into the run (only in builds without sanitizers, whose runtimes must come first).

#include <cstdlib>
#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "kwq/context.h"

namespace kwq {
namespace {

// WaitFor(300 ms) on `ctx`, which never becomes done: returns false within 10 s. The
// waiter is detached, so a failure is reported at once (not when its wait ends).
void ExpectTimesOutOnTime(const Context& ctx) {
  auto result = std::make_shared<std::promise<bool>>();
  std::future<bool> done = result->get_future();
  std::thread([ctx, result] {
    result->set_value(ctx.Done().WaitFor(absl::Milliseconds(300)));
  }).detach();
  // Timed on the wall clock the wait would end an hour late.
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "WaitFor(300 ms) still waiting 10 s later: it follows the wall clock";
  EXPECT_FALSE(done.get());
}

TEST(RealtimeStepTest, WaitForIgnoresTheWallClockSteppingBack) {
  if (std::getenv("KWQ_TEST_REALTIME_STEP_S") == nullptr) {
    GTEST_SKIP() << "needs ctest's preloaded tests/testing/realtime_step.cc";
  }
  absl::Now();  // the shim's first wall-clock read: the step comes 100 ms after it
  auto [ctx, cancel] = WithCancel(Background());
  ExpectTimesOutOnTime(ctx);           // the step happens during this wait
  ExpectTimesOutOnTime(Background());  // a context that is never done waits the same way
}

}  // namespace
}  // namespace kwq
