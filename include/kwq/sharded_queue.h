// File: kwq/sharded_queue.h
//
// ShardedQueue<T>: K independent Queue<T> shards chosen by key hash, for K CPU-pinned
// workers that each consume their own shard without touching a shared lock.
//
//   auto q = *kwq::ShardedQueue<std::string>::Create(/*shards=*/4);
//   q->Add("default/web");                           // goes to shard q->ShardOf(key)
//   // worker w (pinned to CPU w):
//   while (auto item = q->Get(w)) Reconcile(**item); // own shard first, then steals
//
// Promises (pinned by tests/sharded_queue_test.cc):
//   - A key always lives in the same shard, so every Queue promise holds per key: queued
//     once while waiting, never handed to two workers at once, added-while-processing
//     runs again after Done, level-triggered.
//   - Get(w) serves shard w first; when it is empty the worker steals one ready item from
//     another shard (scanning from w + 1) before it sleeps. A stolen item's lease ends in
//     its home shard, so exclusivity is unaffected.
//   - No worker sleeps while an item waits: an item made ready on a shard (by an add, or
//     by the Done of an item added again while in flight) that none of that shard's own
//     Gets is on its way to take (none signalled for it, none polling) wakes one worker
//     asleep on another shard, which steals it. So any number of workers serves any
//     number of shards (fewer workers than shards included), and an idle worker relieves
//     a busy one. An item its shard's own sleeping worker is woken for wakes nobody else.
//     The price: an add whose item is not claimed that way (the shard's workers are busy,
//     or it has none) pays a store-load fence (one locked instruction) to see a worker
//     going to sleep.
//   - Order is FIFO within a shard, not across shards.
//   - ShutDown / ShutDownWithDrain act on every shard, one after another; Get(w) returns
//     nullopt once every shard is shut down, nothing is left ready on any and, during a
//     drain, no shard owes a run (an item in flight that was added again is ready at its
//     Done, and a Get takes it then, on whichever shard, as in Queue).
//
// Thread safety: every member may be called from any thread; shards lock independently.
// As for Queue, a Lease must not outlive its queue: destroying the queue while a lease
// is active fails a check (Queue's destructor, in every build).

#ifndef KWQ_SHARDED_QUEUE_H_
#define KWQ_SHARDED_QUEUE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kwq/internal/check.h"
#include "kwq/internal/fence.h"
#include "kwq/internal/park_list.h"
#include "kwq/queue.h"

namespace kwq {

template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class ShardedQueue {
 public:
  using Shard = Queue<T, Hash, Eq>;
  using Lease = typename Shard::Lease;

  // `shards` must be in [1, 4096]: InvalidArgument otherwise. Each shard gets `options`,
  // with "/<index>" appended to its name when it has one ("pods/0", "pods/1", ...; an
  // unnamed queue's shards stay unnamed, and so get no Prometheus series).
  static absl::StatusOr<std::unique_ptr<ShardedQueue>> Create(int shards,
                                                              QueueOptions options = {}) {
    if (shards < 1 || shards > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat("ShardedQueue: shards must be in [1, 4096], got ", shards));
    }
    return std::unique_ptr<ShardedQueue>(new ShardedQueue(shards, std::move(options)));
  }

  ShardedQueue(const ShardedQueue&) = delete;
  ShardedQueue& operator=(const ShardedQueue&) = delete;

  // K, as given to Create; constant.
  int shards() const { return static_cast<int>(shards_.size()); }

  // The shard `item` lives in.
  int ShardOf(const T& item) const { return ShardOfHash(Shard::Table::HashOf(item)); }

  // Shard::Add on the item's shard (the key is hashed once, for both).
  // Wakes a worker asleep on another shard when no Get of the item's shard is on its way
  // to take it (see Get).
  template <typename K>
  bool Add(K&& item) {
    const uint32_t hash = Shard::Table::HashOf(item);  // the shard's own hash of the key
    const size_t shard = static_cast<size_t>(ShardOfHash(hash));
    bool unclaimed = false;
    if (!shards_[shard]->AddHashed(std::forward<K>(item), hash, /*retry=*/false, &unclaimed)) {
      return false;
    }
    if (unclaimed) MadeReady(shard, 1);
    return true;
  }

