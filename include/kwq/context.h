// File: kwq/context.h
//
// Go-style context cancellation trees: cancellation, deadlines, causes and request-scoped
// values that flow from a root to every piece of work started on its behalf.
//
//   kwq::Context root = kwq::Background();
//   auto [ctx, cancel] = kwq::WithTimeout(root, absl::Seconds(5));
//   worker(ctx);                 // polls ctx.IsCancelled() or waits on ctx.Done()
//   cancel();                    // or let the deadline fire
//
// Promises (pinned by tests/context_test.cc):
//   - Cancelling a context cancels every descendant, with the same Err() and Cause(); a
//     child's own cancel never touches its parent. Cancel after cancel is a no-op.
//   - When a cancel function returns, every descendant already reports IsCancelled(), as
//     in Go. A cancel that finds its context being cancelled by another thread waits for
//     that cancellation to reach every descendant (not for its AfterFuncs, which may
//     still be running on that thread). Any cancellation, also by a deadline, reaches
//     every descendant before the AfterFuncs of the subtree run.
//   - Err() is OK while live, then Cancelled or DeadlineExceeded; Cause() is the status
//     given to the cancel function (or the deadline's cause), else Err().
//   - IsCancelled() is one lock-free atomic load.
//   - A deadline earlier in the parent wins; a deadline in the past cancels at once.
//     Deadlines fire through a TimerService (the process default unless the root was made
//     with BackgroundWithTimers), so no thread is created per context.
//   - A child whose last handle (Context, CancelFunc, DoneSignal, AfterFuncHandle) is
//     dropped is unlinked from its parent and freed, even if it was never cancelled.
//   - Cancelling a tree of any depth or width, and destroying a chain of any depth, uses
//     bounded stack, also when contexts are chained through AfterFuncs or values (beyond
//     16 nested levels the deeper work is queued on the thread and finished before the
//     16th level returns; see AfterFunc); no lock of a parent is held while user
//     callbacks run.
//   - A child created while its parent is being cancelled is cancelled too (never missed).
//
// Thread safety: every function here may be called concurrently from any thread, on
// different handles, and the const members also on the same handle. Assigning to a handle
// while another thread uses that same handle object is a data race (the rule of
// std::shared_ptr). Handles are cheap to copy (one atomic increment).
//
// Differences from Go: AfterFunc runs `fn` on the cancelling thread (after its locks are
// released) rather than in a new goroutine, and at once on the calling thread when the
// context is already done; for a deadline that is the timer service's thread, so an `fn`
// that blocks holds up every timer of that service (see AfterFunc). Done() is a waitable
// object rather than a channel.

#ifndef KWQ_CONTEXT_H_
#define KWQ_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kwq/internal/check.h"
#include "kwq/timer.h"

namespace kwq {

namespace internal {
struct ContextNode;
struct AfterFuncRecord;
// The cancellation word of contexts that can never be cancelled (always 0).
extern const std::atomic<uint32_t> kNeverCancelledWord;
inline constexpr uint32_t kCancelledBit = 1;
// IsCancelled() is one load of this word: it must never fall back to a lock.
static_assert(std::atomic<uint32_t>::is_always_lock_free);
}  // namespace internal

// Identifies one value slot of a context. Identity is the key object's address, so a key
// is usually a global or a static: `inline constexpr kwq::ContextKey<std::string>
// kRequestId{"request-id"};`. The name is for debugging only.
template <typename T>
class ContextKey {
 public:
  constexpr explicit ContextKey(const char* name) : name_(name) {}
  ContextKey(const ContextKey&) = delete;
  ContextKey& operator=(const ContextKey&) = delete;
  const char* name() const { return name_; }

 private:
  const char* name_;
};

class Context;
class DoneSignal;
class CancelFunc;
class AfterFuncHandle;

namespace internal {
CancelFunc MakeCancelFunc(ContextNode* node);  // takes over one reference
ContextNode* NodeOf(const Context& ctx);
Context AdoptNode(ContextNode* node);
}  // namespace internal

// A handle to one node of a context tree. A default-constructed Context is Background().
// A moved-from Context is invalid: using it fails a debug assertion (and behaves as
// Background() in release builds).
class Context {
 public:
  Context();
  Context(const Context& other);
  Context(Context&& other) noexcept;
  Context& operator=(const Context& other);
  Context& operator=(Context&& other) noexcept;
  ~Context();

