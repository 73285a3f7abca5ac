// Futex wait/wake on a 32-bit atomic word (Linux). Used where a waitable flag must cost
// nothing when nobody waits: the context done signal. Memory ordering comes from the
// atomics around these calls; the futex itself only parks and wakes threads.

#ifndef KWQ_SRC_INTERNAL_FUTEX_H_
#define KWQ_SRC_INTERNAL_FUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace kwq::internal {

// Blocks while `*word == expected`, until woken, until `timeout` (real time) passes, or
// spuriously. absl::InfiniteDuration() waits without a timeout.
void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

// Wakes every thread blocked in FutexWait on `word`.
void FutexWakeAll(const std::atomic<uint32_t>* word);

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_FUTEX_H_
