// internal::QueuePeer: the tests' access to the private state of kwq's queues (a friend
// of Queue, DelayingQueue, PriorityQueue and ShardedQueue), and internal::FailureCountsPeer
// for the failure counts a queue keeps. One definition for every test: each accessor
// takes any queue that has the state it reads, a DelayingQueue (or RateLimitingQueue)
// through the Queue it holds. Accessors that read under the queue's lock take it
// themselves; the others read atomics or are for set-up before any other call.

#ifndef KWQ_TESTS_TESTING_QUEUE_PEER_H_
#define KWQ_TESTS_TESTING_QUEUE_PEER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kwq/internal/check.h"
#include "kwq/internal/failure_counts.h"
#include "kwq/internal/mutex.h"

namespace kwq {

struct internal::FailureCountsPeer {
  static void Set(FailureCounts& counts, uint32_t slot, int64_t failures) {
    counts.At(slot).failures.store(failures);
  }
};

struct internal::QueuePeer {
  // The queue that holds the state: a DelayingQueue's Queue, else `q` itself (a Queue, a
  // PriorityQueue, a ShardedQueue's shard).
  template <typename Q>
  static auto& Core(Q& q) {
    if constexpr (requires { q.queue_; }) {
      return q.queue_;
    } else {
      return q;
    }
  }

  // Gets asleep on the queue (not polling) (Queue, DelayingQueue).
  template <typename Q>
  static int Sleepers(Q& q) {
    return Core(q).sleepers_hint_.load();
  }
  // Gets polling at length.
  template <typename Q>
  static int Polling(Q& q) {
    return Core(q).spinners_.load();
  }
  // Sets how many Gets the queue counts as polling at length (a test stands in for one).
  template <typename Q>
  static void SetPolling(Q& q, int polling) {
    Core(q).spinners_.store(polling);
  }
  // Gets blocked on the queue's condition variable.
  template <typename Q>
  static int Waiters(Q& q) {
    internal::MutexLock lock(&Core(q).mu_);
    return Core(q).waiters_;
  }
  // The same, with the caller holding Mu(q).
  template <typename Q>
  static int WaitersLocked(Q& q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return Core(q).waiters_;
  }
  // ShutDownWithDrain calls under way: a drainer counts itself in the hold of the lock in
  // which it checks and goes to wait (PriorityQueue: shuts the queue down), so a count
  // seen here means that many drains are under way (and a ShutDown from then on ends them).
  template <typename Q>
  static int Draining(Q& q) {
    internal::MutexLock lock(&Core(q).mu_);
    return Core(q).draining_;
  }
  // Keys the queue stores (its key table's size).
  template <typename Q>
  static size_t StoredKeys(Q& q) {
    internal::MutexLock lock(&Core(q).mu_);
    return Core(q).table_.size();
  }
  // Slots the key table has ever handed out (its high-water mark).
  template <typename Q>
  static uint32_t SlotLimit(Q& q) {
    internal::MutexLock lock(&Core(q).mu_);
    return Core(q).table_.slot_limit();
  }
  // The queue's table lock, and the lock its hand-outs take.
  template <typename Q>
  static internal::Mutex& Mu(Q& q) {
    return Core(q).mu_;
  }
  template <typename Q>
  static internal::Mutex& OutMu(Q& q) {
    return Core(q).out_mu_;
  }

  // DelayingQueue: whether sleeping Gets wake in steps to look for due items themselves.
  template <typename Q>
  static bool SleepsInSteps(Q& q) {
    internal::MutexLock lock(&Core(q).mu_);
    return Core(q).sleep_in_steps_;
  }
  // PriorityQueue: puts `item` among the waiting ones, ready at `ready` (its time keys),
  // and promotes those due at `now`.
  template <typename Q>
  static void AddWaiting(Q& q, int item, int64_t ready) {
    internal::MutexLock lock(&q.mu_);
    q.AddWaitingLocked(item, Q::Table::HashOf(item), ready);
  }
  template <typename Q>
  static size_t PromoteDue(Q& q, int64_t now) {
    internal::MutexLock lock(&q.mu_);
    bool more;
    return q.PromoteDueLocked(now, 1 << 30, &more);
  }
  // RateLimitingQueue: sets the failure count the queue keeps for `item` (which it must
  // store: fails a check otherwise).
  template <typename Q, typename T>
  static void SetFailures(Q& q, const T& item, int64_t failures) {
    internal::MutexLock lock(&Core(q).mu_);
    const uint32_t slot = Core(q).FindLocked(item);
    KWQ_CHECK(slot != UINT32_MAX, "SetFailures: the queue does not store the item");
    FailureCountsPeer::Set(*Core(q).counts_, slot, failures);
  }

  // ShardedQueue: workers parked on q (asleep on their home shard, or waiting for a run
  // owed elsewhere), listed for a kick, and their home shards, the one parked last first.
  template <typename S>
  static int Parked(const S& q) {
    return q.parked_.count();
  }
  template <typename S>
  static std::vector<size_t> ParkedHomes(S& q) {
    return q.parked_.Homes();
  }
  // ShardedQueue hooks (set each before the calls it watches): `fn(shard)` after each
  // shard's ShutDown in q's ShutDown; `fn(home)` in each Get just before the worker
  // parks; `fn(shard)` before each shard's wait in q's ShutDownWithDrain.
  template <typename S>
  static void AfterShardShutDown(S& q, std::function<void(size_t)> fn) {
    q.after_shard_shutdown_ = std::move(fn);
  }
  template <typename S>
  static void BeforePark(S& q, std::function<void(size_t)> fn) {
    q.before_park_ = std::move(fn);
  }
  template <typename S>
  static void BeforeShardWait(S& q, std::function<void(size_t)> fn) {
    q.before_shard_wait_ = std::move(fn);
  }
};

}  // namespace kwq

#endif  // KWQ_TESTS_TESTING_QUEUE_PEER_H_
