// TimerService microbenchmarks: schedule+cancel cost (with and without 100,000 other
// timers armed) and lateness percentiles with 100,000 armed timers, on both backends;
// the cost of one RealClock::Now (every AddAfter, limiter When and deadline reads it); and
// one FakeClock move over many timers in one nanosecond.
// Results and the command that produced them: docs/benchmarks.md.

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "benchmark/benchmark.h"
#include "kwq/clock.h"
#include "kwq/timer.h"

namespace kwq {
namespace {

std::unique_ptr<TimerService> NewService(int64_t backend) {
  TimerService::Options options;
  options.backend =
      backend == 0 ? TimerService::Backend::kPortable : TimerService::Backend::kIoUring;
  return std::move(*TimerService::Create(options));
}

const char* BackendLabel(int64_t backend) { return backend == 0 ? "portable" : "io_uring"; }

// One read of the real clock, as AddAfter makes it.
void BM_RealClockNow(benchmark::State& state) {
  Clock* clock = RealClock::Default();
  for (auto _ : state) benchmark::DoNotOptimize(clock->Now());
}
BENCHMARK(BM_RealClockNow);

// One coarse read (CLOCK_MONOTONIC_COARSE), as the rate limiters' idle horizons make it.
void BM_RealClockCoarseNow(benchmark::State& state) {
  Clock* clock = RealClock::Default();
  for (auto _ : state) benchmark::DoNotOptimize(clock->CoarseNow());
}
BENCHMARK(BM_RealClockCoarseNow);

// Schedule a timer one hour out, then cancel it. Arg 1: timers already armed.
void BM_ScheduleCancel(benchmark::State& state) {
  auto service = NewService(state.range(0));
  const absl::Time far = service->clock().Now() + absl::Hours(2);
  for (int64_t i = 0; i < state.range(1); ++i) service->Schedule(far, [] {});
  const absl::Time deadline = service->clock().Now() + absl::Hours(1);
  for (auto _ : state) {
    const TimerId id = service->Schedule(deadline, [] {});
    benchmark::DoNotOptimize(service->Cancel(id));
  }
  state.SetLabel(BackendLabel(state.range(0)));
}
BENCHMARK(BM_ScheduleCancel)->ArgsProduct({{0, 1}, {0, 100'000}});

// Arms 100,000 timers with deadlines uniform over [20 ms, 1 s) and records, for each, how
// late its callback ran. Reports p50/p99/max lateness in microseconds.
void BM_Lateness100k(benchmark::State& state) {
  constexpr int kTimers = 100'000;
  auto service = NewService(state.range(0));
  std::vector<double> late_us;
  for (auto _ : state) {
    std::vector<double> sample(kTimers);
    std::atomic<int> fired{0};
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<int64_t> us(20'000, 999'999);
    const absl::Time base = service->clock().Now();
    for (int i = 0; i < kTimers; ++i) {
      const absl::Time deadline = base + absl::Microseconds(us(rng));
      service->Schedule(deadline, [&, i, deadline] {
        sample[i] = absl::ToDoubleMicroseconds(service->clock().Now() - deadline);
        fired.fetch_add(1, std::memory_order_release);
      });
    }
    while (fired.load(std::memory_order_acquire) < kTimers) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    late_us = std::move(sample);
  }
  std::sort(late_us.begin(), late_us.end());
  state.counters["late_p50_us"] = late_us[late_us.size() / 2];
  state.counters["late_p99_us"] = late_us[late_us.size() * 99 / 100];
  state.counters["late_max_us"] = late_us.back();
  state.SetLabel(BackendLabel(state.range(0)));
}
BENCHMARK(BM_Lateness100k)->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);

// One FakeClock move that runs n timers sharing one fractional deadline (Now() + 1 s / 3).
// Ordering deadlines within a nanosecond by scanning the top key's entries made this
// quadratic (834 ms for 20,000); quarter-nanosecond keys keep it O(n log n).
void BM_FakeClockRunsTimersInOneNanosecond(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    FakeClock clock(absl::FromUnixSeconds(1000));
    auto service = *TimerService::Create({.clock = &clock});
    int ran = 0;
    const absl::Time deadline = clock.Now() + absl::Seconds(1) / 3;
    for (int i = 0; i < n; ++i) service->Schedule(deadline, [&ran] { ++ran; });
    state.ResumeTiming();
    clock.Advance(absl::Seconds(1));
    benchmark::DoNotOptimize(ran);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_FakeClockRunsTimersInOneNanosecond)->Arg(20'000)->Unit(benchmark::kMillisecond);

// The service thread's CPU for one near timer that runs on its own (the thread then goes
// back to sleep) while n timers wait 300 years out, past the heap's exact key range: a
// context with a "no timeout" of the largest Duration Go allows (292 years) is one. Going
// back to sleep looked at every such timer for the earliest deadline: about 310 us of CPU
// per near timer with 100,000 of them, against 29 us with 100,000 timers a year out.
// Process CPU time per iteration (the 100 us pause is a sleep).
void BM_NearTimerWithFarTimersPending(benchmark::State& state) {
  auto service = NewService(0);
  std::vector<TimerId> far;
  for (int64_t i = 0; i < state.range(0); ++i) {
    far.push_back(service->ScheduleAfter(absl::Hours(24 * 365 * 300), [] {}));
  }
  for (auto _ : state) {
    absl::Notification ran;
    service->ScheduleAfter(absl::ZeroDuration(), [&ran] { ran.Notify(); });
    ran.WaitForNotification();
    absl::SleepFor(absl::Microseconds(100));  // the service thread goes back to sleep
  }
  for (TimerId id : far) service->Cancel(id);
}
BENCHMARK(BM_NearTimerWithFarTimersPending)
    ->Arg(0)
    ->Arg(100'000)
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMicrosecond);

// 20,000 timers sharing one deadline (1 ms out) fire, with range(0) timers 300 years out
// pending (their keys saturate: src/internal/timer_heap.h). While any saturated timer was
// pending, every pop looked at all the timers still sharing the top deadline: 20,000
// timers took N^2 / 2 = 200,000,000 looks to fire. Wall time from the first Schedule to
// the last callback.
void BM_EqualDeadlinesFire(benchmark::State& state) {
  constexpr int kTimers = 20'000;
  auto service = NewService(0);
  std::vector<TimerId> far;
  for (int64_t i = 0; i < state.range(0); ++i) {
    far.push_back(service->ScheduleAfter(absl::Hours(24 * 365 * 300), [] {}));
  }
  for (auto _ : state) {
    std::atomic<int> left{kTimers};
    absl::Notification all_ran;
    const absl::Time deadline = service->clock().Now() + absl::Milliseconds(1);
    for (int i = 0; i < kTimers; ++i) {
      service->Schedule(deadline, [&left, &all_ran] {
        if (left.fetch_sub(1, std::memory_order_relaxed) == 1) all_ran.Notify();
      });
    }
    all_ran.WaitForNotification();
  }
  for (TimerId id : far) service->Cancel(id);
  state.SetItemsProcessed(state.iterations() * kTimers);
}
BENCHMARK(BM_EqualDeadlinesFire)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// range(0) observers (a DelayingQueue or TimerService each, on a test's FakeClock) added,
// then removed oldest first. Removal erased from a vector: N^2 / 2 pointer moves in all
// (80,000 queues on one FakeClock took 2 s to destroy).
void BM_FakeClockObserversAddedAndRemoved(benchmark::State& state) {
  struct Nothing : ClockObserver {
    void OnClockMoved(absl::Time) override {}
  };
  std::vector<Nothing> observers(state.range(0));
  FakeClock clock;
  for (auto _ : state) {
    for (auto& o : observers) clock.AddObserver(&o);
    for (auto& o : observers) clock.RemoveObserver(&o);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_FakeClockObserversAddedAndRemoved)
    ->Arg(5'000)
    ->Arg(80'000)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kwq
