// File: kwq/internal/park_list.h
//
// ParkList: the workers of a ShardedQueue that are asleep, or about to sleep, each with
// its home shard, so that an item made ready on any shard can wake one of them to steal
// it (ShardedQueue's kick; docs/design.md, "Waking a worker of another shard").
// Internal: kwq users must not depend on this header.
//
// A worker parks an Entry that lives in its own frame, then (after a store-load fence,
// the caller's) looks for work once more and sleeps; whoever makes an item ready that no
// Get of its shard is on its way to take (after its own fence) reads count() and, when it
// is not zero, calls TakeOne, which takes an entry off the list, marks it kicked and tells
// the caller where that worker sleeps, so the caller can wake it there. The worker leaves
// with Unpark (a no-op once kicked).
//
// Thread safety: every member may be called from any thread. The list's lock is taken
// with no shard lock held, and no shard lock is taken under it (callers wake a kicked
// worker after TakeOne returns). An Entry must stay alive until Unpark returns.

#ifndef KWQ_INTERNAL_PARK_LIST_H_
#define KWQ_INTERNAL_PARK_LIST_H_

#include <atomic>
#include <cstddef>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "kwq/context.h"
#include "kwq/internal/context_wake.h"
#include "kwq/internal/fence.h"
#include "kwq/internal/mutex.h"

namespace kwq::internal {

class ParkList {
 public:
  // One parked worker.
  struct Entry {
    Entry(size_t home_shard, bool on_list_cv) : home(home_shard), on_cv(on_list_cv) {}
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    const size_t home;  // the shard it sleeps on
    const bool on_cv;   // sleeps in WaitStep (on the list's own condition variable)
    // Set under the list's lock by the TakeOne that took it off the list (or by Unpark
    // with kick); read by its own worker, which then looks at every shard again instead
    // of sleeping (a shard's Get checks it under that shard's lock: Queue::WaitForReady).
    std::atomic<bool> kicked{false};
    // Set with `kicked` by TakeOne only: a kick for an item elsewhere, which the worker
    // passes on if it leaves without that item. Final once the entry is off the list and
    // its worker has taken the lock since (Unpark, or WaitStep's return).
    std::atomic<bool> taken{false};
    // The shard TakeOne was called for (the item's), written with `taken`.
    std::atomic<size_t> kicked_for{0};

   private:
    friend class ParkList;
    Entry* prev = nullptr;  // links and membership: under the list's lock
    Entry* next = nullptr;
    bool listed = false;
  };

  // Where a worker taken off the list by TakeOne sleeps.
  struct Taken {
    size_t home;
    bool on_cv;  // in WaitStep: wake it with WakeWaitSteps, not through its shard
  };

  ParkList() = default;
  ParkList(const ParkList&) = delete;
  ParkList& operator=(const ParkList&) = delete;

  // Parked workers, read without the lock (relaxed: the callers' fences order it).
  int count() const { return count_.load(std::memory_order_relaxed); }

  // Lists `entry` (first: the one parked last is taken first, its caches warmest).
  void Park(Entry* entry) {
    MutexLock lock(&mu_);
    LinkLocked(entry);
  }

  // Takes `entry` off the list if it is still on it; with `kick`, also marks it kicked
  // (its worker found work elsewhere itself).
  void Unpark(Entry* entry, bool kick = false) {
    MutexLock lock(&mu_);
    if (entry->listed) UnlinkLocked(entry);
    if (kick) entry->kicked.store(true, std::memory_order_relaxed);
  }

  // Takes one entry off the list for an item on `shard` that none of that shard's own
  // Gets is on its way to take, and marks it kicked: the one parked last among those whose
  // home is another shard, else the one parked last. (A parked worker of `shard` itself
  // was signalled by its shard, or has yet to look under that shard's lock and will find
  // the item: kicking it wakes nobody new.) nullopt when none is parked. O(parked).
  std::optional<Taken> TakeOne(size_t shard) {
    MutexLock lock(&mu_);
    Entry* chosen = head_;
    for (Entry* e = head_; e != nullptr; e = e->next) {
      if (e->home != shard) {
        chosen = e;
        break;
      }
    }
    if (chosen == nullptr) return std::nullopt;
    UnlinkLocked(chosen);
    chosen->taken.store(true, std::memory_order_relaxed);
    chosen->kicked_for.store(shard, std::memory_order_relaxed);
    chosen->kicked.store(true, std::memory_order_release);
    // `chosen` may be gone once the lock is released.
    return Taken{.home = chosen->home, .on_cv = chosen->on_cv};
  }

  // Parks `entry` (made with on_cv) and sleeps for at most `step`, unless `ready()`
  // (called after the fence, under the list's lock) says there is work, or `ctx` (may be
  // null) is done. Woken early by WakeWaitSteps (a kick, a ShutDown) or a cancel (unless
  // the wake-up on `ctx` cannot be registered for want of memory: then the step ends it).
  // Leaves the list before it returns.
  template <typename Ready>
  void WaitStep(Entry* entry, const Context* ctx, Ready ready, absl::Duration step) {
    // Before the lock (kwq/internal/context_wake.h); gone once the lock is released.
    std::optional<ContextWake> wake;
    if (ctx != nullptr) ContextWake::TryEmplace(&wake, *ctx, &mu_, &cv_);
    MutexLock lock(&mu_);
    LinkLocked(entry);
    // Listed, then look: work made ready before this fence is seen by ready(); whoever
    // makes it ready after it sees this entry listed and kicks it (TakeOne under mu_,
    // then WakeWaitSteps, which comes after this wait began).
    SeqCstFence();
    if (!ready() && (ctx == nullptr || !ctx->IsCancelled())) cv_.WaitFor(&mu_, step);
    if (entry->listed) UnlinkLocked(entry);
  }

  // Wakes every worker in WaitStep (each looks for work again). Signals under the lock, so
  // a WaitStep that has checked is waiting by then.
  void WakeWaitSteps() {
    MutexLock lock(&mu_);
    cv_.SignalAll();
  }

  // The home shards of the parked workers, the one parked last first. For tests.
  std::vector<size_t> Homes() {
    MutexLock lock(&mu_);
    std::vector<size_t> homes;
    for (Entry* e = head_; e != nullptr; e = e->next) homes.push_back(e->home);
    return homes;
  }

 private:
  void LinkLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    entry->prev = nullptr;
    entry->next = head_;
    if (head_ != nullptr) head_->prev = entry;
    head_ = entry;
    entry->listed = true;
    count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  void UnlinkLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (entry->prev != nullptr) {
      entry->prev->next = entry->next;
    } else {
      head_ = entry->next;
    }
    if (entry->next != nullptr) entry->next->prev = entry->prev;
    entry->listed = false;
    count_.store(count_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  }

  Mutex mu_;
  Entry* head_ ABSL_GUARDED_BY(mu_) = nullptr;
  CondVar cv_;  // WaitStep's sleepers
  // The list's length, written under mu_; read without it by every add that queues an
  // item, so on a line of its own that changes only when a worker parks or leaves.
  alignas(64) std::atomic<int> count_{0};
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_PARK_LIST_H_
