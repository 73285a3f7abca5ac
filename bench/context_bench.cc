// Context microbenchmarks: the per-operation costs behind the ctx_* scenarios.
// Results and the command that produced them: docs/benchmarks.md.

#include <atomic>

#include "benchmark/benchmark.h"
#include "kwq/context.h"

namespace kwq {
namespace {

// The unit the design notes count in: one uncontended locked read-modify-write (a
// reference count, a lock word), back to back on one thread.
void BM_LockedFetchAdd(benchmark::State& state) {
  std::atomic<int> word{0};
  for (auto _ : state) word.fetch_add(1, std::memory_order_relaxed);
  benchmark::DoNotOptimize(word.load());
}
BENCHMARK(BM_LockedFetchAdd);

void BM_IsCancelled(benchmark::State& state) {
  auto [ctx, cancel] = WithCancel(Background());
  for (auto _ : state) benchmark::DoNotOptimize(ctx.IsCancelled());
}
BENCHMARK(BM_IsCancelled);

void BM_ErrLive(benchmark::State& state) {
  auto [ctx, cancel] = WithCancel(Background());
  for (auto _ : state) benchmark::DoNotOptimize(ctx.Err());
}
BENCHMARK(BM_ErrLive);

void BM_WithCancelAndCancel(benchmark::State& state) {
  auto [root, cancel_root] = WithCancel(Background());
  for (auto _ : state) {
    auto [ctx, cancel] = WithCancel(root);
    cancel();
  }
}
BENCHMARK(BM_WithCancelAndCancel);

void BM_WithCancelDropped(benchmark::State& state) {
  auto [root, cancel_root] = WithCancel(Background());
  for (auto _ : state) benchmark::DoNotOptimize(WithCancel(root));
}
BENCHMARK(BM_WithCancelDropped);

void BM_WithTimeoutAndCancel(benchmark::State& state) {
  auto [root, cancel_root] = WithCancel(Background());
  for (auto _ : state) {
    auto [ctx, cancel] = WithTimeout(root, absl::Hours(1));
    cancel();
  }
}
BENCHMARK(BM_WithTimeoutAndCancel);

inline constexpr ContextKey<int> kKey{"bench"};

void BM_ValueLookupDepth(benchmark::State& state) {
  Context ctx = WithValue(Background(), kKey, 1);
  for (int i = 0; i < state.range(0); ++i) ctx = WithCancel(ctx).context;
  for (auto _ : state) benchmark::DoNotOptimize(ctx.Value(kKey));
}
BENCHMARK(BM_ValueLookupDepth)->Arg(1)->Arg(8)->Arg(64);

void BM_CopyHandle(benchmark::State& state) {
  auto [ctx, cancel] = WithCancel(Background());
  for (auto _ : state) {
    Context copy = ctx;
    benchmark::DoNotOptimize(copy);
  }
}
BENCHMARK(BM_CopyHandle);

}  // namespace
}  // namespace kwq
