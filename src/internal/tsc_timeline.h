// TscTimeline: CLOCK_MONOTONIC's timeline read from the x86 time-stamp counter.
//
// RealClock::Now is on the hot path of every delayed and rate-limited add; through the
// vDSO, clock_gettime(CLOCK_MONOTONIC) costs about 21 ns on the development VM and a bare
// rdtsc about 9 ns (docs/design.md, "A TSC-read RealClock"). The kernel itself computes
// CLOCK_MONOTONIC from the TSC when its clocksource is "tsc"; this class does the same
// multiply-and-add from user space with parameters it keeps itself:
//
//   now_ns = base_ns + ((ticks - base_ticks) * mult) >> 32
//
// published under a sequence lock (readers never write shared memory). The parameters
// come from pairs of (TSC, clock_gettime) readings:
//   - Calibration: until `calibrate_ns` of kernel time has passed since the first call,
//     Now() returns clock_gettime itself; then the rate over that window is adopted and
//     the TSC timeline starts where the kernel's is.
//   - Resync: once `resync_ns` has passed since the last pair, the next reader takes a
//     new pair (one thread, under a try-lock; the others keep extrapolating). The new rate
//     is the kernel's over the last window, steered so that the timeline meets the
//     kernel's `resync_ns` later (like an NTP slew, at most `max_slew_ppm` off the
//     kernel's rate), starting from where the old parameters had got to, so the timeline
//     is continuous. It steps forward only when more than `step_ns` behind the kernel's
//     (after a suspend, say); it never steps back.
//
// Guarantees: monotonic for every thread, also across threads ordered by happens-before
// (the writer opens the sequence lock before it reads the TSC at which the new
// parameters take over); within about a microsecond of CLOCK_MONOTONIC while the kernel
// slews its own rate by less than max_slew_ppm. An rdtsc that the CPU executes ahead of
// the parameter loads (rdtsc is not ordered with loads) reads the base time rather than
// a time before it.
//
// `Source` supplies Ticks() (the counter, unordered), OrderedTicks() (ordered after
// earlier loads and stores) and KernelNanos() (the reference clock); tests pass fakes.
// Thread-safe. Now() never blocks, except that a reader finding a resync in progress
// (a write section of a few tens of nanoseconds) spins, yielding now and then.

#ifndef KWQ_SRC_INTERNAL_TSC_TIMELINE_H_
#define KWQ_SRC_INTERNAL_TSC_TIMELINE_H_

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "kwq/internal/mutex.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace kwq::internal {

struct TscTimelineOptions {
  int64_t calibrate_ns = 10'000'000;  // kernel time before the TSC takes over
  int64_t resync_ns = 1'000'000'000;  // between (TSC, kernel) pairs
  int64_t max_slew_ppm = 500;         // how far the steered rate may leave the kernel's
  int64_t step_ns = 1'000'000;        // behind the kernel by more: step forward
};

// The real counter and the real reference (x86-64 only).
struct SystemTimeSource {
#if defined(__x86_64__)
  uint64_t Ticks() const { return __rdtsc(); }
  uint64_t OrderedTicks() const {
    _mm_lfence();
    return __rdtsc();
  }
#endif
  int64_t KernelNanos() const {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
};

struct TscTimelinePeer;  // tests

template <typename Source>
class TscTimeline {
 public:
  explicit TscTimeline(Source source = Source(), TscTimelineOptions options = {})
      : source_(source), options_(options) {}
  TscTimeline(const TscTimeline&) = delete;
  TscTimeline& operator=(const TscTimeline&) = delete;

