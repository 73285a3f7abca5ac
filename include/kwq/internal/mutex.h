// File: kwq/internal/mutex.h
//
// A thin, annotated wrapper over a pthread mutex and condition variable.
//
// Why not absl::Mutex: Debian's Abseil is built without ThreadSanitizer, so absl::Mutex
// synchronisation is invisible to TSan and it reports false races on the data it guards.
// std::mutex is understood by TSan; the Abseil capability annotations on this wrapper let
// clang's -Wthread-safety check every ABSL_GUARDED_BY in kwq. (LevelDB's port::Mutex is
// the model.) Internal: kwq users must not depend on this header.
//
// The mutex is glibc's adaptive kind (PTHREAD_MUTEX_ADAPTIVE_NP): it spins briefly before
// sleeping in the kernel, like Go's sync.Mutex. Queues whose lock is passed between a
// producer and workers at a high rate spend most of their time in futex calls with a
// plain mutex (pc_2w went from about 330 to 180 ns per item on 2 cores). TSan intercepts the
// pthread calls, so it still sees every lock. LockSpinning spins longer, bounded in time,
// for the few callers that measured better for it (docs/design.md).

#ifndef KWQ_INTERNAL_MUTEX_H_
#define KWQ_INTERNAL_MUTEX_H_

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cerrno>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace kwq::internal {

struct MutexPeer;  // tests' access to LockedHint

// A non-recursive mutual-exclusion lock. Not movable or copyable.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&mu_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~Mutex() { pthread_mutex_destroy(&mu_); }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { pthread_mutex_lock(&mu_); }
  // Lock, spinning for up to about `spin` (clamped to [0, 1 s]; at 0, 32 pauses) before
  // sleeping in the kernel (the adaptive mutex alone gives up after about a hundred
  // pauses, a few microseconds). For a lock whose other holders do bounded work that
  // takes longer than that, taken by a caller that has nothing better to do than wait:
  // sleeping costs it a futex wake-up and the scheduler's latency, tens of microseconds
  // on a busy machine.
  void LockSpinning(absl::Duration spin) ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (!TryLockUnannotated()) SpinThenLock(spin);
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { pthread_mutex_unlock(&mu_); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return TryLockUnannotated(); }
  // Whether the mutex looks taken, from a relaxed read of glibc's lock word (always
  // false elsewhere, so the caller just tries). A poller reads it before TryLock: a
  // failed trylock still takes the lock word's line from its holder.
  bool LockedHint() const {
#ifdef __GLIBC__
    return __atomic_load_n(&mu_.__data.__lock, __ATOMIC_RELAXED) != 0;
#else
    return false;
#endif
  }
  // Documents (and tells the analysis) that the caller holds the lock. No run-time check.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  friend struct MutexPeer;
  // TryLock without the annotation, for LockSpinning's body (whose own annotation covers
  // both ways of getting the lock).
  bool TryLockUnannotated() { return pthread_mutex_trylock(&mu_) == 0; }
  void SpinThenLock(absl::Duration spin);  // src/internal/mutex.cc
  pthread_mutex_t mu_;
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

// MutexLock with Mutex::LockSpinning.
class ABSL_SCOPED_LOCKABLE SpinningMutexLock {
 public:
  SpinningMutexLock(Mutex* mu, absl::Duration spin) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->LockSpinning(spin);
  }
  ~SpinningMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  SpinningMutexLock(const SpinningMutexLock&) = delete;
  SpinningMutexLock& operator=(const SpinningMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Condition variable bound to a kwq Mutex, on CLOCK_MONOTONIC. Wait* must be called with
// the mutex held; they release it while blocked and hold it again on return. Spurious
// wake-ups are possible, so callers re-check their condition in a loop.
class CondVar {
 public:
  CondVar() {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cv_, &attr);
    pthread_condattr_destroy(&attr);
  }
  ~CondVar() { pthread_cond_destroy(&cv_); }
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { pthread_cond_wait(&cv_, &mu->mu_); }

  // Waits until notified or `timeout` (real time) passes. Returns true on timeout.
  bool WaitFor(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (timeout == absl::InfiniteDuration()) {
      Wait(mu);
      return false;
    }
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const timespec deadline =
        absl::ToTimespec(absl::DurationFromTimespec(now) + std::max(timeout, absl::ZeroDuration()));
    return pthread_cond_timedwait(&cv_, &mu->mu_, &deadline) == ETIMEDOUT;
  }

  void Signal() { pthread_cond_signal(&cv_); }
  void SignalAll() { pthread_cond_broadcast(&cv_); }

 private:
  pthread_cond_t cv_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_MUTEX_H_
