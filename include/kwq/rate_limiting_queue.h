// File: kwq/rate_limiting_queue.h
//
// RateLimitingQueue<T>: a DelayingQueue whose AddRateLimited asks a RateLimiter how long
// to wait, client-go's rate-limiting queue.
//
//   kwq::RateLimitingQueue<std::string> q;            // DefaultControllerRateLimiter
//   while (auto item = q.Get()) {
//     if (Reconcile(**item).ok()) q.Forget(**item);   // reset its backoff
//     else q.AddRateLimited(**item);                  // retry after the limiter's delay
//   }
//
// Promises (pinned by tests/rate_limiting_queue_test.cc): AddRateLimited(item) is
// AddAfter(item, limiter.When(item)) and so counts one retry in the metrics (none after
// ShutDown); Forget and NumRequeues act on the failure counts, wherever they live
// (below); everything else is DelayingQueue's.
//
// Where the failure counts live: with a limiter whose delay depends on an item only
// through its failure count (RateLimiter::Counting: the exponential and fast/slow
// limiters, and MaxOf/WithMaxWait/Bucket combinations of them, such as the default), the
// queue keeps each item's count beside the item's key and asks the limiter only for the
// delay of the n-th failure (WhenCounted), with the same delays and the limiter's idle
// horizon, which here runs only while the key is idle: a count never lapses while its key
// waits, is queued or is being processed (however long a backoff, a bucket's backlog or
// a reconcile takes), and the horizon starts from the later of its last failure and the
// moment the key last went idle (the Done that ended its processing, or a CancelAfter or
// shutdown that ended its wait). An idle key whose count has not lapsed stays in the
// table. (A limiter's own table can only count from the last failure.) A retry of the item being
// processed (AddRateLimited(lease->item()), NumRequeues, Forget) then hashes nothing and
// looks nothing up, and AddRateLimited takes one lock. The limiter's own table stays
// empty: its NumRequeues and TrackedItems, called directly, report nothing for items of
// this queue. Other limiters are called with the item, as client-go does.
//
// Thread safety: every member may be called from any thread.

#ifndef KWQ_RATE_LIMITING_QUEUE_H_
#define KWQ_RATE_LIMITING_QUEUE_H_

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "kwq/delaying_queue.h"
#include "kwq/rate_limiter.h"

namespace kwq {

template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class RateLimitingQueue : public DelayingQueue<T, Hash, Eq> {
 public:
  using Limiter = RateLimiter<T, Hash, Eq>;
  using Base = DelayingQueue<T, Hash, Eq>;
  using Lease = typename Base::Lease;

  // With DefaultControllerRateLimiter (5 ms exponential to 1000 s, and 10 qps / 100 burst
  // overall), reading time on options.clock.
  explicit RateLimitingQueue(QueueOptions options = {})
      : RateLimitingQueue(nullptr, std::move(options)) {}

  // With `limiter`; nullptr means the default limiter.
  explicit RateLimitingQueue(std::unique_ptr<Limiter> limiter, QueueOptions options = {})
      : DelayingQueue<T, Hash, Eq>(options),
        limiter_(limiter != nullptr ? std::move(limiter)
                                    : DefaultControllerRateLimiter<T, Hash, Eq>(options.clock)) {
    const typename Limiter::FailureCounting counting = limiter_->Counting();
    counted_ = counting.by_count && counting.reports_count && counting.clock != nullptr;
    if (counted_) {
      this->EnableFailureCounts(counting.idle_horizon, counting.clock);
    } else {
      this->EnableNextHashHint();
    }
  }

  // The constructor, after DelayingQueue::CheckOptions (its errors).
  static absl::StatusOr<std::unique_ptr<RateLimitingQueue>> Create(
      std::unique_ptr<Limiter> limiter = nullptr, QueueOptions options = {}) {
    if (absl::Status s = Base::CheckOptions(options); !s.ok()) return s;
    return std::make_unique<RateLimitingQueue>(std::move(limiter), std::move(options));
  }

  // DelayingQueue's Get, TryGet and Get(ctx). With a limiter that keeps its own counts
  // (not counting, see above), each hand-out also names the item next in line to the
  // limiter (RateLimiter::Prefetch), so that with a large failure table the
  // NumRequeues/When/Forget for that item finds its entry in the cache.
  std::optional<Lease> Get() { return WithPrefetch(Base::Get()); }
  std::optional<Lease> TryGet() { return WithPrefetch(Base::TryGet()); }
  std::optional<Lease> Get(const Context& ctx) { return WithPrefetch(Base::Get(ctx)); }

  // Adds `item` after the delay the limiter gives it, recording one failure. With a
  // counting limiter its WhenCounted runs under the queue's table lock (so it must not
  // block or call this queue); any other limiter's When runs first, on the calling
  // thread, without the queue's lock. After ShutDown the item is not queued, but the
  // failure is still recorded (with a counting limiter, only for a key the queue still
  // stores). A limiter that throws adds nothing: the caller keeps an item the queue does
  // not hold (no failure is recorded for it); a counting limiter's known key keeps the
  // failure, as PriorityQueue's does.
  template <typename K>
  void AddRateLimited(K&& item) {
    // The retry is counted by AddAfter / AddAfterFailure (not after ShutDown: client-go's).
    if (counted_) {
      this->AddAfterFailure(std::forward<K>(item),
                            [this](int64_t failures) { return limiter_->WhenCounted(failures); });
      return;
    }
    this->AddAfter(std::forward<K>(item), limiter_->When(item));
  }

  // Clears `item`'s failure history (its next AddRateLimited waits the shortest delay).
  void Forget(const T& item) {
    if (counted_) {
      this->ForgetFailures(item);
    } else {
      limiter_->Forget(item);
    }
  }

  // Failures recorded for `item` since its last Forget (saturates at INT_MAX).
  int NumRequeues(const T& item) {
    if (counted_) return static_cast<int>(std::min<int64_t>(this->FailuresOf(item), INT_MAX));
    return limiter_->NumRequeues(item);
  }

  // The limiter. With a counting limiter (the default one included) the queue keeps the
  // failure counts: the limiter's own NumRequeues, TrackedItems and Forget, called
  // directly, neither see nor clear them; call the queue's.
  Limiter& rate_limiter() { return *limiter_; }

 private:
  // Only a hint: a custom limiter's Prefetch that throws is dropped (it ended the lease
  // just handed out, unseen by the caller).
  std::optional<Lease> WithPrefetch(std::optional<Lease> lease) {
    if (const std::optional<uint32_t> next = this->TakeNextHash()) {
      try {
        limiter_->Prefetch(*next);
      } catch (...) {
      }
    }
    return lease;
  }

  const std::unique_ptr<Limiter> limiter_;  // I: thread-safe itself
  bool counted_ = false;                    // I: the queue keeps the failure counts
};

}  // namespace kwq

#endif  // KWQ_RATE_LIMITING_QUEUE_H_
