// Test helper: Eventually(pred, limit) polls `pred` every 200 us until it holds or `limit`
// (real time, 5 s by default) passes, and returns its last value. For effects that happen
// on other threads (workers, a drainer); the limit only bounds a failure, so a passing
// test never depends on timing. A negative check (EXPECT_FALSE(Eventually(...)) with a
// short limit) can only miss a failure, never report a false one.

#ifndef KWQ_TESTS_TESTING_EVENTUALLY_H_
#define KWQ_TESTS_TESTING_EVENTUALLY_H_

#include <chrono>
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

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_EVENTUALLY_H_