  // True once this context is cancelled or its deadline passed. One acquire load; never
  // blocks. Everything written before the cancel is visible after it returns true.
  bool IsCancelled() const noexcept {
    return (word_->load(std::memory_order_acquire) & internal::kCancelledBit) != 0;
  }

  // OK while live; then absl::CancelledError("context canceled") or
  // absl::DeadlineExceededError("context deadline exceeded"). While live it is
  // IsCancelled() inlined (one load); after the cancel it takes the canceller's lock.
  absl::Status Err() const { return LiveForStatus() ? absl::OkStatus() : CancelledErr(); }

  // The cause given when this context (or the ancestor that cancelled it) was cancelled;
  // Err() when none was given; OK while live (one load, like Err()).
  absl::Status Cause() const { return LiveForStatus() ? absl::OkStatus() : CancelledCause(); }

  // The earliest deadline of this context and its ancestors; InfiniteFuture if none. On
  // the tree's timer clock (timers().clock()), not absl::Now()'s (see WithDeadline).
  absl::Time Deadline() const;

  // The done signal: wait on it, poll it, or register a callback.
  DoneSignal Done() const;

  // The value stored under `key` by the nearest WithValue ancestor (or this context), or
  // nullptr. The pointer stays valid while this context is alive. Walks up the ancestors,
  // without a lock, to the nearest one holding `key`: O(depth) for a key set far up the
  // tree or not set at all.
  template <typename T>
  const T* Value(const ContextKey<T>& key) const {
    return static_cast<const T*>(FindValue(&key));
  }

  // The timer service deadlines of this tree use.
  TimerService& timers() const;

  // False only for a moved-from handle.
  bool valid() const { return node_ != nullptr; }

 private:
  friend struct internal::ContextNode;
  friend internal::ContextNode* internal::NodeOf(const Context& ctx);
  friend Context internal::AdoptNode(internal::ContextNode* node);
  friend class CancelFunc;
  friend class DoneSignal;
  friend AfterFuncHandle AfterFunc(const Context& ctx, absl::AnyInvocable<void()> fn);
  // Takes over one reference to `node`.
  explicit Context(internal::ContextNode* node);
  const void* FindValue(const void* key) const;
  // !IsCancelled(), for Err() and Cause(); debug builds die on a moved-from handle there,
  // as every use other than IsCancelled() does.
  bool LiveForStatus() const {
#ifndef NDEBUG
    (void)node();
#endif
    return !IsCancelled();
  }
  // Err() and Cause() once IsCancelled(): read under the canceller's lock.
  absl::Status CancelledErr() const;
  absl::Status CancelledCause() const;
  internal::ContextNode* node() const;  // the node, or Background's for a moved-from handle

  internal::ContextNode* node_;
  const std::atomic<uint32_t>* word_;  // the nearest cancellable ancestor's state word
};

// Returned by AfterFunc. Copyable; dropping it does not stop the function (but see
// AfterFunc: once every handle of the context holding the registration is gone too, the
// context is freed uncancelled and the function never runs).
class AfterFuncHandle {
 public:
  // Names no function: Stop() returns false.
  AfterFuncHandle() = default;
  AfterFuncHandle(const AfterFuncHandle&) = default;
  AfterFuncHandle(AfterFuncHandle&&) noexcept = default;
  // Copy-and-swap: `other` is read whole before the old record and owner go (which may
  // free `other`, when it lives in what they held).
  AfterFuncHandle& operator=(AfterFuncHandle other) noexcept {
    record_.swap(other.record_);
    std::swap(owner_, other.owner_);
    return *this;
  }
  // Stops the function from running. Returns true when this call stopped it; false when
  // it has already started (it may still be running: Stop does not wait) or was already
  // stopped. Never blocks on the function.
  bool Stop() const;

