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
//     new pair (one thread, under a try-lock; the others keep extrapolating, up to twice
//     `resync_ns`). The new rate is the kernel's over the last window, steered so that
//     the timeline meets the kernel's `resync_ns` later (like an NTP slew, at most
//     `max_slew_ppm` off the kernel's rate; up to 5% slower when more than `step_ns`
//     ahead, as after a suspend, when the TSC ran and CLOCK_MONOTONIC did not), starting
//     from where the old parameters had got to, so the timeline is continuous. It steps
//     forward when more than `step_ns` behind the kernel's; it does not step back (but
//     see "counter that goes back" below).
//
// Guarantees: each thread's readings are monotonic. Across threads, a reading ordered
// after another (by a lock or an acquire load) is no earlier than it as far as the TSC
// reads are ordered: the writer opens the sequence lock before it reads the TSC at which
// the new parameters take over, but a reader's rdtsc is unordered (Ticks(); fencing it
// cost more than clock_gettime) and may run before the load that ordered it, so such a
// reading can be earlier: by that load's latency (tens of nanoseconds) on bare metal, by
// up to microseconds on a VM (docs/design.md, "Unordered rdtsc"). Within about a
// microsecond of CLOCK_MONOTONIC while the kernel keeps its rate; a change of the
// kernel's rate by r shows as up to r * resync_ns, steered out over the next interval.
// An rdtsc that runs ahead of the parameter loads reads the base time rather than a
// time before it. A counter that goes back (an unsynchronised TSC, which the kernel
// would have rejected as a clocksource) restarts the timeline at the later of the old
// base and the kernel's time, which can be before readings the old parameters gave.
//
// `Source` supplies Ticks() (the counter, unordered), OrderedTicks() (ordered after
// earlier loads and stores) and KernelNanos() (the reference clock); tests pass fakes.
// Thread-safe. Now() does not block, except that a reader that finds a resync in
// progress (a write section of a few tens of nanoseconds), or whose parameters are over
// twice resync_ns old or behind its counter while another thread holds the resync lock,
// spins (yielding) until they are republished. Not async-signal-safe: a signal handler
// that interrupts its own thread's write section would spin for ever. Fork: the owner
// of a process-wide timeline holds the resync lock across fork() (BeforeFork,
// AfterFork), so a child never starts with a write section open or the lock taken.

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
  // A calibration window is used once the two pairs' uncertainty (their spreads) is at
  // most this fraction of it; otherwise the window is extended (a preempted pair must not
  // set the rate).
  int64_t calibration_error_ppm = 20;
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
      const int64_t elapsed = static_cast<int64_t>(ticks - base_ticks);
      if (ABSL_PREDICT_TRUE(elapsed >= 0)) {
        const uint64_t ns = Scale(static_cast<uint64_t>(elapsed), mult);
        if (ABSL_PREDICT_TRUE(ns < static_cast<uint64_t>(options_.resync_ns))) {
          return base_ns + static_cast<int64_t>(ns);
        }
        if (TrySync()) continue;
        // Another thread is taking a pair: the old parameters stay good (they drift from
        // the kernel's rate by ppm) up to kExtrapolateResyncs intervals, which also
        // bounds how far a counter that ran through a suspend can carry the timeline.
        if (ns < kExtrapolateResyncs * static_cast<uint64_t>(options_.resync_ns)) {
          return base_ns + static_cast<int64_t>(ns);
        }
      } else {
        // An rdtsc executed ahead of the loads above, a few nanoseconds before base_ticks.
        if (Scale(0 - static_cast<uint64_t>(elapsed), mult) < kReorderNs) return base_ns;
        if (TrySync()) continue;  // the counter went back
      }
      Backoff(attempt);
    }
  }

  // For the owner of a process-wide timeline, around fork() (pthread_atfork): holds the
  // resync lock, so that no write section is open and the child can take the lock.
  // (Unannotated: the lock is taken in one pthread_atfork handler and released in another.)
  void BeforeFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }

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
  static constexpr uint64_t kExtrapolateResyncs = 2;
  // How much slower than the kernel the timeline may run when far ahead of it.
  static constexpr int64_t kFarAheadSlewPpm = 50'000;

  // (ticks * mult) >> 32, saturating at UINT64_MAX.
  static uint64_t Scale(uint64_t ticks, uint64_t mult) {
    const unsigned __int128 ns = (static_cast<unsigned __int128>(ticks) * mult) >> 32;
    return ns > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(ns);
  }
  // Scale for a signed tick difference, saturating at +-2^62 ns (146 years).
  static int64_t SignedScale(int64_t ticks, uint64_t mult) {
    constexpr uint64_t kLimit = uint64_t{1} << 62;
    const uint64_t ns = std::min(
        Scale(ticks < 0 ? 0 - static_cast<uint64_t>(ticks) : static_cast<uint64_t>(ticks), mult),
        kLimit);
    return ticks < 0 ? -static_cast<int64_t>(ns) : static_cast<int64_t>(ns);
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
    const int64_t next = next_calibration_ns_.load(std::memory_order_relaxed);
    if (next == kUnset || kernel >= next) TrySync();
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
    int64_t spread;  // between the two reference reads
  };
  Pair ReadPair() const {
    Pair best{0, 0, INT64_MAX};
    for (int i = 0; i < 5 && best.spread > kGoodSpreadNs; ++i) {
      const int64_t before = source_.KernelNanos();
      const uint64_t ticks = source_.Ticks();
      const int64_t after = source_.KernelNanos();
      if (after - before < best.spread)
        best = {ticks, before + (after - before) / 2, after - before};
    }
    return best;
  }

  // The kernel's rate over the window since the last pair. A window over which the
  // counter went back keeps the last rate; so does one off the last rate by more than
  // 0.1% (an invariant TSC keeps its frequency and NTP moves the kernel's by ppm: the
  // counter jumped, or a suspend stopped the kernel's clock while the counter ran on),
  // unless three windows in a row agree with each other on a new one. The first rate is
  // taken only when two windows in a row agree: one window that held a suspend would
  // otherwise slow the clock by the suspend's ratio, for as long as its readers took to
  // reach the next resync on that slow timeline (hours). Returns false when the window
  // is too short to measure: it goes on from the same pair.
  bool MeasureRate(const Pair& pair) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t ticks = static_cast<int64_t>(pair.ticks - last_.ticks);  // < 0: went back
    if (ticks <= 0) return true;
    if (pair.ns - last_.ns < options_.calibrate_ns) return false;
    const uint64_t rate = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(pair.ns - last_.ns) << 32) / static_cast<uint64_t>(ticks));
    if (rate == 0) return true;  // over 2^32 ticks per nanosecond: not a TSC
    if (rate_ == 0 ? Agree(rate, candidate_rate_) : Agree(rate, rate_)) {
      rate_ = rate;
      odd_windows_ = 0;
      return true;
    }
    // The first window, or an odd one: kept until enough windows agree with it.
    if (odd_windows_ == 0 || !Agree(rate, candidate_rate_)) {
      candidate_rate_ = rate;
      odd_windows_ = 1;
      return true;
    }
    if (++odd_windows_ < 3) return true;
    rate_ = rate;
    odd_windows_ = 0;
    return true;
  }
  // Whether `rate` is within 0.1% of `reference` (never when `reference` is 0).
  static bool Agree(uint64_t rate, uint64_t reference) {
    const uint64_t off = rate > reference ? rate - reference : reference - rate;
    return reference != 0 && off <= reference / 1000;
  }

  void Sync() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t old_mult = mult_.load(std::memory_order_relaxed);
    const uint64_t old_base_ticks = base_ticks_.load(std::memory_order_relaxed);
    const int64_t old_base_ns = base_ns_.load(std::memory_order_relaxed);
    if (old_mult != 0) {  // fresh already (another thread synced since the caller looked)?
      // Half an interval: the caller's counter read and this one may disagree by a few
      // ticks (another CPU's counter), and a caller that found the parameters stale must
      // not find them fresh here for ever.
      const int64_t elapsed = static_cast<int64_t>(source_.OrderedTicks() - old_base_ticks);
      if (elapsed >= 0 && Scale(static_cast<uint64_t>(elapsed), old_mult) <
                              static_cast<uint64_t>(options_.resync_ns / 2)) {
        return;
      }
    }
    const Pair pair = ReadPair();
    if (!have_pair_) {
      have_pair_ = true;
      last_ = pair;
      next_calibration_ns_.store(pair.ns + options_.calibrate_ns, std::memory_order_relaxed);
      return;
    }
    if (old_mult == 0) {  // calibrating: a long enough window, measured well enough
      const int64_t window = pair.ns - last_.ns;
      if (window < options_.calibrate_ns ||
          static_cast<__int128>(last_.spread + pair.spread) * 1'000'000 >
              static_cast<__int128>(window) * options_.calibration_error_ppm) {
        next_calibration_ns_.store(pair.ns + options_.calibrate_ns, std::memory_order_relaxed);
        return;
      }
    }
    if (MeasureRate(pair)) last_ = pair;
    if (rate_ == 0) {  // no agreed rate yet: stay on the reference, measure another window
      next_calibration_ns_.store(last_.ns + options_.calibrate_ns, std::memory_order_relaxed);
      return;
    }

    // Steering constants, outside the write section (they do not depend on its tick).
    const __int128 rate = rate_;
    const __int128 period_ticks = (static_cast<__int128>(options_.resync_ns) << 32) / rate;
    const __int128 slew = rate * options_.max_slew_ppm / 1'000'000;
    const __int128 far_slew = rate * kFarAheadSlewPpm / 1'000'000;
    const int64_t max_reach = static_cast<int64_t>(kExtrapolateResyncs) * options_.resync_ns;

    // Open the write section before reading the tick at which the new parameters take
    // over: a reader that completes with the old ones read its ticks before it.
    const uint32_t seq = seq_.load(std::memory_order_relaxed);
    seq_.store(seq + 1, std::memory_order_seq_cst);  // a full barrier before the rdtsc
    const uint64_t ticks = source_.OrderedTicks();
    // Signed: the pair's unordered rdtsc may read after this one (another CPU's counter
    // a few nanoseconds ahead, say).
    int64_t kernel = pair.ns + SignedScale(static_cast<int64_t>(ticks - pair.ticks), rate_);
    int64_t base;
    if (old_mult == 0) {
      // Calibrating readers returned the kernel's own readings, all taken before the
      // write section opened; the pair's midpoint may lag them by half its spread.
      kernel = std::max(kernel, source_.KernelNanos());
      base = kernel;
    } else {
      const int64_t elapsed = static_cast<int64_t>(ticks - old_base_ticks);
      if (elapsed < 0) {
        // The counter went back: the old parameters cannot tell how far they got, but
        // they tracked the kernel's timeline.
        base = std::max(old_base_ns, kernel);
      } else {
        // Where the old parameters got to (readers stop extrapolating at max_reach), plus
        // kHandoverNs: both round down to whole nanoseconds, and a reader's unordered
        // rdtsc may run a little after its sequence check (tens of nanoseconds, times
        // the rate change, at most about 0.2% unless three windows agreed on a new rate).
        const int64_t reached = static_cast<int64_t>(std::min<uint64_t>(
            Scale(static_cast<uint64_t>(elapsed), old_mult), static_cast<uint64_t>(max_reach)));
        const int64_t ours = old_base_ns + reached + kHandoverNs;
        base = ours < kernel - options_.step_ns ? kernel : ours;  // step forward only
      }
    }
    // Steer: reach the kernel's timeline resync_ns from now, within the slew limits.
    const __int128 gap = static_cast<__int128>(kernel) + options_.resync_ns - base;
    __int128 mult = period_ticks > 0 ? (gap << 32) / period_ticks : rate;
    const bool far_ahead = base - kernel > options_.step_ns;
    mult = std::clamp<__int128>(mult, rate - (far_ahead ? far_slew : slew), rate + slew);
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
  // Kernel time from which a calibrating reader tries to finish the calibration.
  std::atomic<int64_t> next_calibration_ns_{kUnset};
  alignas(64) std::atomic<uint64_t> rate_view_{0};
  Mutex mu_;
  bool have_pair_ ABSL_GUARDED_BY(mu_) = false;
  Pair last_ ABSL_GUARDED_BY(mu_){0, 0, 0};
  uint64_t rate_ ABSL_GUARDED_BY(mu_) = 0;  // the kernel's ns per tick, 32.32
  // A rate seen but not taken yet (the first window's, or odd windows' while rate_ is
  // set), and how many windows in a row agreed with it.
  uint64_t candidate_rate_ ABSL_GUARDED_BY(mu_) = 0;
  int odd_windows_ ABSL_GUARDED_BY(mu_) = 0;
};

// The rate of the timeline behind RealClock, in nanoseconds per rdtsc tick, calibrating
// it first if need be (about 10 ms, once); 0 when RealClock does not read the TSC.
// Defined in clock.cc.
double SystemTscNanosPerTick();

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_TSC_TIMELINE_H_