  // Nanoseconds on the reference clock's timeline.
  int64_t Now() {
    for (int attempt = 0;; ++attempt) {
      // Acquire loads throughout (plain loads on x86) keep the second load of seq_ after
      // the others; GCC's TSan does not support atomic_thread_fence.
      const uint32_t seq = seq_.load(std::memory_order_acquire);
      const uint64_t mult = mult_.load(std::memory_order_acquire);
      const uint64_t base_ticks = base_ticks_.load(std::memory_order_acquire);
      const int64_t base_ns = base_ns_.load(std::memory_order_acquire);
      if (ABSL_PREDICT_FALSE(mult == 0)) {  // calibrating: the reference itself
        const int64_t kernel = source_.KernelNanos();
        if ((seq & 1) != 0 || seq_.load(std::memory_order_relaxed) != seq) {
          Backoff(attempt);
          continue;
        }
        MaybeCalibrate(kernel);
        return kernel;
      }
      const uint64_t ticks = source_.Ticks();
      if (ABSL_PREDICT_FALSE((seq & 1) != 0 || seq_.load(std::memory_order_relaxed) != seq)) {
        Backoff(attempt);
        continue;
      }
      const uint64_t elapsed = ticks - base_ticks;
      const uint64_t ns = Scale(elapsed, mult);
      if (ABSL_PREDICT_TRUE(ns < static_cast<uint64_t>(options_.resync_ns))) return base_ns + ns;
      // An rdtsc executed ahead of the loads above, a few nanoseconds before base_ticks.
      if (static_cast<int64_t>(elapsed) < 0 && Scale(0 - elapsed, mult) < kReorderNs) {
        return base_ns;
      }
      if (TrySync()) continue;
      // Another thread is taking a pair. Until it publishes, the old parameters stay good
      // (they drift from the kernel's rate by ppm), however long that takes: a thread
      // holding the lock may never publish (it was preempted, or this is a child forked
      // while it held the lock). Only a counter that went back has to wait.
      if (static_cast<int64_t>(elapsed) >= 0) return base_ns + ns;
      Backoff(attempt);
    }
  }

  // The kernel's rate in nanoseconds per tick, 0 before calibration.
  double NanosPerTick() const {
    return static_cast<double>(rate_view_.load(std::memory_order_relaxed)) / 4294967296.0;
  }

 private:
  friend struct TscTimelinePeer;
  static constexpr uint64_t kReorderNs = 1000;
  static constexpr int64_t kUnset = INT64_MIN;
  static constexpr int64_t kGoodSpreadNs = 1000;
  static constexpr int64_t kHandoverNs = 2;

