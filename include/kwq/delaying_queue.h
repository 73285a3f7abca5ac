// File: kwq/delaying_queue.h
//
// DelayingQueue<T>: a Queue<T> plus AddAfter, client-go's delaying queue, on the shared
// TimerService (no goroutine-like thread per queue).
//
//   kwq::DelayingQueue<std::string> q;
//   q.AddAfter("default/web", absl::Seconds(30));   // ready in 30 s
//   q.CancelAfter("default/web");                    // changed my mind (client-go can't)
//
// Promises (pinned by tests/delaying_queue_test.cc), beyond Queue's:
//   - AddAfter(item, d) with d <= 0 is Add(item). Otherwise the item becomes ready at
//     now + d (read on the queue's clock). One entry per item: the earliest ready time
//     wins, also against a run the item is owed already (it is ready, or in flight and
//     added again): then it does not wait as well (client-go's would run it once more).
//   - Add of a waiting item makes it ready now and removes the waiting entry, so it runs
//     once, not twice (fixes kubernetes#126027).
//   - CancelAfter removes a waiting entry.
//   - AddAfter never blocks on a buffer (client-go's blocks when 1000 adds are pending):
//     it takes one short lock and at most one timer-service call (two when the queue
//     has no timer yet: its first delayed add, or the first after every waiting item
//     came due, makes one and then arms it).
//   - Waiting items are counted by Waiting() and the `delayed` metric, not by Depth().
//   - Lateness (ready time to the item being ready for Get) is the timer service's
//     resolution plus at most 50 us of coalescing, independent of the number of waiting
//     items: one timer is armed, for the earliest ready time, and each firing moves every
//     due item (16 per hold of the lock). A Get that finds nothing ready moves due items
//     itself (one batch of up to 16; the timer, due by then, moves the rest), also while
//     it polls before sleeping (reading the next ready time without the lock); one that
//     has to block first re-arms the timer for the exact next ready time, and while a Get
//     sleeps an AddAfter arms it for the exact time too: coalescing is only for when no
//     Get sleeps, so an idle worker gets an item at its ready time plus the timer
//     service's resolution. (A firing or an AddAfter in the instant between a Get's last
//     look and its going to sleep re-arms the timer coalesced; the Get, in the hold of
//     the lock in which it is counted asleep, sees that and looks again, arming it
//     exactly.)
//     Every AddAfter (and AddRateLimited) that makes an item wait also moves up to two due
//     items along the way, so a reconcile loop's retries move its own due retries.
//   - Ready times are kept in int64 nanoseconds since the Unix epoch: one past about the
//     year 2262 (a delay of centuries, or a FakeClock moved that far) never comes due,
//     like absl::InfiniteDuration(), until an Add; on a clock before about 1677 a delayed
//     item waits until the clock enters the range. On a FakeClock moved by a fraction of a
//     nanosecond, a ready time between two nanoseconds comes due at the next whole one
//     (kwq/internal/time_key.h): move fake clocks by whole nanoseconds.
//   - ShutDown first queues the waiting items already due (as the timer would have, had
//     it fired in time: whether they run does not depend on how late the timer thread
//     is), drops the rest (they were never queued) and then shuts the queue down.
//   - Out of memory: AddAfter throws std::bad_alloc before it changes anything. A firing
//     or a Get that cannot make the timer again leaves the items waiting without one:
//     sleeping Gets then wake every millisecond, move due items themselves and try the
//     timer again, until one is armed (the next AddAfter makes one too). Nothing is lost
//     and no lock is left held.
//
// Storage: a waiting item's key lives in the queue's one key table (kwq/internal/key_table.h)
// beside the ready and in-flight ones, marked waiting, and a heap of slot numbers orders
// the waiting items by ready time. An AddAfter stores the key once (none when it is
// already there, as for a retry of the item being processed), and an item coming due is
// queued where it lies: no key is copied, moved or hashed again.
//
// Thread safety: every member may be called from any thread. One lock (the queue's
// table lock) guards the keys, the waiting items and the timer state; lock order: that
// lock, then the timer service's.

#ifndef KWQ_DELAYING_QUEUE_H_
#define KWQ_DELAYING_QUEUE_H_

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kwq/internal/indexed_heap.h"
#include "kwq/internal/key_table.h"
#include "kwq/internal/time_key.h"
#include "kwq/queue.h"

