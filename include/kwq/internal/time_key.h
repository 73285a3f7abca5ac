// File: kwq/internal/time_key.h
//
// Times as int64 nanoseconds since the Unix epoch, the keys of the delaying and priority
// queues' heaps. A ready time rounds up and a current time rounds down, so an item is
// never ready before its time, even for a time between two nanoseconds (absl::Time has
// quarter-nanosecond steps). Times past the int64 range (about year 2262) saturate:
// InfiniteFuture and later times map to kNeverKey, InfinitePast and earlier to INT64_MIN.
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

// `t` rounded up (for a ready time): not before `t`.
inline int64_t ReadyKey(absl::Time t) {
  int64_t key = NowKey(t);
  if (key != kNeverKey && key != std::numeric_limits<int64_t>::min() &&
      absl::FromUnixNanos(key) < t) {
    ++key;
  }
  return key;
}

inline absl::Time TimeOfKey(int64_t key) {
  if (key == kNeverKey) return absl::InfiniteFuture();
  return absl::FromUnixNanos(key);
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_TIME_KEY_H_
