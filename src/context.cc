#include "kwq/context.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <list>
#include <new>
#include <vector>

#include "internal/context_node.h"
#include "internal/futex.h"

namespace kwq {
namespace internal {

const std::atomic<uint32_t> kNeverCancelledWord{0};

namespace {

ContextNode* BackgroundNode() {
  static ContextNode* const node = [] {
    auto* n = new ContextNode(nullptr, CancelSource::kNone, nullptr, absl::InfiniteFuture());
    n->immortal = true;
    return n;
  }();
  return node;
}

// The node of every DoneSignal taken from a context whose cancellation is over (see
// Context::Done): cancelled, its subtree marked, never counted or freed.
ContextNode* FiredNode() {
  static ContextNode* const node = [] {
    auto* n = new ContextNode(nullptr, CancelSource::kOwn, nullptr, absl::InfiniteFuture());
    n->immortal = true;
    {
      SpinLockHolder lock(&n->mu);
      n->err = &CanceledError();
    }
    n->state.store(kCancelledBit | kSubtreeCancelledBit, std::memory_order_release);
    return n;
  }();
  return node;
}

const std::atomic<uint32_t>* WordOf(const ContextNode* node) {
  return node->canceller != nullptr ? &node->canceller->state : &kNeverCancelledWord;
}

}  // namespace

const absl::Status& CanceledError() {
  static const absl::Status* const status =
      new absl::Status(absl::CancelledError("context canceled"));
  return *status;
}
const absl::Status& DeadlineError() {
  static const absl::Status* const status =
      new absl::Status(absl::DeadlineExceededError("context deadline exceeded"));
  return *status;
}

namespace {

void RunAfterFunc(AfterFuncRecord& record) {
  int expected = AfterFuncRecord::kPending;
  if (!record.state.compare_exchange_strong(expected, AfterFuncRecord::kStarted,
                                            std::memory_order_acq_rel)) {
    return;  // stopped
  }
  try {
    record.fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kwq: AfterFunc threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kwq: AfterFunc threw a non-std exception\n");
  }
  record.fn = nullptr;
}

// Nesting beyond which work that would recurse is queued instead. An AfterFunc may
// cancel another context (Go's AfterFunc(a, cancel_b) idiom, and the std::stop_token
// bridge), whose AfterFuncs may cancel a third, and so on; freeing a context destroys its
// values and AfterFunc functions, which may hold the last handle of another context. Each
// such link nests a CancelTree or a Destroy on the stack (a few hundred bytes; 20,000
// links overflowed an 8 MiB stack). Up to this depth they run inline, exactly as without
// nesting (code around them may rely on that: a value's destructor that drops a context
// and then destroys the TimerService it used, an AfterFunc that cancels a context and
// then waits for that context's AfterFuncs); deeper ones are queued on the thread and run
// by the call at this depth before it returns. So a chain of any length uses bounded
// stack, and the queues are always empty once the outermost call returns.
constexpr int kInlineDepth = 16;

// The queues are plain thread_local pointers and counters (trivially destructible), so a
// context destroyed during thread or static destruction still finds them intact.
thread_local int after_func_depth = 0;
// AfterFunc batches queued past kInlineDepth, oldest first.
struct QueuedFuncs {
  AfterFuncList funcs;
  QueuedFuncs* next = nullptr;
};
thread_local QueuedFuncs* queued_funcs_head = nullptr;
thread_local QueuedFuncs* queued_funcs_tail = nullptr;

// Runs `run` (which runs AfterFuncs) one AfterFunc depth deeper. The call that reaches
// kInlineDepth then runs what deeper cancels queued, before it returns: every way of
// running an AfterFunc goes through here, so no queued batch is left behind.
template <typename Run>
void AtNextAfterFuncDepth(Run run) {
  ++after_func_depth;
  run();
  if (after_func_depth == kInlineDepth) {
    while (QueuedFuncs* batch = queued_funcs_head) {
      queued_funcs_head = batch->next;
      if (queued_funcs_head == nullptr) queued_funcs_tail = nullptr;
      for (auto& record : batch->funcs) RunAfterFunc(*record);
      delete batch;
    }
  }
  --after_func_depth;
}

// Runs `funcs` (RunAfterFunc each, in order) at the next AfterFunc depth, or queues them
// past kInlineDepth (see there). Takes the records out of `funcs` when it queues them.
void RunAfterFuncs(AfterFuncList& funcs) {
  if (funcs.empty()) return;
  if (after_func_depth >= kInlineDepth) {
    // Out of memory: run them inline after all (a deeper stack, but nothing is lost).
    if (auto* batch = new (std::nothrow) QueuedFuncs) {
      batch->funcs.splice(batch->funcs.end(), funcs);
      (queued_funcs_tail != nullptr ? queued_funcs_tail->next : queued_funcs_head) = batch;
      queued_funcs_tail = batch;
      return;
    }
  }
  AtNextAfterFuncDepth([&] {
    for (auto& record : funcs) RunAfterFunc(*record);
  });
}

// Removes `node` from its registrar's child list if it is still there.
void Unlink(ContextNode* node) {
  ContextNode* reg = node->registrar();
  if (reg == nullptr) return;
  SpinLockHolder lock(&reg->mu);
  if (!node->linked) return;
  if (node->prev_sibling != nullptr) {
    node->prev_sibling->next_sibling = node->next_sibling;
  } else {
    reg->first_child = node->next_sibling;
  }
  if (node->next_sibling != nullptr) node->next_sibling->prev_sibling = node->prev_sibling;
  node->prev_sibling = node->next_sibling = nullptr;
  node->linked = false;
}

// Stops the AfterFuncs tied to a dying value node (its canceller, an ancestor, is alive),
// unless a cancellation of the canceller has taken them already: those run (the value
// context was cancelled before it died, so its stop must be requested).
// Whether a dying value node has tied AfterFuncs. Without the lock: its count is zero, and
// only AfterFuncFreedWithNode, whose caller holds a reference, adds to the list.
bool HasTiedFuncs(const ContextNode* node) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return !node->after_funcs.empty();
}

void StopTiedFuncs(ContextNode* node) {
  if (!HasTiedFuncs(node)) return;  // the common case: no lock taken
  AfterFuncList tied;
  {
    SpinLockHolder lock(&node->mu);
    tied.swap(node->after_funcs);
  }
  for (auto& record : tied) StopAfterFunc(*record, node->canceller, /*only_if_linked=*/true);
}

void DestroyChain(ContextNode* node);

thread_local int destroy_depth = 0;
thread_local ContextNode* queued_destroys = nullptr;  // linked through marked_by

// The queue's link: marked_by, which nothing reads once the count reached zero (only a
// holder of a reference does), so no lock is needed.
ContextNode*& QueueLink(ContextNode* node) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return node->marked_by;
}

// Frees `node` and then every ancestor whose last reference was the child's, in a loop:
// a chain of any depth is freed with constant stack. Freeing a node destroys its values
// and AfterFunc functions (user objects), which may drop the last handle of another
// context: that nested Destroy runs inline up to kInlineDepth, and is queued beyond it,
// for the call at that depth to free before it returns (a queued node has no references:
// the others pass it by, as they do one being destroyed on another thread).
void Destroy(ContextNode* node) {
  if (destroy_depth >= kInlineDepth) {
    QueueLink(node) = queued_destroys;
    queued_destroys = node;
    return;
  }
  ++destroy_depth;
  DestroyChain(node);
  if (destroy_depth == kInlineDepth) {
    while (ContextNode* queued = queued_destroys) {
      queued_destroys = QueueLink(queued);
      DestroyChain(queued);
    }
  }
  --destroy_depth;
}

void DestroyChain(ContextNode* node) {
  while (node != nullptr) {
    // First the attachment: a std::stop_callback's destructor waits for a callback that
    // is running on another thread, whose TryRef fails from now on.
    node->attachment.reset();
    if (node->canceller != nullptr && !node->cancellable()) StopTiedFuncs(node);
    if (node->cancellable()) {
      // A cancelled node was unlinked by whoever cancelled it (CancelTree unlinks the
      // node it starts from; a parent's cancel detaches its children) or never linked
      // (Register leaves out a node whose deadline fired first), so only a live
      // node needs its registrar's lock. The canceller's reference, released with
      // acq_rel, orders that unlink before this load.
      if ((node->state.load(std::memory_order_acquire) & kCancelledBit) == 0) Unlink(node);
    }
    // Waits for a deadline callback running right now (it fails TryRef and returns).
    if (const TimerId timer = node->timer.load(std::memory_order_relaxed); timer != 0) {
      node->Timers().CancelSync(timer);
    }
    ContextNode* parent = node->parent;
    delete node;
    node = nullptr;
    if (parent != nullptr && !parent->immortal &&
        parent->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      node = parent;
    }
  }
}

}  // namespace

