// A cheap elapsed-time counter for hot paths: the x86 TSC (rdtsc, about 10 ns), its rate
// taken from RealClock's TSC timeline (or measured against CLOCK_MONOTONIC once where
// RealClock does not read the TSC), or steady_clock elsewhere. Used to time work executions
// (a clock_gettime through the vDSO costs 20-30 ns on the development VM, and twice per
// work item was a fifth of wq_tiny's time). Not for deadlines: it is not a kwq::Clock.

#ifndef KWQ_SRC_INTERNAL_CYCLE_CLOCK_H_
#define KWQ_SRC_INTERNAL_CYCLE_CLOCK_H_

#include <cstdint>

#include "absl/time/time.h"

namespace kwq::internal {

class CycleClock {
 public:
  // Ticks of an invariant counter. Thread-safe; never blocks.
  static int64_t Now();
  // Converts a tick difference to a duration (first call calibrates, about 10 ms).
  static absl::Duration ToDuration(int64_t ticks);
};

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_CYCLE_CLOCK_H_
