// File: kwq/priority_queue.h
//
// PriorityQueue<T>: controller-runtime's priority queue (pkg/controller/priorityqueue) for
// C++: a deduplicating work queue that hands out the highest-priority ready item first,
// with delayed and rate-limited adds built in, plus three things controller-runtime lacks:
// anti-starvation aging, optional round-robin fairness between groups of items, and a
// draining shutdown.
//
//   auto q = *kwq::PriorityQueue<std::string>::Create();
//   q->Add("default/web", {.priority = 10});           // producers
//   q->AddAfter("default/db", absl::Seconds(30));
//   while (auto item = q->Get()) {                     // workers; blocks until ready
//     if (Reconcile(**item)) q->Forget(**item); else q->AddRateLimited(**item);
//   }                                                  // the lease's destructor calls Done
//
// Promises (pinned by tests/priority_queue_test.cc):
//   - Ready items are handed out highest priority first; within one priority, in the
//     order they became ready (FIFO). With Options::group, groups of one priority take
//     turns (below). With Options::aging, items ready for `aging` go first (below).
//   - An item waiting to be processed is stored once, however often it is added. An add
//     of a waiting item (ready or delayed) merges into it: its priority becomes the
//     larger of the two, its ready time the earlier of the two (so a delayed item added
//     with no delay becomes ready now, and a ready item stays where it is).
//   - An add with `after` > 0, or with `rate_limited` (a delay of max(after,
//     rate_limiter->When(item))), leaves the item delayed: not handed out and not in Len()
//     until its ready time. One TimerService timer is armed, for the earliest ready time
//     of all delayed items; each firing makes every due item ready at once.
//   - An item is never handed to two workers at once. An add while it is in flight is
//     remembered (highest priority, earliest ready time) and the item is queued again
//     when its lease ends, once (level-triggered: a change made during processing is
//     never lost).
//   - Get blocks until an item is ready or the queue is shut down and nothing is ready
//     (during a ShutDownWithDrain, also none owed a run by a lease in flight: a worker
//     must not call Get while it holds a lease whose item was added again, as on Queue).
//     After ShutDown, adds are ignored, delayed items already due are ready (as if the
//     timer had fired in time) and the others dropped (they were never ready), and Get
//     keeps returning ready items until none are left.
//   - ShutDownWithDrain waits until every queued and in-flight item is Done (as
//     Queue::ShutDownWithDrain; controller-runtime's only calls ShutDown), waking every blocked
//     Get; a ShutDown() from another thread ends the wait early.
//   - Get returns a move-only Lease whose destructor calls Done.
//   - Add and Get are O(log n) (amortised) in the number of waiting items; every key is
//     stored once (kwq/internal/key_table.h), as in Queue.
//
// Order of hand-out, exactly. An item becomes *ready* when an add with no delay stores
// it, when its delay ends (its ready time is then the end of the delay), or, for an item
// added while in flight, when its lease ends -- whichever is latest. Get then picks:
//   1. Aging (Options::aging = A, off by default): an item ready for at least A (now -
//      ready time >= A, on the queue's clock) is *aged*. Aged items go before every other
//      item, oldest first, whatever their priority or group. So once an item has waited
//      A, only items that became ready before it can still go first: no priority stream
//      starves it.
//   2. Otherwise the highest priority level that has a ready item.
//   3. Fairness (Options::group set): the groups that have ready items at that level take
//      turns, in a ring. Get serves the group at the front of the ring (its earliest-ready
//      item) and moves it to the back, or out of the ring when it has no ready item left
//      at this level; a group that gets a ready item at a level where it had none joins
//      at the back. An aged item taken out of turn does not move its group; one that is
//      the item these rules serve next takes its group's turn like any other. Without
//      groups, a level is one group.
//   4. Within a group of a level: FIFO by ready time (ties in the order the items became
//      ready). An item whose priority an add raises keeps its ready time, so it goes
//      before the items of its new level that became ready after it.
// One exception, while the queue's timer is late (its service busy with another
// callback): a delayed item whose delay has ended is moved by that timer, by an add or a
// Done, or by a Get that finds nothing else ready, and until then items already ready go
// first, whatever their priority. (controller-runtime checks each item's ready time at
// hand-out. kwq's Get does not read the clock while items are ready, and so allocates
// nothing; checking cost a Get about 10 ns, and moving the due items made their groups
// there. A timer is late by microseconds unless its service is busy.)
//
// Beyond controller-runtime's interface: Add returns whether it stored a new waiting item;
// Get returns a Lease (whose destructor calls Done) and reports the priority; TryGet,
// Get(ctx), Depth and InFlight as on Queue, Waiting as on DelayingQueue; aging, fairness
// and the drain. QueueOptions::polling_workers bounds the idle Gets that poll at length
// before they sleep, as on Queue.
//
// Thread safety: every member may be called from any thread. One mutex guards the queue.
// It is not held while calling `group`, or a rate limiter that keeps its own counts (its
// When, Forget and NumRequeues); it is held while calling a counting limiter's
// WhenCounted and any limiter's Prefetch (the queue keeps the count, so the delay of the
// n-th failure is asked under the lock that recorded it). The built-in limiters' locks
// there (a token bucket's, a jitter source's) are leaves; a custom limiter's WhenCounted
// and Prefetch must not block or call this queue. Get blocks on a condition variable.
// Lock order: this queue's lock, then a limiter's, the clock's and the timer service's. A
// Lease must not outlive its queue, and no call may be in progress when it is destroyed:
// after ShutDownWithDrain returns true the queue may be destroyed once every other
// ShutDownWithDrain call and every Get has returned.
//
// Out of memory: an add that cannot allocate throws std::bad_alloc before it changes
// anything, and before it moves the caller's item in (in AddAll, the items before it stay
// added; with rate_limited and a limiter that keeps its own counts, its When was asked for
// every item before the lock was taken, so the items after the one that threw have a
// failure counted without being added, as a failed AddRateLimited has). It sets aside what
// its item will need later: room in every structure indexed by slot and, unless the item
// is delayed, a pinned place in its (priority, group), so that a lease's Done never throws
// (it allocates only for a delayed re-add that is due by then). A delayed item pins its
// place when it comes due; if that cannot allocate, the item stays waiting and the timer
// tries again 1 ms later (a ShutDown then drops it with the items not yet due). A delayed
// item whose timer cannot be made still waits, and sleeping Gets look for due items every
// millisecond until a later arming makes one.

#ifndef KWQ_PRIORITY_QUEUE_H_
#define KWQ_PRIORITY_QUEUE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/context.h"
#include "kwq/internal/check.h"
#include "kwq/internal/context_wake.h"
#include "kwq/internal/failure_counts.h"
#include "kwq/internal/hand_out_record.h"
#include "kwq/internal/indexed_heap.h"
#include "kwq/internal/key_table.h"
#include "kwq/internal/lease.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/pod_vector.h"
#include "kwq/internal/queue_metrics.h"
#include "kwq/internal/range_items.h"
#include "kwq/internal/ready_levels.h"
#include "kwq/internal/slot_fifo.h"
#include "kwq/internal/spin.h"
#include "kwq/internal/time_key.h"
#include "kwq/metrics.h"
#include "kwq/queue.h"
#include "kwq/rate_limiter.h"
#include "kwq/timer.h"

