// File: kwq/internal/mutex.h
//
// A thin, annotated wrapper over std::mutex and std::condition_variable_any.
//
// Why not absl::Mutex: Debian's Abseil is built without ThreadSanitizer, so absl::Mutex
// synchronisation is invisible to TSan and it reports false races on the data it guards.
// std::mutex is understood by TSan; the Abseil capability annotations on this wrapper let
// clang's -Wthread-safety check every ABSL_GUARDED_BY in kwq. (LevelDB's port::Mutex is
// the model.) Internal: kwq users must not depend on this header.

#ifndef KWQ_INTERNAL_MUTEX_H_
#define KWQ_INTERNAL_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace kwq::internal {

// A non-recursive mutual-exclusion lock. Not movable or copyable.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Documents (and tells the analysis) that the caller holds the lock. No run-time check.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// RAII holder of a Mutex for one scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Condition variable bound to a kwq Mutex. Wait* must be called with the mutex held; they
// release it while blocked and hold it again on return. Spurious wake-ups are possible, so
// callers re-check their condition in a loop.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }

  // Waits until notified or until `deadline` (steady clock) passes. Returns true on
  // timeout. absl::InfiniteFuture() waits without a deadline.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool timed_out = cv_.wait_until(lock, deadline) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }

  // Waits until notified or `timeout` (real time) passes. Returns true on timeout.
  bool WaitFor(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (timeout == absl::InfiniteDuration()) {
      Wait(mu);
      return false;
    }
    return WaitUntil(mu, std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout));
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_MUTEX_H_