  // Adds every item of `items`, each to its shard, under one acquisition of each shard's
  // lock that gets some (Queue::AddAll), shard by shard in index order, each shard's
  // items in batch order. Returns how many were queued. Items are moved in or copied
  // once, as Queue::AddAll says. Costs O(b) for a batch of b items, or O(b log b) where
  // b is far below the shard count (never O(shards)). An item whose copy or hash (or a
  // batch's growth) throws ends the batch, as on Queue: the items before it are still
  // added, each to its shard, and then the exception goes on (the first one, when a
  // shard's add throws too; the other shards' items are added all the same). A shard's
  // share stops at its first item that throws. When there is no memory to put the batch
  // in shard order, its items are added one at a time and then std::bad_alloc goes on.
  template <typename Range>
  size_t AddAll(Range&& items) {
    constexpr bool kMove = internal::MovesItems<Range>();
    std::vector<Entry> batch;
    std::exception_ptr thrown;
    try {
      if constexpr (std::ranges::sized_range<Range>) batch.reserve(std::ranges::size(items));
      for (auto&& item : items) {
        // Hashed before it is taken: an item whose hash throws stays the caller's.
        const uint32_t hash = Shard::Table::HashOf(item);  // the shard's own hash, once
        const auto shard = static_cast<uint32_t>(ShardOfHash(hash));
        if constexpr (kMove) {
          batch.emplace_back(std::move(item), hash, shard);
        } else {
          batch.emplace_back(item, hash, shard);
        }
      }
    } catch (...) {
      thrown = std::current_exception();
    }
    size_t added = 0;
    std::vector<size_t> order;
    try {
      order = ShardOrder(batch);
    } catch (...) {  // out of memory: each item on its own, which allocates no order
      if (!thrown) thrown = std::current_exception();
      for (Entry& e : batch) {
        try {
          bool unclaimed = false;
          if (shards_[e.shard]->AddHashed(std::move(e.item), e.hash, /*retry=*/false, &unclaimed)) {
            ++added;
            if (unclaimed) MadeReady(e.shard, 1);
          }
        } catch (...) {  // dropped: the first exception, kept in `thrown`, goes on
        }
      }
      std::rethrow_exception(thrown);
    }
    for (size_t begin = 0; begin < order.size();) {
      const uint32_t s = batch[order[begin]].shard;
      size_t end = begin + 1;
      while (end < order.size() && batch[order[end]].shard == s) ++end;
      size_t unclaimed = 0;  // set also when the shard's add throws
      try {
        added += shards_[s]->AddEntries(batch, std::span<const size_t>(&order[begin], end - begin),
                                        &unclaimed);
      } catch (...) {
        if (!thrown) thrown = std::current_exception();
      }
      if (unclaimed > 0) MadeReady(s, unclaimed);
      begin = end;
    }
    if (thrown) std::rethrow_exception(thrown);
    return added;
  }

  // Ready item from shard `worker` % K (any int: a negative worker counts as
  // -(worker + 1)), else stolen from another shard; blocks on shard `worker` when none is
  // ready anywhere, until an item comes to that shard or is made ready on another one
  // whose own Gets do not take it (then it steals it; see the promises above).
  // While it polls before sleeping it also watches the other shards, one per poll.
  // nullopt once every shard is shut down, none has a ready item left to steal and,
  // during a drain, none owes a run (with its own shard done it waits for the others, in
  // steps of 1 ms, or until a kick or the end of the ShutDown). A steal reads every other
  // shard's ready count without its lock (O(K)) and locks only a shard that reports one.
  std::optional<Lease> Get(int worker) { return GetFrom(Home(worker), nullptr); }

  // Like Get(worker), and also returns nullopt when `ctx` is done: a ready item on any
  // shard still wins over a context already done at the call; a cancel that ends the
  // sleep returns without stealing. Does not throw when the wake-up on `ctx` cannot be
  // registered for want of memory: it then looks at `ctx` every millisecond (as
  // Queue::Get(ctx)).
  std::optional<Lease> Get(int worker, const Context& ctx) { return GetFrom(Home(worker), &ctx); }

  // A ready item from shard `worker` % K or any other, without blocking (worker mapped
  // as in Get). Finding nothing costs a TryGet on its own shard and a lock-free read of
  // each other shard's ready count (O(K)).
  std::optional<Lease> TryGet(int worker) { return TryGetFrom(Home(worker)); }

