// The node behind kwq::Context handles, shared by context.cc and stop_token.cc.
//
// Locking rules (one letter per field, as in the kernel's workqueue.c):
//   I: set before the node is published, read-only after.
//   M: this node's mu.
//   P: the mu of the node this one is registered with (parent->canceller).
//   A: atomic; the comment says which order.
// At most one node mutex is held at a time; user callbacks run with none held.

#ifndef KWQ_SRC_INTERNAL_CONTEXT_NODE_H_
#define KWQ_SRC_INTERNAL_CONTEXT_NODE_H_

#include <atomic>
#include <list>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kwq/context.h"
#include "kwq/internal/spin_lock.h"
#include "kwq/timer.h"

namespace kwq::internal {

// Bits of ContextNode::state besides kCancelledBit (kwq/context.h).
inline constexpr uint32_t kWaitersBit = 2;  // a Done() waiter may sleep in FutexWait on state
// Every descendant is marked cancelled too. Set with kCancelledBit on a node with no
// child to mark, and on the start of a cancellation once it has marked the whole subtree;
// a node with children marked by a cancellation started above it never gets it (its
// marked_by start does).
inline constexpr uint32_t kSubtreeCancelledBit = 4;
// A thread may sleep in FutexWait on state until kSubtreeCancelledBit is set.
inline constexpr uint32_t kSubtreeWaitersBit = 8;

// Something a node owns and destroys first when it dies (a std::stop_callback).
struct ContextAttachment {
  virtual ~ContextAttachment() = default;
};

struct AfterFuncRecord;
// A node's AfterFunc registrations. Records move between lists by splicing, which
// neither allocates nor invalidates a record's `it`.
using AfterFuncList = std::list<std::shared_ptr<AfterFuncRecord>>;

struct AfterFuncRecord {
  enum : int { kPending = 0, kStarted = 1, kStopped = 2 };
  explicit AfterFuncRecord(absl::AnyInvocable<void()> f) : fn(std::move(f)) {}
  std::atomic<int> state{kPending};  // A: the CAS winner (acq_rel) owns fn
  absl::AnyInvocable<void()> fn;
  bool linked = false;         // owner's M
  AfterFuncList::iterator it;  // owner's M
};

// Where a node's cancellation comes from.
enum class CancelSource {
  kOwn,      // cancellable itself (WithCancel, WithDeadline, ...)
  kInherit,  // shares its parent's (WithValue)
  kNone,     // never cancelled (roots, WithoutCancel)
};

struct ContextNode {
  // `parent_ref`: a reference the node takes over (or null for a root).
  ContextNode(ContextNode* parent_ref, CancelSource source, TimerService* timers_in,
              absl::Time deadline_in)
      : parent(parent_ref),
        canceller(source == CancelSource::kOwn       ? this
                  : source == CancelSource::kInherit ? parent_ref->canceller
                                                     : nullptr),
        timers(timers_in),
        deadline(deadline_in) {}

  TimerService& Timers() const { return timers ? *timers : TimerService::Default(); }
  bool cancellable() const { return canceller == this; }
  // The node a cancellable node registers with: the parent's canceller.
  ContextNode* registrar() const { return parent ? parent->canceller : nullptr; }

  std::atomic<int32_t> refs{1};  // A: increments relaxed, decrement acq_rel
  bool immortal = false;         // I: Background's node; never counted or freed

  ContextNode* const parent;                      // I: owns one reference; null for roots
  ContextNode* const canceller;                   // I: self, nearest cancellable ancestor, or null
  TimerService* const timers;                     // I: null means TimerService::Default()
  const absl::Time deadline;                      // I: effective (earliest in the chain)
  const void* value_key = nullptr;                // I
  std::shared_ptr<const void> value;              // I
  std::unique_ptr<ContextAttachment> attachment;  // I (destroyed first by Destroy)
  absl::Status deadline_cause;                    // I: Cause() when the deadline fires

  // Cancellable nodes only (except mu and after_funcs: see there).
  // A: kCancelledBit set once with release (under mu); kSubtreeCancelledBit set once with
  // release, with it or later by the same thread; the waiter bits set by waiters
  // (acquire) before they sleep.
  std::atomic<uint32_t> state{0};
  SpinLock mu;
  // Err(): one of the two process-wide statuses below (no count to bump per node).
  const absl::Status* err ABSL_GUARDED_BY(mu) = nullptr;
  // Cause() when it differs from *err; OK means "the same as *err".
  absl::Status cause ABSL_GUARDED_BY(mu);
  ContextNode* first_child ABSL_GUARDED_BY(mu) = nullptr;
  // Cancellable nodes: the AfterFuncs registered on this node. Value nodes: those
  // registered through this node by AfterFuncFreedWithNode, which live on the
  // canceller's list (their `it` and `linked` are about that list); Destroy stops them.
  AfterFuncList after_funcs ABSL_GUARDED_BY(mu);
  // A (relaxed): the deadline timer. Stored once by WithDeadline after arming, before
  // Register publishes the node (so a parent's cancel always sees it); reset to 0 by
  // CancelTree when its Cancel stopped the timer. While non-zero, the callback may be
  // pending or running, so Destroy must CancelSync it before freeing the node.
  std::atomic<TimerId> timer{0};

