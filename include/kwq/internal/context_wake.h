// File: kwq/internal/context_wake.h
//
// ContextWake: wakes the waiters of a queue's condition variable once a context is done,
// for the blocking calls that take a context (Get(ctx), ShutDownWithDrain(ctx)) of Queue
// and PriorityQueue. Internal: kwq users must not depend on this header.
//
// Construct it before taking the queue's mutex: on a context already done the wake-up
// runs at once, on the constructing thread, and takes that mutex. The wake-up takes the
// mutex before it signals, so a waiter that checked the context under the mutex and
// then waits is woken (the cancel happened after its check, and the signal comes after
// its wait began). The destructor stops the wake-up or, when it has started, waits for
// it to finish: it touches the queue and this object, so destroy it only once the mutex
// is released (the wake-up may be waiting for it) and before the queue may go. Not
// movable: the registration points at this object.

#ifndef KWQ_INTERNAL_CONTEXT_WAKE_H_
#define KWQ_INTERNAL_CONTEXT_WAKE_H_

#include <atomic>
#include <new>
#include <optional>
#include <thread>

#include "absl/base/attributes.h"
#include "kwq/context.h"
#include "kwq/internal/mutex.h"

namespace kwq::internal {

class ContextWake {
 public:
  // Signals every waiter of `cv` (which waits with `mu`) once `ctx` is done.
  ContextWake(const Context& ctx, Mutex* mu, CondVar* cv)
      : mu_(mu), cv_(cv), handle_(AfterFunc(ctx, [this] { Wake(); })) {}
  ~ContextWake() {
    if (!handle_.Stop()) {
      while (!finished_.load(std::memory_order_acquire)) std::this_thread::yield();
    }
  }
  ContextWake(const ContextWake&) = delete;
  ContextWake& operator=(const ContextWake&) = delete;

  // Makes the wake-up in `*wake` (as the constructor, which throws std::bad_alloc when the
  // registration on `ctx` cannot be made); false, with `*wake` left empty, when it cannot.
  // For the Gets: one that cannot register sleeps in short steps instead and looks at
  // `ctx` after each (a worker's Get(ctx) does not throw for want of memory).
  ABSL_ATTRIBUTE_NOINLINE static bool TryEmplace(std::optional<ContextWake>* wake,
                                                 const Context& ctx, Mutex* mu,
                                                 CondVar* cv) noexcept {
    try {
      wake->emplace(ctx, mu, cv);
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }

 private:
  void Wake() {
    { MutexLock lock(mu_); }
    cv_->SignalAll();
    finished_.store(true, std::memory_order_release);
  }

  Mutex* const mu_;
  CondVar* const cv_;
  std::atomic<bool> finished_{false};
  const AfterFuncHandle handle_;  // last: registered once the rest is set
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_CONTEXT_WAKE_H_