  // (ticks * mult) >> 32 without overflow.
  static uint64_t Scale(uint64_t ticks, uint64_t mult) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(ticks) * mult) >> 32);
  }

  static void Backoff(int attempt) {
    if (attempt % 64 == 63) {
      std::this_thread::yield();  // the writer may have been preempted
    } else {
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
  }

  void MaybeCalibrate(int64_t kernel) {
    const int64_t start = calibration_start_ns_.load(std::memory_order_relaxed);
    if (start == kUnset || kernel - start >= options_.calibrate_ns) TrySync();
  }

  // Takes a pair and republishes if no other thread is at it. Returns whether it got the
  // lock (the parameters are then fresh).
  bool TrySync() ABSL_LOCKS_EXCLUDED(mu_) {
    if (!mu_.TryLock()) return false;
    Sync();
    mu_.Unlock();
    return true;
  }

  // A (ticks, kernel ns) pair: the counter read between two reference reads, taking the
  // closest of up to five tries (a preempted try is hundreds of microseconds wide).
  struct Pair {
    uint64_t ticks;
    int64_t ns;
  };
  Pair ReadPair() const {
    Pair best{};
    int64_t best_spread = INT64_MAX;
    for (int i = 0; i < 5 && best_spread > kGoodSpreadNs; ++i) {
      const int64_t before = source_.KernelNanos();
      const uint64_t ticks = source_.Ticks();
      const int64_t after = source_.KernelNanos();
      if (after - before < best_spread) {
        best_spread = after - before;
        best = {ticks, before + (after - before) / 2};
      }
    }
    return best;
  }

  // The kernel's rate over the window since the last pair. A window that is too short, or
  // over which the counter went back, keeps the last rate; so does one off the last rate
  // by more than 0.1% (an invariant TSC keeps its frequency and NTP moves the kernel's by
  // ppm: the counter jumped), unless three windows in a row say so.
  void MeasureRate(const Pair& pair) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t ticks = static_cast<int64_t>(pair.ticks - last_.ticks);  // < 0: went back
    if (ticks <= 0 || pair.ns - last_.ns < options_.calibrate_ns) return;
    const uint64_t rate = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(pair.ns - last_.ns) << 32) / static_cast<uint64_t>(ticks));
    if (rate == 0) return;  // a counter over 4 GHz per ns: not a TSC
    const uint64_t off = rate > rate_ ? rate - rate_ : rate_ - rate;
    if (rate_ != 0 && off > rate_ / 1000 && ++odd_windows_ < 3) return;
    rate_ = rate;
    odd_windows_ = 0;
  }

  void Sync() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t old_mult = mult_.load(std::memory_order_relaxed);
    const uint64_t old_base_ticks = base_ticks_.load(std::memory_order_relaxed);
    const int64_t old_base_ns = base_ns_.load(std::memory_order_relaxed);
    if (old_mult != 0) {  // fresh already (another thread synced since the caller looked)?
      const uint64_t elapsed = source_.OrderedTicks() - old_base_ticks;
      if (static_cast<int64_t>(elapsed) >= 0 &&
          Scale(elapsed, old_mult) < static_cast<uint64_t>(options_.resync_ns)) {
        return;
      }
    }
    const Pair pair = ReadPair();
    if (!have_pair_) {
      have_pair_ = true;
      last_ = pair;
      calibration_start_ns_.store(pair.ns, std::memory_order_relaxed);
      return;
    }
    if (old_mult == 0 && pair.ns - last_.ns < options_.calibrate_ns) return;
    MeasureRate(pair);
    last_ = pair;
    if (rate_ == 0) return;  // no usable window yet: stay on the reference

    // Open the write section before reading the tick at which the new parameters take
    // over: a reader that completes with the old ones read its ticks before it.
    const uint32_t seq = seq_.load(std::memory_order_relaxed);
    seq_.store(seq + 1, std::memory_order_seq_cst);  // a full barrier before the rdtsc
    const uint64_t ticks = source_.OrderedTicks();
    const int64_t kernel = pair.ns + static_cast<int64_t>(Scale(ticks - pair.ticks, rate_));
    int64_t base = kernel;
    if (old_mult != 0) {
      const uint64_t elapsed = ticks - old_base_ticks;
      if (static_cast<int64_t>(elapsed) < 0) {
        // The counter went back: the old parameters cannot tell how far they got, but
        // they tracked the kernel's timeline.
        base = std::max(old_base_ns, kernel);
      } else {
        // kHandoverNs ahead of where the old parameters got to: both round down to whole
        // nanoseconds, and a reader's unordered rdtsc may run a little after its
        // sequence check (by tens of nanoseconds, times the <= 0.1% rate change).
        const int64_t ours =
            old_base_ns + static_cast<int64_t>(Scale(elapsed, old_mult)) + kHandoverNs;
        base = ours < kernel - options_.step_ns ? kernel : ours;  // step forward only
      }
    }
    // Steer: reach the kernel's timeline resync_ns from now, within max_slew_ppm.
    const __int128 period_ticks = (static_cast<__int128>(options_.resync_ns) << 32) / rate_;
    const __int128 gap = static_cast<__int128>(kernel) + options_.resync_ns - base;
    __int128 mult = period_ticks > 0 ? (gap << 32) / period_ticks : rate_;
    const __int128 slew = static_cast<__int128>(rate_) * options_.max_slew_ppm / 1'000'000;
    mult = std::clamp<__int128>(mult, rate_ - slew, rate_ + slew);
    // Release stores: not visible before the odd sequence number.
    base_ticks_.store(ticks, std::memory_order_release);
    base_ns_.store(base, std::memory_order_release);
    mult_.store(static_cast<uint64_t>(std::max<__int128>(mult, 1)), std::memory_order_release);
    seq_.store(seq + 2, std::memory_order_release);
    rate_view_.store(rate_, std::memory_order_relaxed);
  }

  const Source source_;
  const TscTimelineOptions options_;
  // Read by every Now(); written only in Sync's write section.
  alignas(64) std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> mult_{0};  // ns per tick, 32.32 fixed point; 0 while calibrating
  std::atomic<uint64_t> base_ticks_{0};
  std::atomic<int64_t> base_ns_{0};
  std::atomic<int64_t> calibration_start_ns_{kUnset};  // the first pair's kernel time
  alignas(64) std::atomic<uint64_t> rate_view_{0};
  Mutex mu_;
  bool have_pair_ ABSL_GUARDED_BY(mu_) = false;
  Pair last_ ABSL_GUARDED_BY(mu_){};
  uint64_t rate_ ABSL_GUARDED_BY(mu_) = 0;  // the kernel's ns per tick, 32.32
  int odd_windows_ ABSL_GUARDED_BY(mu_) = 0;
};

// The rate of the timeline behind RealClock, in nanoseconds per rdtsc tick, calibrating
// it first if need be (about 10 ms, once); 0 when RealClock does not read the TSC.
// Defined in clock.cc.
double SystemTscNanosPerTick();

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_TSC_TIMELINE_H_
