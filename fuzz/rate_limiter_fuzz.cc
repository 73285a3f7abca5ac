// Fuzzer for the per-item rate limiters on a FakeClock against their formulas, with
// random When / Forget / NumRequeues / clock moves on a few keys and huge failure counts:
//   - ExponentialFailure: base * 2^failures, capped at max, never overflowing;
//   - FastSlow: fast for the first max_fast_attempts failures, then slow;
//   - WithMaxWait(exponential, cap): the exponential's delay, at most cap;
//   - MaxOf(exponential, fast/slow): the larger of the two;
//   - for each, WhenCounted(n) is When's delay for an item with n earlier failures (what a
//     queue that keeps the counts asks), and NumRequeues is the model's count.
// Every limiter has the same finite idle horizon, so the model's count lapses to zero once
// no failure was recorded for longer than the horizon (clock moves of up to 60 ms).

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "kwq/rate_limiter.h"

namespace {

absl::Duration Expected(absl::Duration base, absl::Duration max, int64_t failures) {
  absl::Duration d = base;
  for (int64_t i = 0; i < failures && d < max; ++i) d *= 2;
  return std::min(d, max);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  kwq::FakeClock clock;
  const absl::Duration base = absl::Nanoseconds(1 + data[0] % 200);
  const absl::Duration max = base * (1 + data[1] % 100) * 1000;
  const int max_fast = data[2] % 5;
  const absl::Duration horizon = absl::Milliseconds(5 + data[3] % 40);
  const absl::Duration cap = base * (1 + data[4] % 64);
  auto exponential = [&] {
    return *kwq::ExponentialFailureRateLimiter<int>::Create(
        {.base = base, .max = max, .clock = &clock, .idle_horizon = horizon});
  };
  auto fast_slow = [&] {
    return *kwq::FastSlowRateLimiter<int>::Create({.fast = base,
                                                   .slow = max,
                                                   .max_fast_attempts = max_fast,
                                                   .clock = &clock,
                                                   .idle_horizon = horizon});
  };
  auto exp = exponential();
  auto fs = fast_slow();
  auto capped = *kwq::WithMaxWaitRateLimiter<int>::Create(exponential(), cap);
  std::vector<std::unique_ptr<kwq::RateLimiter<int>>> children;
  children.push_back(exponential());
  children.push_back(fast_slow());
  auto max_of = *kwq::MaxOfRateLimiter<int>::Create(std::move(children));
  kwq::RateLimiter<int>* const all[] = {exp.get(), fs.get(), capped.get(), max_of.get()};

  const auto fast_slow_delay = [&](int64_t n) { return n + 1 <= max_fast ? base : max; };
  const auto expected = [&](int which, int64_t n) {
    switch (which) {
      case 0:
        return Expected(base, max, n);
      case 1:
        return fast_slow_delay(n);
      case 2:
        return std::min(Expected(base, max, n), cap);
      default:
        return std::max(Expected(base, max, n), fast_slow_delay(n));
    }
  };
  struct Count {
    int64_t failures = 0;
    absl::Time last;
  };
  std::map<int, Count> model;  // failures since the last Forget, and when the last was
  const auto failures = [&](int key) -> int64_t {
    auto it = model.find(key);
    if (it == model.end() || clock.Now() - it->second.last > horizon) return 0;
    return it->second.failures;
  };
  const auto fail = [&](int key) {
    const int64_t n = failures(key);
    for (int w = 0; w < 4; ++w) {
      FUZZ_CHECK(all[w]->When(key) == expected(w, n));
      FUZZ_CHECK(all[w]->WhenCounted(n) == expected(w, n));
    }
    model[key] = Count{n + 1, clock.Now()};
  };

  for (size_t i = 5; i + 1 < size; i += 2) {
    const int key = data[i + 1] % 6;
    switch (data[i] % 6) {
      case 0:
      case 1:
        fail(key);
        break;
      case 2:
        for (auto* l : all) l->Forget(key);
        model.erase(key);
        break;
      case 3:
        for (auto* l : all) FUZZ_CHECK(l->NumRequeues(key) == failures(key));
        break;
      case 4:  // a burst of failures: the formulas must not overflow
        for (int j = 0; j < 200; ++j) fail(key);
        break;
      case 5:  // time passes: counts older than the horizon lapse
        clock.Advance(absl::Milliseconds(data[i + 1] % 60));
        break;
    }
    clock.Advance(absl::Milliseconds(1));
  }
  return 0;
}
