// Rate limiter microbenchmarks: the per-failure cost of When (plus Forget where a success
// follows), for the limiters a rate-limiting work queue calls on every retry.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kwq/clock.h"
#include "kwq/rate_limiter.h"

namespace kwq {
namespace {

template <typename T>
std::unique_ptr<RateLimiter<T>> Exponential(Clock* clock, absl::Duration idle_horizon) {
  ExponentialFailureRateLimiterOptions options;
  options.base = absl::Milliseconds(5);
  options.max = absl::Seconds(1000);
  options.clock = clock;
  options.idle_horizon = idle_horizon;
  return *ExponentialFailureRateLimiter<T>::Create(options);
}

// One item failing and succeeding over and over.
void BM_ExponentialWhenForget_OneItem(benchmark::State& state) {
  auto limiter = Exponential<int64_t>(RealClock::Default(), absl::Seconds(2000));
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(42));
    limiter->Forget(42);
  }
}
BENCHMARK(BM_ExponentialWhenForget_OneItem);

// A table holding 100,000 items; each iteration fails and forgets the next one in turn,
// so every lookup misses the cache as a large controller's would.
template <typename T>
void ExponentialWhenForgetDistinct(benchmark::State& state, const std::vector<T>& items) {
  auto limiter = Exponential<T>(RealClock::Default(), absl::Seconds(2000));
  for (const T& item : items) limiter->When(item);
  size_t i = 0;
  for (auto _ : state) {
    const T& item = items[i];
    benchmark::DoNotOptimize(limiter->When(item));
    limiter->Forget(item);
    limiter->When(item);  // keeps the table at 100,000 entries
    if (++i == items.size()) i = 0;
  }
  state.counters["tracked"] = static_cast<double>(limiter->TrackedItems());
}

void BM_ExponentialWhenForget_100kItems(benchmark::State& state) {
  std::vector<int64_t> items;
  for (int64_t i = 0; i < 100'000; ++i) items.push_back(i * 7919);
  ExponentialWhenForgetDistinct(state, items);
}
BENCHMARK(BM_ExponentialWhenForget_100kItems);

void BM_ExponentialWhenForget_100kStringItems(benchmark::State& state) {
  std::vector<std::string> items;
  for (int i = 0; i < 100'000; ++i) items.push_back(absl::StrCat("default/object-", i));
  ExponentialWhenForgetDistinct(state, items);
}
BENCHMARK(BM_ExponentialWhenForget_100kStringItems);

// The leak client-go has: distinct items that never succeed. The fake clock moves 1 ms
// per failure and the horizon is one minute, so the table holds 60,001 items and every
// When also evicts one.
void BM_ExponentialWhen_NeverForgotten(benchmark::State& state) {
  FakeClock clock;
  auto limiter = Exponential<int64_t>(&clock, absl::Minutes(1));
  int64_t item = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(item++));
    clock.Advance(absl::Milliseconds(1));
  }
  state.counters["tracked"] = static_cast<double>(limiter->TrackedItems());
}
BENCHMARK(BM_ExponentialWhen_NeverForgotten);

// The limiter's share of the ratelimited scenario (SCENARIOS.md): 1,000,000 string items
// taken in turn, each asked NumRequeues and then failed (When) until it has failed three
// times, then forgotten. One iteration is one reconcile's limiter calls; the table holds
// up to a million items, so each item's first lookup misses the cache. With `prefetch`,
// each iteration first gives the hint a RateLimitingQueue gives at each hand-out:
// Prefetch of the item next in line.
void ReconcilePattern(benchmark::State& state, bool prefetch) {
  constexpr int kItems = 1'000'000;
  std::vector<std::string> items;
  std::vector<uint32_t> hashes;  // as the queue stores them
  items.reserve(kItems);
  hashes.reserve(kItems);
  for (int i = 0; i < kItems; ++i) {
    items.push_back(absl::StrCat("default/object-", i));
    hashes.push_back(internal::TableHash<std::string, absl::Hash<std::string>>(items.back()));
  }
  ExponentialFailureRateLimiterOptions options;
  options.base = absl::Microseconds(1);
  options.max = absl::Milliseconds(1);
  auto limiter = *ExponentialFailureRateLimiter<std::string>::Create(options);
  size_t i = 0;
  for (auto _ : state) {
    const std::string& item = items[i];
    if (++i == items.size()) i = 0;
    if (prefetch) limiter->Prefetch(hashes[i]);
    if (limiter->NumRequeues(item) < 3) {
      benchmark::DoNotOptimize(limiter->When(item));
    } else {
      limiter->Forget(item);
    }
  }
  state.counters["tracked"] = static_cast<double>(limiter->TrackedItems());
}

void BM_ExponentialReconcilePattern_1M(benchmark::State& state) { ReconcilePattern(state, false); }
BENCHMARK(BM_ExponentialReconcilePattern_1M)->Iterations(8'000'000);

void BM_ExponentialReconcilePattern_1M_Prefetched(benchmark::State& state) {
  ReconcilePattern(state, true);
}
BENCHMARK(BM_ExponentialReconcilePattern_1M_Prefetched)->Iterations(8'000'000);

void BM_BucketWhen(benchmark::State& state) {
  auto limiter = *BucketRateLimiter<int64_t>::Create({.qps = 10, .burst = 100});
  for (auto _ : state) benchmark::DoNotOptimize(limiter->When(1));
}
BENCHMARK(BM_BucketWhen);

// The other built-in limiters, one item failing and succeeding over and over.
void BM_FastSlowWhenForget(benchmark::State& state) {
  auto limiter = *FastSlowRateLimiter<int64_t>::Create(
      {.fast = absl::Milliseconds(5), .slow = absl::Seconds(10), .max_fast_attempts = 3});
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(42));
    limiter->Forget(42);
  }
}
BENCHMARK(BM_FastSlowWhenForget);

void BM_WithMaxWaitWhenForget(benchmark::State& state) {
  auto limiter = *WithMaxWaitRateLimiter<int64_t>::Create(
      Exponential<int64_t>(RealClock::Default(), absl::Seconds(2000)), absl::Seconds(1));
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(42));
    limiter->Forget(42);
  }
}
BENCHMARK(BM_WithMaxWaitWhenForget);

// MaxOf two per-item limiters (the default is MaxOf(exponential, bucket), below).
void BM_MaxOfTwoPerItemWhenForget(benchmark::State& state) {
  std::vector<std::unique_ptr<RateLimiter<int64_t>>> children;
  children.push_back(Exponential<int64_t>(RealClock::Default(), absl::Seconds(2000)));
  children.push_back(*FastSlowRateLimiter<int64_t>::Create(
      {.fast = absl::Milliseconds(5), .slow = absl::Seconds(10), .max_fast_attempts = 3}));
  auto limiter = *MaxOfRateLimiter<int64_t>::Create(std::move(children));
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(42));
    limiter->Forget(42);
  }
}
BENCHMARK(BM_MaxOfTwoPerItemWhenForget);

void BM_DefaultControllerWhenForget(benchmark::State& state) {
  auto limiter = DefaultControllerRateLimiter<int64_t>();
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(42));
    limiter->Forget(42);
  }
}
BENCHMARK(BM_DefaultControllerWhenForget);

void BM_DefaultControllerWhenForget_String(benchmark::State& state) {
  auto limiter = DefaultControllerRateLimiter<std::string>();
  const std::string item = "default/object-42";
  for (auto _ : state) {
    benchmark::DoNotOptimize(limiter->When(item));
    limiter->Forget(item);
  }
}
BENCHMARK(BM_DefaultControllerWhenForget_String);

}  // namespace
}  // namespace kwq
