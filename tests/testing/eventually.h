// Test helpers for effects on other threads; their limits only bound a failure, so a
// passing test never depends on timing.
//
// Eventually(pred, limit) polls `pred` every 200 us until it holds or `limit` (real time,
// 5 s by default) passes, and returns its last value. A negative check
// (EXPECT_FALSE(Eventually(...)) with a short limit) can only miss a failure, never report
// a false one.
//
// ReturnsInTime(call, limit) runs `call` on a thread and reports whether it returned
// within `limit` (5 s). A call that hangs is left running on its detached thread, so the
// test fails instead of hanging the whole binary; `call` must then not refer to the
// test's stack (capture shared state by shared_ptr), or it must be a failure the process
// does not survive anyway.

#ifndef KWQ_TESTS_TESTING_EVENTUALLY_H_
#define KWQ_TESTS_TESTING_EVENTUALLY_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kwq::testing {

template <typename Pred>
bool Eventually(Pred pred, absl::Duration limit = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + limit;
  while (!pred()) {
    if (absl::Now() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

template <typename Call>
bool ReturnsInTime(Call call, absl::Duration limit = absl::Seconds(5)) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([call = std::move(call), done]() mutable {
    call();
    *done = true;
  });
  if (!Eventually([&] { return done->load(); }, limit)) {
    t.detach();
    return false;
  }
  t.join();
  return true;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_EVENTUALLY_H_