  // Ready items over all shards (each shard read at a slightly different moment).
  size_t Len() const {
    size_t n = 0;
    for (const auto& s : shards_) n += s->Len();
    return n;
  }
  // Items waiting to run over all shards (ready ones plus in-flight ones added again).
  size_t Depth() const {
    size_t n = 0;
    for (const auto& s : shards_) n += s->Depth();
    return n;
  }
  // Leases not yet ended over all shards.
  size_t InFlight() const {
    size_t n = 0;
    for (const auto& s : shards_) n += s->InFlight();
    return n;
  }
  // Shard `index`, in [0, shards()) (a check fails loudly otherwise), for inspection and
  // its Get/TryGet. Add through this queue's Add: a key added to a shard directly may
  // end up in two shards, and then in two workers' hands at once.
  Shard& shard(int index) {
    KWQ_CHECK(index >= 0 && static_cast<size_t>(index) < shards_.size(),
              "ShardedQueue::shard: index out of range");
    return *shards_[index];
  }

  // Shuts every shard down (Queue::ShutDown); ends every ShutDownWithDrain in progress.
  void ShutDown() {
    // A drain that this call ends may return, and its caller destroy the queue, only once
    // this call is done with it (DrainAll waits for the count to fall).
    shutting_down_calls_.fetch_add(1, std::memory_order_acq_rel);
    aborts_.fetch_add(1, std::memory_order_acq_rel);  // before the shards wake the drains
    for (size_t i = 0; i < shards_.size(); ++i) {
      shards_[i]->ShutDown();
      if (after_shard_shutdown_) after_shard_shutdown_(i);
    }
    parked_.WakeWaitSteps();  // Gets waiting for a run owed elsewhere look again
    shutting_down_calls_.fetch_sub(1, std::memory_order_release);  // last touch
  }
  // Stops adds on every shard, then waits for each to drain (queued and in-flight items,
  // as Queue::ShutDownWithDrain). True when all drained; false when a ShutDown() from
  // another thread ended the wait (it returns once that ShutDown() is done with the
  // queue, so the caller may destroy the queue at once). Concurrent drains do not end
  // each other. A thread that holds a Lease of this queue must not call it (it would wait
  // for that lease).
  bool ShutDownWithDrain() { return DrainAll(nullptr); }
  // ShutDownWithDrain bounded by `ctx`, as Queue::ShutDownWithDrain(ctx): the wait also
  // ends, returning false, once `ctx` is done, whichever shard it has reached (leases
  // still in flight must end before the queue is destroyed). Throws std::bad_alloc when
  // the wake-up on `ctx` cannot be registered; every shard is shut down by then, and no
  // drain is left counted.
  bool ShutDownWithDrain(const Context& ctx) { return DrainAll(&ctx); }
  // True once every shard refuses adds. The last shard is asked: ShutDown and
  // ShutDownWithDrain stop the shards in index order, so it is the last to stop (asking
  // the first said true while later shards still took adds).
  bool ShuttingDown() const { return shards_.back()->ShuttingDown(); }

 private:
  friend struct internal::QueuePeer;  // tests: the hooks below, parked_

