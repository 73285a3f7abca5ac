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
//     ShutDown, Add is ignored and Get keeps returning queued items until none are left;
//     during a ShutDownWithDrain it waits also for runs owed by leases still in flight
//     (items added again while they ran, queued at their Done, which may come from
//     another thread).
//   - ShutDownWithDrain waits until every queued and in-flight item is Done (client-go
//     waits only for in-flight ones), waking every blocked Get; a ShutDown() from another
//     thread ends the wait early.
//   - Get returns a move-only Lease whose destructor calls Done, so a forgotten Done
//     cannot hang a drain.
//   - Each key is stored once: the three sets of client-go (queue, dirty, processing) are
//     state bits beside one copy of the key (see kwq/internal/key_table.h), and so are a
//     DelayingQueue's waiting items and a RateLimitingQueue's failure counts.
//
// Thread safety: every member may be called from any thread. A Lease must not outlive its
// queue, and no call may be in progress when it is destroyed: after ShutDownWithDrain
// returns true the queue may be destroyed once every other ShutDownWithDrain call and
// every Get has returned (workers blocked in Get are woken and return nullopt). Producers and
// workers do not share a lock on the common path (docs/design.md has the protocol and the
// measurements): Add takes the table lock (key index, pushing end of the ready order); Get takes
// the outbox lock and receives ready items from the table lock's holder through a lock-free
// single-producer single-consumer ring (kwq/internal/slot_ring.h), falling back to a list under the
// table lock when the ring is full. Each key's state bits are atomic, so Done takes no lock unless
// the item must run again, a drain is waiting or metrics are on. An idle Get polls for a while
// before it sleeps on a condition variable; one Get at a time polls at length (by default;
// QueueOptions::polling_workers), and while one polls, workers rather than the producer wake
// sleepers.

#ifndef KWQ_QUEUE_H_
#define KWQ_QUEUE_H_

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/cleanup/cleanup.h"
#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "kwq/clock.h"
#include "kwq/context.h"
#include "kwq/internal/check.h"
#include "kwq/internal/context_wake.h"
#include "kwq/internal/failure_counts.h"
#include "kwq/internal/fence.h"
#include "kwq/internal/hand_out_record.h"
#include "kwq/internal/indexed_heap.h"
#include "kwq/internal/key_table.h"
#include "kwq/internal/lease.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/queue_metrics.h"
#include "kwq/internal/range_items.h"
#include "kwq/internal/slot_fifo.h"
#include "kwq/internal/slot_ring.h"
#include "kwq/internal/spin.h"
#include "kwq/internal/test_hooks.h"
#include "kwq/metrics.h"
#include "kwq/timer.h"

namespace kwq {

// Options shared by every queue type.
struct QueueOptions {
  // Names the queue in metrics.
  std::string name = {};
  // nullptr (default): no metrics, no cost. Must outlive the queue.
  MetricsProvider* metrics = nullptr;
  // Time source for metrics and (delaying queues) for delays. nullptr: RealClock. Must
  // outlive the queue.
  Clock* clock = nullptr;
  // Timer service for delays and metric refreshes; must run on `clock`. nullptr:
  // TimerService::Default(), or for a DelayingQueue, RateLimitingQueue or PriorityQueue on
  // a manual clock (FakeClock), a service of the queue's own on that clock, which has no
  // thread (should it fail to start, because the clock refuses observers, a
  // DelayingQueue's constructor says so on stderr and uses the default one; the Create of
  // each of the three returns the error). A clock of your own that is not manual needs a service
  // built on it (one service per clock, not per queue: a real-time service runs a thread). The
  // Create of PriorityQueue, DelayingQueue and RateLimitingQueue refuses a service on another clock
  // (InvalidArgument); a DelayingQueue or RateLimitingQueue built by its constructor says
  // so on stderr and makes a service of its own on its clock. A plain Queue's metric
  // refreshes on a FakeClock need one built on that clock.
  TimerService* timers = nullptr;
  // How many idle Gets may poll at length (about half a millisecond) before they sleep;
  // the others poll briefly, sleep, and are woken when items pile up (by the producer
  // when no Get polls, else by a worker that takes an item while more are ready).
  // 0 (default) means 1; values above 1024 count as 1024, negative ones as 0. More
  // pollers can save a producer that outpaces one worker its futex wake-ups, at the price
  // of CPU time spent polling; on 16 CPUs the measured effect was mixed
  // (docs/benchmarks.md, scaling), and on 2 CPUs a second poller mostly takes CPU time
  // from the producer.
  int polling_workers = 0;
};

namespace internal {
struct QueuePeer;  // tests' access to internal state (wake-ups, stored keys)

// The timer service a delaying queue makes for itself (QueueOptions::timers): one on
// `clock` when `given` is null and `clock` is manual (such a service has no thread), else
// null (use `given`, or TimerService::Default()). Errors are TimerService::Create's.
inline absl::StatusOr<std::unique_ptr<TimerService>> OwnTimerService(Clock* clock,
                                                                     TimerService* given) {
  if (given != nullptr || !clock->is_manual()) return std::unique_ptr<TimerService>();
  return TimerService::Create({.clock = clock});
}

// OK when delays of a queue on `clock` can run on `timers` (null: TimerService::Default(),
// which runs on RealClock::Default()); else InvalidArgument naming `who`: a timer armed on
// another clock's service comes due by that clock, never by the queue's (a Get asleep for
// a delayed item slept for ever).
inline absl::Status CheckTimersClock(const char* who, Clock* clock, TimerService* timers) {
  Clock* const timer_clock = timers != nullptr ? &timers->clock() : RealClock::Default();
  if (timer_clock == clock) return absl::OkStatus();
  return absl::InvalidArgumentError(
      std::string(who) +
      ": options.timers must run on options.clock (a clock of your own that is not manual "
      "needs a timer service built on it)");
}
}  // namespace internal

template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class Queue {
 public:
  using Options = QueueOptions;

  // The right to process one item (kwq/internal/lease.h): move-only; item(), *, ->,
  // priority(), Done() (idempotent, also run by the destructor), active().
  using Lease = internal::Lease<Queue, T>;
  friend Lease;  // calls Finish
  template <typename, typename, typename>
  friend class DelayingQueue;  // calls GetPromoting, AddHashed, EvictBackstopLocked
  template <typename, typename, typename>
  friend class ShardedQueue;  // uses Table::HashOf; calls AddHashed, AddEntries, StopAdds,
                              // DrainUntil, ReadyHint, GetPromoting, WakeAllSleepers,
                              // OwesRuns, SetReadyHook
  friend struct internal::QueuePeer;

  // Refuses no option (polling_workers is clamped: QueueOptions); only an allocation,
  // the MetricsProvider's New* calls or, with metrics, the clock's Now (the recorder's
  // refresh timer is scheduled on it) can throw.
  Queue() : Queue(Options{}) {}
  explicit Queue(Options options)
      : options_(std::move(options)), max_pollers_(internal::MaxPollers(options_.polling_workers)) {
    metrics_ = internal::QueueMetricsRecorder::Make(options_.metrics, options_.name, options_.clock,
                                                    options_.timers);
  }
  // Shuts the queue down. Leases must have ended: a check fails loudly otherwise, in
  // every build (the lease's Done would touch the freed queue).
  ~Queue() {
    ShutDown();
    metrics_.reset();
    KWQ_CHECK(InFlight() == 0, "kwq::Queue destroyed while a Lease is active");
  }
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // Queues `item` unless it is already waiting. Returns true when this call queued it
  // (or marked an item in flight to run again after its Done); false when it was
  // already waiting or the queue is shutting down. Never blocks on workers. Writes made
  // before an Add (whatever it returns) are visible to the processing that follows it.
  template <typename K>
  bool Add(K&& item) {
    const uint32_t hash = Table::HashOf(item);  // outside the lock
    return AddHashed(std::forward<K>(item), hash);
  }

  // Adds every item of `items` under one acquisition of the table lock, in the range's
  // order, each as Add would. Returns how many were queued (0 once the queue is shutting
  // down). The lock is held for the whole range, hashing included: Adds, and Gets that
  // need the table lock (to sleep, or to take the overflow list), wait for it. An item
  // whose copy or hash throws ends the batch: the items before it stay queued, and the
  // exception goes on. Items of an rvalue container that owns them (one with an
  // allocator, a std::array, a built-in array), or of a range that yields rvalues (a
  // transform), are moved in; those of an lvalue, of a view (a span, a filter) or of any
  // other range (absl::Span) stay the caller's and are copied
  // (kwq/internal/range_items.h).
  template <typename Range>
  size_t AddAll(Range&& items) {
    constexpr bool kMove = internal::MovesItems<Range>();
    return AddBatch([&](size_t* added) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (auto&& item : items) {
        const uint32_t hash = Table::HashOf(item);
        if constexpr (kMove) {
          AddOneLocked(std::move(item), hash, added);
        } else {
          AddOneLocked(item, hash, added);
        }
      }
    });
  }

