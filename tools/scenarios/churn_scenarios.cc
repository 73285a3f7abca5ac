// Memory under churn (the reliability issue): 1,000,000 distinct keys cycled through a
// queue and through rate limiters, with and without Forget. Each prints the RSS growth
// from after the first batch to the end: bounded structures keep it near zero.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kwq/queue.h"
#include "kwq/rate_limiter.h"
#include "scenario.h"

namespace kwq::scenarios {
namespace {

constexpr int64_t kBatch = 10'000;

// n distinct keys in batches: Add a batch, then Get+Done all of it.
std::string ChurnQueue(int64_t n) {
  Queue<std::string> q;
  int64_t base_rss = 0;
  for (int64_t start = 0; start < n; start += kBatch) {
    for (int64_t i = start; i < start + kBatch; ++i) q.Add(absl::StrCat("default/object-", i));
    while (auto lease = q.TryGet()) {
    }
    if (start == 0) base_rss = ResidentBytes();
  }
  const int64_t growth = ResidentBytes() - base_rss;
  return absl::StrFormat("rss_growth_kb=%d keys=%d batch=%d", growth / 1024, n, kBatch);
}

// n distinct keys fail once each on a limiter; `forget` calls Forget after each. Without
// Forget the idle horizon (1 minute here) bounds the table; the fake clock moves 1 ms per
// key.
std::string ChurnLimiter(int64_t n, bool forget) {
  FakeClock clock;
  auto limiter =
      *ExponentialFailureRateLimiter<std::string>::Create({.base = absl::Milliseconds(5),
                                                           .max = absl::Seconds(10),
                                                           .clock = &clock,
                                                           .idle_horizon = absl::Minutes(1)});
  int64_t base_rss = 0;
  size_t peak = 0;
  for (int64_t i = 0; i < n; ++i) {
    const std::string key = absl::StrCat("default/object-", i);
    limiter->When(key);
    if (forget) limiter->Forget(key);
    clock.Advance(absl::Milliseconds(1));
    peak = std::max(peak, limiter->TrackedItems());
    if (i == 100'000) base_rss = ResidentBytes();
  }
  const int64_t growth = ResidentBytes() - base_rss;
  return absl::StrFormat("rss_growth_kb=%d tracked_end=%d tracked_peak=%d keys=%d", growth / 1024,
                         limiter->TrackedItems(), peak, n);
}

}  // namespace

std::vector<Scenario> ChurnScenarios() {
  return {
      {"churn_queue", 1'000'000, ChurnQueue},
      {"churn_limiter_forget", 1'000'000, [](int64_t n) { return ChurnLimiter(n, true); }},
      {"churn_limiter_noforget", 1'000'000, [](int64_t n) { return ChurnLimiter(n, false); }},
  };
}

}  // namespace kwq::scenarios