  // ShutDownWithDrain; `ctx` may be null (no bound).
  bool DrainAll(const Context* ctx) {
    const uint64_t aborts = aborts_.load(std::memory_order_acquire);
    drains_.fetch_add(1, std::memory_order_acq_rel);  // before any shard stops adds
    absl::Cleanup uncount = [this] {
      drains_.fetch_sub(1, std::memory_order_acq_rel);
      // Gets waiting for a run owed elsewhere see the drain over (DrainOwesRuns).
      parked_.WakeWaitSteps();
      // A ShutDown() that ended this drain may still be at work on the queue, which the
      // caller may destroy as soon as this returns.
      while (shutting_down_calls_.load(std::memory_order_acquire) != 0) {
        std::this_thread::yield();
      }
    };
    // Every shard counts as draining from the start (not only once the wait reaches it),
    // so each worker's Get waits for the runs owed on its shard by leases in flight.
    for (auto& s : shards_) s->BeginDrain();
    parked_.WakeWaitSteps();  // every shard refuses adds now: Gets waiting on that look again
    // Also when a shard's wait throws (std::bad_alloc registering the wake-up on `ctx`):
    // a drain left counted would keep every Done on its slow path for good.
    absl::Cleanup end_drains = [this] {
      for (auto& s : shards_) s->EndDrain();
    };
    bool drained = true;
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (before_shard_wait_) before_shard_wait_(i);
      if (!shards_[i]->DrainUntil(&aborts_, aborts, ctx)) {
        drained = false;
        break;
      }
    }
    return drained;
  }

  ShardedQueue(int shards, QueueOptions options) {
    shards_.reserve(shards);
    for (int i = 0; i < shards; ++i) {
      QueueOptions o = options;
      // Each shard's metrics apart; unnamed shards of an unnamed queue (see Create).
      if (!options.name.empty()) o.name = absl::StrCat(options.name, "/", i);
      shards_.push_back(std::make_unique<Shard>(std::move(o)));
      // A Done that queues an item added again while in flight wakes a parked worker too.
      shards_.back()->SetReadyHook(
          {.fn = &ShardedQueue::ReadyOnShard, .owner = this, .shard = static_cast<size_t>(i)});
    }
  }

  using Parked = internal::ParkList::Entry;

  // Get(worker) and Get(worker, ctx) (`ctx` may be null): an item from home or stolen;
  // else sleeps on home, parked, until an item comes to home, a kick (an item made ready
  // on another shard), `ctx`, or the end. During a drain it returns nullopt only once no
  // shard owes a run any more, so that fewer workers than shards still drain them all.
  std::optional<Lease> GetFrom(size_t home, const Context* ctx) {
    // Kicked for an item on shard `owed_for` and not yet holding one from there: on every
    // way out without one (an item taken elsewhere, a done context, nullopt, a throw) the
    // kick goes on to another parked worker, or the item it was for could wait beside a
    // sleeping worker. (An item stolen from another shard does not pay it: that one may
    // be the item a sleeper of its own shard was woken for, who then finds nothing.)
    bool owe_kick = false;
    size_t owed_for = 0;
    absl::Cleanup pass_on = [&] {
      if (owe_kick) PassOnKick(owed_for);
    };
    // Takes on a kick noted in `entry`, once the entry is off the list (`taken` is final).
    auto note_kick = [&](const Parked& entry) {
      if (entry.taken.load(std::memory_order_relaxed)) {
        owe_kick = true;
        owed_for = entry.kicked_for.load(std::memory_order_relaxed);
      }
    };
    bool home_done = false;  // home is shut down with nothing ready or owed: for good
    for (;;) {
      // Read before the look for items: once every shard refuses adds, an item the look
      // misses can only be one a Done queues, which DrainOwesRuns counts.
      const bool all_stopped = home_done && ShuttingDown();
      if (owe_kick) {  // the item it was kicked for first
        if (auto lease = shards_[owed_for]->TryGet()) {
          owe_kick = false;
          return lease;
        }
      }
      size_t from = home;
      if (auto lease = TryGetFrom(home, &from)) {
        if (owe_kick && from == owed_for) owe_kick = false;
        return lease;
      }
      if (ctx != nullptr && ctx->IsCancelled()) return std::nullopt;
      if (home_done) {
        // Shards not yet stopped may still take adds (a ShutDown or drain stops them one
        // by one), and during a drain a Done may queue a run owed on any shard.
        if (all_stopped && !DrainOwesRuns()) return std::nullopt;
        // Wait a step of 1 ms (a hand-out that leaves none owed wakes nobody, as in
        // Queue::WaitForReady), or until a kick, the end of a ShutDown or of a drain's
        // start or end, or `ctx`.
        Parked waiting(home, /*on_list_cv=*/true);
        parked_.WaitStep(
            &waiting, ctx, [&] { return AnyReadyShard().has_value(); }, absl::Milliseconds(1));
        note_kick(waiting);
        continue;
      }
      Parked parked(home, /*on_list_cv=*/false);
      std::optional<Lease> lease;
      {
        // Also when SleepOnHome throws (after a kick took it).
        absl::Cleanup note = [&] { note_kick(parked); };
        lease = SleepOnHome(&parked, ctx);
      }
      if (lease) {  // from home: pays a kick for home (when none of another was parked)
        if (owe_kick && owed_for == home) owe_kick = false;
        return lease;
      }
      if (ctx != nullptr && ctx->IsCancelled()) return std::nullopt;
      if (parked.kicked.load(std::memory_order_acquire)) continue;  // look everywhere again
      home_done = true;  // then what the others still hold, and runs owed there
    }
  }

  // Home shard's Get (a GetPromoting) with this worker parked before it sleeps. While it
  // polls it also looks at one other shard per poll, round the ring, and stops polling
  // when one has an item ready; it does not sleep when one has.
  std::optional<Lease> SleepOnHome(Parked* parked, const Context* ctx) {
    const size_t n = shards_.size();
    const size_t home = parked->home;
    bool listed = false;
    absl::Cleanup unpark = [&] {
      if (listed) parked_.Unpark(parked);
    };
    size_t probe = 0;
    return shards_[home]->GetPromoting(
        ctx,
        [&] {
          if (n == 1) return false;
          probe = probe + 1 < n ? probe + 1 : 1;
          return shards_[(home + probe) % n]->ReadyHint() != 0;
        },
        [&](bool about_to_wait) {
          if (!about_to_wait || listed || parked->kicked.load(std::memory_order_relaxed)) {
            return false;
          }
          if (OtherShardReady(home)) {  // steal instead (the list needs no visit)
            parked->kicked.store(true, std::memory_order_relaxed);
            return false;
          }
          if (before_park_) before_park_(home);
          parked_.Park(parked);
          listed = true;
          // Parked, then look: an item made ready before this fence is seen here, and
          // one after it sees this worker parked (MadeReady's fence).
          internal::SeqCstFence();
          if (OtherShardReady(home)) parked_.Unpark(parked, /*kick=*/true);
          return false;
        },
        &parked->kicked);
  }

  // Whether a drain is in progress and some shard still has an item queued or owed a run.
  bool DrainOwesRuns() const {
    if (drains_.load(std::memory_order_acquire) == 0) return false;
    for (const auto& s : shards_) {
      if (s->OwesRuns()) return true;
    }
    return false;
  }

  // The first shard after `home` (round the ring, `home` itself excluded) that reports a
  // ready item (ReadyHint, no lock), or nullopt.
  std::optional<size_t> ReadyShardAfter(size_t home) const {
    const size_t n = shards_.size();
    for (size_t i = 1; i < n; ++i) {
      const size_t s = (home + i) % n;
      if (shards_[s]->ReadyHint() != 0) return s;
    }
    return std::nullopt;
  }
  bool OtherShardReady(size_t home) const { return ReadyShardAfter(home).has_value(); }
  // The first shard (from 0) that reports a ready item, or nullopt.
  std::optional<size_t> AnyReadyShard() const {
    if (shards_[0]->ReadyHint() != 0) return 0;
    return ReadyShardAfter(0);
  }

  // `count` items were made ready on `shard` that none of its own Gets is on its way to
  // take (Queue::UnclaimedAfterPushLocked, UnclaimedLocked): wakes up to that many parked
  // workers, those of other shards first. Costs a fence and a load when none is parked
  // (an Add pays it whenever its item is unclaimed, as when the shard's workers are
  // busy). Never throws.
  void MadeReady(size_t shard, size_t count) {
    // Made ready, then look for parked workers: pairs with the parking side's fence.
    internal::SeqCstFence();
    if (parked_.count() == 0) [[likely]]
      return;
    Kick(shard, count);
  }

  // Shard::ReadyHook: a Done on `shard` queued an item added again while in flight.
  static void ReadyOnShard(void* owner, size_t shard) {
    static_cast<ShardedQueue*>(owner)->MadeReady(shard, 1);
  }

  // Takes up to `count` parked workers off the list (ParkList::TakeOne: those of other
  // shards first) and wakes each where it sleeps, to look at every shard again.
  void Kick(size_t shard, size_t count) {
    for (; count > 0; --count) {
      const std::optional<internal::ParkList::Taken> taken = parked_.TakeOne(shard);
      if (!taken) return;
      if (taken->on_cv) {
        parked_.WakeWaitSteps();
      } else {
        shards_[taken->home]->WakeAllSleepers();  // it checks `kicked` under that lock
      }
    }
  }

  // A kicked worker that leaves without the item it was kicked for, on `shard`: wakes
  // another parked worker for that shard, if it still has an item ready. (Kicking for the
  // first shard with a ready item could send the worker to an item that shard's own
  // sleeper was already signalled for: that sleeper then woke to nothing, and the item the
  // kick was for waited beside it.) The push of the item came before the kick took this
  // worker off the park list, so the read here sees it unless another Get took it.
  void PassOnKick(size_t shard) {
    if (parked_.count() == 0) return;
    if (shards_[shard]->ReadyHint() != 0) Kick(shard, 1);
  }

  // The shard of a key whose table hash (KeyTable::HashOf) is `hash`. It is mixed first (the
  // high half of a product with a 64-bit odd constant, Fibonacci hashing), so a hash whose
  // entropy is in its low bits only (std::hash of an integer is the integer) still spreads
  // over every shard, and the keys of one shard share no hash bits: picked from the
  // hash's own top bits, they shared those, which absl's index in each shard takes its
  // probe positions from, so a shard's index clustered past about 2^25 / shards keys.
  int ShardOfHash(uint32_t hash) const {
    const uint64_t mixed = (uint64_t{hash} * 0x9E3779B97F4A7C15ull) >> 32;
    return static_cast<int>((mixed * shards_.size()) >> 32);
  }

  // One item of an AddAll batch, with its table hash and its shard.
  struct Entry {
    template <typename K>
    Entry(K&& key, uint32_t key_hash, uint32_t key_shard)
        : item(std::forward<K>(key)), hash(key_hash), shard(key_shard) {}  // one copy or move
    T item;
    uint32_t hash;
    uint32_t shard;
  };

  // The indices of `batch` in shard order, each shard's in batch order. A counting sort
  // (O(b + K)) where the batch is not far smaller than the shard count K; else a sort of
  // the (shard, index) pairs (O(b log b)): a 2-item batch on 4,096 shards cost 16 us when
  // every call made a vector per shard.
  std::vector<size_t> ShardOrder(const std::vector<Entry>& batch) const {
    const size_t b = batch.size();
    const size_t k = shards_.size();
    std::vector<size_t> order(b);
    if (b * 8 < k) {  // then b < 512: an index fits in the pair's low half
      std::vector<uint64_t> pairs(b);
      for (size_t i = 0; i < b; ++i) pairs[i] = uint64_t{batch[i].shard} << 32 | i;
      std::sort(pairs.begin(), pairs.end());
      for (size_t i = 0; i < b; ++i) order[i] = static_cast<uint32_t>(pairs[i]);
    } else {
      std::vector<size_t> next(k + 1, 0);  // then: where shard s's next index goes
      for (const Entry& e : batch) ++next[e.shard + 1];
      for (size_t s = 1; s <= k; ++s) next[s] += next[s - 1];
      for (size_t i = 0; i < b; ++i) order[next[batch[i].shard]++] = i;
    }
    return order;
  }

  size_t Home(int worker) const {
    const size_t n = shards_.size();
    return static_cast<size_t>(worker < 0 ? -(worker + 1) : worker) % n;
  }

  // A ready item from shard `home`, else from the next shard round that has one. Other
  // shards are looked at through their ready count first, read without their locks, and
  // locked only when it says some item is ready: locking each in turn contended with the
  // shards' own workers, and cost 0.69 us per stolen item at 64 shards (an item added
  // to a shard concurrently may be passed by, as it could be just after the look; one
  // added before the call, as the items a ShutDown finds, is seen, also while that
  // shard's worker moves its overflow list to its outbox: Queue::ReadyHint).
  // `from` (may be null) is set to the shard the item came from.
  std::optional<Lease> TryGetFrom(size_t home, size_t* from = nullptr) {
    if (auto lease = shards_[home]->TryGet()) {
      if (from != nullptr) *from = home;
      return lease;
    }
    const size_t n = shards_.size();
    for (size_t i = 1; i < n; ++i) {
      const size_t s = (home + i) % n;
      if (shards_[s]->ReadyHint() == 0) continue;
      if (auto lease = shards_[s]->TryGet()) {
        if (from != nullptr) *from = s;
        return lease;
      }
    }
    return std::nullopt;
  }

  std::vector<std::unique_ptr<Shard>> shards_;  // I: the shards lock themselves
  // ShutDown() calls so far: a drain that sees it change ends (DrainUntil).
  std::atomic<uint64_t> aborts_{0};
  // ShutDownWithDrain calls in progress (DrainOwesRuns).
  std::atomic<int> drains_{0};
  // ShutDown() calls in progress, which a drain waits out before it returns.
  std::atomic<int> shutting_down_calls_{0};

  // Workers asleep, or about to sleep, for a kick (MadeReady).
  internal::ParkList parked_;
  // Tests only (set through internal::QueuePeer before a drain starts): called by
  // ShutDownWithDrain with the shard's index before it waits on each shard, so that a
  // test can land a ShutDown between two shards' waits.
  std::function<void(size_t)> before_shard_wait_;
  // Tests only (set the same way before any Get): called by a Get with its home shard just
  // before it parks, so that a test can land an add in the moment before the worker is
  // listed (and so before any add can see it).
  std::function<void(size_t)> before_park_;
  // Tests only (set the same way before a ShutDown): called by ShutDown with each shard's
  // index after that shard is shut down.
  std::function<void(size_t)> after_shard_shutdown_;
};

}  // namespace kwq

#endif  // KWQ_SHARDED_QUEUE_H_