void Ref(ContextNode* node) {
  if (!node->immortal) node->refs.fetch_add(1, std::memory_order_relaxed);
}

void Unref(ContextNode* node) {
  if (node->immortal) return;
  if (node->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) Destroy(node);
}

bool TryRef(ContextNode* node) {
  if (node->immortal) return true;
  int32_t refs = node->refs.load(std::memory_order_relaxed);
  while (refs != 0) {
    if (node->refs.compare_exchange_weak(refs, refs + 1, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

namespace {

// Drops one reference unless it is the last; returns false (and drops nothing) then.
bool UnrefIfNotLast(ContextNode* node) {
  if (node->immortal) return true;
  int32_t refs = node->refs.load(std::memory_order_relaxed);
  while (refs > 1) {
    if (node->refs.compare_exchange_weak(refs, refs - 1, std::memory_order_release,
                                         std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

// The nodes one cancellation holds (marks to come, or last references to drop), linked
// through next_sibling: once Mark has detached a node from its registrar's list (linked
// false, under the registrar's lock), nothing else reads or writes its sibling fields,
// and a registrar marked cancelled never links a child again. So a cancellation allocates
// nothing: with a vector, a std::bad_alloc on the 17th child left that parent's list half
// detached and the references already taken leaked.
class NodeStack {
 public:
  bool empty() const { return top_ == nullptr; }
  void Push(ContextNode* node) {
    node->next_sibling = top_;
    top_ = node;
  }
  ContextNode* Pop() {
    ContextNode* node = top_;
    top_ = node->next_sibling;
    node->next_sibling = nullptr;
    return node;
  }

 private:
  ContextNode* top_ = nullptr;
};

// One cancellation's marking of `node`: unless another one marked it first, sets err,
// cause and kCancelledBit (and kSubtreeCancelledBit when no child is left to mark), moves
// its children to `work` (one reference each; children being destroyed are only
// detached) and its AfterFunc records to the end of `funcs`, and returns nullptr. When
// `node` was marked already, returns the start of the cancellation to wait for, or
// nullptr when its subtree is marked.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline ContextNode* Mark(ContextNode* node, ContextNode* start,
                                                      const absl::Status* err,
                                                      const absl::Status& cause, NodeStack& work,
                                                      AfterFuncList& funcs)
    ABSL_LOCKS_EXCLUDED(node->mu) {
  TimerId timer;
  uint32_t before;
  {
    SpinLockHolder lock(&node->mu);
    const uint32_t s = node->state.load(std::memory_order_relaxed);
    if ((s & kCancelledBit) != 0) {
      return (s & kSubtreeCancelledBit) != 0 ? nullptr : node->marked_by;
    }
    node->err = err;
    node->cause = cause;
    node->marked_by = start;
    bool complete = true;  // no child left to mark
    for (ContextNode* child = node->first_child; child != nullptr;) {
      ContextNode* next = child->next_sibling;
      child->prev_sibling = child->next_sibling = nullptr;
      child->linked = false;
      // A child whose count reached zero is being destroyed; it is unlinked now and
      // its Destroy will not touch this list.
      if (TryRef(child)) {
        work.Push(child);
        complete = false;
      }
      child = next;
    }
    node->first_child = nullptr;
    before = node->state.fetch_or(complete ? kCancelledBit | kSubtreeCancelledBit : kCancelledBit,
                                  std::memory_order_release);
    for (auto& record : node->after_funcs) record->linked = false;
    funcs.splice(funcs.end(), node->after_funcs);
    timer = node->timer.load(std::memory_order_relaxed);
  }
  // A timer stopped here can never run, so Destroy need not wait for it; one that could
  // not be stopped is running (or ran) and Destroy's CancelSync waits it out.
  if (timer != 0 && node->Timers().Cancel(timer)) {
    node->timer.compare_exchange_strong(timer, 0, std::memory_order_relaxed);
  }
  if ((before & kWaitersBit) != 0) FutexWakeAll(&node->state);
  return nullptr;
}

// Blocks until `start`, the start of a cancellation, has kSubtreeCancelledBit.
void AwaitCancellation(ContextNode* start) {
  uint32_t s = start->state.load(std::memory_order_acquire);
  while ((s & kSubtreeCancelledBit) == 0) {
    if ((s & kSubtreeWaitersBit) == 0) {
      if (!start->state.compare_exchange_weak(s, s | kSubtreeWaitersBit,
                                              std::memory_order_acquire)) {
        continue;
      }
      s |= kSubtreeWaitersBit;
    }
    FutexWait(&start->state, s, absl::InfiniteDuration());
    s = start->state.load(std::memory_order_acquire);
  }
}

}  // namespace

void AwaitSubtreeCancelled(ContextNode* node) {
  if ((node->state.load(std::memory_order_acquire) & kSubtreeCancelledBit) != 0) return;
  ContextNode* start;
  {
    SpinLockHolder lock(&node->mu);
    start = node->marked_by;
  }
  AwaitCancellation(start);
}

// Two phases. First every node of the subtree is marked, iteratively; a node some other
// cancellation marked first is waited for (that cancellation's start gets
// kSubtreeCancelledBit once its marking is done, never later: waits only go down the
// tree, so they cannot form a cycle). Only then does `start` get kSubtreeCancelledBit and
// leave its registrar's list, and do the AfterFuncs run: a parent's cancel finds `start`
// either in its list (and waits) or gone with its subtree marked, and an AfterFunc may
// wait on any descendant's Done.
void CancelTree(ContextNode* start, const absl::Status* err, const absl::Status& cause) {
  NodeStack work;  // each holds one reference
  AfterFuncList funcs;
  if (ContextNode* other = Mark(start, start, err, cause, work, funcs)) {
    AwaitCancellation(other);  // being cancelled elsewhere: wait for its marking only
    return;
  }
  // (Mark also returns nullptr for a `start` whose subtree another cancellation has
  // marked already: what follows is then a no-op.)
  const bool complete = work.empty();  // Mark set kSubtreeCancelledBit already
  // A last reference is released only once `start` has its subtree bit: freeing a node
  // can run a value's destructor (user code), which may cancel or wait on an ancestor
  // marked by this cancellation, and so wait for that bit. Other references go at once,
  // while the node is still in cache.
  NodeStack last;
  while (!work.empty()) {
    ContextNode* node = work.Pop();
    if (ContextNode* other = Mark(node, start, err, cause, work, funcs)) AwaitCancellation(other);
    if (!UnrefIfNotLast(node)) last.Push(node);
  }
  if (!complete && (start->state.fetch_or(kSubtreeCancelledBit, std::memory_order_release) &
                    kSubtreeWaitersBit) != 0) {
    FutexWakeAll(&start->state);
  }
  Unlink(start);
  while (!last.empty()) Unref(last.Pop());
  RunAfterFuncs(funcs);
}

ContextNode* NewCancellableNode(ContextNode* parent, absl::Time deadline, int32_t refs) {
  // Made before the parent's reference is taken: a std::bad_alloc leaked that reference.
  auto* node = new ContextNode(parent, CancelSource::kOwn, parent->timers, deadline);
  Ref(parent);
  node->refs.store(refs, std::memory_order_relaxed);  // before the node is published
  return node;
}

void Register(ContextNode* node) {
  ContextNode* reg = node->registrar();
  if (reg == nullptr) return;  // the parent can never be cancelled
  const absl::Status* err;
  absl::Status cause;
  {
    SpinLockHolder lock(&reg->mu);
    if ((reg->state.load(std::memory_order_relaxed) & kCancelledBit) == 0) {
      // A node whose deadline fired already stays out: the Unlink of that cancellation
      // comes after this lock (or came before it, and its mark is visible here).
      if ((node->state.load(std::memory_order_relaxed) & kCancelledBit) == 0) {
        node->next_sibling = reg->first_child;
        if (reg->first_child != nullptr) reg->first_child->prev_sibling = node;
        reg->first_child = node;
        node->linked = true;
      }
      return;
    }
    err = reg->err;
    cause = reg->cause;
  }
  CancelTree(node, err, cause);
}

ContextNode* NewCancellableChild(ContextNode* parent, absl::Time deadline, int32_t refs) {
  ContextNode* node = NewCancellableNode(parent, deadline, refs);
  Register(node);
  return node;
}

AfterFuncList NewAfterFunc(absl::AnyInvocable<void()> fn) {
  AfterFuncList one;
  one.push_back(std::make_shared<AfterFuncRecord>(std::move(fn)));
  return one;
}

bool AddAfterFunc(ContextNode* c, AfterFuncList& one) {
  if (c == nullptr) return false;  // never cancelled: never runs
  AfterFuncRecord* const record = one.front().get();
  {
    SpinLockHolder lock(&c->mu);
    if ((c->state.load(std::memory_order_relaxed) & kCancelledBit) == 0) {
      record->it = one.begin();  // still valid once spliced
      c->after_funcs.splice(c->after_funcs.end(), one);
      record->linked = true;
      return true;
    }
  }
  AwaitSubtreeCancelled(c);  // a cancel in progress marks the rest first
  // At once, on this thread, but counted as an AfterFunc run: a cancel inside it nests.
  AtNextAfterFuncDepth([&] { RunAfterFunc(*record); });
  return false;
}

bool StopAfterFunc(AfterFuncRecord& record, ContextNode* owner, bool only_if_linked) {
  auto try_stop = [&record] {
    int expected = AfterFuncRecord::kPending;
    return record.state.compare_exchange_strong(expected, AfterFuncRecord::kStopped,
                                                std::memory_order_acq_rel);
  };
  // The winner of the stop owns fn and frees it now, as a run does, so that a stopped
  // function's captures (which may hold this registration's handle) go even while a
  // handle lives. Freed after the lock: its captures' destructors may reach this node.
  absl::AnyInvocable<void()> doomed_fn;
  if (owner == nullptr) {
    if (only_if_linked || !try_stop()) return false;
    doomed_fn = std::move(record.fn);
    return true;
  }
  std::shared_ptr<AfterFuncRecord> doomed;  // freed after the lock
  SpinLockHolder lock(&owner->mu);
  if (only_if_linked && !record.linked) return false;  // taken by a cancellation: it runs
  if (!try_stop()) return false;
  doomed_fn = std::move(record.fn);
  if (record.linked) {
    doomed = std::move(*record.it);
    owner->after_funcs.erase(record.it);
    record.linked = false;
  }
  return true;
}

void AfterFuncFreedWithNode(ContextNode* node, absl::AnyInvocable<void()> fn) {
  AfterFuncList one = NewAfterFunc(std::move(fn));
  if (node->cancellable()) {  // it frees its own list
    AddAfterFunc(node, one);
    return;
  }
  // A value node's records live on its canceller, and the node keeps a second handle to
  // stop them when it dies. That handle's list node is made before the record is
  // registered: a std::bad_alloc after it left the record on the canceller, alive until
  // the canceller ended.
  AfterFuncList tied{one.front()};
  if (!AddAfterFunc(node->canceller, one)) return;
  SpinLockHolder lock(&node->mu);
  node->after_funcs.splice(node->after_funcs.end(), tied);
}

CancelFunc MakeCancelFunc(ContextNode* node) { return CancelFunc(node); }

ContextNode* NodeOf(const Context& ctx) { return ctx.node(); }
Context AdoptNode(ContextNode* node) { return Context(node); }

Context WithValueErased(const Context& parent, const void* key, std::shared_ptr<const void> value) {
  ContextNode* p = NodeOf(parent);
  // Made before the parent's reference is taken: a std::bad_alloc leaked that reference.
  auto* node = new ContextNode(p, CancelSource::kInherit, p->timers, p->deadline);
  Ref(p);
  node->value_key = key;
  node->value = std::move(value);
  return AdoptNode(node);
}

}  // namespace internal

using internal::CancelSource;
using internal::ContextNode;

// ---- Context ----

Context::Context() : Context(Background()) {}

Context::Context(ContextNode* node) : node_(node), word_(internal::WordOf(node)) {}

Context::Context(const Context& other) : node_(other.node_), word_(other.word_) {
  if (node_ != nullptr) internal::Ref(node_);
}

Context::Context(Context&& other) noexcept : node_(other.node_), word_(other.word_) {
  other.node_ = nullptr;
  other.word_ = &internal::kNeverCancelledWord;
}

// Both assignments take the new reference (and read `other`) before they drop the old
// one, which may free the node and with it `other` itself (a context stored as a value of
// the context it replaces: ctx = ctx.Value(k)->ctx), or run user code (value destructors,
// AfterFunc captures) that reads this handle: it then sees the new context, whole.
Context& Context::operator=(const Context& other) {
  Context copy(other);
  std::swap(node_, copy.node_);
  std::swap(word_, copy.word_);
  return *this;  // `copy` drops the old reference
}

Context& Context::operator=(Context&& other) noexcept {
  if (this != &other) {
    Context taken(std::move(other));
    std::swap(node_, taken.node_);
    std::swap(word_, taken.word_);
  }
  return *this;
}

Context::~Context() {
  if (node_ != nullptr) internal::Unref(node_);
}

ContextNode* Context::node() const {
  KWQ_DCHECK(node_ != nullptr, "use of a moved-from kwq::Context");
  return node_ != nullptr ? node_ : internal::BackgroundNode();
}

absl::Status Context::CancelledErr() const {
  ContextNode* c = node()->canceller;
  internal::SpinLockHolder lock(&c->mu);
  return *c->err;
}

absl::Status Context::CancelledCause() const {
  ContextNode* c = node()->canceller;
  internal::SpinLockHolder lock(&c->mu);
  return c->cause.ok() ? *c->err : c->cause;
}

absl::Time Context::Deadline() const { return node()->deadline; }

DoneSignal Context::Done() const {
  // Once a context's cancellation is over (its canceller's subtree marked: a leaf at its
  // cancel, the start of a cancellation when it has marked everything), its signal can
  // never change, and every DoneSignal operation on it does what it does on the shared
  // fired node: return at once, or run an OnDone function at once (AfterFunc would not
  // wait for anything either). So no reference to this context is taken: two atomic
  // read-modify-writes per signal (waiting on a million cancelled children took 44.5 ms
  // with them and 40.0 without, docs/benchmarks.md).
  const ContextNode* c = node()->canceller;
  if (c != nullptr &&
      (c->state.load(std::memory_order_acquire) & internal::kSubtreeCancelledBit) != 0) {
    return DoneSignal(internal::AdoptNode(internal::FiredNode()));
  }
  return DoneSignal(*this);
}

TimerService& Context::timers() const { return node()->Timers(); }

const void* Context::FindValue(const void* key) const {
  for (const ContextNode* n = node(); n != nullptr; n = n->parent) {
    if (n->value_key == key) return n->value.get();
  }
  return nullptr;
}

// ---- DoneSignal ----

namespace {
// WaitFor's timeouts are real time on the monotonic clock: absl::Now() (the wall clock)
// would stretch a wait by a step of the system time back, or cut it by one forward.
absl::Time MonotonicNow() { return RealClock::Default()->Now(); }
}  // namespace

bool DoneSignal::WaitFor(absl::Duration timeout) const {
  ContextNode* c = ctx_.node()->canceller;
  if (c == nullptr) {
    // Never done: sleep out the timeout on a word nobody changes.
    if (timeout == absl::InfiniteDuration()) {
      for (;;) internal::FutexWait(&internal::kNeverCancelledWord, 0, absl::Hours(24));
    }
    const absl::Time end = MonotonicNow() + timeout;
    for (absl::Duration left = timeout; left > absl::ZeroDuration(); left = end - MonotonicNow()) {
      internal::FutexWait(&internal::kNeverCancelledWord, 0, left);
    }
    return false;
  }
  const absl::Time end =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : MonotonicNow() + timeout;
  uint32_t s = c->state.load(std::memory_order_acquire);
  while ((s & internal::kCancelledBit) == 0) {
    // The time left first: a wait with none left (a poll, WaitFor(0)) sets no waiters
    // bit, which would cost the cancel a wake-up call for nobody.
    const absl::Duration left =
        end == absl::InfiniteFuture() ? absl::InfiniteDuration() : end - MonotonicNow();
    if (left <= absl::ZeroDuration()) return false;
    if ((s & internal::kWaitersBit) == 0) {
      if (!c->state.compare_exchange_weak(s, s | internal::kWaitersBit,
                                          std::memory_order_acquire)) {
        continue;
      }
      s |= internal::kWaitersBit;
    }
    internal::FutexWait(&c->state, s, left);
    s = c->state.load(std::memory_order_acquire);
  }
  return true;
}

AfterFuncHandle DoneSignal::OnDone(absl::AnyInvocable<void()> fn) const {
  return AfterFunc(ctx_, std::move(fn));
}

// ---- CancelFunc ----

void CancelFunc::operator()(absl::Status cause) const {
  ContextNode* node = ctx_.node();
  if (!node->cancellable()) return;  // default-constructed CancelFunc: Background
  // Done when the whole subtree is marked; a cancel in progress elsewhere is waited for.
  if ((node->state.load(std::memory_order_acquire) & internal::kSubtreeCancelledBit) != 0) return;
  internal::CancelTree(node, &internal::CanceledError(), cause);
}

// ---- AfterFunc ----

bool AfterFuncHandle::Stop() const {
  if (record_ == nullptr) return false;
  return internal::StopAfterFunc(*record_, internal::NodeOf(owner_)->canceller,
                                 /*only_if_linked=*/false);
}

AfterFuncHandle AfterFunc(const Context& ctx, absl::AnyInvocable<void()> fn) {
  if (!fn) fn = [] {};  // an empty callable runs nothing (it was called, at address 0)
  internal::AfterFuncList one = internal::NewAfterFunc(std::move(fn));
  std::shared_ptr<internal::AfterFuncRecord> record = one.front();
  internal::AddAfterFunc(internal::NodeOf(ctx)->canceller, one);
  return AfterFuncHandle(std::move(record), ctx);
}

// ---- constructors of contexts ----

Context Background() {
  ContextNode* node = internal::BackgroundNode();
  return internal::AdoptNode(node);  // immortal: no reference counted
}

Context BackgroundWithTimers(TimerService* timers) {
  return internal::AdoptNode(
      new ContextNode(nullptr, internal::CancelSource::kNone, timers, absl::InfiniteFuture()));
}

CancelableContext WithCancel(const Context& parent) {
  ContextNode* p = internal::NodeOf(parent);
  // Two references: one for the context, one for the cancel function.
  ContextNode* node = internal::NewCancellableChild(p, p->deadline, /*refs=*/2);
  // Both handles built in place in the caller's result: no handle is moved, so none is
  // read back right after its stores (a store-forwarding stall of a few ns).
  return {internal::AdoptNode(node), internal::MakeCancelFunc(node)};
}

CancelableContext WithCancelCause(const Context& parent) { return WithCancel(parent); }

namespace {

// A deadline's timer callback (a plain function: no callable to store or move per
// timer). `arg` is the node.
void DeadlineFired(void* arg) {
  auto* node = static_cast<ContextNode*>(arg);
  if (!internal::TryRef(node)) return;
  internal::CancelTree(node, &internal::DeadlineError(), node->deadline_cause);
  internal::Unref(node);
}

// WithDeadline with `past` (the deadline is not in the future) decided by the caller:
// WithTimeout decides it from the timeout, one clock read in all.
CancelableContext WithDeadlineAt(const Context& parent, absl::Time deadline, bool past,
                                 absl::Status cause) {
  ContextNode* p = internal::NodeOf(parent);
  // A deadline not in the future cancels at once, even when the parent's is earlier (it
  // may have passed with its timer still to run). Otherwise a parent's deadline that is
  // not later serves the child too, with no timer of its own.
  if (!past && deadline >= p->deadline) return WithCancel(parent);
  // Two references: one for the context, one for the cancel function.
  ContextNode* node = internal::NewCancellableNode(p, std::min(deadline, p->deadline), /*refs=*/2);
  node->deadline_cause = std::move(cause);  // before anyone can fire; OK = DeadlineError
  if (!past) {
    // Armed before the node is published, so that a parent's cancel always finds the id
    // and stops the timer. The callback holds no reference (the node may die first);
    // Destroy cancels the timer with CancelSync, so `node` is valid whenever it runs.
    TimerId timer;
    try {
      timer = node->Timers().Schedule(deadline, &DeadlineFired, node);
    } catch (...) {  // std::bad_alloc: undo NewCancellableNode (it leaked the node and
      delete node;   // the parent's reference); nothing has seen the node yet
      internal::Unref(p);
      throw;
    }
    node->timer.store(timer, std::memory_order_relaxed);
  }
  // The node holds the handles' two references already, so it may be published (and
  // cancelled) before they exist. They are built in place in the caller's result, so
  // none is moved and read back right after its stores (a store-forwarding stall).
  internal::Register(node);
  if (past) internal::CancelTree(node, &internal::DeadlineError(), node->deadline_cause);
  return {internal::AdoptNode(node), internal::MakeCancelFunc(node)};
}

}  // namespace

CancelableContext WithDeadline(const Context& parent, absl::Time deadline, absl::Status cause) {
  // InfiniteFuture is no deadline, also on a clock that reads InfiniteFuture (a FakeClock
  // advanced by InfiniteDuration()).
  const bool past = deadline != absl::InfiniteFuture() && deadline <= parent.timers().clock().Now();
  return WithDeadlineAt(parent, deadline, past, std::move(cause));
}

CancelableContext WithTimeout(const Context& parent, absl::Duration timeout, absl::Status cause) {
  const absl::Time now = parent.timers().clock().Now();
  // Decided by the timeout itself: a non-positive one has passed even on a clock that
  // reads InfiniteFuture (where now + timeout saturates to it), and a positive one that
  // saturates is no deadline.
  return WithDeadlineAt(parent, now + timeout, timeout <= absl::ZeroDuration(), std::move(cause));
}

Context WithoutCancel(const Context& parent) {
  ContextNode* p = internal::NodeOf(parent);
  // Made before the parent's reference is taken, as in WithValue.
  auto* node = new ContextNode(p, internal::CancelSource::kNone, p->timers, absl::InfiniteFuture());
  internal::Ref(p);
  return internal::AdoptNode(node);
}

}  // namespace kwq