namespace kwq {

template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class DelayingQueue {
 public:
  using Options = QueueOptions;
  using Lease = typename Queue<T, Hash, Eq>::Lease;

  DelayingQueue() : DelayingQueue(Options{}) {}
  // Without options.timers, delays run on TimerService::Default(), or for a manual clock
  // (FakeClock) on a service of the queue's own (QueueOptions::timers). A service that
  // does not run on the queue's clock (options.timers, or the default one for a clock
  // of your own that is not manual) is not used: the queue says so on stderr and makes
  // one of its own on its clock. Create refuses such options instead.
  explicit DelayingQueue(Options options)
      : clock_(options.clock != nullptr ? options.clock : RealClock::Default()),
        own_timers_(OwnTimers(clock_, options)),
        timers_(own_timers_ != nullptr      ? own_timers_.get()
                : options.timers != nullptr ? options.timers
                                            : &TimerService::Default()),
        queue_(WithTimers(std::move(options), timers_)) {
    queue_.EnableHandOutTracking();
  }

  // The constructor, after CheckOptions (its errors).
  static absl::StatusOr<std::unique_ptr<DelayingQueue>> Create(Options options) {
    if (absl::Status s = CheckOptions(options); !s.ok()) return s;
    return std::make_unique<DelayingQueue>(std::move(options));
  }
  // OK unless the timer service the options name (or, without one, the default service
  // for a clock that is not manual) runs on another clock than the options' clock
  // (InvalidArgument), or, for a manual clock without one, the service of the queue's own
  // cannot start (FailedPrecondition for a clock that refuses observers; the constructor
  // would say so on stderr and use the default one, on the real clock). The check makes
  // that service and drops it.
  static absl::Status CheckOptions(const Options& options) {
    Clock* const clock = options.clock != nullptr ? options.clock : RealClock::Default();
    if (options.timers == nullptr && clock->is_manual()) {
      absl::StatusOr<std::unique_ptr<TimerService>> own =
          internal::OwnTimerService(clock, options.timers);
      return own.ok() ? absl::OkStatus() : own.status();
    }
    return internal::CheckTimersClock("DelayingQueue", clock, options.timers);
  }

  // Drops waiting items, stops the timer (waiting for a firing in progress) and shuts
  // the queue down. Virtual: a RateLimitingQueue may be owned and deleted as a
  // DelayingQueue (Go embeds the one interface in the other).
  virtual ~DelayingQueue() {
    StopWaiting(/*evict=*/false);  // the table goes whole
    queue_.ShutDown();
  }

  friend struct internal::QueuePeer;  // tests: the keys stored

  DelayingQueue(const DelayingQueue&) = delete;
  DelayingQueue& operator=(const DelayingQueue&) = delete;

  // Queue::Add; an Add of a waiting item also ends its wait (it runs now, once).
  template <typename K>
  bool Add(K&& item) {
    return queue_.Add(std::forward<K>(item));
  }

  // Makes `item` ready after `delay`. Ignored after ShutDown. Counts a retry in the
  // metrics (client-go's AddAfter: every call before ShutDown). With a positive delay,
  // when `item` is the key this queue last handed to the calling thread (lease->item()),
  // it is found by its address: no hash, no lookup. A delay <= 0 is an Add.
  template <typename K>
  void AddAfter(K&& item, absl::Duration delay) {
    if (delay <= absl::ZeroDuration()) {
      // client-go counts every AddAfter as a retry, also one with no delay.
      const uint32_t hash = Table::HashOf(item);
      queue_.AddHashed(std::forward<K>(item), hash, /*retry=*/true);
      return;
    }
    const absl::Time now = clock_->Now();
    const int64_t ready = ReadyKey(now + delay);
    const uint32_t slot = LeasedSlotOf(item);
    const uint32_t hash = slot == Table::kNone ? Table::HashOf(item) : 0;  // outside the lock
    internal::SpinningMutexLock lock(&queue_.mu_, kAddSpin);
    if (stopping_) return;
    if (slot != Table::kNone && !queue_.LiveLocked(slot)) return;  // a lease used after Done
    const bool made_timer = EnsureTimerLocked();  // may throw: before anything changes
    // Both make room in the waiting heap before they change anything (and may throw).
    const bool changed = slot != Table::kNone
                             ? queue_.SetWaitingLocked(slot, /*fresh=*/false, ready)
                             : queue_.AddWaitingLocked(std::forward<K>(item), hash, ready);
    queue_.RecordRetryLocked();  // once the add cannot fail any more
    AfterWaitingLocked(changed || made_timer, now);
  }

  // Removes `item`'s waiting entry. Returns true when there was one.
  bool CancelAfter(const T& item) {
    internal::MutexLock lock(&queue_.mu_);
    const uint32_t slot = queue_.FindWaitingLocked(item);
    if (slot == Table::kNone) return false;
    queue_.RemoveWaitingLocked(slot);
    // The key is idle now, and only adds and hand-outs evict: without the backstop, keys
    // added after a delay and cancelled stayed stored (1,000,000 of them after as many
    // AddAfter + CancelAfter; 989,480 after 1,000 more add / get cycles).
    queue_.EvictBackstopLocked();
    PublishLocked();
    return true;  // the timer may fire early for nothing; it re-arms itself
  }

  // Items waiting for their delay.
  size_t Waiting() const {
    internal::MutexLock lock(&queue_.mu_);
    return queue_.waiting_.size();
  }

  // Queue's Get, TryGet and Get(ctx). When no item is ready, the caller first moves
  // waiting items that are already due into the queue itself (instead of waiting for the
  // timer thread to do it), so a busy worker never sleeps on work that is due; Get keeps
  // doing so while it polls before sleeping.
  std::optional<Lease> Get() { return GetUntil(nullptr); }
  std::optional<Lease> TryGet() {
    if (auto lease = queue_.TryGet()) return lease;
    PromoteDue(/*about_to_wait=*/false);
    return queue_.TryGet();
  }
  std::optional<Lease> Get(const Context& ctx) { return GetUntil(&ctx); }
  // Queue::AddAll; waiting items among `items` end their wait.
  template <typename Range>
  size_t AddAll(Range&& items) {
    return queue_.AddAll(std::forward<Range>(items));
  }
  // Queue's Len, Depth, InFlight and ShuttingDown. Len and Depth do not count waiting
  // items (see Waiting) until they come due.
  size_t Len() const { return queue_.Len(); }
  size_t Depth() const { return queue_.Depth(); }
  size_t InFlight() const { return queue_.InFlight(); }
  bool ShuttingDown() const { return queue_.ShuttingDown(); }

  // Queues the waiting items already due, drops the others and shuts the queue down
  // (Queue::ShutDown). Moves every due item under the table lock (O(due items)) and
  // waits for a timer firing in progress.
  void ShutDown() {
    StopWaiting();
    queue_.ShutDown();
  }
  // Queues the waiting items already due, drops the others, then
  // Queue::ShutDownWithDrain (which a thread holding a Lease of this queue must not call).
  bool ShutDownWithDrain() {
    StopWaiting();
    return queue_.ShutDownWithDrain();
  }
  // The same bounded by `ctx` (Queue::ShutDownWithDrain(ctx), which says what a drain
  // that ends undrained leaves): false once `ctx` is done with items still queued or in
  // flight.
  bool ShutDownWithDrain(const Context& ctx) {
    StopWaiting();
    return queue_.ShutDownWithDrain(ctx);
  }

 protected:
  // For RateLimitingQueue: Queue::EnableNextHashHint and Queue::TakeNextHash.
  void EnableNextHashHint() { queue_.EnableNextHashHint(); }
  std::optional<uint32_t> TakeNextHash() { return queue_.TakeNextHash(); }

  // For RateLimitingQueue with a counting limiter: each key carries its failure count
  // (Queue::EnableFailureCounts). Call from the constructor.
  void EnableFailureCounts(absl::Duration idle_horizon, Clock* clock) {
    queue_.EnableFailureCounts(idle_horizon, clock);
  }

  // With failure counts: records one failure of `item` and makes it ready after
  // `delay_for(failures recorded before this one)`, under one hold of the lock (AddAfter's;
  // `delay_for` must not call back into this queue). After ShutDown the item is not
  // queued, but the failure of a known item is still recorded. If `delay_for` throws,
  // nothing is queued or waiting: a new key is not stored (the caller keeps its item, no
  // failure is recorded); a known key's failure stays recorded.
  template <typename K, typename DelayFor>
  void AddAfterFailure(K&& item, DelayFor delay_for) {
    const absl::Time now = clock_->Now();
    uint32_t slot = LeasedSlotOf(item);
    const uint32_t hash = slot == Table::kNone ? Table::HashOf(item) : 0;  // outside the lock
    bool wake = false;
    {
      internal::SpinningMutexLock lock(&queue_.mu_, kAddSpin);
      internal::FailureCounts& counts = *queue_.counts_;
      if (slot != Table::kNone && !queue_.LiveLocked(slot)) return;  // a lease used after Done
      if (stopping_) {
        // Still counts the failure, as a limiter called with the item would.
        if (slot == Table::kNone) slot = queue_.FindLocked(item);
        if (slot != Table::kNone) delay_for(counts.Record(slot, counts.Now(), queue_.Busy(slot)));
        return;
      }
      const bool made_timer = EnsureTimerLocked();  // may throw: before anything changes
      queue_.ReserveWaitingLocked();                // the same (it may wait)
      bool fresh = false;
      absl::Duration delay;
      try {
        if (slot == Table::kNone) slot = queue_.FindLocked(item, hash);
        if (slot == Table::kNone) {
          // A key the queue does not hold has no failures: the limiter is asked before the
          // item is moved in, so one that throws leaves the caller's item and records
          // nothing (no key would hold the count), as PriorityQueue's add does.
          delay = delay_for(0);
          slot = queue_.FindOrInsertLocked(std::forward<K>(item), hash, &fresh);
          if (slot == Table::kNone) return;
          counts.Record(slot, counts.NowGiven(clock_, now), /*busy=*/false);  // 0 before it
        } else {
          // A known key's failure stays counted if the limiter throws; nothing is queued.
          delay = delay_for(counts.Record(slot, counts.NowGiven(clock_, now), queue_.Busy(slot)));
        }
      } catch (...) {
        // A timer it made is armed for the items that were left without one, all the same.
        if (made_timer) {
          try {
            AfterWaitingLocked(true, now);
          } catch (...) {  // the add's own exception goes on
          }
        }
        throw;
      }
      if (delay <= absl::ZeroDuration()) {
        // Arms a timer it made for the items left without one first: AddSlotLocked counts
        // the signal it asks for, and nothing that may throw (a clock) may come between
        // that and the signal.
        if (made_timer) AfterWaitingLocked(true, now);
        wake = queue_.AddSlotLocked(slot, fresh);
      } else {
        AfterWaitingLocked(
            queue_.SetWaitingLocked(slot, fresh, ReadyKey(now + delay)) || made_timer, now);
      }
      queue_.RecordRetryLocked();  // the add happened: a call that threw counts none
    }
    if (wake) queue_.ready_cv_.Signal();
  }

  // With failure counts: the failures recorded for `item` since its last Forget (0 once
  // lapsed, or for an unknown item). Takes no lock for the item being processed.
  int64_t FailuresOf(const T& item) {
    internal::FailureCounts& counts = *queue_.counts_;
    uint32_t slot = LeasedSlotOf(item);
    if (slot != Table::kNone) {
      bool lapsed = false;
      const int64_t failures = counts.Failures(slot, counts.Now(), queue_.Busy(slot), &lapsed);
      if (!lapsed) return failures;
    }
    internal::MutexLock lock(&queue_.mu_);
    if (slot != Table::kNone && !queue_.LiveLocked(slot)) return 0;  // a lease used after Done
    if (slot == Table::kNone) slot = queue_.FindLocked(item);
    return slot == Table::kNone ? 0 : counts.FailuresLocked(slot, counts.Now(), queue_.Busy(slot));
  }

  // With failure counts: clears `item`'s count. Takes no lock for the item being
  // processed when it has no count.
  void ForgetFailures(const T& item) {
    internal::FailureCounts& counts = *queue_.counts_;
    uint32_t slot = LeasedSlotOf(item);
    bool lapsed = false;
    if (slot != Table::kNone &&
        counts.Failures(slot, counts.Now(), queue_.Busy(slot), &lapsed) == 0 && !lapsed) {
      return;
    }
    internal::MutexLock lock(&queue_.mu_);
    if (slot != Table::kNone && !queue_.LiveLocked(slot)) return;  // a lease used after Done
    if (slot == Table::kNone) slot = queue_.FindLocked(item);
    if (slot != Table::kNone) counts.Forget(slot);
  }

 private:
  using Table = internal::KeyTable<T, Hash, Eq>;

  // Get and Get(ctx) (`ctx` may be null). While polling: every kDueCheckEvery polls, a
  // clock read against the published next ready time, and a try-lock promotion when it
  // has passed; before every sleep, a promotion that also arms the exact timer.
  std::optional<Lease> GetUntil(const Context* ctx) {
    return queue_.GetPromoting(
        ctx,
        [this, polls = 0]() mutable {
          return ++polls % kDueCheckEvery == 0 &&
                 ToKey(clock_->Now()) >= next_hint_.load(std::memory_order_acquire) &&
                 PromoteBatch(/*about_to_wait=*/false, /*try_lock=*/true);
        },
        [this](bool about_to_wait) { return PromoteDue(about_to_wait, !about_to_wait); },
        /*stop=*/nullptr,
        [this] {
          queue_.mu_.AssertHeld();  // WaitForReady holds it
          return TimerWakesSleeperLocked();
        });
  }

  // For a Get about to sleep, in the hold of the lock in which it is counted asleep:
  // whether the timer fires by the next ready time. Its promote step armed it so (or saw
  // it so), but a firing that took the lock in between, with the Get not yet counted in
  // waiters_, re-armed it coalesced, up to kCoalesce later (on a FakeClock that stops at
  // the ready time: never). False sends the Get back to its promote step, which moves
  // what is due and arms the timer exactly. True also while promotions starve for memory
  // (the timer is then meant to be later: NotWhileStarvedLocked). Reads no clock and
  // allocates nothing.
  bool TimerWakesSleeperLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    if (stopping_ || heap().empty() || heap().TopKey() == kNever || queue_.promote_starved_) {
      return true;
    }
    return timer_ != 0 && armed_for_ <= heap().TopKey();
  }

