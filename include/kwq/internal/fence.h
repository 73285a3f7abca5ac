// File: kwq/internal/fence.h
//
// SeqCstFence: std::atomic_thread_fence(std::memory_order_seq_cst), for the store-load
// pairs of the queues' wake-up protocol (see Queue::NeedWakeLocked). Internal.
//
// ThreadSanitizer does not model fences, and g++ rejects them under -fsanitize=thread
// (-Wtsan). There the fence becomes a seq_cst read-modify-write of a local atomic: TSan
// checks data races, not the lost wake-ups the fence prevents. In C++ terms that is no
// fence; on x86 the locked instruction is the same full barrier, so TSan builds keep the
// protocol on x86 only (on ARMv8.0 without LSE a liveness stress test under TSan could
// rarely stall). Release builds use the real fence everywhere.

#ifndef KWQ_INTERNAL_FENCE_H_
#define KWQ_INTERNAL_FENCE_H_

#include <atomic>

#if defined(__SANITIZE_THREAD__)
#define KWQ_INTERNAL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KWQ_INTERNAL_TSAN 1
#endif
#endif

namespace kwq::internal {

inline void SeqCstFence() {
#ifdef KWQ_INTERNAL_TSAN
  std::atomic<int> barrier{0};
  barrier.fetch_add(0, std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_FENCE_H_
