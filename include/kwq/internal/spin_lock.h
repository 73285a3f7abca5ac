// File: kwq/internal/spin_lock.h
//
// SpinLock: a one-word lock for short critical sections: context nodes (a few pointer
// updates: linking a child, marking the node cancelled) and a queue's metrics recorder
// (kwq/internal/queue_metrics.h, three lock pairs per item). Compared with the pthread mutex
// of kwq/internal/mutex.h it needs no initialisation call, takes 1 byte instead of 40,
// and unlocks with a plain release store instead of a read-modify-write; creating and
// cancelling a child context takes three lock pairs, so this is measurable
// (docs/benchmarks.md). Waiters spin with a CPU pause, then yield, then sleep briefly, so
// a holder that was preempted (or a cancel detaching a million children) does not make
// them burn a CPU for long. Built from std::atomic, so ThreadSanitizer sees it, and
// annotated for clang's -Wthread-safety.
//
// Why not absl::base_internal::SpinLock: it is not public API, and Debian's Abseil is not
// built with ThreadSanitizer, so TSan would not see its synchronisation (see mutex.h).
// Not for long critical sections or for waiting on a condition: use internal::Mutex.
// Internal: kwq users must not depend on this header.

#ifndef KWQ_INTERNAL_SPIN_LOCK_H_
#define KWQ_INTERNAL_SPIN_LOCK_H_

#include <atomic>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"

namespace kwq::internal {

class ABSL_LOCKABLE SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    LockSlow();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }

 private:
  ABSL_ATTRIBUTE_NOINLINE void LockSlow();

  std::atomic<bool> locked_{false};
};

// RAII holder of a SpinLock for one scope.
class ABSL_SCOPED_LOCKABLE SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_->Lock();
  }
  ~SpinLockHolder() ABSL_UNLOCK_FUNCTION() { lock_->Unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock* const lock_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SPIN_LOCK_H_
