#include "internal/cycle_clock.h"

#include <chrono>
#include <thread>

#include "internal/tsc_timeline.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace kwq::internal {

namespace {
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double NanosPerTick() {
#if defined(__x86_64__)
  static const double ns_per_tick = [] {
    // RealClock's timeline measures the same counter's rate; without it, measure here.
    if (const double rate = SystemTscNanosPerTick(); rate > 0) return rate;
    const int64_t t0 = SteadyNanos();
    const uint64_t c0 = __rdtsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int64_t t1 = SteadyNanos();
    const uint64_t c1 = __rdtsc();
    return c1 > c0 ? static_cast<double>(t1 - t0) / static_cast<double>(c1 - c0) : 1.0;
  }();
  return ns_per_tick;
#else
  return 1.0;
#endif
}
}  // namespace

int64_t CycleClock::Now() {
#if defined(__x86_64__)
  return static_cast<int64_t>(__rdtsc());
#else
  return SteadyNanos();
#endif
}

absl::Duration CycleClock::ToDuration(int64_t ticks) {
  return absl::Nanoseconds(static_cast<double>(ticks) * NanosPerTick());
}

}  // namespace kwq::internal
