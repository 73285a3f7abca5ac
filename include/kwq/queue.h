// File: kwq/queue.h
//
// Queue<T>: client-go's deduplicating work queue (workqueue.Typed), for C++.
//
//   kwq::Queue<std::string> q;
//   q.Add("default/web");                  // producers
//   while (auto item = q.Get()) {          // workers; blocks until ready or shut down
//     Reconcile(**item);
//   }                                      // the lease's destructor calls Done
//
// Promises (pinned by tests/queue_test.cc):
//   - An item waiting to be processed is queued once, however often it is added.
//   - An item is never handed to two workers at once. An item added while it is being
//     processed is queued again when its Done comes (so a change made during processing
//     is never lost).
//   - Items are handed out in the order they became ready (FIFO).
//   - Get blocks until an item is ready or the queue is shut down and empty. After
//     ShutDown, Add is ignored and Get keeps returning queued items until none are left.
//   - ShutDownWithDrain waits until every queued and in-flight item is Done (client-go
//     waits only for in-flight ones), waking every blocked Get; a ShutDown() from another
//     thread ends the wait early.
//   - Get returns a move-only Lease whose destructor calls Done, so a forgotten Done
//     cannot hang a drain.
//   - Each key is stored once: the three sets of client-go (queue, dirty, processing) are
//     state bits beside one copy of the key (see kwq/internal/key_table.h).
//
// Thread safety: every member may be called from any thread. One mutex guards the queue;
// Get blocks on a condition variable. A Lease must not outlive its queue.

#ifndef KWQ_QUEUE_H_
#define KWQ_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/hash/hash.h"
#include "kwq/clock.h"
#include "kwq/context.h"
#include "kwq/internal/check.h"
#include "kwq/internal/key_table.h"
#include "kwq/internal/lease.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/queue_metrics.h"
#include "kwq/internal/slot_fifo.h"
#include "kwq/internal/spin.h"
#include "kwq/metrics.h"
#include "kwq/timer.h"

