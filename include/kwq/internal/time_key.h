// File: kwq/internal/time_key.h
//
// Times as int64 nanoseconds since the Unix epoch, the keys of the delaying and priority
// queues' heaps. A ready time rounds up and a current time rounds down, so an item is
// never ready before its time, even for a time between two nanoseconds (absl::Time has
// quarter-nanosecond steps). The price: on a clock that itself reads between two
// nanoseconds (only a FakeClock moved by a fraction of one; RealClock reads whole ones),
// an item whose ready time is fractional too comes due at the next whole nanosecond, not
// at its exact time (the timer service, which keeps exact deadlines, is exact there).
// Times outside the int64 range saturate: InfiniteFuture and times past about year 2262
// map to kNeverKey; current times before about 1677 map to INT64_MIN, and ready times
// there to INT64_MIN + 1, so an item is not due while the clock reads that early (it
// waits for the clock to enter the range) instead of coming due at once.
// Internal: used by DelayingQueue and PriorityQueue.
//
// The timer service's heap (src/internal/timer_heap.h) rounds the same way but counts
// from the service's start and keeps each timer's exact deadline for keys that
// saturate, so a timer centuries away still fires at its time. The queues do without
// that slot of exact time per item: an item ready after about 2262 saturates to
// kNeverKey (see the queues' own notes on what that means for them).

#ifndef KWQ_INTERNAL_TIME_KEY_H_
#define KWQ_INTERNAL_TIME_KEY_H_

#include <cstdint>
#include <limits>

#include "absl/time/time.h"

namespace kwq::internal {

inline constexpr int64_t kNeverKey = std::numeric_limits<int64_t>::max();

// `t` rounded down (for the current time).
inline int64_t NowKey(absl::Time t) {
  if (t == absl::InfiniteFuture()) return kNeverKey;
  if (t == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  return absl::ToUnixNanos(t);  // rounds down, saturates
}

// `t` rounded up (for a ready time): not before `t`, and after every current time that
// saturates to INT64_MIN.
inline int64_t ReadyKey(absl::Time t) {
  int64_t key = NowKey(t);
  if (key == std::numeric_limits<int64_t>::min()) return key + 1;
  if (key != kNeverKey && absl::FromUnixNanos(key) < t) ++key;
  return key;
}

// A span between two keys, exact: `d` (>= 0) in whole nanoseconds, rounded up, as a
// uint64_t, since two int64 keys can be up to 2^64 - 1 ns (about 584 years) apart. An
// int64 count saturated at about 292 years and turned a longer finite span into
// "never" or into 292 years. Spans of 2^64 ns or more, and InfiniteDuration, give
// kNeverSpan: no two keys are that far apart.
inline constexpr uint64_t kNeverSpan = std::numeric_limits<uint64_t>::max();
inline uint64_t SpanNanos(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  if (d == absl::InfiniteDuration()) return kNeverSpan;
  const int64_t seconds = absl::ToInt64Seconds(d);  // rounds down
  if (seconds > 18'446'744'073) return kNeverSpan;  // 2^64 ns is 18,446,744,073.7 s
  const int64_t nanos =
      absl::ToInt64Nanoseconds(absl::Ceil(d - absl::Seconds(seconds), absl::Nanoseconds(1)));
  const uint64_t span = static_cast<uint64_t>(seconds) * 1'000'000'000u;
  return span > kNeverSpan - static_cast<uint64_t>(nanos) ? kNeverSpan
                                                          : span + static_cast<uint64_t>(nanos);
}

// Whether key `later` is at least `span` after key `earlier` (false when it is before),
// without overflow for any two keys.
inline bool AtLeastApart(int64_t earlier, int64_t later, uint64_t span) {
  return later >= earlier && span != kNeverSpan &&
         static_cast<uint64_t>(later) - static_cast<uint64_t>(earlier) >= span;
}

inline absl::Time TimeOfKey(int64_t key) {
  if (key == kNeverKey) return absl::InfiniteFuture();
  return absl::FromUnixNanos(key);
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_TIME_KEY_H_
