// DoneSignal::WaitFor times out on the monotonic clock: a step of the wall clock during
// the wait neither stretches nor cuts it. ctest runs this binary with
// tests/testing/realtime_step.cc preloaded (only in builds without sanitizers, whose
// runtimes must be the first library loaded); the test tells the shim to step the wall
// clock back an hour right after the next wall-clock read, which a wait timed on the
// wall clock makes when it computes its end.

#include <dlfcn.h>

#include <future>
#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "kwq/context.h"

namespace kwq {
namespace {

using StepFn = void (*)(long);

StepFn Shim() {
  return reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "kwq_test_step_realtime_after_next_read"));
}

// WaitFor(300 ms) on `ctx`, which never becomes done, with the wall clock stepped back an
// hour after the wait's first wall-clock read: returns false within 10 s. The waiter is
// detached, so a failure is reported at once (not when its wait ends).
void ExpectTimesOutOnTime(const Context& ctx) {
  auto result = std::make_shared<std::promise<bool>>();
  std::future<bool> done = result->get_future();
  Shim()(3600);
  std::thread([ctx, result] {
    result->set_value(ctx.Done().WaitFor(absl::Milliseconds(300)));
  }).detach();
  // Timed on the wall clock the wait would end an hour late.
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "WaitFor(300 ms) still waiting 10 s later: it follows the wall clock";
  EXPECT_FALSE(done.get());
}

TEST(RealtimeStepTest, WaitForIgnoresTheWallClockSteppingBack) {
  if (Shim() == nullptr) GTEST_SKIP() << "needs ctest's preloaded tests/testing/realtime_step.cc";
  auto [ctx, cancel] = WithCancel(Background());
  ExpectTimesOutOnTime(ctx);
}

TEST(RealtimeStepTest, WaitForOnANeverDoneContextIgnoresTheWallClockSteppingBack) {
  if (Shim() == nullptr) GTEST_SKIP() << "needs ctest's preloaded tests/testing/realtime_step.cc";
  ExpectTimesOutOnTime(Background());
}

}  // namespace
}  // namespace kwq