namespace kwq {

// Options shared by every queue type.
struct QueueOptions {
  // Names the queue in metrics.
  std::string name;
  // nullptr (default): no metrics, no cost. Must outlive the queue.
  MetricsProvider* metrics = nullptr;
  // Time source for metrics and (delaying queues) for delays. nullptr: RealClock.
  Clock* clock = nullptr;
  // Timer service for delays and metric refreshes. nullptr: TimerService::Default().
  // For a FakeClock, pass a TimerService built on that clock.
  TimerService* timers = nullptr;
};

template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class Queue {
 public:
  using Options = QueueOptions;

  // The right to process one item (kwq/internal/lease.h): move-only; item(), *, ->,
  // priority(), Done() (idempotent, also run by the destructor), active().
  using Lease = internal::Lease<Queue, T>;
  friend Lease;  // calls Finish

  Queue() : Queue(Options{}) {}
  explicit Queue(Options options) : options_(std::move(options)) {
    if (options_.metrics != nullptr) {
      metrics_ = std::make_unique<internal::QueueMetricsRecorder>(
          options_.metrics, options_.name, options_.clock, options_.timers, &mu_);
    }
  }
  // Shuts the queue down. Leases must have ended (a debug assertion checks it).
  ~Queue() {
    ShutDown();
    metrics_.reset();
    internal::MutexLock lock(&mu_);
    KWQ_DCHECK(in_flight_ == 0, "kwq::Queue destroyed while a Lease is active");
  }
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // Queues `item` unless it is already waiting. Returns true when this call queued it
  // (or marked an item in flight to run again after its Done); false when it was
  // already waiting or the queue is shutting down. Never blocks on workers.
  template <typename K>
  bool Add(K&& item) {
    const uint32_t hash = Table::HashOf(item);  // outside the lock
    bool wake;
    {
      internal::MutexLock lock(&mu_);
      if (!AddLocked(std::forward<K>(item), hash)) return false;
      wake = NeedWakeLocked();
    }
    if (wake) ready_cv_.Signal();
    return true;
  }

  // Adds every item of `items` under one lock acquisition. Returns how many were queued.
  // Items of an rvalue range are moved in.
  template <typename Range>
  size_t AddAll(Range&& items) {
    constexpr bool kMove = !std::is_lvalue_reference_v<Range>;
    size_t added = 0;
    bool wake;
    {
      internal::MutexLock lock(&mu_);
      for (auto& item : items) {
        const uint32_t hash = Table::HashOf(item);
        if constexpr (kMove) {
          added += AddLocked(std::move(item), hash);
        } else {
          added += AddLocked(item, hash);
        }
      }
      wake = added > 0 && waiters_ > signaled_;
      if (wake) signaled_ = waiters_;
    }
    if (wake) ready_cv_.SignalAll();
    return added;
  }

  // Blocks until an item is ready and returns its lease, or returns nullopt once the
  // queue is shut down and empty.
  std::optional<Lease> Get() {
    internal::MutexLock lock(&mu_);
    if (ready_.empty() && !shutting_down_) SpinLocked();
    while (ready_.empty()) {
      if (shutting_down_) return std::nullopt;
      WaitLocked();
    }
    return PopLocked();
  }

  // Returns a ready item's lease, or nullopt at once when none is ready.
  std::optional<Lease> TryGet() {
    internal::MutexLock lock(&mu_);
    if (ready_.empty()) return std::nullopt;
    return PopLocked();
  }

  // Like Get, and also returns nullopt when `ctx` is done (check ctx.IsCancelled() to
  // tell). Registers a wake-up on `ctx` only when it has to block.
  std::optional<Lease> Get(const Context& ctx) {
    {
      internal::MutexLock lock(&mu_);
      if (!ready_.empty()) return PopLocked();
      if (shutting_down_ || ctx.IsCancelled()) return std::nullopt;
    }
    Waker waker{this};
    AfterFuncHandle handle = AfterFunc(ctx, [&waker] { waker.Wake(); });
    std::optional<Lease> lease;
    {
      internal::MutexLock lock(&mu_);
      while (ready_.empty() && !shutting_down_ && !ctx.IsCancelled()) WaitLocked();
      if (!ready_.empty()) lease.emplace(PopLocked());
    }
    // The waker touches this queue: make sure it is not running when we return.
    if (!handle.Stop()) {
      while (!waker.finished.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    return lease;
  }

  // Items ready to be handed out.
  size_t Len() const {
    internal::MutexLock lock(&mu_);
    return ready_.size();
  }
  // Items waiting to run: ready ones plus in-flight ones added again (client-go's depth).
  size_t Depth() const {
    internal::MutexLock lock(&mu_);
    return dirty_;
  }
  // Leases not yet ended.
  size_t InFlight() const {
    internal::MutexLock lock(&mu_);
    return in_flight_;
  }

  // Stops accepting adds and wakes every blocked Get. Items already queued are still
  // handed out. Ends a ShutDownWithDrain wait in progress. Idempotent.
  void ShutDown() {
    {
      internal::MutexLock lock(&mu_);
      shutting_down_ = true;
      if (draining_ > 0) drain_aborted_ = true;
    }
    ready_cv_.SignalAll();
    drained_cv_.SignalAll();
  }

  // ShutDown, then blocks until every queued and in-flight item is Done. Returns true
  // when the queue drained, false when a ShutDown() from another thread ended the wait.
  // Workers must keep calling Get to drain queued items.
  bool ShutDownWithDrain() {
    internal::MutexLock lock(&mu_);
    shutting_down_ = true;
    if (draining_ == 0) drain_aborted_ = false;
    ++draining_;
    ready_cv_.SignalAll();
    while (dirty_ + in_flight_ > 0 && !drain_aborted_) drained_cv_.Wait(&mu_);
    --draining_;
    return dirty_ + in_flight_ == 0;
  }

  bool ShuttingDown() const {
    internal::MutexLock lock(&mu_);
    return shutting_down_;
  }

  // The metrics recorder, or nullptr without a MetricsProvider. For the queue types
  // built on Queue (their OnRetry/OnDelayed calls need no lock).
  internal::QueueMetricsRecorder* metrics_recorder() { return metrics_.get(); }

 private:
  static constexpr uint8_t kDirty = 1;       // waiting to run (queued, or re-added)
  static constexpr uint8_t kProcessing = 2;  // a lease is active
  static constexpr uint8_t kIdleListed = 4;  // the slot is in idle_ (it may be busy again)
  // Keys done and not re-added stay in the table, idle, until more than this many are
  // idle: a hot key that cycles through Add/Get/Done is then not copied, hashed into the
  // index and freed on every cycle. Older idle keys are erased first.
  static constexpr size_t kMaxIdle = 4096;

  // Wakes a Get(ctx) blocked on this queue when the context is cancelled.
  struct Waker {
    Queue* queue;
    std::atomic<bool> finished{false};
    void Wake() {
      { internal::MutexLock lock(&queue->mu_); }
      queue->ready_cv_.SignalAll();
      finished.store(true, std::memory_order_release);
    }
  };

  // Before a Get sleeps, it polls (without the lock) for a while: a producer usually adds
  // the next item soon, and catching it here saves both the worker's sleep and the
  // producer's futex wake-up.
  void SpinLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.Unlock();
    internal::PollWhileZero(ready_hint_);
    mu_.Lock();
  }

  // Blocks one Get on ready_cv_. Each Signal wakes exactly one blocked waiter, which
  // then consumes one unit of signaled_.
  void WaitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++waiters_;
    ready_cv_.Wait(&mu_);
    --waiters_;
    if (signaled_ > 0) --signaled_;
  }

  // Whether a newly ready item needs a Signal: only when more Gets are blocked than have
  // been signalled and not yet woken. A producer adding items faster than workers wake
  // then makes one futex call per sleeping worker, not one per item.
  bool NeedWakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiters_ <= signaled_) return false;
    ++signaled_;
    return true;
  }

  template <typename K>
  bool AddLocked(K&& item, uint32_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) return false;
    uint32_t slot = table_.Find(item, hash);
    if (slot == Table::kNone) {
      slot = table_.Insert(std::forward<K>(item), hash, kDirty);
      ready_.push_back(slot);
      ready_hint_.store(ready_.size(), std::memory_order_relaxed);
    } else {
      uint8_t& state = table_.state(slot);
      if (state & kDirty) return false;  // already waiting
      state |= kDirty;
      if (!(state & kProcessing)) {  // idle: queue it now (in flight: Finish queues it)
        ready_.push_back(slot);
        ready_hint_.store(ready_.size(), std::memory_order_relaxed);
      }
    }
    ++dirty_;
    if (metrics_) metrics_->OnAdd(slot);
    return true;
  }

  Lease PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t slot = ready_.front();
    ready_.pop_front();
    ready_hint_.store(ready_.size(), std::memory_order_relaxed);
    table_.state(slot) = static_cast<uint8_t>((table_.state(slot) & ~kDirty) | kProcessing);
    --dirty_;
    ++in_flight_;
    if (metrics_) metrics_->OnGet(slot);
    return Lease(this, slot, &table_.item(slot));
  }

  // Lists a slot that just went idle and erases the oldest idle keys beyond kMaxIdle.
  void KeepIdleLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint8_t& state = table_.state(slot);
    if (!(state & kIdleListed)) {
      state |= kIdleListed;
      idle_.push_back(slot);
    }
    while (idle_.size() > kMaxIdle) {
      const uint32_t old = idle_.front();
      idle_.pop_front();
      uint8_t& old_state = table_.state(old);
      old_state &= ~kIdleListed;
      if (!(old_state & (kDirty | kProcessing))) table_.Erase(old);
    }
  }

  void Finish(uint32_t slot) {
    bool wake_getter = false;
    {
      internal::MutexLock lock(&mu_);
      uint8_t& state = table_.state(slot);
      state &= ~kProcessing;
      --in_flight_;
      if (metrics_) metrics_->OnDone(slot);
      if (state & kDirty) {
        ready_.push_back(slot);
        ready_hint_.store(ready_.size(), std::memory_order_relaxed);
        wake_getter = NeedWakeLocked();
      } else {
        KeepIdleLocked(slot);
        // Under the lock: a drainer that returns may destroy the queue at once.
        if (draining_ > 0 && dirty_ + in_flight_ == 0) drained_cv_.SignalAll();
      }
    }
    if (wake_getter) ready_cv_.Signal();
  }

  using Table = internal::KeyTable<T, Hash, Eq>;

  const Options options_;
  mutable internal::Mutex mu_;
  internal::CondVar ready_cv_;    // an item became ready, or shutdown
  internal::CondVar drained_cv_;  // the table emptied while draining, or abort
  Table table_ ABSL_GUARDED_BY(mu_);
  internal::SlotFifo ready_ ABSL_GUARDED_BY(mu_);   // slots in hand-out order
  std::deque<uint32_t> idle_ ABSL_GUARDED_BY(mu_);  // kIdleListed slots, oldest first
  // ready_.size(), readable without the lock (relaxed: only a hint for SpinLocked).
  std::atomic<size_t> ready_hint_{0};
  size_t dirty_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;   // Gets blocked on ready_cv_
  int signaled_ ABSL_GUARDED_BY(mu_) = 0;  // Signals sent that no waiter consumed yet
  int draining_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_aborted_ ABSL_GUARDED_BY(mu_) = false;
  // Set at construction; its methods are called with mu_ held.
  std::unique_ptr<internal::QueueMetricsRecorder> metrics_;
};

}  // namespace kwq

#endif  // KWQ_QUEUE_H_