  // Blocks until an item is ready and returns its lease, or returns nullopt once the
  // queue is shut down and empty (during a drain: also none owed a run by a lease in
  // flight).
  std::optional<Lease> Get() {
    for (bool spun = false;; spun = true) {
      if (std::optional<Lease> lease = TryGet()) return lease;
      if (!spun) {
        Spin([] { return false; });
        continue;
      }
      if (!WaitForReady(nullptr)) return std::nullopt;
    }
  }

  // Returns a ready item's lease, or nullopt at once when none is ready.
  std::optional<Lease> TryGet() {
    std::optional<Lease> lease;
    int64_t taken;
    {
      internal::MutexLock lock(&out_mu_);
      uint32_t slot;
      if (!NextSlotLocked(&slot)) return std::nullopt;
      lease.emplace(HandOutLocked(slot));
      taken = taken_.load(std::memory_order_relaxed);
      if (hint_next_) PublishNextHashLocked();
    }
    // More items ready and a Get asleep: wake it here, since a producer does not while a
    // Get polls (NeedWakeLocked). Only hints are read unless both hold; seq_cst loads, see
    // NeedWakeLocked, case 2.
    if (sleepers_hint_.load(std::memory_order_seq_cst) > 0 && ReadyHintSeqCst() > 0) {
      WakeSleeper();
    }
    if (taken % kEvictBatch == 0) EvictFromWorker();
    return lease;
  }

  // Like Get, and also returns nullopt when `ctx` is done (check ctx.IsCancelled() to
  // tell); a ready item wins over a done context. Polls like Get before it sleeps (the
  // polling ends when ctx is done), and registers a wake-up on `ctx` only when it has to
  // sleep. Does not throw when that registration cannot allocate: it then sleeps in
  // steps of a millisecond and looks at `ctx` after each.
  std::optional<Lease> Get(const Context& ctx) {
    return GetPromoting(
        &ctx, [] { return false; }, [](bool) { return false; });
  }

  // Items ready to be handed out.
  size_t Len() const {
    internal::MutexLock out_lock(&out_mu_);
    internal::MutexLock lock(&mu_);
    return outbox_.size() + ring_.SizeHint() + overflow_.size();
  }
  // Items waiting to run: ready ones plus in-flight ones added again (client-go's depth).
  size_t Depth() const {
    internal::MutexLock out_lock(&out_mu_);
    internal::MutexLock lock(&mu_);
    return static_cast<size_t>(added_.load(std::memory_order_relaxed) -
                               taken_.load(std::memory_order_relaxed));
  }
  // Leases not yet ended.
  size_t InFlight() const {
    internal::MutexLock lock(&out_mu_);
    return static_cast<size_t>(taken_.load(std::memory_order_relaxed) - Finished());
  }

  // Stops accepting adds and wakes every blocked Get. Items already queued are still
  // handed out. Ends a ShutDownWithDrain wait in progress. Idempotent.
  void ShutDown() {
    // Signalled under mu_: a drainer that then returns may destroy the queue at once.
    internal::MutexLock lock(&mu_);
    shutting_down_ = true;
    ++aborts_;
    ready_cv_.SignalAll();
    drained_cv_.SignalAll();
  }

  // ShutDown, then blocks until every queued and in-flight item is Done. Returns true
  // when the queue drained, false when a ShutDown() from another thread ended the wait.
  // Workers must keep calling Get to drain queued items. A thread that holds a Lease of
  // this queue must not call it: it would wait for its own lease until a ShutDown().
  bool ShutDownWithDrain() { return DrainUntil(nullptr, 0, nullptr); }

  // ShutDownWithDrain bounded by `ctx`: the wait also ends, returning false, once `ctx` is
  // done (a deadline bounds a graceful shutdown). True when the queue drained, also when
  // `ctx` was done at the call but nothing was queued or in flight. A wait that ends
  // undrained leaves the queue shut down: adds refused, queued items still handed out,
  // and, unless another drain is still in progress (a context ends only its own drain,
  // a ShutDown() every one), Gets no longer wait for runs owed by leases in flight.
  // Leases still in flight end as usual, and must end before the queue is destroyed
  // (join the workers first; they still get what is queued). Throws std::bad_alloc,
  // before anything changes, when the wake-up on `ctx` cannot be registered.
  bool ShutDownWithDrain(const Context& ctx) { return DrainUntil(nullptr, 0, &ctx); }

  // True from the first ShutDown or ShutDownWithDrain on; never false again.
  bool ShuttingDown() const {
    internal::MutexLock lock(&mu_);
    return shutting_down_;
  }