namespace kwq {

namespace internal {
struct QueuePeer;  // tests' access to internal state
}  // namespace internal

// How an add is queued (controller-runtime's AddOpts).
struct AddOpts {
  // Higher runs first. Any int; an add of a waiting item keeps the larger priority.
  int priority = 0;
  // The item becomes ready this long after the add; <= 0 means now. An add of a waiting
  // item keeps the earlier ready time. absl::InfiniteDuration() means never (until an
  // add with an earlier ready time).
  absl::Duration after = absl::ZeroDuration();
  // Also wait max(after, rate_limiter->When(item)) (which records a failure of the item
  // in the limiter). An add whose delay (`after`, or the backoff) is positive counts a retry in
  // the metrics, as controller-runtime's does, also one merged into an item already
  // ready, which does not wait.
  bool rate_limited = false;
};

template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class PriorityQueue {
 public:
  using Limiter = RateLimiter<T, Hash, Eq>;

  // QueueOptions' members (the same names, meanings and defaults: kwq/queue.h), then the
  // priority queue's own. Flat, not derived from QueueOptions, so that designated
  // initializers reach every member (C++ has none for a base's):
  //   Create({.name = "pods", .metrics = provider, .aging = absl::Seconds(30)})
  // Move-only.
  struct Options {
    std::string name = {};               // QueueOptions::name
    MetricsProvider* metrics = nullptr;  // QueueOptions::metrics
    Clock* clock = nullptr;              // QueueOptions::clock
    TimerService* timers = nullptr;      // QueueOptions::timers (Create checks its clock)
    int polling_workers = 0;             // QueueOptions::polling_workers
    // Delays of rate-limited adds; Forget and NumRequeues are its. nullptr (default):
    // DefaultControllerRateLimiter on `clock` (needs a copyable T).
    std::unique_ptr<Limiter> rate_limiter = nullptr;
    // Anti-starvation: an item ready for at least `aging` goes before every item that
    // became ready after it (see the order of hand-out above). Must be > 0;
    // absl::InfiniteDuration() (default) turns aging off and Get then never reads the clock for it.
    absl::Duration aging = absl::InfiniteDuration();
    // Fairness: when set, the ready items of one priority are handed out round-robin
    // across group(item) values (say, a hash of the namespace), FIFO within a group.
    // Called on every add, without the queue's lock (the value of the add that stored the
    // key is kept); must be a pure function of the item and must not call this queue. One
    // that throws ends the add before anything is added; in AddAll that is every item (it
    // is called for all of them first), and with rate_limited a limiter that keeps its own
    // counts was already asked When for the items before the one that threw, so they have
    // a failure counted without being added (as for a failed AddRateLimited).
    std::function<uint64_t(const T&)> group = nullptr;
  };

  // The right to process one item (kwq/internal/lease.h): move-only; item(), *, ->,
  // priority(), Done() (idempotent, also run by the destructor), active().
  using Lease = internal::Lease<PriorityQueue, T>;
  friend Lease;                       // calls Finish
  friend struct internal::QueuePeer;  // tests: the keys stored

  // Builds a queue. Without `timers`, delays run on TimerService::Default() (created on
  // the first delay), or for a manual clock (FakeClock) on a service of the queue's own
  // (QueueOptions::timers). Errors (InvalidArgument): aging <= 0; `timers` not running on
  // `clock` (a clock of your own that is not manual needs a service built on it); no
  // rate_limiter for a T that is not copyable; and that own service's errors
  // (FailedPrecondition for a manual clock that refuses observers).
  static absl::StatusOr<std::unique_ptr<PriorityQueue>> Create(Options options) {
    if (!(options.aging > absl::ZeroDuration())) {
      return absl::InvalidArgumentError(
          "PriorityQueue: aging must be > 0 (absl::InfiniteDuration() turns it off), got " +
          absl::FormatDuration(options.aging));
    }
    Clock* const clock = options.clock != nullptr ? options.clock : RealClock::Default();
    absl::StatusOr<std::unique_ptr<TimerService>> own =
        internal::OwnTimerService(clock, options.timers);
    if (!own.ok()) return own.status();
    std::unique_ptr<TimerService> own_timers = *std::move(own);
    if (own_timers != nullptr) options.timers = own_timers.get();
    if (absl::Status s = internal::CheckTimersClock("PriorityQueue", clock, options.timers);
        !s.ok()) {
      return s;
    }
    if (options.rate_limiter == nullptr) {
      if constexpr (std::is_copy_constructible_v<T>) {
        options.rate_limiter = DefaultControllerRateLimiter<T, Hash, Eq>(clock);
      } else {
        return absl::InvalidArgumentError(
            "PriorityQueue: a non-copyable item type needs an explicit rate_limiter");
      }
    }
    return std::unique_ptr<PriorityQueue>(
        new PriorityQueue(std::move(options), clock, std::move(own_timers)));
  }
  // Create with default options (fails only for a non-copyable T, which needs a
  // rate_limiter).
  static absl::StatusOr<std::unique_ptr<PriorityQueue>> Create() { return Create(Options{}); }

  // Shuts the queue down (dropping delayed items and stopping the timer, waiting for a
  // firing in progress). Leases must have ended: a check fails loudly otherwise, in every
  // build (the lease's Done would touch the freed queue).
  ~PriorityQueue() {
    // The delayed keys are dropped without listing them idle: the table is freed whole
    // below (evicting them one by one made destroying a queue with 1,000,000 keys delayed
    // take 129-137 ms instead of 27: priority_queue_bench's
    // BM_PriorityQueue_DestroyWithDelayed1M/0).
    ShutDown(/*keep_idle=*/false);
    metrics_.reset();
    internal::MutexLock lock(&mu_);
    KWQ_CHECK(in_flight_ == 0, "kwq::PriorityQueue destroyed while a Lease is active");
  }
  PriorityQueue(const PriorityQueue&) = delete;
  PriorityQueue& operator=(const PriorityQueue&) = delete;

  // Adds `item` with `opts` (see AddOpts and the promises above). Returns true when the
  // item was not waiting before (this call made it ready, delayed, or marked to run again
  // after its Done); false when it was already waiting (the add merged into it: larger
  // priority, earlier ready time) or the queue is shutting down. Never blocks on workers;
  // with rate_limited, calls the rate limiter's When first, without the queue's lock (or,
  // with a counting limiter, its WhenCounted under the lock: see Thread safety above).
  template <typename K>
  bool Add(K&& item, AddOpts opts = {}) {
    if constexpr (!std::is_same_v<std::remove_cvref_t<K>, T>) {
      return Add(T(std::forward<K>(item)), opts);  // convert once, not at every use
    } else {
      const Prep prep = Prepare(item, opts);  // outside the lock
      return AddUnderLock(ClockNeed(prep), [&](absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return size_t{AddLocked(std::forward<K>(item), prep, opts.priority, now)};
      });
    }
  }

  // Add(item, {.after = delay}): client-go's AddAfter.
  template <typename K>
  bool AddAfter(K&& item, absl::Duration delay) {
    return Add(std::forward<K>(item), AddOpts{.after = delay});
  }

  // Add(item, {.rate_limited = true}): client-go's AddRateLimited.
  template <typename K>
  bool AddRateLimited(K&& item) {
    return Add(std::forward<K>(item), AddOpts{.rate_limited = true});
  }

  // Adds every item of `items` (a container or other multi-pass range of T, or of values
  // convertible to T) with the same `opts`, under one lock acquisition. Returns how many
  // were not waiting before (as Add). Items of an rvalue container that owns them (one
  // with an allocator, a std::array, a built-in array), or of a range that yields
  // rvalues, are moved in; those of an lvalue, of a view (a span, a filter) or of any
  // other range (absl::Span) are copied. The range is iterated twice.
  template <typename Range>
  size_t AddAll(Range&& items, AddOpts opts = {}) {
    constexpr bool kMove = internal::MovesItems<Range>();
    std::vector<Prep> preps;
    if constexpr (requires { std::size(items); }) preps.reserve(std::size(items));
    absl::Duration longest = absl::ZeroDuration();
    for (auto&& item : items) {
      preps.push_back(Prepare(item, opts));
      longest = std::max(longest, ClockNeed(preps.back()));
    }
    // An item whose copy throws ends the batch; the items before it stay added (and
    // sleeping Gets are woken for them).
    return AddUnderLock(longest, [&](absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      size_t added = 0;
      size_t i = 0;
      for (auto&& item : items) {
        if constexpr (kMove) {
          added += AddLocked(std::move(item), preps[i++], opts.priority, now);
        } else {
          added += AddLocked(item, preps[i++], opts.priority, now);
        }
      }
      return added;
    });
  }

  // controller-runtime's AddWithOpts(opts, items...): AddAll of the arguments, in order.
  template <typename... Items>
  size_t AddWithOpts(const AddOpts& opts, Items&&... items) {
    const std::array<Prep, sizeof...(Items)> preps{Prepare(items, opts)...};
    absl::Duration longest = absl::ZeroDuration();
    for (const Prep& prep : preps) longest = std::max(longest, ClockNeed(prep));
    return AddUnderLock(longest, [&](absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      size_t added = 0;
      [[maybe_unused]] size_t i = 0;
      ((added += AddLocked(std::forward<Items>(items), preps[i++], opts.priority, now)), ...);
      return added;
    });
  }

  // The rate limiter's Forget: clears `item`'s failure history (call it on success).
  // Does not touch a waiting entry of the item. With a counting limiter the queue keeps
  // the counts (as RateLimitingQueue does, see kwq/rate_limiting_queue.h).
  void Forget(const T& item) {
    if (!Counted()) {
      limiter_->Forget(item);
      return;
    }
    internal::MutexLock lock(&mu_);
    if (!counts_) return;  // nothing counted yet
    const uint32_t slot = SlotOfLocked(item);
    if (slot != kNone) counts_->Forget(slot);
  }
  // The rate limiter (thread-safe). With a counting limiter the queue keeps the failure
  // counts, so the limiter's own NumRequeues and TrackedItems report nothing for its items.
  Limiter& rate_limiter() { return *limiter_; }

  // The rate limiter's NumRequeues: failures recorded for `item` since its last Forget
  // (saturates at INT_MAX).
  int NumRequeues(const T& item) {
    if (!Counted()) return limiter_->NumRequeues(item);
    internal::MutexLock lock(&mu_);
    if (!counts_) return 0;  // nothing counted yet
    const uint32_t slot = SlotOfLocked(item);
    if (slot == kNone) return 0;
    return static_cast<int>(std::min<int64_t>(
        counts_->FailuresLocked(slot, counts_->Now(), BusyLocked(slot)), INT_MAX));
  }

  // Blocks until an item is ready and returns its lease, or returns nullopt once the
  // queue is shut down and nothing is ready (during a drain: also none owed a run by a
  // lease in flight). Polls briefly before it sleeps (QueueOptions::polling_workers).
  std::optional<Lease> Get() {
    internal::MutexLock lock(&mu_);
    PromoteIfNoneReadyLocked();
    if (ready_.empty() && !shutting_down_) SpinLocked();
    while (ready_.empty()) {
      if (shutting_down_) {
        // During a drain, runs owed by leases in flight (items added again meanwhile) are
        // queued at their Done, which signals: wait for them, as Queue's Get does.
        if (draining_ == 0 || queued_ == 0) return std::nullopt;
      }
      WaitLocked();
    }
    return PopLocked();
  }

  // Returns a ready item's lease, or nullopt at once when none is ready.
  std::optional<Lease> TryGet() {
    internal::MutexLock lock(&mu_);
    PromoteIfNoneReadyLocked();
    if (ready_.empty()) return std::nullopt;
    return PopLocked();
  }

  // Like Get, and also returns nullopt when `ctx` is done (check ctx.IsCancelled() to
  // tell). A ready item wins over a done context. Registers a wake-up on `ctx` only when
  // it has to block; when that cannot allocate it does not throw, but sleeps in steps of
  // a millisecond and looks at `ctx` after each.
  std::optional<Lease> Get(const Context& ctx) {
    {
      internal::MutexLock lock(&mu_);
      PromoteIfNoneReadyLocked();
      if (!ready_.empty()) return PopLocked();
      if ((shutting_down_ && (draining_ == 0 || queued_ == 0)) || ctx.IsCancelled()) {
        return std::nullopt;
      }
    }
    // Gone on every way out, a throw included (WaitLocked reads a user's clock while
    // delayed items have no timer): it touches this queue (kwq/internal/context_wake.h).
    std::optional<internal::ContextWake> wake;
    const bool unwatched = !internal::ContextWake::TryEmplace(&wake, ctx, &mu_, &ready_cv_);
    std::optional<Lease> lease;
    internal::MutexLock lock(&mu_);
    while (ready_.empty() && !(shutting_down_ && (draining_ == 0 || queued_ == 0)) &&
           !ctx.IsCancelled()) {
      WaitLocked(unwatched ? kUnwatchedStep : absl::InfiniteDuration());
    }
    if (!ready_.empty()) lease.emplace(PopLocked());
    return lease;
  }

  // Items ready to be handed out. A delayed item counts from the timer firing for it (or
  // an Add, a Done of an item added again, or a Get or TryGet finding nothing else ready,
  // noticing it is due).
  size_t Len() const {
    internal::MutexLock lock(&mu_);
    return ready_.size();
  }
  // Items waiting to run without a delay: ready ones plus in-flight ones added again
  // with no delay (client-go's depth; the `depth` metric).
  size_t Depth() const {
    internal::MutexLock lock(&mu_);
    return queued_;
  }
  // Delayed items (by `after` or the rate limiter), including in-flight ones added again
  // with a delay (the `delayed` metric).
  size_t Waiting() const {
    internal::MutexLock lock(&mu_);
    return delayed_count_;
  }
  // Leases not yet ended.
  size_t InFlight() const {
    internal::MutexLock lock(&mu_);
    return in_flight_;
  }

  // Stops accepting adds, makes the delayed items already due ready and drops the others
  // (an in-flight item's delayed re-add is dropped at its Done), stops the timer (waiting for a
  // firing in progress) and wakes every blocked Get. Ready items, and in-flight items added again
  // with no delay, are still handed out. Ends a ShutDownWithDrain wait in progress. Idempotent.
  void ShutDown() { ShutDown(/*keep_idle=*/true); }

  // ShutDown (without aborting other drains), then blocks until every queued and
  // in-flight item is Done. Returns true when the queue drained, false when a ShutDown()
  // from another thread ended the wait. Workers must keep calling Get to drain queued
  // items. Delayed items not yet due are dropped, not waited for. A thread that holds a
  // Lease of this queue must not call it: it would wait for its own lease until a
  // ShutDown().
  bool ShutDownWithDrain() { return Drain(nullptr); }
  // ShutDownWithDrain bounded by `ctx`: the wait also ends, returning false, once `ctx`
  // is done (a deadline bounds a graceful shutdown). True when the queue drained, also
  // when `ctx` was done at the call but nothing was queued or in flight. A wait that ends
  // undrained leaves the queue shut down: adds refused, queued items still handed out,
  // and, unless another drain is still in progress (a context ends only its own drain,
  // a ShutDown() every one), Gets no longer wait for runs owed by leases in flight.
  // Leases still in flight end as usual, and must end before the queue is destroyed
  // (join the workers first; they still get what is queued). Throws std::bad_alloc,
  // before anything changes, when the wake-up on `ctx` cannot be registered.
  bool ShutDownWithDrain(const Context& ctx) { return Drain(&ctx); }

  // True from the first ShutDown or ShutDownWithDrain on; never false again.
  bool ShuttingDown() const {
    internal::MutexLock lock(&mu_);
    return shutting_down_;
  }

 private:
  // ShutDownWithDrain; `ctx` may be null (no bound).
  bool Drain(const Context* ctx) {
    // Before any lock (kwq/internal/context_wake.h); gone once the lock is released.
    std::optional<internal::ContextWake> wake;
    if (ctx != nullptr) wake.emplace(*ctx, &mu_, &drained_cv_);
    PendingTimer timer;
    uint64_t aborts;
    {
      internal::MutexLock lock(&mu_);
      timer = StopLocked(/*keep_idle=*/true);
      aborts = aborts_;  // a ShutDown() from now on ends this wait
      // Counted in the hold that shuts the queue down: a Get that finds it shut down
      // then also sees the drain, and waits for runs owed by leases in flight instead of
      // giving up on them (as Queue's drain does). A non-zero count seen under the lock
      // means a drain is under way: a Done from then on signals, and a ShutDown ends it.
      ++draining_;
    }
    timer.CancelSync();
    ready_cv_.SignalAll();
    internal::MutexLock lock(&mu_);
    while (queued_ + in_flight_ > 0 && aborts_ == aborts &&
           (ctx == nullptr || !ctx->IsCancelled())) {
      drained_cv_.Wait(&mu_);
    }
    // Gets waiting for an owed run stop waiting once no drain is left (one a ShutDown
    // or its context ended returns with runs still owed).
    if (--draining_ == 0) ready_cv_.SignalAll();
    return queued_ + in_flight_ == 0;
  }

  using Table = internal::KeyTable<T, Hash, Eq>;
  static constexpr uint32_t kNone = UINT32_MAX;

  // State bits of a stored key. kQueued and kDelayed exclude each other.
  static constexpr uint8_t kQueued = 1;      // ready (in a group), or to be at its Done
  static constexpr uint8_t kDelayed = 2;     // in delayed_, or to be at its Done
  static constexpr uint8_t kProcessing = 4;  // a lease is active
  static constexpr uint8_t kIdleListed = 8;  // the slot is in idle_ (it may be busy again)
  // As Queue's: idle keys kept in the table before the oldest is erased.
  static constexpr size_t kMaxIdle = 4096;

  // What an add computed before taking the lock.
  struct Prep {
    uint32_t hash;
    uint64_t group;
    absl::Duration after;  // including the rate limiter's delay (unless counted)
    bool rate_limited;
    bool counted;  // rate-limited with the queue's failure counts: the delay comes under mu_
  };

  // Per stored key: 16 bytes (the group key, where there is one, is kept apart:
  // group_keys_).
  struct SlotInfo {
    int priority;  // while waiting: the largest of the adds since the last Get
    // While the slot is owed a place among the ready items with no delay (kQueued and in
    // flight): the group of (priority, group key), pinned for it (ReadyLevels::Pin), so
    // that linking it at the Done cannot fail. Else kNoGroup: a delayed item pins its
    // group only when it comes due (TryPinLocked), so a delayed add makes no group.
    uint32_t group = kNoGroup;
    int64_t due;  // kProcessing | kDelayed: ready time (ReadyKey) of the re-add
  };
  static_assert(sizeof(SlotInfo) == 16);
  static constexpr uint32_t kNoGroup = internal::ReadyLevels::kNoGroup;

  enum class WakeKind { kNone, kOne, kAll };

  PriorityQueue(Options options, Clock* clock, std::unique_ptr<TimerService> own_timers)
      : own_timers_(std::move(own_timers)),
        clock_(clock),
        limiter_(std::move(options.rate_limiter)),
        counting_(limiter_->Counting()),
        group_fn_(std::move(options.group)),
        aging_(options.aging != absl::InfiniteDuration()),
        // Rounded up: a sub-nanosecond aging must not truncate to "aged at once". Exact
        // past 292 years (an int64 count saturated there: items aged too early).
        aging_ns_(internal::SpanNanos(options.aging)),
        timers_(options.timers),
        max_pollers_(internal::MaxPollers(options.polling_workers)) {
    metrics_ = internal::QueueMetricsRecorder::Make(options.metrics, options.name, options.clock,
                                                    options.timers, /*by_priority=*/true);
  }

  // Times as ns since the Unix epoch (kwq/internal/time_key.h): current times round
  // down, due times up, so nothing is due before its time.
  static int64_t ToKey(absl::Time now) { return internal::NowKey(now); }
  static int64_t ReadyKey(absl::Time due) { return internal::ReadyKey(due); }
  static absl::Time FromKey(int64_t key) { return internal::TimeOfKey(key); }

  Prep Prepare(const T& item, const AddOpts& opts) {
    Prep prep{Table::HashOf(item), group_fn_ ? group_fn_(item) : 0, opts.after, opts.rate_limited,
              opts.rate_limited && Counted()};
    if (opts.rate_limited && !prep.counted) {
      prep.after = std::max(prep.after, limiter_->When(item));
      if (!hint_limiter_.load(std::memory_order_relaxed)) {
        hint_limiter_.store(true, std::memory_order_relaxed);
      }
    }
    return prep;
  }

  // Whether the queue keeps the failure counts (the limiter counts by failure number).
  bool Counted() const {
    return counting_.by_count && counting_.reports_count && counting_.clock != nullptr;
  }

  // Starts keeping failure counts, at the first counted rate-limited add (a queue that
  // never rate-limits pays nothing for them).
  // Throws std::bad_alloc with nothing changed.
  void StartCountingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto counts =
        std::make_unique<internal::FailureCounts>(counting_.idle_horizon, counting_.clock);
    // Every slot the per-slot structures have room for (ReserveSlotsLocked), so that the
    // slot of the key an add is about to store is covered too.
    counts->Reserve(static_cast<uint32_t>(std::max<size_t>(table_.slot_limit(), info_.size())));
    counts_ = std::move(counts);
  }

