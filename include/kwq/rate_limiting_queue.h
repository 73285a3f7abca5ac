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
// AddAfter(item, limiter.When(item)) and counts one retry in the metrics; Forget and
// NumRequeues delegate to the limiter; everything else is DelayingQueue's.
//
// Thread safety: every member may be called from any thread.

#ifndef KWQ_RATE_LIMITING_QUEUE_H_
#define KWQ_RATE_LIMITING_QUEUE_H_

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
    this->EnableNextHashHint();
  }

  // DelayingQueue's Get, TryGet and Get(ctx). Each hand-out also names the item next in
  // line to the limiter (RateLimiter::Prefetch), so that with a large failure table the
  // NumRequeues/When/Forget for that item finds its entry in the cache.
  std::optional<Lease> Get() { return WithPrefetch(Base::Get()); }
  std::optional<Lease> TryGet() { return WithPrefetch(Base::TryGet()); }
  std::optional<Lease> Get(const Context& ctx) { return WithPrefetch(Base::Get(ctx)); }

  // Adds `item` after the delay the limiter gives it, recording one failure.
  template <typename K>
  void AddRateLimited(K&& item) {
    const absl::Duration delay = limiter_->When(item);
    if (auto* m = this->metrics_recorder()) m->OnRetry();
    this->AddAfter(std::forward<K>(item), delay);
  }

  // Clears `item`'s failure history (its next AddRateLimited waits the shortest delay).
  void Forget(const T& item) { limiter_->Forget(item); }

  // Failures recorded for `item` since its last Forget.
  int NumRequeues(const T& item) { return limiter_->NumRequeues(item); }

  Limiter& rate_limiter() { return *limiter_; }

 private:
  std::optional<Lease> WithPrefetch(std::optional<Lease> lease) {
    if (const std::optional<uint32_t> next = this->TakeNextHash()) limiter_->Prefetch(*next);
    return lease;
  }

  const std::unique_ptr<Limiter> limiter_;  // I: thread-safe itself
};

}  // namespace kwq

#endif  // KWQ_RATE_LIMITING_QUEUE_H_
