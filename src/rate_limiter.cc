// The non-template parts of kwq/rate_limiter.h: backoff arithmetic, parameter checks and
// the token bucket.

#include "kwq/rate_limiter.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kwq::internal {

namespace {

std::string Format(absl::Duration d) { return absl::FormatDuration(d); }

// An error unless `idle_horizon` is unset or >= 0.
absl::Status ValidateIdleHorizon(const char* limiter, std::optional<absl::Duration> idle_horizon) {
  if (idle_horizon.has_value() && *idle_horizon < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(limiter, ": idle_horizon must be >= 0, got ", Format(*idle_horizon)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Duration ExponentialBackoff(absl::Duration base, absl::Duration max, int64_t exponent) {
  if (exponent <= 0 || base <= absl::ZeroDuration()) return std::min(base, max);
  // Now base >= 1/4 ns, absl::Duration's resolution, and the largest finite Duration is
  // below 2^63 s < 2^95 quarter nanoseconds: from 2^128 on, the product is beyond range.
  if (exponent >= 128) return max;
  absl::Duration delay = base;
  while (exponent > 0) {
    const int64_t step = std::min<int64_t>(exponent, 62);
    delay *= int64_t{1} << step;  // saturates at absl::InfiniteDuration() on overflow
    if (delay >= max) return max;
    exponent -= step;
  }
  return delay;
}

BackoffSchedule::BackoffSchedule(absl::Duration base, absl::Duration max) {
  // Below max and with base > 0 each step doubles; once a value repeats (max reached, or
  // base == 0) every later one equals it. Past 2^128 the product is max (see above).
  for (int64_t n = 0; n <= 128; ++n) {
    const absl::Duration d = ExponentialBackoff(base, max, n);
    if (!steps_.empty() && d == steps_.back()) break;
    steps_.push_back(d);
  }
}

absl::Duration ApplyJitter(absl::Duration delay, absl::Duration max, double factor) {
  if (factor == 1.0 || delay == absl::InfiniteDuration()) return delay;
  return std::min(delay * factor, max);
}

absl::Duration DefaultIdleHorizon(absl::Duration max_delay) {
  if (max_delay == absl::InfiniteDuration()) return absl::InfiniteDuration();
  return std::max(2 * max_delay, absl::Minutes(1));  // 2 * max_delay saturates
}

uint64_t JitterSeed(uint64_t seed) {
  if (seed != 0) return seed;
  try {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ uint64_t { device() };
  } catch (const std::exception&) {
    // No entropy source to open (std::random_device throws then): the limiter is made all
    // the same, seeded from the time and a count of such seeds, which differ per limiter.
    static std::atomic<uint64_t> drawn{0};
    return absl::Hash<std::pair<int64_t, uint64_t>>()(
        {absl::GetCurrentTimeNanos(), drawn.fetch_add(1, std::memory_order_relaxed)});
  }
}

absl::Status ValidateExponentialFailure(absl::Duration base, absl::Duration max, double jitter,
                                        std::optional<absl::Duration> idle_horizon) {
  constexpr char kName[] = "ExponentialFailureRateLimiter";
  if (base < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": base must be >= 0, got ", Format(base)));
  }
  if (max < base) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": max must be >= base (", Format(base), "), got ", Format(max)));
  }
  if (!(jitter >= 0 && jitter <= 1)) {  // also rejects NaN
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": jitter must be in [0, 1], got ", jitter));
  }
  return ValidateIdleHorizon(kName, idle_horizon);
}

absl::Status ValidateFastSlow(absl::Duration fast, absl::Duration slow, int max_fast_attempts,
                              std::optional<absl::Duration> idle_horizon) {
  constexpr char kName[] = "FastSlowRateLimiter";
  if (fast < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": fast must be >= 0, got ", Format(fast)));
  }
  if (slow < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": slow must be >= 0, got ", Format(slow)));
  }
  if (max_fast_attempts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": max_fast_attempts must be >= 0, got ", max_fast_attempts));
  }
  return ValidateIdleHorizon(kName, idle_horizon);
}