  // Ready times as ns since the Unix epoch (kwq/internal/time_key.h: ready times round
  // up, current times down). Times past the int64 range (about year 2262) saturate to
  // kNever: such an item never becomes ready (it can still be added or cancelled).
  static constexpr int64_t kNever = internal::kNeverKey;
  static int64_t ToKey(absl::Time now) { return internal::NowKey(now); }
  static int64_t ReadyKey(absl::Time ready) { return internal::ReadyKey(ready); }
  static absl::Time FromKey(int64_t key) { return internal::TimeOfKey(key); }

  // A delayed add also queues up to kPiggyback waiting items that are already due at `now`
  // (the clock was read anyway). A thread that keeps adding delayed items (a reconcile
  // loop retrying) then moves its own due retries, whose state lines are in its cache,
  // instead of the timer thread pulling each line across while it holds the lock the
  // adder waits for. Returns true when it moved any.
  bool PromoteSomeLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    const int64_t now_key = ToKey(now);
    if (heap().empty() || heap().TopKey() > now_key) return false;
    bool more;
    return queue_.PromoteDueLocked(now_key, kPiggyback, &more) > 0;
  }

  // After a delayed add made (`changed`) or kept an item's waiting entry at `now`: moves
  // due items along the way, re-arms the timer for a new entry and republishes the hints.
  // An add that made the timer (EnsureTimerLocked) passes `changed` too: items left
  // waiting with no timer (one could not be made) get one then.
  void AfterWaitingLocked(bool changed, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    const bool promoted = PromoteSomeLocked(now);
    if (changed) {
      try {
        ArmLocked();  // reads the clock while due items wait for memory
      } catch (...) {
        PublishLocked();  // the new entry and the moved items, for readers of the hints
        throw;
      }
    }
    if (changed || promoted) PublishLocked();
  }

  // Queue::LeasedSlotOf for a key of type T (an item of another type names no slot).
  template <typename K>
  uint32_t LeasedSlotOf(const K& item) {
    if constexpr (std::is_same_v<K, T>) {
      return queue_.LeasedSlotOf(item);
    } else {
      return Table::kNone;
    }
  }

  // The waiting items, ordered by ready time (they live in the queue's key table).
  const internal::IndexedHeap& heap() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    return queue_.waiting_;
  }

  // Arms (or moves) the one timer to the earliest ready time, if that is earlier than the
  // time it is armed for: not within kCoalesce of the last firing, unless a Get is
  // blocked on the queue, which nothing else would wake at the exact time.
  void ArmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    if (heap().empty() || stopping_) return;
    // Any blocked Get counts, also one already signalled: a Get woken for an item that
    // someone else takes sleeps again without re-arming (Queue::WaitForReady).
    const bool get_asleep = queue_.waiters_ > 0;
    const int64_t top = heap().TopKey();
    // Coalesced, the wait is capped relative to the item too (kCoalesce past its ready
    // time), so a quiet window left from before a clock jumped back holds nothing longer.
    // Both stay below kNever (the timer parked for good) for a finite `top`: near the end
    // of the key range the window's end saturated there (a firing at the range's end, a
    // FakeClock set back, and an item due within 50 us of the end never fired).
    const int64_t next = NotWhileStarvedLocked(
        get_asleep
            ? top
            : std::max(top, std::min({quiet_until_, SaturatingAdd(top, kCoalesceNs), kNever - 1})));
    if (timer_ != 0) {
      if (next >= armed_for_) return;
      // If Reschedule fails the timer is firing right now; that Fire re-arms under the lock.
      if (timers_->Reschedule(timer_, FromKey(next))) armed_for_ = next;
      return;
    }
    // Only a firing gets here with no timer (an add made one first, EnsureTimerLocked; a
    // Get about to sleep uses ArmExactLocked): a timer that cannot be made for want of
    // memory leaves the waiting items to the next add's timer and to Gets, rather than
    // throw there.
    try {
      timer_ = timers_->Schedule(FromKey(next), [this] { Fire(); });
      armed_for_ = next;
    } catch (const std::bad_alloc&) {
      timer_ = 0;  // Fire wakes the sleeping Gets
    }
  }

  // Makes sure a timer exists (parked at the end of time when there was none), so that
  // arming it for the add that follows only moves it and allocates nothing: an add then
  // throws std::bad_alloc, if at all, before it changes anything. Not while stopping.
  // Returns true when it made one (the caller then arms it: AfterWaitingLocked).
  // Inline up to the check (every delayed add asks; a timer is made once).
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool EnsureTimerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    if (timer_ != 0 || stopping_) [[likely]]
      return false;
    MakeTimerLocked();
    return true;
  }
  ABSL_ATTRIBUTE_NOINLINE void MakeTimerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    timer_ = timers_->Schedule(absl::InfiniteFuture(), [this] { Fire(); });
    armed_for_ = kNever;
  }

  // `next`, or kStarvedRetry from now if that is later, when the last promotion stopped for
  // want of memory (Queue::PromoteDueLocked) with due items left: a timer armed for their
  // past ready time would fire again at once, over and over, and starve the service's
  // other timers.
  int64_t NotWhileStarvedLocked(int64_t next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    if (!queue_.promote_starved_) return next;
    return std::max(next,
                    std::min(SaturatingAdd(ToKey(clock_->Now()), kStarvedRetryNs), kNever - 1));
  }

  // Timer callback: queues every due item, kMoveBatch per hold of the lock, then re-arms
  // no sooner than kCoalesce from now, so a stream of short delays costs one timer firing
  // per window rather than one per item (and adds at most kCoalesce of lateness to items
  // due inside the window; a Get that finds nothing ready promotes due items itself).
  void Fire() {
    // Spins rather than sleeps behind a producer (kAddSpin): a sleeping waiter costs the
    // holder a wake-up call at its unlock.
    queue_.mu_.LockSpinning(kAddSpin);
    if (stopping_) {
      queue_.mu_.Unlock();
      return;
    }
    timer_ = 0;  // this timer has fired
    ++firing_;   // StopWaiting waits for this firing to end before the queue may go
    // A user's clock that throws, or a timer that cannot be re-armed for want of memory,
    // ends the firing with the queue's lock released and the firing counted as over (the
    // lock is held by hand here: a throw used to leave it locked, and the next add
    // deadlocked); the exception goes on to the timer service. Due items left waiting are
    // moved by the next firing an add arms, or by a Get (sleeping Gets wake every
    // millisecond to look while no timer is armed).
    std::exception_ptr thrown;
    bool counted = true;  // firing_ still counts this firing
    try {
      quiet_until_ = SaturatingAdd(ToKey(clock_->Now()), kCoalesceNs);
      for (;;) {
        bool more;
        queue_.PromoteDueLocked(ToKey(clock_->Now()), kMoveBatch, &more);
        if (!more || stopping_) break;
        // Let an AddAfter or a Get in between batches.
        queue_.mu_.Unlock();
        queue_.mu_.LockSpinning(kAddSpin);
      }
      --firing_;
      counted = false;
      ArmLocked();
    } catch (...) {
      thrown = std::current_exception();
      if (counted) --firing_;
    }
    PublishLocked();
    // Items left waiting with no timer (it could not be re-armed, or the clock threw):
    // Gets asleep now wake and look for due items themselves, in steps, until a timer is
    // armed again (Queue::sleep_in_steps_). They slept on, and only an add woke them.
    if (queue_.sleep_in_steps_) queue_.ready_cv_.SignalAll();
    // Under the lock: once StopWaiting sees firing_ == 0 the queue may be destroyed.
    fired_cv_.SignalAll();
    queue_.mu_.Unlock();
    if (thrown) std::rethrow_exception(thrown);
  }

  // For a Get that found nothing ready: moves due waiting items into the queue. A caller
  // about to block also makes sure the timer fires exactly at the next ready time:
  // coalescing (kCoalesce) is only for when no worker waits. Returns true when it moved
  // items. With `try_lock` it gives up when the lock is taken.
  bool PromoteDue(bool about_to_wait, bool try_lock = false) {
    // Lock-free exit for a worker that finds nothing ready while nothing is due (and, if
    // it is about to sleep, a timer is armed for the next ready time). An AddAfter racing
    // with these reads is covered by the timer it arms (ArmLocked).
    if (ToKey(clock_->Now()) < next_hint_.load(std::memory_order_acquire) &&
        (!about_to_wait || exact_hint_.load(std::memory_order_acquire))) {
      return false;
    }
    return PromoteBatch(about_to_wait, try_lock);
  }

  // PromoteDue past its lock-free exit. A Get moves one batch, enough to go on with; the
  // timer thread, due by then, moves the rest on its own CPU instead of the worker's.
  // `try_lock` is for a polling Get: it polls on rather than sleep on a lock a producer
  // holds and cost that producer a futex wake-up at its unlock.
  bool PromoteBatch(bool about_to_wait, bool try_lock) {
    if (try_lock) {
      if (queue_.mu_.LockedHint() || !queue_.mu_.TryLock()) return false;
    } else {
      queue_.mu_.Lock();
    }
    bool any = false;
    // The lock is held by hand (it may be a try-lock): a user's clock that throws must
    // not leave it held.
    try {
      if (!stopping_) {
        bool more;
        any = queue_.PromoteDueLocked(ToKey(clock_->Now()), kMoveBatch, &more) > 0;
        // Also when it moved items: others may take them, and this Get then sleeps.
        if (about_to_wait && !heap().empty() && heap().TopKey() != kNever) {
          ArmExactLocked(heap().TopKey());
        }
        PublishLocked();
      }
    } catch (...) {
      PublishLocked();  // whatever moved before the throw
      queue_.mu_.Unlock();
      throw;
    }
    queue_.mu_.Unlock();
    return any;
  }

  // Arms the timer for exactly `next` (a Get about to sleep). A timer that cannot be made
  // (std::bad_alloc) leaves timer_ at 0, and the Get sleeps in steps (PublishLocked).
  void ArmExactLocked(int64_t next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    next = NotWhileStarvedLocked(next);
    if (timer_ != 0) {
      if (next < armed_for_ && timers_->Reschedule(timer_, FromKey(next))) armed_for_ = next;
      return;
    }
    try {
      timer_ = timers_->Schedule(FromKey(next), [this] { Fire(); });
      armed_for_ = next;
    } catch (const std::bad_alloc&) {
      timer_ = 0;
    }
  }

  // Queues the waiting items already due, drops the rest (evicting their keys beyond the
  // idle allowance with `evict`) and stops the timer. After it returns no Fire is running
  // and none will start.
  void StopWaiting(bool evict = true) {
    TimerId timer;
    {
      internal::MutexLock lock(&queue_.mu_);
      stopping_ = true;
      timer = timer_;
      timer_ = 0;
      try {
        bool more;
        queue_.PromoteDueLocked(ToKey(clock_->Now()), std::numeric_limits<size_t>::max(), &more);
      } catch (...) {  // a user's clock that throws: the due items are dropped with the rest
      }
      queue_.DropWaitingLocked(evict);
      PublishLocked();
    }
    // A Fire that has not taken the lock yet is this timer's callback: wait for it (it
    // sees stopping_ and returns). One that has is counted in firing_.
    if (timer != 0) timers_->CancelSync(timer);
    internal::MutexLock lock(&queue_.mu_);
    while (firing_ > 0) fired_cv_.Wait(&queue_.mu_);
  }

  // Publishes the hints read without the lock (PromoteDue, Get's polling): the earliest
  // ready time (kNever when nothing waits), and whether a timer is armed to fire by then.
  // Stores only on change, so the line stays shared with the readers while the head of
  // the heap does not move. An Add that ends the wait of the head leaves the hint early,
  // which costs a reader one needless promotion attempt, never a missed item.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_.mu_) {
    const int64_t next = stopping_ || heap().empty() ? kNever : heap().TopKey();
    const bool exact = next == kNever || (timer_ != 0 && armed_for_ <= next);
    // Items wait with no timer armed for them: sleeping Gets look for due ones in steps.
    const bool steps = next != kNever && (timer_ == 0 || armed_for_ == kNever);
    if (steps != queue_.sleep_in_steps_) queue_.sleep_in_steps_ = steps;
    // exact first: a reader loads next_hint_ (acquire) and then exact_hint_, so one that
    // sees the new head also sees whether the timer is armed for it.
    if (exact != published_exact_) {
      published_exact_ = exact;
      exact_hint_.store(exact, std::memory_order_release);
    }
    if (next != published_next_) {
      published_next_ = next;
      next_hint_.store(next, std::memory_order_release);
    }
  }

  static constexpr absl::Duration kCoalesce = absl::Microseconds(50);
  static constexpr int64_t kCoalesceNs = 50'000;
  // How long due items that found no memory to be queued wait before the next try.
  static constexpr int64_t kStarvedRetryNs = 1'000'000;
  static_assert(kCoalesce == absl::Nanoseconds(kCoalesceNs));

  // a + b for b >= 0, saturating at kNever (time keys near it must not overflow).
  static int64_t SaturatingAdd(int64_t a, int64_t b) { return a > kNever - b ? kNever : a + b; }
  // Due items moved per lock hold (PromoteDueLocked).
  static constexpr size_t kMoveBatch = 16;
  // How long AddAfter and the timer's Fire spin for the lock before they sleep. A holder
  // moving a batch of due items out of a large heap takes longer than the adaptive mutex's
  // own spin (a few microseconds); in `delay` the producer then slept 200-400 times in
  // 45 ms of adds and paid a wake-up each time. The other way round, a Fire that slept
  // behind a busy producer cost that producer a futex wake-up at its unlock, about 530
  // per 200,000 adds (docs/design.md).
  static constexpr absl::Duration kAddSpin = absl::Microseconds(25);
  // Due items a delayed add moves along the way (PromoteSomeLocked).
  static constexpr size_t kPiggyback = 2;
  // A polling Get reads the clock every this many polls (each poll is a pause).
  static constexpr int kDueCheckEvery = 8;

  // A timer service on clock_ when the options named none and clock_ is manual (the
  // default service runs on the real clock, where a FakeClock's delays would never come
  // due; a manual clock's service has no thread), or when the service they name (or the
  // default one, for a clock of your own) runs on another clock (said on stderr). Null
  // when none is needed, or when it cannot start (said on stderr; then the options' or
  // the default one).
  static std::unique_ptr<TimerService> OwnTimers(Clock* clock, const Options& options) {
    absl::StatusOr<std::unique_ptr<TimerService>> timers =
        internal::OwnTimerService(clock, options.timers);
    if (timers.ok() && *timers == nullptr) {
      if (absl::Status wrong = CheckOptions(options); !wrong.ok()) {
        std::fprintf(stderr, "kwq::DelayingQueue: %s; using a timer service of its own\n",
                     wrong.ToString().c_str());
        timers = TimerService::Create({.clock = clock});
      }
    }
    if (!timers.ok()) {
      std::fprintf(stderr, "kwq::DelayingQueue: no timer service on its clock (%s)\n",
                   timers.status().ToString().c_str());
      return nullptr;
    }
    return *std::move(timers);
  }
  static Options WithTimers(Options options, TimerService* timers) {
    options.timers = timers;  // the inner queue's metric refreshes run on it too
    return options;
  }

  Clock* const clock_;                              // I
  const std::unique_ptr<TimerService> own_timers_;  // I; outlives queue_
  TimerService* const timers_;                      // I
  // The keys, the waiting items (Queue::waiting_) and the lock (Queue::mu_) that also
  // guards the timer state below.
  Queue<T, Hash, Eq> queue_;

  internal::CondVar fired_cv_;  // a Fire finished (firing_ went down)
  // The one timer, armed for armed_for_; 0 when none is pending. A Fire in progress
  // (firing_) re-arms it at its end.
  TimerId timer_ ABSL_GUARDED_BY(queue_.mu_) = 0;
  int64_t armed_for_ ABSL_GUARDED_BY(queue_.mu_) = 0;
  // No firing before this time (the last firing + kCoalesce).
  int64_t quiet_until_ ABSL_GUARDED_BY(queue_.mu_) = std::numeric_limits<int64_t>::min();
  int firing_ ABSL_GUARDED_BY(queue_.mu_) = 0;  // timer firings in progress (Fire)
  bool stopping_ ABSL_GUARDED_BY(queue_.mu_) = false;
  // The last values PublishLocked stored in the hints.
  int64_t published_next_ ABSL_GUARDED_BY(queue_.mu_) = kNever;
  bool published_exact_ ABSL_GUARDED_BY(queue_.mu_) = true;
  // Written under the lock by PublishLocked, read without it by PromoteDue and Get's
  // polling: no waiting item is due before next_hint_, and exact_hint_ says a timer is
  // armed to fire by then. Own cache line: the producer's lock and table must not share
  // it with the polling workers.
  alignas(64) std::atomic<int64_t> next_hint_{kNever};
  std::atomic<bool> exact_hint_{true};
};

}  // namespace kwq

#endif  // KWQ_DELAYING_QUEUE_H_