  // How far ahead an add looks, for NowForAddLocked: a counted rate-limited add learns
  // its delay only under the lock, so it always needs the clock.
  static absl::Duration ClockNeed(const Prep& prep) {
    return prep.counted ? absl::InfiniteDuration() : prep.after;
  }

  // The slot of `item`: found by address when it is the item this queue last handed to
  // the calling thread (kwq/internal/hand_out_record.h), else looked up; kNone if absent.
  uint32_t SlotOfLocked(const T& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t slot = LeasedSlotLocked(item);
    return slot != kNone ? slot : table_.Find(item);
  }
  // The same with the item's hash (Table::HashOf) already computed.
  uint32_t SlotOfLocked(const T& item, uint32_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t slot = LeasedSlotLocked(item);
    return slot != kNone ? slot : table_.Find(item, hash);
  }
  // Whether `slot`'s key is queued, delayed or in flight (then its failure count cannot
  // lapse, see FailureCounts).
  bool BusyLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return table_.state(slot) & (kQueued | kDelayed | kProcessing);
  }
  uint32_t LeasedSlotLocked(const T& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t last = hand_outs_.LastSlot();
    if (last != internal::HandOutRecord::kNone && (table_.state(last) & Table::kLive) &&
        &table_.item(last) == &item) {
      return last;
    }
    return kNone;
  }

  // After a hand-out, once rate-limited adds are in use: names the item that would be
  // handed out next (ignoring aging: it is only a hint) to the limiter, which prefetches
  // its entry (RateLimiter::Prefetch, as RateLimitingQueue does). Under mu_: the limiter
  // only try-locks its own lock, so this cannot wait, and Get keeps returning its lease
  // without a move.
  void HintNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!hint_limiter_.load(std::memory_order_relaxed) || ready_.empty()) return;
    // Only a hint: a custom limiter's Prefetch that throws is dropped (it came after the
    // hand-out's state change, and left an item counted in flight with no lease).
    try {
      limiter_->Prefetch(table_.hash(ready_.Next()));
    } catch (...) {
    }
  }

  // Every add's frame: under mu_, makes due delayed items ready (NowForAddLocked, with
  // the clock read if `clock_need` or the queue needs it), runs `add(now)` (returns how
  // many items it added) and wakes sleeping Gets for every item made ready, also when
  // `add` throws (the exception goes on after the wake-ups): an item the add's promotion
  // made ready, or one an add before the throw queued, is never left beside a sleeping
  // Get whose timer has already fired.
  template <typename AddFn>
  size_t AddUnderLock(absl::Duration clock_need, AddFn add) {
    size_t added = 0;
    WakeKind wake;
    std::exception_ptr thrown;
    {
      internal::MutexLock lock(&mu_);
      const uint64_t ready_before = next_seq_;
      try {
        added = add(NowForAddLocked(clock_need));
      } catch (...) {
        thrown = std::current_exception();
      }
      wake = WakeLocked(next_seq_ - ready_before);
    }
    Notify(wake);
    if (thrown) std::rethrow_exception(thrown);
    return added;
  }

  // Reads the clock when an add needs it (for a delay, for aging's ready times, or when
  // items are delayed) and first makes every due delayed item ready, so that ready order
  // follows ready time. Returns the time read (InfinitePast, unused, when not read).
  absl::Time NowForAddLocked(absl::Duration longest_after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (longest_after > absl::ZeroDuration() || aging_ || !delayed_.empty()) {
      const absl::Time now = clock_->Now();
      last_now_ = now;
      PromoteDueLocked(now);
      return now;
    }
    return absl::InfinitePast();  // unused
  }

  // Stores or merges one add. `now` is the clock (read when the add needs it).
  // Out of memory: everything that allocates comes before the add changes anything, and
  // throws std::bad_alloc; the item is moved in only once nothing else can fail for
  // memory. A counting limiter whose WhenCounted throws undoes the add; the failure it
  // counted stays for a key the queue held, and a new key is not stored (the caller keeps
  // the item).
  template <typename K>
  bool AddLocked(K&& item, const Prep& prep, int priority, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) {
      // A counted failure of a known item still counts, as a limiter called with the item
      // would count it, whether or not counting had started.
      if (prep.counted) {
        if (const uint32_t known = SlotOfLocked(item, prep.hash); known != kNone) {
          if (!counts_) StartCountingLocked();
          limiter_->WhenCounted(counts_->Record(known, counts_->Now(), BusyLocked(known)));
        }
      }
      return false;
    }
    uint32_t slot = prep.counted ? SlotOfLocked(item, prep.hash) : table_.Find(item, prep.hash);
    const bool fresh = slot == Table::kNone;
    const uint8_t state = fresh ? 0 : table_.state(slot);
    // Every allocation first (each may throw std::bad_alloc): room for the key's slot in
    // the per-slot structures, the failure counts, and the group the add's link goes to,
    // pinned (ReadyLevels::Pin) with the pin it replaces given back later. Then the key is
    // stored (its move is the last step that can fail, so a caller's item is not taken
    // by an add that fails).
    if (fresh) ReserveSlotsLocked(table_.slot_limit_after_insert());
    if (prep.counted && !counts_) StartCountingLocked();
    // A delayed add pins nothing (its item pins when it comes due); one that may be
    // immediate pins, and gives the pin back if the limiter delays it after all.
    uint32_t pinned = kNoGroup;
    const bool maybe_now = prep.after <= absl::ZeroDuration();
    if (state & kQueued) {
      if (priority > info_[slot].priority) {  // a raise: a place at the new priority
        const bool linked = !(state & kProcessing);
        pinned = ready_.Pin(priority, GroupKeyLocked(slot), /*late=*/linked);
      }
    } else if (maybe_now) {  // idle, in flight, or delayed: it may become ready (or owed)
      const int p = (state & kDelayed) ? std::max(priority, info_[slot].priority) : priority;
      pinned = ready_.Pin(p, fresh ? prep.group : GroupKeyLocked(slot));
    }
    absl::Duration after = prep.after;
    if (fresh) {
      // A key the queue does not hold has no failures: its limiter is asked before the
      // item is moved in, so a limiter that throws leaves the caller's item, and the add
      // records nothing (no key holds the count).
      try {
        if (prep.counted) after = std::max(after, limiter_->WhenCounted(0));
        slot = table_.Insert(std::forward<K>(item), prep.hash, 0);
      } catch (...) {
        if (pinned != kNoGroup) ready_.Unpin(pinned);
        throw;
      }
      if (counts_) {  // room reserved: cannot fail
        counts_->Reset(slot);
        if (prep.counted) counts_->Record(slot, counts_->Now(), /*busy=*/false);  // 0 before
      }
      info_[slot] = SlotInfo{.priority = priority, .due = 0};
      if (group_fn_) group_keys_[slot] = prep.group;
    } else {
      if (counts_ && !BusyLocked(slot)) {
        counts_->EndIdle(slot);  // a count that lapsed while idle goes before it is busy
      }
      if (prep.counted) {
        const int64_t failures = counts_->Record(slot, counts_->Now(), BusyLocked(slot));
        try {
          after = std::max(after, limiter_->WhenCounted(failures));
        } catch (...) {  // a limiter of the user's: the add does not happen (the failure counts)
          if (pinned != kNoGroup) ready_.Unpin(pinned);
          throw;
        }
      }
    }
    const bool immediate = after <= absl::ZeroDuration();
    if (!immediate && !(state & kQueued) && pinned != kNoGroup) {  // delayed after all
      ready_.Unpin(pinned);
      pinned = kNoGroup;
    }
    if (!immediate && metrics_) metrics_->OnRetry();  // controller-runtime: adds that wait
    const int64_t due = immediate ? 0 : ReadyKey(now + after);
    SlotInfo& info = info_[slot];
    if (state & kQueued) {  // waiting with no delay: keep its ready time, raise priority
      if (pinned != kNoGroup) {
        if (metrics_) metrics_->OnReprioritize(info.priority, priority);
        info.priority = priority;
        if (state & kProcessing) {
          ready_.Unpin(std::exchange(info.group, pinned));
        } else {
          ready_.Link(slot, pinned, UnlinkLocked(slot));
          ready_hint_.store(ready_.size(), std::memory_order_relaxed);
        }
      }
      return false;
    }
    if (state & kDelayed) {  // waiting for its time: earliest time, largest priority
      info.priority = std::max(info.priority, priority);
      if (immediate) {
        info.group = pinned;  // pinned at the larger priority
        if (!(state & kProcessing)) delayed_.Remove(slot);
        DelayedToQueuedLocked(slot);
        if (!(state & kProcessing)) MakeReadyLocked(slot, now);
      } else if (state & kProcessing) {
        info.due = std::min(info.due, due);
      } else if (due < delayed_.KeyOf(slot)) {
        delayed_.Update(slot, due);
        ArmLocked();
      }
      return false;
    }
    // Not waiting: idle, or in flight and not added since its Get.
    info.priority = priority;
    info.group = pinned;
    if (immediate) {
      table_.state(slot) |= kQueued;
      ++queued_;
      if (metrics_) metrics_->OnAdd(slot, priority);
      if (!(state & kProcessing)) MakeReadyLocked(slot, now);
    } else {
      table_.state(slot) |= kDelayed;
      ++delayed_count_;
      if (metrics_) metrics_->OnDelayed(+1);
      if (state & kProcessing) {
        info.due = due;
      } else {
        delayed_.Push(slot, due);
        ArmLocked();
      }
    }
    return true;
  }

  // Options::group(item) of the key in `slot`; 0 without Options::group.
  uint64_t GroupKeyLocked(uint32_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return group_fn_ ? group_keys_[slot] : 0;
  }

  // Makes room, in every structure indexed by slot, for slots below `limit` (rounded up
  // to a chunk of 4,096), so that moving a slot between them never allocates. Throws
  // std::bad_alloc; what it grew stays grown, unused.
  void ReserveSlotsLocked(size_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (info_.size() >= limit) return;
    constexpr size_t kChunk = 4096;
    const size_t slots = (limit + kChunk - 1) / kChunk * kChunk;
    ready_.ReserveSlots(slots);
    delayed_.Reserve(slots);
    if (aging_) aged_.Reserve(slots);
    idle_.ReserveFor(slots);  // each slot is listed at most once
    if (counts_) counts_->Reserve(static_cast<uint32_t>(slots));
    if (group_fn_) group_keys_.resize(slots, 0);
    info_.resize(slots, SlotInfo{});  // last: it says the others are done
  }

  // kDelayed -> kQueued bookkeeping (the caller moves the slot between structures).
  void DelayedToQueuedLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint8_t& state = table_.state(slot);
    state = static_cast<uint8_t>((state & ~kDelayed) | kQueued);
    --delayed_count_;
    ++queued_;
    if (metrics_) {
      metrics_->OnDelayed(-1);
      metrics_->OnAdd(slot, info_[slot].priority);
    }
  }

  // A Get or TryGet that finds nothing ready makes due delayed items ready itself (one
  // clock read), as DelayingQueue's do: a worker does not miss work that is due while the
  // timer is late (its service busy with another callback), and a ready item wins over a
  // done context in Get(ctx) also then. A Get that finds items ready does not look (no
  // clock read, and no group to make: a hand-out allocates nothing): while the timer is
  // late, a due item waits behind the ready ones, whatever their priority (the order
  // section above).
  // The caller takes one of the items made ready; sleeping Gets are woken for the rest
  // (the late timer, finding nothing left to move, would wake nobody).
  void PromoteIfNoneReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ready_.empty() || delayed_.empty()) return;
    const uint64_t ready_before = next_seq_;
    PromoteDueLocked(clock_->Now());
    const uint64_t made_ready = next_seq_ - ready_before;
    if (made_ready > 1) Notify(WakeLocked(made_ready - 1));
  }

  // Makes every delayed item due at `now` ready, in ready-time order, with its ready
  // time as the time it became ready. Never throws: an item whose group cannot be made
  // (out of memory) stays delayed, with the rest, and the timer tries again
  // kStarvedRetry later (ArmLocked), not at once.
  void PromoteDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t now_key = ToKey(now);
    promote_starved_ = false;
    // kNeverKey never comes due, also once `now` saturates to it (past year 2262).
    while (!delayed_.empty() && delayed_.TopKey() <= now_key &&
           delayed_.TopKey() != internal::kNeverKey) {
      const uint32_t slot = delayed_.TopId();
      if (!TryPinLocked(slot)) {
        promote_starved_ = true;
        starved_retry_ = RetryKey(now_key);
        return;
      }
      const absl::Time due = FromKey(delayed_.TopKey());
      delayed_.Pop();
      DelayedToQueuedLocked(slot);
      MakeReadyLocked(slot, due);
    }
  }

  // Pins the group of a delayed slot about to become ready (its info_.group). False,
  // with nothing changed, when the group cannot be made for want of memory.
  bool TryPinLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SlotInfo& info = info_[slot];
    try {
      info.group = ready_.Pin(info.priority, GroupKeyLocked(slot));
    } catch (const std::bad_alloc&) {
      return false;
    }
    return true;
  }
  static constexpr absl::Duration kStarvedRetry = absl::Milliseconds(1);
  // kStarvedRetry after `now_key`, saturating (a clock past about the year 2262 reads the
  // largest key: the retry then waits for a Get or an add).
  static int64_t RetryKey(int64_t now_key) {
    const int64_t retry_ns = absl::ToInt64Nanoseconds(kStarvedRetry);
    return now_key > std::numeric_limits<int64_t>::max() - retry_ns ? internal::kNeverKey
                                                                    : now_key + retry_ns;
  }

  // Puts a kQueued slot that is not in flight into the ready structures, into the group
  // pinned for it. Allocates nothing.
  void MakeReadyLocked(uint32_t slot, absl::Time ready_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ready_.Link(slot, std::exchange(info_[slot].group, kNoGroup),
                static_cast<int64_t>(next_seq_++));
    ready_hint_.store(ready_.size(), std::memory_order_relaxed);
    if (aging_) aged_.Push(slot, ReadyKey(ready_at));
  }

  // Takes a ready `slot` out of the ready items (not out of aged_); returns its ready
  // sequence.
  int64_t UnlinkLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t seq = ready_.Unlink(slot);
    ready_hint_.store(ready_.size(), std::memory_order_relaxed);
    return seq;
  }

  // Whether an item ready at `ready_key` is aged at `now_key` (now - ready >= aging),
  // without overflow for any two keys.
  bool Aged(int64_t now_key, int64_t ready_key) const {
    return internal::AtLeastApart(ready_key, now_key, aging_ns_);
  }
  int64_t AgingNowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    try {
      return ToKey(clock_->Now());
    } catch (...) {
      WakeNextLocked();
      throw;
    }
  }

  // Hands out the next ready item (ready_ must not be empty). A clock that throws (read
  // for aging) throws out of it with nothing taken, after waking a sleeping Get for the
  // item: this caller may have been the Get signalled for it, or the one that made it
  // ready (PromoteIfNoneReadyLocked wakes others only for the rest).
  Lease PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint32_t slot;
    if (aging_ && Aged(AgingNowLocked(), aged_.TopKey()) && aged_.TopId() != ready_.Next()) {
      slot = aged_.TopId();  // out of turn: no group's turn moves on
      ready_.Unlink(slot);
    } else {  // in turn (also an aged item that is the one served next: its group moves on)
      slot = ready_.PopNext();
      PrefetchUpcomingLocked();
    }
    ready_hint_.store(ready_.size(), std::memory_order_relaxed);
    if (aging_) aged_.Remove(slot);
    uint8_t& state = table_.state(slot);
    state = static_cast<uint8_t>((state & ~kQueued) | kProcessing);
    // The last owed run taken during a drain: the other Gets waiting for it stop waiting.
    if (--queued_ == 0 && draining_ > 0) ready_cv_.SignalAll();
    WakeNextLocked();
    ++in_flight_;
    if (metrics_) metrics_->OnGet(slot, info_[slot].priority);
    HintNextLocked();
    if (counts_) hand_outs_.Record(slot);
    return Lease(this, slot, &table_.item(slot), info_[slot].priority);
  }

  // Prefetches the lines (position in ready_, SlotInfo, state byte and key) of the entry
  // kPrefetchAhead places behind the front of the FIFO of the group served next: with one
  // group per priority the (kPrefetchAhead + 1)-th hand-out from now, later with fairness
  // groups. So a drain's cache misses overlap: items of one priority lie scattered over
  // the key table when priorities are mixed, and each hand-out's misses, one after
  // another, made a drain several times slower than with one priority (docs/benchmarks.md,
  // "Memory per key of the other queues").
  static constexpr size_t kPrefetchAhead = 8;
  void PrefetchUpcomingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t ahead = ready_.Upcoming(kPrefetchAhead);
    if (ahead == internal::ReadyLevels::kNoSlot) return;
    ready_.PrefetchPosition(ahead);
    __builtin_prefetch(&info_[ahead], 1);
    table_.PrefetchSlot(ahead);
  }

  // ShutDown(); `keep_idle` false (the destructor only) drops the delayed keys without
  // listing them idle or evicting them.
  void ShutDown(bool keep_idle) {
    PendingTimer timer;
    {
      // Signalled under mu_: a drainer that then returns may destroy the queue at once.
      internal::MutexLock lock(&mu_);
      timer = StopLocked(keep_idle);
      ++aborts_;
      ready_cv_.SignalAll();
      drained_cv_.SignalAll();
    }
    timer.CancelSync();
  }

  // A lease ended: queue the item again if it was added meanwhile.
  void Finish(uint32_t slot) {
    {
      internal::MutexLock lock(&mu_);
      const uint64_t ready_before = next_seq_;
      uint8_t& state = table_.state(slot);
      // Read before anything changes, and never thrown out of a Done: a user's clock that
      // throws gives the time an add last read (the re-add's own, when aging or a delay
      // made it read one). A throw here left the lease ended and its re-add neither ready
      // nor delayed, and a drain waited for ever; the distant past instead made the item
      // aged at once, ahead of every priority.
      absl::Time now = last_now_;
      if (state & (kQueued | kDelayed)) {
        try {
          now = clock_->Now();
          last_now_ = now;
        } catch (...) {
        }
      }
      state &= ~kProcessing;
      --in_flight_;
      if (metrics_) metrics_->OnDone(slot);
      if (state & (kQueued | kDelayed)) {
        PromoteDueLocked(now);
        if (state & kQueued) {
          MakeReadyLocked(slot, now);
        } else if (shutting_down_) {  // a delayed re-add: dropped like delayed items
          state &= ~kDelayed;
          --delayed_count_;
          if (metrics_) metrics_->OnDelayed(-1);
          KeepIdleLocked(slot);
        } else if (info_[slot].due <= ToKey(now) && info_[slot].due != internal::kNeverKey &&
                   TryPinLocked(slot)) {
          DelayedToQueuedLocked(slot);
          MakeReadyLocked(slot, now);
        } else {  // not due yet, or due with no memory for its group: waits (delayed_ has room)
          if (info_[slot].due <= ToKey(now) && info_[slot].due != internal::kNeverKey) {
            promote_starved_ = true;
            starved_retry_ = RetryKey(ToKey(now));
          }
          delayed_.Push(slot, info_[slot].due);
          ArmLocked();
        }
      } else {
        KeepIdleLocked(slot);
      }
      // Both signals under mu_: this lease already counts as ended, so once mu_ is free
      // another worker may take the re-added item and end it, a drain may return and
      // the owner may destroy the queue (its condition variables with it). Queue::Finish
      // signals after unlocking because it counts its lease as ended only after that.
      Notify(WakeLocked(next_seq_ - ready_before));
      if (draining_ > 0 && queued_ + in_flight_ == 0) drained_cv_.SignalAll();
    }
  }

  // Lists a slot that just went idle and erases the oldest idle keys beyond kMaxIdle (in
  // groups: up to kMaxIdle + 15 may be listed).
  void KeepIdleLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (counts_) counts_->Touch(slot);  // its failure count's idle horizon starts now
    uint8_t& state = table_.state(slot);
    if (!(state & kIdleListed)) {
      state |= kIdleListed;
      idle_.push_back(slot);
    }
    // Erased 16 at a time once that many are over the limit, with their index entries
    // prefetched first so the cache misses overlap (see Queue::EvictLocked).
    constexpr size_t kGroup = 16;
    if (idle_.size() < std::max(kMaxIdle, idle_floor_) + kGroup) return;
    uint32_t group[kGroup];
    size_t n = 0;
    const int64_t now = counts_ ? counts_->Now() : 0;
    // A key with a failure count that has not lapsed stays: back to the end of the list.
    // At most 2 * kGroup looks per call, and after a pass that erased nothing the next
    // waits for a batch more idle keys (idle_floor_), so kept keys are not rescanned on
    // every Done.
    for (size_t looked = 0; idle_.size() > kMaxIdle && n < kGroup && looked < 2 * kGroup;
         ++looked) {
      const uint32_t old = idle_.front();
      idle_.pop_front();
      uint8_t& old_state = table_.state(old);
      old_state &= ~kIdleListed;
      if (!(old_state & (kQueued | kDelayed | kProcessing))) {
        if (counts_ && counts_->Held(old, now)) {
          old_state |= kIdleListed;
          idle_.push_back(old);
          continue;
        }
        table_.Prefetch(old);
        group[n++] = old;
      }
    }
    for (size_t i = 0; i < n; ++i) table_.Erase(group[i]);
    idle_floor_ = n == 0 ? idle_.size() : 0;
    // The next group goes about kGroup Dones from now: its first reads (state bytes and
    // stored hashes, cold since the keys went idle kMaxIdle Dones ago, and scattered when
    // priorities are mixed) are fetched meanwhile instead of one after another then.
    const size_t next = idle_.CopyFront(group, kGroup);
    for (size_t i = 0; i < next; ++i) table_.PrefetchStateAndHash(group[i]);
  }

  // Before a Get sleeps, it polls (without the lock) for a short while, as Queue's: up to
  // max_pollers_ Gets at a time poll at length (QueueOptions::polling_workers), any other
  // polls briefly. Every Get that sleeps is woken by the add that makes an item ready for
  // it (WakeLocked), so how long it polled changes only what its wake-up costs.
  void SpinLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.Unlock();
    const bool at_length = internal::EnterLongPoll(spinners_, max_pollers_);
    internal::PollUntil([this] { return ready_hint_.load(std::memory_order_relaxed) != 0; },
                        at_length ? internal::kGetPolls : internal::kBriefPolls);
    if (at_length) spinners_.fetch_sub(1, std::memory_order_relaxed);
    mu_.Lock();
  }

  // Blocks one Get on ready_cv_. Each Signal wakes exactly one blocked waiter, which
  // then consumes one unit of signaled_. While delayed items have no timer (it could not
  // be made: out of memory, see ArmLocked), the wait ends every kNoTimerPoll, and the
  // Get makes due items ready itself (PromoteIfNoneReadyLocked).
  // Sleeps on ready_cv_ for at most `step` (a Get(ctx) whose wake-up on its context
  // could not be made looks at it every kUnwatchedStep). A wait that ends unsignalled may
  // consume a unit of signaled_ (see Queue::WaitLocked): only extra wake-ups follow.
  void WaitLocked(absl::Duration step = absl::InfiniteDuration())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++waiters_;
    if (timer_ == 0 && !delayed_.empty() && !shutting_down_) step = std::min(step, kNoTimerPoll);
    if (step != absl::InfiniteDuration()) {
      ready_cv_.WaitFor(&mu_, step);
    } else {
      ready_cv_.Wait(&mu_);
    }
    --waiters_;
    if (signaled_ > 0) --signaled_;
    if (timer_ == 0 && !delayed_.empty() && !shutting_down_) {
      ArmLocked();  // memory may be back
      PromoteIfNoneReadyLocked();
    }
  }
  static constexpr absl::Duration kNoTimerPoll = absl::Milliseconds(1);
  static constexpr absl::Duration kUnwatchedStep = absl::Milliseconds(1);

  // How to wake blocked Gets for `made_ready` newly ready items: one Signal per sleeping
  // worker not yet signalled, and none while the Gets polling at length (SpinLocked) are
  // at least as many as the ready items: as Queue's NeedWakeLocked, each poller takes an
  // item without a wake-up call, and a Get that takes an item while more are ready wakes
  // the next sleeper (WakeNextLocked). Nothing is left with nobody to take it: a poller
  // counted here, once it stops polling, takes mu_ and looks at ready_ after this holder
  // has released it; one that has already left the count did so before it took mu_ and
  // went to sleep, and this holder, having taken mu_ after it, sees the count without it.
  WakeKind WakeLocked(uint64_t made_ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (made_ready == 0 || waiters_ <= signaled_) return WakeKind::kNone;
    const int polling = spinners_.load(std::memory_order_relaxed);
    if (polling > 0 && ready_.size() <= static_cast<size_t>(polling)) return WakeKind::kNone;
    if (made_ready == 1) {
      ++signaled_;
      return WakeKind::kOne;
    }
    signaled_ = waiters_;
    return WakeKind::kAll;
  }
  // After a Get took an item: wakes one sleeping Get when more items are ready and no
  // signal is on its way to one already (a poller's add skipped the wake, WakeLocked).
  void WakeNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ready_.empty() || waiters_ <= signaled_) return;
    ++signaled_;
    ready_cv_.Signal();
  }
  void Notify(WakeKind wake) {
    if (wake == WakeKind::kOne) ready_cv_.Signal();
    if (wake == WakeKind::kAll) ready_cv_.SignalAll();
  }

  // The timer service, TimerService::Default() unless the options named one.
  TimerService* TimersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (timers_ == nullptr) timers_ = &TimerService::Default();
    return timers_;
  }

  // Arms (or moves) the one timer to the earliest delayed ready time, if that is earlier
  // than the time it is armed for (as DelayingQueue's). Never throws: called where
  // nothing may (a lease's Done, the timer's firing) and after an add has changed state.
  // A timer that cannot be made (std::bad_alloc) leaves timer_ at 0: the next arming
  // tries again, and meanwhile sleeping Gets look for due items every kNoTimerPoll.
  void ArmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (delayed_.empty() || shutting_down_) return;
    // Due items left for want of memory: again a little later, not at once (a timer at a
    // past time would fire again at once, for as long as memory lacks).
    const int64_t next =
        promote_starved_ ? std::max(delayed_.TopKey(), starved_retry_) : delayed_.TopKey();
    if (timer_ != 0) {
      if (next >= armed_for_) return;
      // If Reschedule fails the timer is firing right now; that Fire re-arms under mu_.
      if (TimersLocked()->Reschedule(timer_, FromKey(next))) armed_for_ = next;
      return;
    }
    try {
      timer_ = TimersLocked()->Schedule(FromKey(next), [this] { Fire(); });
      armed_for_ = next;
      arm_failed_ = false;
    } catch (const std::bad_alloc&) {
      timer_ = 0;
      if (!arm_failed_) {  // once, not at every retry (the Gets retry)
        arm_failed_ = true;
        signaled_ = waiters_;
        ready_cv_.SignalAll();  // sleeping Gets start looking for due items themselves
      }
    }
  }

  // Timer callback: makes every due item ready, re-arms, and wakes workers. Unlike
  // DelayingQueue's, it does all its work (signals included) under mu_, so once
  // StopLocked has run, a Fire either has not taken mu_ yet (then it is the pending
  // timer's callback, and CancelSync waits for it) or no longer touches the queue.
  void Fire() {
    internal::MutexLock lock(&mu_);
    if (shutting_down_) return;
    timer_ = 0;  // this timer has fired
    const uint64_t ready_before = next_seq_;
    try {
      PromoteDueLocked(clock_->Now());
    } catch (...) {
      // A user's clock that throws: the delayed items have no timer now. The Gets asleep
      // wake and, finding none, re-arm it and look for due items themselves (WaitLocked);
      // they slept on beside due items.
      ready_cv_.SignalAll();
      throw;
    }
    ArmLocked();
    const WakeKind wake = WakeLocked(next_seq_ - ready_before);
    if (wake == WakeKind::kOne) ready_cv_.Signal();
    if (wake == WakeKind::kAll) ready_cv_.SignalAll();
  }

  // A timer taken from timer_ by StopLocked, to cancel after releasing mu_.
  struct PendingTimer {
    TimerService* service = nullptr;
    TimerId id = 0;
    // After it returns, the timer's Fire is not running and never will.
    void CancelSync() const {
      if (id != 0) service->CancelSync(id);
    }
  };

  // Starts the shutdown: no more adds; delayed items already due made ready (as the
  // timer would have, had it fired in time), the others dropped. Returns the pending
  // timer, which the caller cancels with CancelSync after releasing mu_ (a running Fire
  // needs mu_ to finish).
  // Stops adds, makes the due delayed items ready and drops the others: listed idle when
  // `keep_idle` (evicted down to the idle allowance as they are listed), else left for the
  // destructor to free with the table. Returns the timer to cancel after unlocking.
  PendingTimer StopLocked(bool keep_idle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!shutting_down_ && !delayed_.empty()) {
      try {
        PromoteDueLocked(clock_->Now());
      } catch (...) {  // a user's clock that throws: the due items are dropped with the rest
      }
    }
    shutting_down_ = true;
    const PendingTimer timer{timers_, timer_};
    timer_ = 0;
    const size_t dropped = delayed_.size();
    // In the heap's order, not the ready order: which dropped keys the idle allowance
    // keeps is arbitrary either way, and popping one by one cost a sift each.
    if (keep_idle) {
      delayed_.Clear([this](uint32_t slot) {
        mu_.AssertHeld();  // the lambda runs here, under mu_
        table_.state(slot) &= ~kDelayed;
        KeepIdleLocked(slot);
      });
    } else {  // the destructor's: the keys' states are freed with the table unread
      delayed_.Clear([](uint32_t) {});
    }
    delayed_count_ -= dropped;
    if (metrics_) {
      for (size_t i = 0; i < dropped; ++i) metrics_->OnDelayed(-1);
    }
    return timer;
  }

  // Create's timer service on clock_ when the options named none and clock_ is manual;
  // first, so it outlives everything that schedules on it.
  const std::unique_ptr<TimerService> own_timers_;  // I, may be null
  Clock* const clock_;                              // I
  const std::unique_ptr<Limiter> limiter_;          // I, thread-safe
  // Set by the first rate-limited add: from then on hand-outs name the next item to the
  // limiter (HintNextLocked). Until then a hand-out pays one relaxed load for it.
  std::atomic<bool> hint_limiter_{false};
  const typename Limiter::FailureCounting counting_;  // I: limiter_->Counting()
  // With a counting limiter (Counted()), from the first rate-limited add on: each key's
  // failure count, by slot (reset when a key is stored); else nullptr. And the hand-outs
  // to each thread, so a leased item passed back is found by address.
  std::unique_ptr<internal::FailureCounts> counts_ ABSL_GUARDED_BY(mu_);
  const internal::HandOutRecord hand_outs_;
  const std::function<uint64_t(const T&)> group_fn_;  // I, may be empty
  const bool aging_;                                  // I: aging is on
  const uint64_t aging_ns_;                           // I (kNeverSpan: never)

  mutable internal::Mutex mu_;
  internal::CondVar ready_cv_;    // an item became ready, or shutdown
  internal::CondVar drained_cv_;  // nothing queued or in flight while draining, or abort
  TimerService* timers_ ABSL_GUARDED_BY(mu_);  // nullptr until the first delay: Default()
  Table table_ ABSL_GUARDED_BY(mu_);
  // Per slot. Grows with realloc (kwq/internal/pod_vector.h): a std::vector would copy
  // itself at each doubling and leave the old blocks resident.
  internal::PodVector<SlotInfo> info_ ABSL_GUARDED_BY(mu_);
  // Per slot, with Options::group only (without it every key's group key is 0): the
  // key's Options::group(item).
  internal::PodVector<uint64_t> group_keys_ ABSL_GUARDED_BY(mu_);
  // kIdleListed slots, oldest first; room for every slot (ReserveSlotsLocked).
  internal::SlotFifo idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_floor_ ABSL_GUARDED_BY(mu_) = 0;  // see KeepIdleLocked

  // The ready items, in serving order (kwq/internal/ready_levels.h).
  internal::ReadyLevels ready_ ABSL_GUARDED_BY(mu_);
  // Aging only: every ready slot by ready time (ReadyKey), so the top is the oldest.
  internal::IndexedHeap aged_ ABSL_GUARDED_BY(mu_);
  // Delayed slots not in flight, by ready time (ReadyKey).
  internal::IndexedHeap delayed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;  // ready sequence: items made ready so far
  // The time an add or a Done last read (InfinitePast before the first), for a Done whose
  // clock throws.
  absl::Time last_now_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // ready_.size(), readable without the lock (relaxed: only a hint for SpinLocked).
  std::atomic<size_t> ready_hint_{0};
  const int max_pollers_;  // Gets that may poll at length at once (SpinLocked), >= 1
  // Gets polling at length; its own line, so that entering and leaving do not take the
  // hint's line from the other pollers.
  alignas(64) std::atomic<int> spinners_{0};
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;         // kQueued slots
  size_t delayed_count_ ABSL_GUARDED_BY(mu_) = 0;  // kDelayed slots
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;   // Gets blocked on ready_cv_
  int signaled_ ABSL_GUARDED_BY(mu_) = 0;  // Signals sent that no waiter consumed yet
  int draining_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t aborts_ ABSL_GUARDED_BY(mu_) = 0;  // ShutDown() calls: each ends the drains waiting
  // The one timer, armed for armed_for_; 0 when none is pending.
  TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t armed_for_ ABSL_GUARDED_BY(mu_) = 0;
  bool arm_failed_ ABSL_GUARDED_BY(mu_) = false;  // the last arming could not make a timer
  // The last promotion left due items for want of memory; retry them at starved_retry_.
  bool promote_starved_ ABSL_GUARDED_BY(mu_) = false;
  int64_t starved_retry_ ABSL_GUARDED_BY(mu_) = 0;
  // Set at construction; its methods are called with mu_ held.
  std::unique_ptr<internal::QueueMetricsRecorder> metrics_;
};

}  // namespace kwq

#endif  // KWQ_PRIORITY_QUEUE_H_