absl::Status ValidateMaxWait(absl::Duration max_wait) {
  if (max_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WithMaxWaitRateLimiter: max_wait must be >= 0, got ", Format(max_wait)));
  }
  return absl::OkStatus();
}

absl::Status TokenBucket::Validate(double qps, int burst) {
  constexpr char kName[] = "BucketRateLimiter";
  if (std::isnan(qps)) return absl::InvalidArgumentError(absl::StrCat(kName, ": qps is NaN"));
  if (qps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": qps must be >= 0, got ", qps));
  }
  if (burst < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": burst must be >= 0, got ", burst));
  }
  // absl::Duration counts quarter nanoseconds: 1 / qps rounded there limited 3e9 qps
  // to 4e9, and from about 8e9 rounded to 0, no limit at all.
  if (qps > 1e9 && !std::isinf(qps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kName,
        ": qps must be at most 1e9 (one token per nanosecond; +infinity means no limit), got ",
        qps));
  }
  if (qps == 0 && burst == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": qps = 0 needs burst > 0 (no token would ever be available)"));
  }
  if (qps > 0 && !std::isinf(qps)) {
    const absl::Duration interval = absl::Seconds(1) / qps;
    if (interval == absl::InfiniteDuration() && burst == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kName, ": qps = ", qps,
          " refills no token within absl::Duration's range, so it needs burst > 0 (as qps = 0)"));
    }
    // A full bucket plus the token being waited for must fit: the debt is kept up to
    // that (a debt that overflowed there saturated to infinity, and every reservation
    // after waited for ever).
    if (interval != absl::InfiniteDuration() &&
        interval * (int64_t{burst} + 1) == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kName, ": (burst + 1) / qps is beyond absl::Duration's range, got burst = ", burst,
          ", qps = ", qps));
    }
  }
  return absl::OkStatus();
}

TokenBucket::TokenBucket(double qps, int burst, Clock* clock)
    : clock_(clock), mode_(Mode::kRefill) {
  if (std::isinf(qps)) {
    mode_ = Mode::kUnlimited;
    return;
  }
  interval_ = qps > 0 ? absl::Seconds(1) / qps : absl::InfiniteDuration();
  MutexLock lock(&mu_);
  if (interval_ == absl::InfiniteDuration()) {
    mode_ = Mode::kNoRefill;
    no_refill_left_ = burst;
    return;
  }
  capacity_ = interval_ * int64_t{burst};
  static const absl::Duration kMaxDebt = absl::Seconds(int64_t{1} << 62);
  max_debt_ = std::max(kMaxDebt, capacity_ + interval_);  // finite: Validate
  last_now_ = clock_->Now();
}

absl::Duration TokenBucket::Reserve() {
  if (mode_ == Mode::kUnlimited) return absl::ZeroDuration();
  MutexLock lock(&mu_);
  if (mode_ == Mode::kNoRefill) {
    if (no_refill_left_ == 0) return absl::InfiniteDuration();
    --no_refill_left_;
    return absl::ZeroDuration();
  }
  const absl::Time now = clock_->Now();
  // The time passed refills; a clock that moved backwards refills nothing (tokens stay as
  // they were at the previous reservation).
  if (now > last_now_) debt_ = std::max(absl::ZeroDuration(), debt_ - (now - last_now_));
  last_now_ = now;
  // Take one token. The debt is kept relative to the last reservation and capped
  // (max_debt_; qps near 1e-18 and many reservations): an absolute next-full time
  // saturated to InfiniteFuture there and waited for ever after, and one capped at a
  // fixed time stopped limiting once the clock passed it.
  debt_ = std::min(debt_ + interval_, max_debt_);
  // Tokens left: burst - debt_ / interval_; negative ones are waited for.
  return std::max(absl::ZeroDuration(), debt_ - capacity_);
}

}  // namespace kwq::internal