  // Membership in registrar()'s child list: P. Once a cancellation has detached the node
  // (linked false), next_sibling links that cancellation's work stack instead, owned by
  // the cancelling thread (NodeStack in context.cc).
  ContextNode* prev_sibling = nullptr;
  ContextNode* next_sibling = nullptr;
  bool linked = false;

  // The start of the cancellation that marked this node (an ancestor or itself, so kept
  // alive by this node); its kSubtreeCancelledBit says when this node's subtree is marked.
  // Once the count reached zero, no thread reads it (only holders of a reference do):
  // then the destroying thread's queue of nested Destroys links through it (Destroy in
  // context.cc), which keeps the node one pointer smaller.
  ContextNode* marked_by ABSL_GUARDED_BY(mu) = nullptr;
};

void Ref(ContextNode* node);
void Unref(ContextNode* node);
// Takes a reference unless the count already reached zero (the node is being destroyed).
bool TryRef(ContextNode* node);

// The two Err() values, built once (a Status with a message is heap-allocated; these are
// shared by every cancelled node).
const absl::Status& CanceledError();
const absl::Status& DeadlineError();

// Cancels `start` and its subtree (iteratively), unlinking `start` from its registrar.
// `err` is CanceledError() or DeadlineError(); `cause` is OK when it is the same as
// *err. The caller holds a reference to `start` and no node lock. Returns once every node
// of the subtree is marked cancelled, also when another thread marked `start` first (it
// waits for that thread's marking, never for its AfterFuncs); runs the AfterFuncs of the
// nodes it marked itself, after marking them all (when AfterFuncs already nest more than
// kInlineDepth deep on this thread, it queues them for a shallower call; context.cc).
void CancelTree(ContextNode* start, const absl::Status* err, const absl::Status& cause);

// Blocks until every descendant of `node`, which must be marked cancelled, is marked too.
// The caller holds a reference to `node` and no node lock.
void AwaitSubtreeCancelled(ContextNode* node);

// Registers the record `one` holds (its only element) on `c`, the canceller of a context,
// moving it from `one` to c's list, and returns true; or, when `c` is done, runs it at once
// (after AwaitSubtreeCancelled) and returns false; or, when `c` is null (never
// cancelled), returns false. Allocates nothing (the list node comes with `one`), so it
// cannot throw once the record exists.
bool AddAfterFunc(ContextNode* c, AfterFuncList& one);
// A list holding a new record of `fn`: what AddAfterFunc takes.
AfterFuncList NewAfterFunc(absl::AnyInvocable<void()> fn);

// Stops `record`, registered on `owner` (or null), unless it started or was stopped:
// returns true when this call stopped it. With `only_if_linked`, a record a cancellation
// has already taken from `owner`'s list (to run it) is left alone. Never blocks on the
// function.
bool StopAfterFunc(AfterFuncRecord& record, ContextNode* owner, bool only_if_linked);

// AfterFunc(node's context, fn) whose registration is freed with `node` when `node` dies
// first, also for a value node (whose AfterFuncs otherwise live on the canceller, an
// ancestor, until it is cancelled or freed). For links that exist only for `node`
// (ToStopToken). The caller holds a reference to `node`.
void AfterFuncFreedWithNode(ContextNode* node, absl::AnyInvocable<void()> fn);

// Creates a cancellable child of `parent` (`refs` references, owned by the caller) with
// the effective deadline `deadline`, not yet registered with its registrar.
ContextNode* NewCancellableNode(ContextNode* parent, absl::Time deadline, int32_t refs = 1);

// Publishes a node made by NewCancellableNode: links it into its registrar's child list,
// or cancels it at once when the registrar is already done. A node that is cancelled
// already (its deadline fired) is left out of the list.
void Register(ContextNode* node);

// NewCancellableNode and Register. Arms no timer.
ContextNode* NewCancellableChild(ContextNode* parent, absl::Time deadline, int32_t refs = 1);

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_CONTEXT_NODE_H_