 private:
  friend AfterFuncHandle AfterFunc(const Context& ctx, absl::AnyInvocable<void()> fn);
  AfterFuncHandle(std::shared_ptr<internal::AfterFuncRecord> record, Context owner)
      : record_(std::move(record)), owner_(std::move(owner)) {}
  std::shared_ptr<internal::AfterFuncRecord> record_;
  Context owner_;  // the node whose list holds the record (kept alive for Stop)
};

// The done signal of a context. Copyable; keeps its context alive (one taken once the
// context's cancellation is over refers to a shared fired signal instead, which behaves
// the same: see Context::Done).
class DoneSignal {
 public:
  // True once the context is done. Lock-free.
  bool HasFired() const noexcept { return ctx_.IsCancelled(); }
  // Blocks until the context is done. Blocks forever on a context that cannot be
  // cancelled (Background, WithoutCancel), as receiving from Go's nil Done channel does.
  // Returns at once, inline, on a context already done.
  void Wait() const {
    if (!HasFired()) WaitFor(absl::InfiniteDuration());
  }
  // Blocks until the context is done or `timeout` passes, in real time on the monotonic
  // clock (a step of the wall clock neither stretches nor cuts it). Returns HasFired().
  bool WaitFor(absl::Duration timeout) const;
  // Runs `fn` once when the context is done: AfterFunc(context, fn) (see there for the
  // reference cycle an `fn` holding this context's handle makes).
  AfterFuncHandle OnDone(absl::AnyInvocable<void()> fn) const;

 private:
  friend class Context;
  explicit DoneSignal(Context ctx) : ctx_(std::move(ctx)) {}
  Context ctx_;
};

// Cancels the context it was returned with (and its descendants). Copyable; each copy
// keeps the context alive. Thread-safe; every call after the first does nothing.
class CancelFunc {
 public:
  // Cancels nothing (Background's): calling it does nothing.
  CancelFunc() = default;
  // `cause` becomes Cause() of the cancelled contexts; an OK cause is replaced by
  // Err()'s status. Err() is always Cancelled. Returns once the context and every
  // descendant report IsCancelled(): when the context was already being cancelled (by a
  // parent, its deadline or another call), after waiting for that cancellation to reach
  // them all; the AfterFuncs it runs may still be running on its thread. When this call
  // cancels, it runs the AfterFuncs of the subtree itself, after marking the subtree,
  // also when called from inside an AfterFunc (unless AfterFuncs already nest more than
  // 16 deep on this thread: see AfterFunc).
  // Never waits for user code running on another thread.
  void operator()(absl::Status cause = absl::OkStatus()) const;

