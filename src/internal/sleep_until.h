// SleepUntilReached: the loop behind RealClock::SleepUntil, with the clock reading and
// the sleep passed in, so that a test can make the reading lag the sleep.
//
// RealClock's sleep (std::this_thread::sleep_for) is timed by the kernel's
// CLOCK_MONOTONIC, but RealClock::Now may read the TSC timeline, which can run up to
// about a microsecond behind the kernel's: one sleep of `deadline - Now()` can end with
// Now() still short of the deadline. So it sleeps again until Now() has got there.

#ifndef KWQ_SRC_INTERNAL_SLEEP_UNTIL_H_
#define KWQ_SRC_INTERNAL_SLEEP_UNTIL_H_

#include "absl/time/time.h"

namespace kwq::internal {

// Calls `sleep_for(left)` until `now()` >= `deadline`, `left` being what remains by
// `now()`. Returns at once for a deadline already reached.
template <typename Now, typename SleepFor>
void SleepUntilReached(absl::Time deadline, Now now, SleepFor sleep_for) {
  for (absl::Duration left = deadline - now(); left > absl::ZeroDuration();
       left = deadline - now()) {
    sleep_for(left);
  }
}

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_SLEEP_UNTIL_H_