 private:
  // Counts one retry in the `retries` metric unless the queue is shut down (client-go's
  // AddAfter); nothing without a MetricsProvider. For DelayingQueue.
  void RecordRetryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (metrics_ && !shutting_down_) metrics_->OnRetry();
  }

  using Table = internal::KeyTable<T, Hash, Eq>;

  // Per-slot state bits (atomic, see State()). Only holders of mu_ set kDirty (an add, a
  // due item's promotion); Get turns kDirty into kProcessing and Done clears kProcessing.
  static constexpr uint8_t kDirty = 1;       // waiting to run (queued, or re-added)
  static constexpr uint8_t kProcessing = 2;  // a lease is active
  // Waiting for a delay (DelayingQueue): the slot is in waiting_. Set and cleared only
  // under mu_. Never with kDirty (an item owed a run does not wait as well: the earliest
  // ready time wins), but a waiting item may be in flight (it runs again when its delay
  // ends).
  static constexpr uint8_t kWaiting = 4;
  // A key with none of these bits is idle: evictable, and its failure count may lapse.
  static constexpr uint8_t kBusyBits = kDirty | kProcessing | kWaiting;
  // finished_: leases ended, in the low bits; kDrainFlag while a drain waits.
  static constexpr uint64_t kDrainFlag = uint64_t{1} << 63;
  // next_hash_: set beside a hash that no TakeNextHash has taken yet.
  static constexpr uint64_t kHashValid = uint64_t{1} << 32;
  // Keys done and not re-added stay in the table, idle, until more than about this many
  // are idle: a hot key that cycles through Add/Get/Done is then not copied, hashed into
  // the index and freed on every cycle. A clock hand over the slots erases idle ones.
  static constexpr int64_t kMaxIdle = 4096;
  // Idle keys a worker lets pile up beyond kMaxIdle before it erases them in one go.
  static constexpr int64_t kEvictBatch = 64;
  // Slots the producer's backstop looks at per insert, on average (past twice kMaxIdle
  // idle keys).
  static constexpr int kEvictScan = 8;
  // How long a Get sleeps at a time while sleep_in_steps_ is set.
  static constexpr absl::Duration kSleepStep = absl::Milliseconds(1);

  // Add with the key's hash (Table::HashOf) already computed: ShardedQueue hashes once to
  // choose the shard and passes the hash on. With `retry`, also counts a retry
  // (RecordRetryLocked) under the same hold of the lock (DelayingQueue's AddAfter), once
  // the add can no longer throw, also when it merges into a queued item. With
  // `unclaimed` (ShardedQueue), also sets *unclaimed to whether the add made an item ready
  // that no Get of this queue is on its way to take (UnclaimedAfterPushLocked).
  template <typename K>
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool AddHashed(K&& item, uint32_t hash, bool retry = false,
                                              bool* unclaimed = nullptr) {
    bool wake = false;
    {
      internal::MutexLock lock(&mu_);
      bool fresh = false;
      const uint32_t slot = FindOrInsertLocked(std::forward<K>(item), hash, &fresh);
      if (slot == Table::kNone) return false;  // shutting down: no retry counted either
      bool pushed = false;
      const bool marked = MarkDirtyLocked(slot, fresh, &pushed);
      // Once nothing can throw any more: an add that throws counts no retry.
      if (retry) RecordRetryLocked();
      if (!marked) return false;
      if (pushed) {
        wake = NeedWakeLocked();
        if (unclaimed != nullptr) *unclaimed = UnclaimedAfterPushLocked(wake);
      }
    }
    if (wake) ready_cv_.Signal();
    return true;
  }

  // Whether the item one push just made ready is left to no Get of this queue, `woke`
  // being whether the push signalled a sleeping Get (NeedWakeLocked): for ShardedQueue,
  // which then wakes a worker of another shard. Not when a sleeper was signalled for it,
  // nor while no more items are ready than Gets poll at length. Reads only the pollers'
  // count unless some Get polls, so an add pays for no line the workers write; when one
  // does, the ready count is read before the pollers' count again, as in NeedWakeLocked's
  // case (1): a poller that took one of the counted items has left the count by then (read
  // the other way round, a poller counted before it took an older item looked like one
  // on its way to this item, which then waited for that poller's whole run).
  bool UnclaimedAfterPushLocked(bool woke) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (woke) return false;
    if (spinners_.load(std::memory_order_relaxed) <= 0) return true;
    const size_t ready = ReadyCountLocked();
    const int polling = spinners_.load(std::memory_order_relaxed);
    return polling <= 0 || ready > static_cast<size_t>(polling);
  }

  // Ready items beyond the Gets of this queue that are on their way to take one: those
  // signalled and not yet awake, and those polling at length (a batch's count, see
  // UnclaimedAfterPushLocked for one push). For ShardedQueue, which wakes workers of other
  // shards for the rest. (Only a hint: a Get that polls briefly, or one just taking an
  // item, is not counted, so it errs towards waking someone.)
  size_t UnclaimedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t ready = ReadyCountLocked();
    const size_t coming =
        static_cast<size_t>(signaled_) +
        static_cast<size_t>(std::max(0, spinners_.load(std::memory_order_relaxed)));
    return ready > coming ? ready - coming : 0;
  }

  // For ShardedQueue, whose drain spans its shards. StopAdds starts a drain without
  // waiting: adds are refused from now on and blocked Gets woken (ShutDown without ending
  // the drains in progress).
  void StopAdds() {
    internal::MutexLock lock(&mu_);
    StopAddsLocked();
  }
  // StopAdds, and counts as drained until EndDrain: for ShardedQueue, which drains its
  // shards one after another, so that a worker's Get on a shard not yet reached still
  // waits for the runs owed there (see WaitForReady).
  void BeginDrain() {
    internal::MutexLock lock(&mu_);
    ++draining_;
    finished_.fetch_or(kDrainFlag, std::memory_order_acq_rel);
    StopAddsLocked();
  }
  void EndDrain() {
    internal::MutexLock lock(&mu_);
    if (--draining_ == 0) finished_.fetch_and(~kDrainFlag, std::memory_order_relaxed);
  }
  void StopAddsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    shutting_down_ = true;
    ready_cv_.SignalAll();
  }
  // ShutDownWithDrain that also ends, returning false, once `*abort_gen` differs from
  // `baseline` (nullptr: never) or `ctx` is done (nullptr: never). The caller changes
  // *abort_gen before it shuts this queue down, which wakes the wait; a done `ctx` wakes
  // it through a ContextWake.
  bool DrainUntil(const std::atomic<uint64_t>* abort_gen, uint64_t baseline, const Context* ctx) {
    // Before the lock (kwq/internal/context_wake.h); gone once the lock is released.
    std::optional<internal::ContextWake> wake;
    if (ctx != nullptr) wake.emplace(*ctx, &mu_, &drained_cv_);
    internal::MutexLock lock(&mu_);
    const uint64_t aborts = aborts_;  // a ShutDown() from now on ends this wait
    ++draining_;
    // From here on every Done counts itself under mu_, so it can signal drained_cv_
    // before the drainer (who may destroy the queue) returns.
    finished_.fetch_or(kDrainFlag, std::memory_order_acq_rel);
    StopAddsLocked();
    while (!DrainedLocked() && aborts_ == aborts &&
           (abort_gen == nullptr || abort_gen->load(std::memory_order_acquire) == baseline) &&
           (ctx == nullptr || !ctx->IsCancelled())) {
      drained_cv_.Wait(&mu_);
    }
    --draining_;
    if (draining_ == 0) finished_.fetch_and(~kDrainFlag, std::memory_order_relaxed);
    return DrainedLocked();
  }

  // Get for DelayingQueue, which has a second source of items: while polling it also
  // polls `due()` (true when waiting items are due), and before taking an item again it
  // calls `promote(about_to_wait)`, which moves due items in and returns true when it
  // moved any; with about_to_wait it also makes sure a timer wakes this Get at the next
  // ready time. So a polling worker moves due items itself instead of waiting for the
  // timer thread.
  // With `ctx` (may be null) it is Get(ctx): also nullopt once ctx is done and nothing
  // is ready, and `promote(true)` before every sleep, not only the first.
  // With `stop` (may be null; ShardedQueue's kick) it also returns nullopt, instead of
  // sleeping, once *stop is true and nothing is ready; whoever sets it then calls
  // WakeAllSleepers.
  // `before_sleep` runs under mu_ in the hold in which this Get is counted asleep, just
  // before it sleeps (not for a step of sleep_in_steps_ or of a shutdown), and returns
  // whether it may: false sends the Get back to take and promote again. For
  // DelayingQueue's timer, which a firing between promote(true) and that hold may have
  // re-armed as if no Get slept. It must not throw.
  template <typename Due, typename Promote, typename BeforeSleep = bool (*)()>
  std::optional<Lease> GetPromoting(
      const Context* ctx, Due due, Promote promote, const std::atomic<bool>* stop = nullptr,
      BeforeSleep before_sleep = [] { return true; }) {
    // Set up before the first sleep on `ctx`, and gone on every way out, a throw from
    // `promote` or `due` (a user's clock) included: it touches this queue and lives in
    // this frame (a throw once left it on `ctx`, and cancelling ran it on a dead frame).
    std::optional<internal::ContextWake> wake;
    bool unwatched = false;  // the wake-up could not be made: sleep in steps, look at ctx
    std::optional<Lease> lease;
    for (bool spun = false;; spun = true) {
      if ((lease = TryGet())) break;
      if (promote(spun) && (lease = TryGet())) break;
      if (!spun) {
        Spin([&] { return due() || (ctx != nullptr && ctx->IsCancelled()); });
        continue;
      }
      if (ctx != nullptr && !wake && !unwatched && !ctx->IsCancelled()) {
        unwatched = !internal::ContextWake::TryEmplace(&wake, *ctx, &mu_, &ready_cv_);
      }
      internal::TestHook(internal::HookPoint::kGetWillWait, this);
      if (!WaitForReady(ctx, stop, unwatched, before_sleep)) break;
    }
    return lease;
  }

  // Waiting items, for DelayingQueue, which holds mu_ around these calls and keeps the
  // timer. A waiting key lives in its slot like any other key, marked kWaiting, and
  // waiting_ orders those slots by ready time (an opaque int64; INT64_MAX never comes
  // due). So a delayed item is hashed and stored once, and coming due moves no key.

  // Makes `item` (hash `hash`) wait until `ready`, inserting it if new. Returns false when
  // nothing changed: the queue is shutting down, the item already waits for a time no
  // later than `ready`, or it is owed a run already (dirty: ready, or to run again after
  // its Done), which is earlier: one entry per item, the earliest ready time wins.
  template <typename K>
  bool AddWaitingLocked(K&& item, uint32_t hash, int64_t ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ReserveWaitingLocked();  // before the key is moved in (FindOrInsertLocked)
    bool fresh = false;
    const uint32_t slot = FindOrInsertLocked(std::forward<K>(item), hash, &fresh);
    if (slot == Table::kNone) return false;
    return SetWaitingLocked(slot, fresh, ready);
  }

  // Room in waiting_ for one more waiting item, whichever slot (up to the next insert's),
  // so that making an item wait cannot fail once its key is stored. Throws
  // std::bad_alloc with nothing changed.
  void ReserveWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    waiting_.ReserveOneMore(table_.slot_limit_after_insert());
  }

  // AddWaitingLocked for a live slot (`fresh`: inserted by this caller, unseen by others).
  // Throws std::bad_alloc (nothing changed) when waiting_ cannot grow.
  bool SetWaitingLocked(uint32_t slot, bool fresh, int64_t ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) return false;
    ReserveWaitingLocked();  // before the state changes (a no-op when the add did it)
    const uint8_t state = State(slot).load(std::memory_order_relaxed);
    if (fresh) {
      State(slot).store(state | kWaiting, std::memory_order_relaxed);
    } else if (state & kWaiting) {
      if (ready >= waiting_.KeyOf(slot)) return false;
      waiting_.Update(slot, ready);  // the earliest ready time wins
      return true;
    } else {
      // A read-modify-write: workers change the other bits without mu_. Acq_rel, and not
      // a load first, for an item owed a run: the add merges into that run, and this RMW
      // orders it before the hand-out that covers it (as Add's merge does). Only mu_
      // holders set kDirty, so an item seen without it stays so until mu_ is released.
      const uint8_t old = State(slot).fetch_or(kWaiting, std::memory_order_acq_rel);
      if (old & kDirty) {
        State(slot).fetch_and(static_cast<uint8_t>(~kWaiting), std::memory_order_relaxed);
        return false;
      }
      if (counts_ && !(old & kBusyBits)) counts_->EndIdle(slot);  // was idle
    }
    waiting_.Push(slot, ready);
    delayed_.store(static_cast<int64_t>(waiting_.size()), std::memory_order_relaxed);
    RecordDelayedLocked(+1);
    return true;
  }

  // The slot of the waiting `item`, or kNone.
  uint32_t FindWaitingLocked(const T& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiting_.empty()) return Table::kNone;
    const uint32_t slot = table_.Find(item);
    if (slot == Table::kNone || !(State(slot).load(std::memory_order_relaxed) & kWaiting)) {
      return Table::kNone;
    }
    return slot;
  }

  // Ends the wait of a waiting slot (it may be idle afterwards).
  void RemoveWaitingLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    waiting_.Remove(slot);
    // Nothing waits: no Get needs to look for due items in steps. (The DelayingQueue sets
    // and clears the flag as it publishes; a plain Add that ended the last wait did not
    // publish, and sleeping Gets woke every kSleepStep until the stale ready hint came due.)
    if (waiting_.empty()) sleep_in_steps_ = false;
    EndWaitLocked(slot);
    delayed_.store(static_cast<int64_t>(waiting_.size()), std::memory_order_relaxed);
    RecordDelayedLocked(-1);
  }

  // Queues up to `max` waiting items due by `now` (a waiting item is never dirty, but one
  // that were would merge, as an Add would), oldest ready time first; `*more`: due items are left.
  // Wakes the blocked Gets when it queued any. Returns how many it took out of waiting_.
  size_t PromoteDueLocked(int64_t now, size_t max, bool* more) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    *more = false;
    promote_starved_ = false;
    size_t taken = 0;
    bool pushed_any = false;
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();  // `now` may saturate
    while (!waiting_.empty() && waiting_.TopKey() <= now && waiting_.TopKey() != kNever) {
      if (taken == max) {
        *more = true;
        break;
      }
      // Room for the push before the item leaves waiting_. Without memory for it the rest
      // stay waiting, for a later pass (the timer is re-armed for them): this runs in the
      // timer's callback and in Get, which must not throw for it.
      if (!shutting_down_) {
        try {
          ReservePushLocked();
        } catch (const std::bad_alloc&) {
          promote_starved_ = true;  // DelayingQueue retries later, not at once
          break;
        }
      }
      const uint32_t slot = waiting_.TopId();
      waiting_.Pop();
      ++taken;
      RecordDelayedLocked(-1);
      if (shutting_down_) {
        EndWaitLocked(slot);
        continue;
      }
      // One read-modify-write ends the wait and marks the item dirty (workers change the
      // other bits meanwhile, hence the loop).
      uint8_t old = State(slot).load(std::memory_order_relaxed);
      while (!State(slot).compare_exchange_weak(
          old, static_cast<uint8_t>((old & ~kWaiting) | kDirty), std::memory_order_acq_rel,
          std::memory_order_relaxed)) {
      }
      if (old & kDirty) continue;  // (a guard: a waiting item is never dirty)
      bool pushed = false;
      QueueMarkedLocked(slot, old, &pushed);
      pushed_any |= pushed;
    }
    if (taken > 0) delayed_.store(static_cast<int64_t>(waiting_.size()), std::memory_order_relaxed);
    if (pushed_any && waiters_ > signaled_) {
      signaled_ = waiters_;
      PublishSleepersLocked();
      ready_cv_.SignalAll();
    }
    return taken;
  }

  // The `delayed` metric moves by `delta` (+1 / -1).
  void RecordDelayedLocked(int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (metrics_) metrics_->OnDelayed(delta);
  }

  // Clears a slot's kWaiting bit without queuing it (the slot may be idle afterwards,
  // which restarts the idle horizon of its failure count).
  void EndWaitLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (counts_) counts_->Touch(slot);
    State(slot).fetch_and(static_cast<uint8_t>(~kWaiting), std::memory_order_relaxed);
  }

  // Whether `slot`'s key is queued, waiting or in flight (then its failure count cannot
  // lapse, see FailureCounts). Lock-free; a caller without mu_ gets a snapshot.
  bool Busy(uint32_t slot) { return State(slot).load(std::memory_order_relaxed) & kBusyBits; }

  // Ends every wait (DelayingQueue's shutdown). The keys dropped are idle now, and with
  // `evict` are evicted here as any idle keys beyond kMaxIdle would be: once the queue is
  // shut down no add comes to evict them, and they stayed stored until it was destroyed.
  // (Not when the queue is being destroyed: erasing them one by one doubled the time a
  // queue with 1,000,000 waiting keys took to destroy, 26.5 -> 53.0 ms in
  // bench/queue_bench's BM_DelayingQueueDropsWaitingKeys, destroy vs ShutDown + destroy.)
  void DropWaitingLocked(bool evict) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t n = waiting_.size();
    waiting_.Clear([this](uint32_t slot) {
      mu_.AssertHeld();  // the lambda runs here, under mu_
      EndWaitLocked(slot);
    });
    delayed_.store(0, std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) RecordDelayedLocked(-1);
    if (evict && n > 0) {
      EvictLocked(static_cast<int>(std::min<size_t>(table_.slot_limit(), INT_MAX)), kMaxIdle);
    }
  }

  // For RateLimitingQueue with a counting limiter (RateLimiter::Counting): from now on
  // each key carries a failure count (FailureCounts, by slot), and an idle key whose count
  // has not lapsed is not evicted. Call before the queue is shared with other threads.
  void EnableFailureCounts(absl::Duration idle_horizon, Clock* clock) {
    counts_ = std::make_unique<internal::FailureCounts>(idle_horizon, clock);
  }

  // The slot of `item`, or kNone.
  uint32_t FindLocked(const T& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return table_.Find(item);
  }
  // The same for a key of any type the table looks up, whose table hash is `hash`.
  template <typename K>
  uint32_t FindLocked(const K& item, uint32_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return table_.Find(item, hash);
  }

  // Whether `slot` (one handed out, see LeasedSlotOf) still holds a key. False only when
  // a caller used an item after its lease ended and the key was evicted meanwhile (a
  // debug assertion fires); the key may then be gone, so the caller drops the call.
  bool LiveLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool live = State(slot).load(std::memory_order_relaxed) & Table::kLive;
    KWQ_DCHECK(live, "kwq queue: an item passed back after its lease ended");
    return live;
  }

  // Queues the live `slot` now, as Add would (`fresh`: inserted by this caller). Returns
  // whether a blocked Get must be signalled (ready_cv_) after the unlock.
  bool AddSlotLocked(uint32_t slot, bool fresh) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool pushed = false;
    return MarkDirtyLocked(slot, fresh, &pushed) && pushed && NeedWakeLocked();
  }

  // From now on each hand-out records, per thread, which slot it handed out, so that
  // LeasedSlotOf knows a key passed back by reference without hashing it. Call before the
  // queue is shared with other threads.
  void EnableHandOutTracking() { track_hand_outs_ = true; }

  // The slot whose stored key `item` is, when that is the item this queue last handed to
  // the calling thread (a worker passing lease->item() back, as a reconcile loop does);
  // else kNone. Decided by address alone, so it reads neither the key nor the index. Safe
  // without a lock: a handed-out slot number stays below the table's limit, and the
  // directory read by ItemOf never shrinks.
  uint32_t LeasedSlotOf(const T& item) {
    const uint32_t slot = hand_outs_.LastSlot();
    if (slot == internal::HandOutRecord::kNone || ItemOf(slot) != &item) return Table::kNone;
    return slot;
  }

  // For RateLimitingQueue (through DelayingQueue): from now on every hand-out publishes
  // the stored hash of the item next in line (TakeNextHash), so the queue's owner can have
  // the rate limiter prefetch that item's entry (RateLimiter::Prefetch) while the current
  // one is processed. Call before the queue is shared with other threads.
  void EnableNextHashHint() { hint_next_ = true; }

  // The hash published by the last hand-out, if no TakeNextHash has taken it since. With
  // several workers it may be another worker's: it is only a hint.
  std::optional<uint32_t> TakeNextHash() {
    const uint64_t hint = next_hash_.load(std::memory_order_relaxed);
    if (!(hint & kHashValid)) return std::nullopt;
    next_hash_.store(0, std::memory_order_relaxed);
    return static_cast<uint32_t>(hint);
  }

  // The outbox's front or the ring's oldest slot (as far as this side's cached view of
  // the ring shows: reading the producer's line for a hint would cost more than it saves).
  // A queued slot's key stays put while out_mu_ is held: only a hand-out, under out_mu_,
  // can start it on the way to being erased.
  void PublishNextHashLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    uint32_t next;
    if (!outbox_.empty()) {
      next = outbox_.front();
    } else if (!ring_.TryPeekCached(&next)) {
      return;
    }
    next_hash_.store(kHashValid | HashOfSlot(next), std::memory_order_relaxed);
  }

  // A slot's state bits. Safe without mu_ for a slot that is queued or in flight: the
  // table never moves a slot's byte, and such a slot is not erased.
  std::atomic_ref<uint8_t> State(uint32_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return std::atomic_ref<uint8_t>(table_.state(slot));
  }
  // A queued or in-flight slot's key (same reasoning as State).
  const T* ItemOf(uint32_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS { return &table_.item(slot); }
  // A queued or in-flight slot's stored hash (same reasoning).
  uint32_t HashOfSlot(uint32_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS { return table_.hash(slot); }

  uint64_t Finished() const { return finished_.load(std::memory_order_acquire) & ~kDrainFlag; }
  // Ready items in the ring, overflow list and outbox, read without their locks (a hint
  // for polling).
  // The overflow list's count is read first, with acquire: NextSlotLocked counts a moved
  // list in out_hint_ before it clears overflow_hint_ (release), so a reader that sees the
  // list gone also sees its items in the outbox (a stealing ShardedQueue worker passed by
  // a shard whose items were between the two, and a Get woken by ShutDown returned
  // nullopt with items left to steal). The ring's items never move to the other two.
  size_t ReadyHint() const {
    const size_t overflow = overflow_hint_.load(std::memory_order_acquire);
    return ring_.SizeHint() + overflow + out_hint_.load(std::memory_order_relaxed);
  }
  // The same with seq_cst loads (plain loads on x86), for TryGet's check after a take.
  size_t ReadyHintSeqCst() const {
    const size_t overflow = overflow_hint_.load(std::memory_order_seq_cst);
    return ring_.SizeHint(std::memory_order_seq_cst) + overflow +
           out_hint_.load(std::memory_order_seq_cst);
  }

  // Polls for a ready item before the Get sleeps. Up to max_pollers_ Gets at a time poll
  // at length (about half a millisecond; by default one: on two cores one polling worker
  // catches a producer's next item as well as two, and a second one would mostly take
  // CPU time from the producer). Any other Get polls briefly (internal::kBriefPolls) and
  // sleeps; it is woken when items pile up (see NeedWakeLocked). Measured in
  // docs/design.md and docs/benchmarks.md (scaling). `also()` ends the polling too
  // (GetPromoting's due items).
  template <typename Also>
  void Spin(Also also) {
    if (!internal::EnterLongPoll(spinners_, max_pollers_)) {
      internal::PollUntil([&] { return ReadyHint() != 0 || also(); }, internal::kBriefPolls);
      return;
    }
    // Leaves the count before this thread takes an item or checks under mu_ whether to
    // sleep (see NeedWakeLocked for why that order matters), also when `also()` throws (a
    // user's clock): a count left behind made every add skip waking sleepers for ever.
    // seq_cst: with TryGet's seq_cst loads after a take it pairs with NeedWakeLocked's
    // fence (its case 2).
    absl::Cleanup leave = [this] {
      if (max_pollers_ == 1) {
        spinners_.store(0, std::memory_order_seq_cst);
      } else {
        spinners_.fetch_sub(1, std::memory_order_seq_cst);
      }
    };
    internal::PollUntil([&] { return ReadyHint() != 0 || also(); });
  }

  // Ready items as seen by the holder of mu_ (the producers' side): exact for the overflow
  // list; the ring's count may include slots a worker just took (never the reverse); and
  // out_hint_ turns non-zero only under mu_ (NextSlotLocked), so nothing ready is missed.
  size_t ReadyCountLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return overflow_.size() + ring_.SizeHint() + out_hint_.load(std::memory_order_acquire);
  }
  bool NothingReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ReadyCountLocked() == 0;
  }

  // Blocks until an item may be ready. Returns false when the queue is shut down (or
  // `ctx` is done, or `*stop` is true) and nothing is ready; true also after one step of
  // kSleepStep while sleep_in_steps_ is set. `ctx` and `stop` may be null. With
  // `ctx_unwatched` (no wake-up on ctx could be made) it sleeps in steps of kSleepStep
  // and looks at ctx after each. `before_sleep` runs under mu_ before each sleep that is
  // not a step of a shutdown or of sleep_in_steps_; when it returns false this returns
  // true at once instead of sleeping (GetPromoting).
  template <typename BeforeSleep = bool (*)()>
  bool WaitForReady(
      const Context* ctx, const std::atomic<bool>* stop = nullptr, bool ctx_unwatched = false,
      BeforeSleep before_sleep = [] { return true; }) {
    internal::MutexLock lock(&mu_);
    while (NothingReadyLocked()) {
      if (ctx != nullptr && ctx->IsCancelled()) return false;
      // Set before WakeAllSleepers takes mu_: seen here, or the wait below is woken.
      if (stop != nullptr && stop->load(std::memory_order_acquire)) return false;
      if (shutting_down_) {
        // During a drain, an item added again while in flight is owed a run, queued at its
        // Done, which may come from another thread (a dispatcher handing leases to a
        // pool): wait for it, or it would be left with no Get to take it and the drain
        // would wait for ever. (After a plain ShutDown Get ends, as client-go's does.) A
        // Done that owes nothing does not signal, so this waits in short steps.
        if (draining_ == 0 ||
            added_.load(std::memory_order_relaxed) <= taken_.load(std::memory_order_relaxed)) {
          return false;
        }
        WaitLocked(absl::Milliseconds(1));
        continue;
      }
      if (sleep_in_steps_) {
        // A DelayingQueue's waiting items have no timer (see sleep_in_steps_): the
        // caller looks for due items itself, and tries the timer again, every step.
        WaitLocked(kSleepStep);
        return true;
      }
      // The caller's timer is not armed to wake this Get (a firing re-armed it since the
      // caller's promote step): back to the caller, whose next promote step arms it.
      if (!before_sleep()) return true;
      if (ctx_unwatched) {  // no wake-up on ctx (no memory for it): look at it every step
        WaitLocked(kSleepStep);
        continue;
      }
      WaitLocked();
    }
    return true;
  }

  // Blocks one Get on ready_cv_. Each Signal wakes exactly one blocked waiter, which
  // then consumes one unit of signaled_.
  // With a timeout (while shutting down, while sleep_in_steps_, or for a Get(ctx) whose
  // wake-up on ctx could not be made), a wait may end unsignalled and still consume a
  // unit of signaled_: it then finds the item that signal was for (or that another Get
  // took it), and the signal, still pending, wakes another Get for nothing; fewer units
  // counted than signals pending only make later adds signal more.
  void WaitLocked(absl::Duration timeout = absl::InfiniteDuration())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++waiters_;
    PublishSleepersLocked();
    if (timeout == absl::InfiniteDuration()) {
      ready_cv_.Wait(&mu_);
    } else {
      ready_cv_.WaitFor(&mu_, timeout);
    }
    --waiters_;
    if (signaled_ > 0) --signaled_;
    PublishSleepersLocked();
  }

  // Wakes every Get asleep on this queue (each goes back to sleep unless it finds an item
  // or a reason to return): for ShardedQueue's kick, after it set the kicked Get's `stop`.
  // The lock is taken and released first, so a Get that checked `stop` before the store
  // is waiting by the time of the signal.
  void WakeAllSleepers() {
    { internal::MutexLock lock(&mu_); }
    ready_cv_.SignalAll();
  }

  // Whether any item is queued or owed a run (added, and not yet handed out), read
  // without the lock: for ShardedQueue, whose Gets during a drain wait for runs owed on
  // any shard.
  bool OwesRuns() const {
    const int64_t taken = taken_.load(std::memory_order_acquire);  // first: it trails added_
    return added_.load(std::memory_order_acquire) > taken;
  }

  // Called by a Done that queued its item (one added again while in flight) when no Get
  // of this queue is on its way to take it (UnclaimedAfterPushLocked), after mu_ is released:
  // ShardedQueue's wake-up of a worker asleep on another shard. Set before the queue is
  // shared. `fn` must not throw.
  struct ReadyHook {
    void (*fn)(void* owner, size_t shard) = nullptr;
    void* owner = nullptr;
    size_t shard = 0;
  };
  void SetReadyHook(ReadyHook hook) { ready_hook_ = hook; }

  // Gets asleep and not yet signalled, for TryGet's check without the lock.
  void PublishSleepersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    sleepers_hint_.store(waiters_ - signaled_, std::memory_order_relaxed);
  }

  // A worker that took an item while more are ready wakes one sleeping Get. Call it only
  // while holding a lease of this queue: the lease keeps a drain from finishing (and so
  // the queue from being destroyed), which makes signalling after the unlock safe.
  void WakeSleeper() {
    bool wake;
    {
      internal::MutexLock lock(&mu_);
      wake = waiters_ > signaled_ && !NothingReadyLocked();
      if (wake) {
        ++signaled_;
        PublishSleepersLocked();
      }
    }
    if (wake) ready_cv_.Signal();
  }

  // Whether a newly ready item needs a Signal: only when more Gets are blocked than have
  // been signalled and not yet woken, and no Get polls. A producer adding items faster
  // than workers wake then makes one futex call per sleeping worker, not one per item.
  // While a Get polls, the producer leaves waking to the workers: the poller takes an
  // item, and a worker that takes an item while more are ready wakes a sleeper
  // (TryGet). So a producer that keeps a poller busy makes no futex calls at all.
  //
  // Why no wake-up is lost. (1) No more items ready than Gets polling: count first, then
  // look for pollers. A Get that stops polling leaves spinners_ before it takes an item,
  // and taking one is a release store (the ring's head, or out_hint_) that the count's
  // acquire loads read: if the count no longer includes an item a poller took,
  // spinners_ no longer includes that poller; so every poller counted here takes one of
  // the counted items. (2) More items than pollers: the producer relies on a poller's
  // post-take check, which needs a store-load pair in each direction (this push, then
  // spinners_; the poller's leaving spinners_, then its ReadyHint and sleepers_hint_
  // reads). The seq_cst fence here, the poller's seq_cst store to spinners_ (Spin) and
  // its seq_cst loads after the take (TryGet) make one side see the other: if both
  // missed, the fence would precede the poller's store, which precedes its loads, which
  // precede the fence in the single total order. So either the producer sees the poller
  // gone and wakes a sleeper itself, or the poller's loads see this push and the sleeper,
  // or later writes: another worker that has since moved the item (and, being ordered
  // after the poller's leave, sees it gone in its own NeedWakeLocked or post-take check),
  // or a zero sleepers count because someone else has signalled the sleeper.
  // Without them a stress harness left an item ready with a worker asleep 27 times in
  // 570,000 rounds. Case (1) needs no fence; in dedup_hot on two busy cores case (2) is
  // common (a poller descheduled while items pile up) and the two barriers cost about
  // 10 ns per add, against a futex call per wake before.
  bool NeedWakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiters_ <= signaled_) return false;
    const size_t ready = ReadyCountLocked();
    const int polling = spinners_.load(std::memory_order_relaxed);
    if (polling > 0) {
      if (ready <= static_cast<size_t>(polling)) return false;  // (1)
      internal::SeqCstFence();                                  // (2)
      if (spinners_.load(std::memory_order_relaxed) > 0) return false;
    }
    ++signaled_;
    PublishSleepersLocked();
    return true;
  }

  // FindOrInsertLocked's refused add (see there), out of line: the add path stays small.
  template <typename K>
  ABSL_ATTRIBUTE_NOINLINE void PublishRefusedAddLocked(const K& item, uint32_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (const uint32_t known = table_.Find(item, hash); known != Table::kNone) {
      State(known).fetch_or(0, std::memory_order_acq_rel);
    }
  }

  // The slot of `item`, inserted (idle; `*fresh` set) if new; or kNone when the queue is
  // shutting down. A refused add still makes a release read-modify-write on a known
  // key's state, as a merged add does, so the caller's earlier writes are visible to the
  // Get that hands out the item, if it is still queued (client-go's refused Add takes
  // the queue's lock, which orders it before a later Get). Rare: no cost on the add path.
  template <typename K>
  uint32_t FindOrInsertLocked(K&& item, uint32_t hash, bool* fresh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) [[unlikely]] {
      PublishRefusedAddLocked(item, hash);
      return Table::kNone;
    }
    // Both index lines at once: the lookup reads the control bytes, and an insert (a new
    // key) then writes the slot line, whose miss would otherwise stall the unlock.
    table_.Prefetch(item, hash);
    uint32_t slot = table_.Find(item, hash);
    if (slot == Table::kNone) {
      // Before the insert: the new slot is idle until MarkDirtyLocked.
      EvictBackstopLocked();
      // Room for what the add does next, before the key is moved in (the last step that
      // can fail for memory), so that an add that throws std::bad_alloc has not taken the
      // caller's item: the push, and the new slot's failure count.
      ReservePushLocked();
      if (counts_) counts_->Reserve(table_.slot_limit_after_insert());
      slot = table_.Insert(std::forward<K>(item), hash, 0);
      stored_.store(static_cast<int64_t>(table_.size()), std::memory_order_relaxed);
      if (counts_) counts_->Reset(slot);
      *fresh = true;
    }
    return slot;
  }

  // Runs `add_items(&added)` under one hold of the table lock, then wakes sleeping Gets
  // for what it queued (add_items adds with AddOneLocked, which counts into `added`).
  // Returns how many were queued. An exception from add_items (an item's hash,
  // comparison or copy) ends the batch: the items before it stay added, so sleeping
  // Gets are woken for them before the exception goes on. With `unclaimed`, also sets
  // *unclaimed to UnclaimedLocked() after the batch (also when it throws).
  template <typename AddItems>
  size_t AddBatch(AddItems&& add_items, size_t* unclaimed = nullptr) {
    size_t added = 0;
    bool wake;
    std::exception_ptr thrown;
    {
      internal::MutexLock lock(&mu_);
      try {
        add_items(&added);
      } catch (...) {
        thrown = std::current_exception();
      }
      wake = added > 0 && waiters_ > signaled_;
      if (wake) {
        signaled_ = waiters_;
        PublishSleepersLocked();
      }
      if (unclaimed != nullptr) *unclaimed = added > 0 ? UnclaimedLocked() : 0;
    }
    if (wake) ready_cv_.SignalAll();
    if (thrown) std::rethrow_exception(thrown);
    return added;
  }

  // One item of an AddBatch: `hash` is Table::HashOf(item). Counts it into *added when
  // this call queued it.
  template <typename K>
  void AddOneLocked(K&& item, uint32_t hash, size_t* added) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool fresh = false;
    const uint32_t slot = FindOrInsertLocked(std::forward<K>(item), hash, &fresh);
    bool pushed = false;
    if (slot != Table::kNone && MarkDirtyLocked(slot, fresh, &pushed)) ++*added;
  }

  // ShardedQueue::AddAll's share for this shard: moves in batch[i].item (whose
  // Table::HashOf is batch[i].hash) for each i in `order`, in that order, as one
  // AddBatch, which sets *unclaimed (also when it throws).
  template <typename Entry>
  size_t AddEntries(std::vector<Entry>& batch, std::span<const size_t> order, size_t* unclaimed) {
    return AddBatch(
        [&](size_t* added) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          for (const size_t i : order) AddOneLocked(std::move(batch[i].item), batch[i].hash, added);
        },
        unclaimed);
  }

  // Marks `slot` waiting and, unless a lease is active (its Done will), queues it. Returns
  // false when it was already waiting (the add merges into it) or the queue is shutting
  // down. The exchange is a release read-modify-write even when the key was waiting, so
  // the caller's earlier writes are visible to the Get that hands the item out.
  // A `fresh` slot (inserted by this call) is not yet visible to any other thread, so it
  // is marked with a plain store: a locked instruction would wait for the insert's cache
  // misses to drain from the store buffer.
  bool MarkDirtyLocked(uint32_t slot, bool fresh, bool* pushed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) return false;
    ReservePushLocked();  // may throw: before anything changes
    uint8_t old;
    if (fresh) {
      old = State(slot).load(std::memory_order_relaxed);
      State(slot).store(old | kDirty, std::memory_order_relaxed);
    } else {
      old = State(slot).fetch_or(kDirty, std::memory_order_acq_rel);
      // An add of a waiting item runs it now, once (DelayingQueue's promise).
      if (old & kWaiting) [[unlikely]]
        RemoveWaitingLocked(slot);
      if (old & kDirty) return false;
      if (counts_ && !(old & kBusyBits)) counts_->EndIdle(slot);  // was idle
    }
    return QueueMarkedLocked(slot, old, pushed);
  }

  // The rest of an add once `slot` is marked dirty (its state was `old`, not dirty):
  // counts it and, unless a lease is active (its Done will), queues it. Returns true.
  bool QueueMarkedLocked(uint32_t slot, uint8_t old, bool* pushed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    added_.store(added_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // The add is recorded before the item is pushed: once pushed, a worker (under out_mu_,
    // not mu_) may hand it out, and its OnGet must find this add's time.
    if (metrics_) metrics_->OnAdd(slot);
    if (!(old & kProcessing)) {
      PushLocked(slot);
      *pushed = true;
    } else {
      ++owed_pushes_;  // its Done pushes it, into the room reserved for it
    }
    return true;
  }

  // Makes room in the overflow list for the push about to be made (if it goes there) and
  // for every push owed by a Done (an item added again while in flight), so that neither
  // allocates: an allocation failure then throws before an add changes anything, and a
  // Done (a lease's destructor, which cannot throw) never allocates. Throws
  // std::bad_alloc. (The outbox gets the same room before it becomes the overflow list,
  // see NextSlotLocked.)
  void ReservePushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    overflow_.Reserve(owed_pushes_ + 1);
  }

  // Makes `slot` ready: into the ring, or into the overflow list when the ring is full or
  // the overflow list already holds older items (so the hand-out order stays FIFO). Does
  // not allocate once ReservePushLocked has made room.
  void PushLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (overflow_.empty() && ring_.TryPush(slot)) return;
    overflow_.push_back(slot);
    overflow_hint_.store(overflow_.size(), std::memory_order_relaxed);
  }

  // The oldest ready slot, in hand-out order: the outbox (former overflow, older than
  // anything pushed since), then the ring (older than the overflow list: the producer
  // stops using the ring while the overflow list is not empty), then the overflow list,
  // which is moved over whole. Moving more than one item wakes one more sleeping Get.
  bool NextSlotLocked(uint32_t* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    if (!outbox_.empty()) {
      *slot = outbox_.front();
      outbox_.pop_front();
      out_hint_.store(outbox_.size(), std::memory_order_release);
      if (outbox_.empty()) outbox_.ReleaseIfEmpty();  // a burst's buffer goes
      return true;
    }
    if (ring_.TryPop(slot)) return true;
    if (overflow_hint_.load(std::memory_order_relaxed) == 0) return false;  // checked below
    bool wake = false;
    {
      internal::MutexLock lock(&mu_);
      // No producer now: a slot pushed to the ring since the check above is older than the
      // overflow list only if the list was empty then, so take the ring first.
      if (ring_.TryPop(slot)) return true;
      if (overflow_.empty()) return false;
      // The empty outbox becomes the overflow list: give it the room the list must keep
      // (ReservePushLocked).
      bool room = true;
      try {
        outbox_.Reserve(owed_pushes_ + 1);
      } catch (const std::bad_alloc&) {
        room = false;
      }
      if (room) {
        std::swap(outbox_, overflow_);
        // Counted in the outbox before they leave the overflow list's count (see ReadyHint).
        out_hint_.store(outbox_.size(), std::memory_order_relaxed);
        overflow_hint_.store(0, std::memory_order_release);
        *slot = outbox_.front();
        outbox_.pop_front();
        out_hint_.store(outbox_.size(), std::memory_order_release);
        if (!outbox_.empty()) wake = NeedWakeLocked();
      } else {
        // No memory for it: take the overflow list's front without the swap (the list
        // keeps its room: popping frees nothing).
        *slot = overflow_.front();
        overflow_.pop_front();
        overflow_hint_.store(overflow_.size(), std::memory_order_relaxed);
        if (!overflow_.empty()) wake = NeedWakeLocked();
      }
    }
    if (wake) ready_cv_.Signal();
    return true;
  }

  // Hands out `slot` (just taken from the ready order).
  Lease HandOutLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    // The hand-out is recorded while the item is still dirty: an add (under mu_, not
    // out_mu_) merges into it until the flip below, and one after the flip records a
    // new add time, which this OnGet must have read first.
    if (metrics_) metrics_->OnGet(slot);
    State(slot).fetch_xor(kDirty | kProcessing, std::memory_order_acq_rel);  // dirty -> processing
    taken_.store(taken_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (track_hand_outs_) hand_outs_.Record(slot);
    return Lease(this, slot, ItemOf(slot));
  }

  // Nothing waiting or in flight: every dirty mark was handed out and its lease ended.
  // Under mu_ with shutting_down_ set, added_ no longer changes.
  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<uint64_t>(added_.load(std::memory_order_relaxed)) == Finished();
  }

  // Idle keys in the table, about: stored minus queued minus in flight minus waiting for
  // a delay (an item in two of these is subtracted twice, so this errs low).
  int64_t IdleEstimate() const {
    return stored_.load(std::memory_order_relaxed) - added_.load(std::memory_order_relaxed) +
           static_cast<int64_t>(Finished()) - delayed_.load(std::memory_order_relaxed);
  }

  // Advances the clock hand over at most `scan` slots, erasing idle keys while more than
  // `keep` are idle. An idle slot seen here stays idle until mu_ is released: only Add
  // makes it busy.
  void EvictLocked(int scan, int64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Erased in groups: the index entries of a group are prefetched first, so their cache
    // misses overlap instead of one erase waiting for the next (with a million keys the
    // index is far larger than the caches, and erasing was a third of fifo_1t's time).
    constexpr int kGroup = 16;
    uint32_t group[kGroup];
    const int64_t now = counts_ ? counts_->Now() : 0;
    int64_t excess = IdleEstimate() - keep;
    bool erased = false;
    bool kept = false;  // an idle key stayed for its live failure count
    while (scan > 0 && excess > 0) {
      int n = 0;
      for (; scan > 0 && n < kGroup && n < excess; --scan) {
        if (hand_ >= table_.slot_limit()) hand_ = 0;
        const uint32_t slot = hand_++;
        const uint8_t state = State(slot).load(std::memory_order_acquire);
        if (!(state & Table::kLive) || (state & kBusyBits)) continue;
        // A key with a failure count that has not lapsed stays (RateLimitingQueue).
        if (counts_ && counts_->Held(slot, now)) {
          kept = true;
          continue;
        }
        table_.Prefetch(slot);
        group[n++] = slot;
      }
      for (int i = 0; i < n; ++i) table_.Erase(group[i]);
      erased |= n > 0;
      stored_.store(static_cast<int64_t>(table_.size()), std::memory_order_relaxed);
      excess = IdleEstimate() - keep;
    }
    // Only keys with live failure counts are idle yet not erasable: a pass that erased
    // nothing because it met only busy keys leaves the floor alone, and the next one moves
    // on; one that kept counted keys waits for a batch more idle keys before trying again.
    if (counts_) {
      evict_floor_.store(erased || excess <= 0 || !kept ? 0 : IdleEstimate(),
                         std::memory_order_relaxed);
    }
  }

  // Backstop for when workers do not keep up with eviction (or there are none to hand
  // out to): every kEvictBatch calls, on the producer's side of the queue (key inserts,
  // and a DelayingQueue's CancelAfter, whose keys go idle with no hand-out to evict
  // them), erases idle keys beyond twice kMaxIdle. (IdleEstimate reads the workers'
  // finished_ counter: a cache miss on a line they keep writing, hence not every call.)
  void EvictBackstopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (++backstop_calls_ % kEvictBatch == 0 &&
        IdleEstimate() >
            std::max(2 * kMaxIdle, evict_floor_.load(std::memory_order_relaxed) + kEvictBatch)) {
      EvictLocked(kEvictBatch * kEvictScan, 2 * kMaxIdle);
    }
  }

  // Every kEvictBatch hand-outs: once a batch of idle keys beyond kMaxIdle has piled up,
  // the worker erases them, if the table lock is free (workers usually have time to
  // spare; the producer only evicts as a backstop, see FindOrInsertLocked). Trying on
  // every hand-out would bounce the producer's lock word between CPUs.
  void EvictFromWorker() {
    if (IdleEstimate() >
            std::max(kMaxIdle, evict_floor_.load(std::memory_order_relaxed)) + kEvictBatch &&
        mu_.TryLock()) {
      EvictLocked(4 * kEvictBatch, kMaxIdle);
      mu_.Unlock();
    }
  }

  // Ends a lease. Without metrics and without a drain waiting, this takes no lock unless
  // the item was added again meanwhile (then it is queued under mu_).
  void Finish(uint32_t slot) {
    if (metrics_) metrics_->OnDone(slot);
    // A key with a failure count that goes idle now starts its idle horizon now (before
    // the exchange: afterwards the slot may be erased). A key queued or waiting again
    // stays busy (the common case, a retry before Done, skips the clock read); one whose
    // wait a CancelAfter ends meanwhile is touched there.
    if (counts_ && !(State(slot).load(std::memory_order_relaxed) & (kDirty | kWaiting))) {
      counts_->Touch(slot);
    }
    // After this exchange the slot may be erased (when idle): it is not touched again.
    const uint8_t old =
        State(slot).fetch_and(static_cast<uint8_t>(~kProcessing), std::memory_order_acq_rel);
    if (old & kDirty) {
      bool wake;
      bool unclaimed = false;
      {
        internal::MutexLock lock(&mu_);
        --owed_pushes_;
        PushLocked(slot);  // into room reserved by the add (no allocation)
        wake = NeedWakeLocked();
        if (ready_hook_.fn != nullptr) unclaimed = UnclaimedAfterPushLocked(wake);
      }
      // Safe before the lease is counted as ended: the item waits, so no drain finishes.
      if (wake) ready_cv_.Signal();
      if (unclaimed) ready_hook_.fn(ready_hook_.owner, ready_hook_.shard);
    }
    uint64_t finished = finished_.load(std::memory_order_relaxed);
    while (!(finished & kDrainFlag)) {
      if (finished_.compare_exchange_weak(finished, finished + 1, std::memory_order_release,
                                          std::memory_order_relaxed)) {
        return;
      }
    }
    // A drain waits: count under the lock, so the drainer (which may destroy the queue as
    // soon as it returns) cannot return before this thread is done with it.
    internal::MutexLock lock(&mu_);
    finished_.fetch_add(1, std::memory_order_release);
    if (draining_ > 0 && DrainedLocked()) drained_cv_.SignalAll();
  }

  const Options options_;
  const int max_pollers_;  // Gets that may poll at length at once (Spin), >= 1
  // Hand-outs to each thread (EnableHandOutTracking), for LeasedSlotOf.
  const internal::HandOutRecord hand_outs_;
  // Per-key failure counts (EnableFailureCounts), or nullptr; set before the queue is
  // shared, then only read (here, on a line nobody writes: the producer reads it on
  // every insert).
  std::unique_ptr<internal::FailureCounts> counts_;

  // Fields are grouped by the thread that writes them, one group per cache line (or
  // more), so a line the producer writes on every Add is not one a polling worker keeps
  // reading. Each group says who writes it and how often. (Producer/worker scenarios are
  // sensitive to layout on 2 cores: one 8-byte field more moved dedup_hot from 58 to 84
  // ns/add before this grouping; see docs/design.md.)

  // Producer side, under the table lock, written on every Add: the key index and the
  // pushing end of the ready order (Add, and a Done whose item was added again).
  alignas(64) mutable internal::Mutex mu_;
  Table table_ ABSL_GUARDED_BY(mu_);
  uint32_t hand_ ABSL_GUARDED_BY(mu_) = 0;            // next slot the idle-key hand looks at
  uint64_t backstop_calls_ ABSL_GUARDED_BY(mu_) = 0;  // EvictBackstopLocked's, ever
  internal::SlotFifo overflow_ ABSL_GUARDED_BY(mu_);
  // Items added again while in flight, whose Done will push them (room for them is kept in
  // overflow_, see ReservePushLocked).
  size_t owed_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  // The last PromoteDueLocked stopped for want of memory, with due items left waiting.
  bool promote_starved_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> stored_{0};  // table_.size(), written under mu_
  std::atomic<int64_t> added_{0};   // dirty marks ever made, written under mu_
  // Also under mu_, written rarely (by workers going to sleep, shutdown, drain).
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;   // Gets blocked on ready_cv_
  int signaled_ ABSL_GUARDED_BY(mu_) = 0;  // Signals sent that no waiter consumed yet
  int draining_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Set by a DelayingQueue while it has waiting items and no timer armed for them (one
  // could not be made, for want of memory, or a firing's clock threw): sleeping Gets then
  // wake every kSleepStep and move due items themselves (WaitForReady).
  bool sleep_in_steps_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t aborts_ ABSL_GUARDED_BY(mu_) = 0;  // ShutDown() calls: each ends the drains waiting

  // Read by polling workers; written only when the ring overflows.
  alignas(64) std::atomic<size_t> overflow_hint_{0};  // overflow_.size(), written under mu_
  // waiters_ - signaled_, written under mu_ when a Get sleeps or is signalled; read by
  // every TryGet (PublishSleepersLocked). Own line: pollers keep reading overflow_hint_.
  alignas(64) std::atomic<int> sleepers_hint_{0};

  // Ready slots pass from the holder of mu_ to the holder of out_mu_ through the ring
  // (its two ends are on lines of their own); those that do not fit wait in overflow_
  // (see PushLocked and NextSlotLocked).
  internal::SlotRing ring_;

  // Both sides, only when a Get sleeps or a drain waits.
  alignas(64) internal::CondVar ready_cv_;  // an item became ready, or shutdown
  internal::CondVar drained_cv_;            // nothing waiting or in flight while draining

  // Workers, on every Get: the outbox (a former overflow list), popped first.
  alignas(64) mutable internal::Mutex out_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  internal::SlotFifo outbox_ ABSL_GUARDED_BY(out_mu_);
  std::atomic<size_t> out_hint_{0};  // outbox_.size(), written under out_mu_
  std::atomic<int64_t> taken_{0};    // hand-outs ever made, written under out_mu_
  // The next item's hash after a hand-out (kHashValid | hash), written under out_mu_ when
  // hint_next_ (set before the queue is shared); cleared by TakeNextHash.
  std::atomic<uint64_t> next_hash_{0};
  bool hint_next_ = false;
  bool track_hand_outs_ = false;  // set before the queue is shared

  // Workers, when they start or stop polling (read by the producer before a wake-up).
  alignas(64) std::atomic<int> spinners_{0};  // Gets polling at length in Spin

  // Workers, on every Done: leases ended (and kDrainFlag), counted without a lock.
  alignas(64) std::atomic<uint64_t> finished_{0};

  // Set before the queue is shared, then only read. Thread-safe (its own lock, taken last).
  alignas(64) std::unique_ptr<internal::QueueMetricsRecorder> metrics_;
  ReadyHook ready_hook_;  // SetReadyHook; on metrics_'s line, which no hot path writes

  // DelayingQueue's waiting items (kWaiting slots) by ready time, and their number. A
  // group of their own, after the hot ones: added to the producer's group they moved every
  // later field by a line, which changes which lines the CPU's adjacent-line prefetcher
  // pairs (pc_2w and fifo_1t measured a few ns worse).
  alignas(64) internal::IndexedHeap waiting_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> delayed_{0};  // waiting_.size(), written under mu_
  // With failure counts: the idle estimate at which the last eviction pass found nothing
  // to erase (idle keys with live counts stay), else 0. Eviction waits until idle keys
  // exceed it by a batch, instead of rescanning the same kept keys. Written under mu_.
  std::atomic<int64_t> evict_floor_{0};
};

}  // namespace kwq

#endif  // KWQ_QUEUE_H_