 private:
  friend CancelFunc internal::MakeCancelFunc(internal::ContextNode* node);
  // Takes over one reference to `node`.
  explicit CancelFunc(internal::ContextNode* node) : ctx_(node) {}
  Context ctx_;
};

// A new context with its cancel function, for `auto [ctx, cancel] = WithCancel(parent);`.
struct CancelableContext {
  Context context;
  CancelFunc cancel;
};

// The root of every tree: never cancelled, no deadline, no values. Deadlines below it use
// TimerService::Default(). Cheap (no allocation).
Context Background();

// A root like Background() whose descendants' deadlines use `timers` (for example one on
// a FakeClock). `timers` must outlive every context of the tree. nullptr means
// TimerService::Default(), as for Background(). Allocates the root (a Background() does
// not).
Context BackgroundWithTimers(TimerService* timers);

// A child cancelled when its cancel function is called or its parent is cancelled.
CancelableContext WithCancel(const Context& parent);
// Go's WithCancelCause: the same as WithCancel, whose CancelFunc takes an optional cause.
CancelableContext WithCancelCause(const Context& parent);

// A child also cancelled, with DeadlineExceeded, at `deadline` (read on the tree's timer
// clock, parent.timers().clock(): for the default tree RealClock, whose times are on the
// CLOCK_MONOTONIC timeline, not absl::Now()'s wall clock; a deadline taken from
// absl::Now() is decades away there. Port Go's WithDeadline(p, t) with a wall-clock t as
// WithTimeout(p, t - absl::Now()), or take the deadline from the tree's clock, as
// parent.timers().clock().Now() + d). absl::InfiniteFuture() means no deadline. A
// deadline at or before now cancels the child before this returns, whatever the
// parent's deadline (unless the parent is cancelled already: then the child has its Err
// and Cause). Otherwise, if the parent's deadline is not later, the child keeps that one
// and gets no timer: the parent's expiry cancels it, with the parent's Cause. `cause`,
// when not OK, becomes Cause() if this child's own deadline fires (as Go's
// WithDeadlineCause).
CancelableContext WithDeadline(const Context& parent, absl::Time deadline,
                               absl::Status cause = absl::OkStatus());
// WithDeadline(parent, now + timeout); saturates for huge timeouts
// (absl::InfiniteDuration() means no deadline).
CancelableContext WithTimeout(const Context& parent, absl::Duration timeout,
                              absl::Status cause = absl::OkStatus());

// A child carrying `value` under `key`, cancelled exactly when the parent is.
template <typename T>
Context WithValue(const Context& parent, const ContextKey<T>& key, T value);

// A child with the parent's values and timer service but none of its cancellation or
// deadline: never cancelled.
Context WithoutCancel(const Context& parent);

// Runs `fn` once after `ctx` is done, on the thread that cancels it (after that thread
// has released every context lock), or on this thread before returning when `ctx` is
// already done. Every descendant of `ctx` reports IsCancelled() before `fn` runs, so `fn`
// may wait on a descendant's Done(). The AfterFuncs of one cancellation run one after
// another on the cancelling thread: one must not wait for another. A deadline's
// cancelling thread is the tree's timer service thread (TimerService::Default()'s, shared
// by every timer of the process, unless the tree was given another): while an `fn` there
// blocks, no other timer of that service fires (nor another deadline: an `fn` that waits
// for a later deadline waits for ever), so hand long or blocking work to a thread or a
// workqueue (Go runs each AfterFunc in a goroutine of its own). On a FakeClock that thread
// is the caller of Advance, which holds the clock's lock of moves: there `fn` must not
// Advance that clock, nor wait for a thread that makes or destroys a timer service or a
// delaying queue on it. The same holds for what a deadline's cancellation runs besides
// (value destructors, ToStopToken's stop callbacks). A cancel made inside
// an AfterFunc (Go's AfterFunc(a, cancel_b)) runs its own AfterFuncs before it returns,
// like any cancel, up to 16 nested levels on one thread; deeper (a long chain of contexts
// cancelling one another through AfterFuncs, or ToStopToken/WithStopToken bridges) they
// are queued and run by the 16th level's cancel before it returns, so such chains run
// with bounded stack however long they are. Then a cancel beyond that depth returns
// before its AfterFuncs have run. An exception thrown by
// `fn` is caught and reported on stderr; cancellation of the rest of the tree continues.
// On a context that can never be cancelled, `fn` never runs.
// The registration lives on the nearest cancellable context at or above `ctx` (a
// WithValue context has no cancellation of its own): it is freed when `fn` has run, by
// Stop (which also frees `fn` at once, while AfterFuncHandles live), or when that context
// is freed uncancelled (then `fn` never runs: unlike Go, where AfterFunc keeps it). So AfterFuncs
// registered per request through WithValue contexts of a long-lived root accumulate on
// the root until they run or are stopped.
//
// Reference cycle: the registration owns `fn`, so an `fn` that holds a handle (Context,
// CancelFunc, DoneSignal, AfterFuncHandle) of `ctx` - as Go code routinely captures ctx -
// or of any context at or below the one holding the registration keeps that context
// alive through its own registration. If it is never cancelled and the registration is
// never stopped, neither it, its ancestors nor `fn` are ever freed. Break the cycle as Go
// code does anyway: call the cancel function when the work is done (Go's `defer
// cancel()`) or Stop() the registration; or capture only what `fn` needs (values, a
// pointer to a Context that outlives the registration, a handle of an ancestor of the
// context holding the registration). An empty `fn` registers a function that does
// nothing.
AfterFuncHandle AfterFunc(const Context& ctx, absl::AnyInvocable<void()> fn);

// ---- implementation details ----

namespace internal {
Context WithValueErased(const Context& parent, const void* key, std::shared_ptr<const void> value);
}  // namespace internal

template <typename T>
Context WithValue(const Context& parent, const ContextKey<T>& key, T value) {
  return internal::WithValueErased(parent, &key, std::make_shared<const T>(std::move(value)));
}

}  // namespace kwq

#endif  // KWQ_CONTEXT_H_
