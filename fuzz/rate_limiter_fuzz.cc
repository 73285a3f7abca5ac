// Fuzzer for the per-item rate limiters on a FakeClock against their formulas:
// ExponentialFailure (base * 2^failures, capped, no jitter, no eviction) and FastSlow,
// with random When / Forget / NumRequeues on a few keys and huge failure counts.

#include <cstdint>
#include <map>

#include "fuzz_check.h"
#include "kwq/rate_limiter.h"

namespace {

absl::Duration Expected(absl::Duration base, absl::Duration max, int failures) {
  absl::Duration d = base;
  for (int i = 0; i < failures && d < max; ++i) d *= 2;
  return std::min(d, max);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  kwq::FakeClock clock;
  const absl::Duration base = absl::Nanoseconds(1 + data[0] % 200);
  const absl::Duration max = base * (1 + data[1] % 100) * 1000;
  auto exp = *kwq::ExponentialFailureRateLimiter<int>::Create(
      {.base = base, .max = max, .clock = &clock, .idle_horizon = absl::InfiniteDuration()});
  const int max_fast = data[2] % 5;
  auto fast_slow =
      *kwq::FastSlowRateLimiter<int>::Create({.fast = base,
                                              .slow = max,
                                              .max_fast_attempts = max_fast,
                                              .clock = &clock,
                                              .idle_horizon = absl::InfiniteDuration()});
  std::map<int, int> failures;  // the model: failures since the last Forget
  for (size_t i = 3; i + 1 < size; i += 2) {
    const int key = data[i + 1] % 6;
    switch (data[i] % 5) {
      case 0:
      case 1: {
        const int n = failures[key]++;
        FUZZ_CHECK(exp->When(key) == Expected(base, max, n));
        FUZZ_CHECK(fast_slow->When(key) == (n + 1 <= max_fast ? base : max));
        break;
      }
      case 2:
        exp->Forget(key);
        fast_slow->Forget(key);
        failures.erase(key);
        break;
      case 3:
        FUZZ_CHECK(exp->NumRequeues(key) == failures[key]);
        FUZZ_CHECK(fast_slow->NumRequeues(key) == failures[key]);
        break;
      case 4:  // a burst of failures: the formula must not overflow
        for (int j = 0; j < 200; ++j) {
          const int n = failures[key]++;
          FUZZ_CHECK(exp->When(key) == Expected(base, max, n));
          fast_slow->When(key);
        }
        break;
    }
    clock.Advance(absl::Milliseconds(1));
  }
  return 0;
}
