// File: kwq/rate_limiter.h
//
// Rate limiters for retries: how long a work queue should wait before handing a failed
// item out again. The interface and the limiters are those of client-go's
// util/workqueue (TypedRateLimiter):
//
//   auto limiter = kwq::DefaultControllerRateLimiter<std::string>();
//   absl::Duration delay = limiter->When(key);   // after a failure: requeue after `delay`
//   limiter->Forget(key);                          // after a success: reset its history
//
//   - ExponentialFailureRateLimiter: base * 2^failures per item, capped, optional jitter.
//   - FastSlowRateLimiter: a fast delay for the first attempts of an item, then a slow one.
//   - BucketRateLimiter: one token bucket for all items (golang.org/x/time/rate semantics).
//   - MaxOfRateLimiter: the largest delay of several limiters.
//   - WithMaxWaitRateLimiter: another limiter's delay, capped.
//   - DefaultControllerRateLimiter: MaxOf(Exponential(5ms, 1000s), Bucket(10 qps, 100)).
//
// Every limiter is generic over the item type T, hashed with `Hash` and compared with
// `Eq` (T must be copyable: the per-item limiters keep a copy of each failing item).
// Factories return absl::StatusOr: a bad parameter is an InvalidArgument error naming the
// parameter and its value, never a crash.
//
// Bounded memory, unlike client-go: a per-item limiter (exponential, fast/slow) forgets an
// item by itself once the item has not failed for `idle_horizon`, so a caller that never
// calls Forget does not grow the table forever. An evicted item starts again from zero
// failures. Time is read on the limiter's Clock, so tests drive it with a FakeClock; the
// per-item limiters measure idleness on Clock::CoarseNow (on RealClock one kernel tick,
// 1-4 ms, of resolution at under a third of Now's cost: a horizon is a matter of minutes).
//
// Thread safety: every member of every limiter here may be called concurrently from any
// thread. No call blocks, other than on the limiter's own short internal lock. That lock
// is held O(1) amortised, not always: in a per-item limiter, a When that inserts a new
// item may grow the table, rehashing every entry under the lock, and a When or
// NumRequeues after a quiet spell evicts every entry that went idle meanwhile, so
// concurrent calls can wait O(entries) once in a while. A per-item limiter's When may
// throw std::bad_alloc (a new item's entry), with no failure recorded.

#ifndef KWQ_RATE_LIMITER_H_
#define KWQ_RATE_LIMITER_H_

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/internal/check.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/rate_limiter_impl.h"

namespace kwq {

// Decides how long to wait before retrying an item. Implementations are thread-safe.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class RateLimiter {
 public:
  virtual ~RateLimiter() = default;

  // Returns how long to wait before retrying `item` and records one failure of it.
  // Thread-safe; never blocks. The result is >= 0, and absl::InfiniteDuration() only
  // where a limiter documents it.
  virtual absl::Duration When(const T& item) = 0;

  // Clears `item`'s failure history (call it when the item succeeded). Thread-safe; never
  // blocks; a no-op for an unknown item.
  virtual void Forget(const T& item) = 0;

  // The failures recorded for `item` since its last Forget (or its eviction after the
  // idle horizon). Thread-safe; never blocks. Saturates at INT_MAX.
  virtual int NumRequeues(const T& item) = 0;

  // The number of per-item entries this limiter holds (what its memory grows with; a
  // table's slot array keeps the size of its peak after entries go): for the
  // per-item limiters, the items that failed within the idle horizon and were not
  // forgotten, as of the last When/NumRequeues call; the sum over children for the
  // composite limiters; 0 for limiters without per-item state. Thread-safe.
  virtual size_t TrackedItems() const { return 0; }

  // A hint, from a rate-limiting queue, that the item whose 32-bit table hash is `hash`
  // (internal::FoldHash(Hash{}(item)), as the queue stores it) is next in line to be
  // handed out, so a NumRequeues/When/Forget for it will likely follow. The per-item
  // limiters fetch the lines of their table where that item's entry would be into the
  // cache (when the table is too large to stay cached, and their lock is free); the
  // composite limiters pass it on. Changes nothing observable. The default does nothing.
  // Thread-safe; must never block (PriorityQueue calls it holding its own lock, so an
  // override must not wait for a lock or call back into the queue).
  virtual void Prefetch(uint32_t hash) { (void)hash; }

  // Whether (and how) a caller may keep this limiter's per-item state for it: a
  // RateLimitingQueue then keeps each item's failure count beside the item's key and
  // calls WhenCounted, instead of When, Forget and NumRequeues, so a retry costs no
  // lookup in the limiter's own table (that table then stays empty).
  struct FailureCounting {
    // When depends on an item only through the failures recorded for it since its last
    // Forget, which lapse to zero once none was added for longer than idle_horizon on
    // clock->CoarseNow(); WhenCounted computes it from that number.
    bool by_count = false;
    // NumRequeues is that number (false: always 0; the limiter keeps no per-item state).
    bool reports_count = false;
    absl::Duration idle_horizon = absl::InfiniteDuration();
    Clock* clock = nullptr;  // non-null when reports_count
  };
  // The default: not by count (callers use When, Forget and NumRequeues). Thread-safe;
  // constant for the limiter's life.
  virtual FailureCounting Counting() const { return {}; }

  // When's delay for an item with `failures` (>= 0) recorded before this failure, counted
  // by the caller as Counting() describes. Updates only state shared by all items (a token
  // bucket), no per-item state. Called only when Counting().by_count. Thread-safe; never
  // blocks (beyond the limiter's own short lock); calls back into nothing.
  virtual absl::Duration WhenCounted(int64_t failures) {
    (void)failures;
    return absl::ZeroDuration();
  }
};

namespace internal {

// What ExponentialFailureRateLimiter and FastSlowRateLimiter share: the bounded failure
// table under a lock, read on a clock, and every member but When.
template <typename T, typename Hash, typename Eq>
class PerItemRateLimiter : public RateLimiter<T, Hash, Eq> {
 public:
  void Forget(const T& item) override {
    MutexLock lock(&mu_);
    table_.Forget(item);
  }

  int NumRequeues(const T& item) override {
    MutexLock lock(&mu_);
    return static_cast<int>(std::min<int64_t>(table_.Failures(item, clock_->CoarseNow()), INT_MAX));
  }

  size_t TrackedItems() const override {
    MutexLock lock(&mu_);
    return table_.size();
  }

  typename RateLimiter<T, Hash, Eq>::FailureCounting Counting() const override {
    return {
        .by_count = true, .reports_count = true, .idle_horizon = idle_horizon_, .clock = clock_};
  }

  void Prefetch(uint32_t hash) override {
    if (!mu_.TryLock()) return;  // a hint is not worth a wait
    table_.Prefetch(hash);
    mu_.Unlock();
  }

 protected:
  PerItemRateLimiter(Clock* clock, absl::Duration idle_horizon)
      : clock_(clock != nullptr ? clock : RealClock::Default()),
        idle_horizon_(idle_horizon),
        table_(idle_horizon) {}

  // Records one failure of `item` and returns the failures recorded before it.
  int64_t RecordFailure(const T& item) {
    MutexLock lock(&mu_);
    return table_.RecordFailure(item, clock_->CoarseNow());
  }

 private:
  Clock* const clock_;
  const absl::Duration idle_horizon_;
  mutable Mutex mu_;
  FailureTable<T, Hash, Eq> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

// Options of ExponentialFailureRateLimiter. The defaults are client-go's
// DefaultControllerRateLimiter's.
struct ExponentialFailureRateLimiterOptions {
  // The first delay. Must be >= 0.
  absl::Duration base = absl::Milliseconds(5);
  // The largest delay. Must be >= base; absl::InfiniteDuration() means no cap.
  absl::Duration max = absl::Seconds(1000);
  // Multiplicative jitter j in [0, 1]: each delay is multiplied by a factor drawn
  // uniformly from [1 - j, 1 + j), after the cap, then capped at `max` again. 0 (the
  // default) means none: delays are exact.
  double jitter = 0;
  // Seed of the jitter generator; 0 (the default) draws one from std::random_device.
  uint64_t jitter_seed = 0;
  // The clock the idle horizon is measured on. nullptr means RealClock::Default(). Must
  // outlive the limiter.
  Clock* clock = nullptr;
  // An item that has not failed for longer than this is forgotten (evicted from the
  // table) and starts again from zero failures, measured on clock->CoarseNow() (so on
  // RealClock to within a kernel tick, 1-4 ms, either way: a horizon that short is
  // honoured only that roughly). Must be >= 0; absl::InfiniteDuration() means never.
  // Unset means internal::DefaultIdleHorizon(max) = max(2 * max, 1 minute) (never, for
  // an infinite max). Counted from the item's last failure, so the time it then waits
  // (also behind other limiters of a MaxOf, such as a bucket), sits queued or is
  // processed counts too: choose a horizon longer than the longest time between two
  // failures of an item. A RateLimitingQueue or PriorityQueue that keeps the counts
  // itself (a counting limiter, see Counting) runs the horizon only while the item's key
  // is idle (kwq/rate_limiting_queue.h).
  std::optional<absl::Duration> idle_horizon = std::nullopt;
};

// client-go's ItemExponentialFailureRateLimiter: the n-th failure of an item since its
// last Forget (n = 0, 1, 2, ...) waits min(base * 2^n, max), computed exactly and without
// overflow for any n; with jitter j, that delay d then becomes min(d * U[1 - j, 1 + j), max).
// With max = absl::InfiniteDuration() the delay is absl::InfiniteDuration() once base * 2^n
// is beyond absl::Duration's range (about failure 71 for a 5 ms base; with jitter, once
// the jittered delay is, which can be a failure earlier): a RateLimitingQueue then parks
// the item until a plain Add.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class ExponentialFailureRateLimiter final : public internal::PerItemRateLimiter<T, Hash, Eq> {
 public:
  using Options = ExponentialFailureRateLimiterOptions;

  // Errors: InvalidArgument for base < 0, max < base, jitter outside [0, 1] or NaN, or a
  // negative idle_horizon.
  static absl::StatusOr<std::unique_ptr<RateLimiter<T, Hash, Eq>>> Create(const Options& options) {
    absl::Status status = internal::ValidateExponentialFailure(
        options.base, options.max, options.jitter, options.idle_horizon);
    if (!status.ok()) return status;
    return std::unique_ptr<RateLimiter<T, Hash, Eq>>(new ExponentialFailureRateLimiter(options));
  }

  // Thread-safe; O(1) amortised (see FailureTable); never blocks.
  absl::Duration When(const T& item) override { return WhenCounted(this->RecordFailure(item)); }

  // min(base * 2^failures, max), with jitter if configured.
  absl::Duration WhenCounted(int64_t failures) override {
    double factor = 1;
    if (jitter_ > 0) {
      internal::MutexLock lock(&rng_mu_);
      factor = internal::DrawJitterFactor(rng_, jitter_);
    }
    return internal::ApplyJitter(backoff_.At(failures), max_, factor);
  }

 private:
  explicit ExponentialFailureRateLimiter(const Options& options)
      : internal::PerItemRateLimiter<T, Hash, Eq>(
            options.clock,
            options.idle_horizon.value_or(internal::DefaultIdleHorizon(options.max))),
        backoff_(options.base, options.max),
        max_(options.max),
        jitter_(options.jitter),
        rng_(internal::JitterSeed(options.jitter_seed)) {}

  const internal::BackoffSchedule backoff_;
  const absl::Duration max_;
  const double jitter_;
  internal::Mutex rng_mu_;  // only used with jitter
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);
};

// Options of FastSlowRateLimiter.
struct FastSlowRateLimiterOptions {
  // The delay of an item's first max_fast_attempts failures. Must be >= 0.
  absl::Duration fast = absl::ZeroDuration();
  // The delay of every later failure. Must be >= 0.
  absl::Duration slow = absl::ZeroDuration();
  // How many failures get `fast`. Must be >= 0.
  int max_fast_attempts = 0;
  // As in ExponentialFailureRateLimiterOptions.
  Clock* clock = nullptr;
  // As in ExponentialFailureRateLimiterOptions; unset means
  // internal::DefaultIdleHorizon(max(fast, slow)).
  std::optional<absl::Duration> idle_horizon = std::nullopt;
};

// client-go's ItemFastSlowRateLimiter: an item's failures 1..max_fast_attempts (counted
// since its last Forget) wait `fast`, later ones wait `slow`.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class FastSlowRateLimiter final : public internal::PerItemRateLimiter<T, Hash, Eq> {
 public:
  using Options = FastSlowRateLimiterOptions;

  // Errors: InvalidArgument for a negative fast, slow or idle_horizon, or
  // max_fast_attempts < 0.
  static absl::StatusOr<std::unique_ptr<RateLimiter<T, Hash, Eq>>> Create(const Options& options) {
    absl::Status status = internal::ValidateFastSlow(
        options.fast, options.slow, options.max_fast_attempts, options.idle_horizon);
    if (!status.ok()) return status;
    return std::unique_ptr<RateLimiter<T, Hash, Eq>>(new FastSlowRateLimiter(options));
  }

  // Thread-safe; O(1) amortised; never blocks.
  absl::Duration When(const T& item) override { return WhenCounted(this->RecordFailure(item)); }

  // `fast` while this is failure number max_fast_attempts or below, else `slow`.
  absl::Duration WhenCounted(int64_t failures) override {
    return failures < max_fast_attempts_ ? fast_ : slow_;
  }

 private:
  explicit FastSlowRateLimiter(const Options& options)
      : internal::PerItemRateLimiter<T, Hash, Eq>(
            options.clock, options.idle_horizon.value_or(
                               internal::DefaultIdleHorizon(std::max(options.fast, options.slow)))),
        fast_(options.fast),
        slow_(options.slow),
        max_fast_attempts_(options.max_fast_attempts) {}

  const absl::Duration fast_;
  const absl::Duration slow_;
  const int64_t max_fast_attempts_;
};

// Options of BucketRateLimiter. The defaults are client-go's DefaultControllerRateLimiter's.
struct BucketRateLimiterOptions {
  // Tokens added per second. Must be >= 0, at most 1e9 (one per nanosecond: the
  // interval is kept in absl::Duration's quarter nanoseconds, which could not express
  // higher rates), and not NaN; +infinity means no limit.
  double qps = 10;
  // The bucket's size (and its initial content). Must be >= 0, and > 0 when qps == 0 (or
  // so small that 1 / qps is beyond absl::Duration's range: no token would ever come).
  int burst = 100;
  // The clock tokens refill on. nullptr means RealClock::Default(). Must outlive the
  // limiter.
  Clock* clock = nullptr;
};

// client-go's BucketRateLimiter: one token bucket shared by all items, with the
// reservation semantics of golang.org/x/time/rate's Limiter.Reserve().Delay(). The bucket
// starts full with `burst` tokens and refills at `qps` tokens per second up to `burst`.
// Every When takes one token, even when none is left (the count goes negative), and
// returns how long until that token would have been available: 0 while the bucket holds
// a token, then 1/qps, 2/qps, ... for calls made at the same instant. Arithmetic is exact
// in absl::Duration, with 1/qps rounded to a quarter nanosecond.
//
// Not per-item: NumRequeues is always 0, Forget does nothing, TrackedItems is 0.
//
// Edge cases:
//   - qps = +infinity: When always returns 0 (burst is ignored).
//   - qps = 0, burst > 0: the first `burst` calls return 0, every later one returns
//     absl::InfiniteDuration() (no token is ever refilled; x/time/rate's Delay() returns
//     its InfDuration there too). So does a qps so small that 1/qps is beyond
//     absl::Duration's range.
//   - burst = 0, qps > 0: calls at one instant wait 1/qps, 2/qps, ... (x/time/rate refuses
//     such reservations outright and reports InfDuration; a bucket of size 0 that still
//     refills is the more useful reading).
//   - A clock that moves backwards neither adds nor removes tokens.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class BucketRateLimiter final : public RateLimiter<T, Hash, Eq> {
 public:
  using Options = BucketRateLimiterOptions;

  // Errors: InvalidArgument for qps < 0, NaN or finite above 1e9, burst < 0, qps == 0 (or 1 / qps
  // beyond absl::Duration's range) with burst == 0, or (burst + 1) / qps beyond that range (about
  // 292 billion years).
  static absl::StatusOr<std::unique_ptr<RateLimiter<T, Hash, Eq>>> Create(const Options& options) {
    absl::Status status = internal::TokenBucket::Validate(options.qps, options.burst);
    if (!status.ok()) return status;
    return std::unique_ptr<RateLimiter<T, Hash, Eq>>(new BucketRateLimiter(options));
  }

  // Thread-safe; O(1); never blocks.
  absl::Duration When(const T&) override { return bucket_.Reserve(); }
  void Forget(const T&) override {}
  int NumRequeues(const T&) override { return 0; }
  // By count trivially: no per-item state.
  typename RateLimiter<T, Hash, Eq>::FailureCounting Counting() const override {
    return {.by_count = true};
  }
  absl::Duration WhenCounted(int64_t) override { return bucket_.Reserve(); }

 private:
  explicit BucketRateLimiter(const Options& options)
      : bucket_(options.qps, options.burst,
                options.clock != nullptr ? options.clock : RealClock::Default()) {}

  internal::TokenBucket bucket_;
};

// client-go's MaxOfRateLimiter: When calls every child's When (so each records the
// failure) and returns the largest delay; NumRequeues is the largest of the children's;
// Forget forwards to every child.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class MaxOfRateLimiter final : public RateLimiter<T, Hash, Eq> {
 public:
  using Child = std::unique_ptr<RateLimiter<T, Hash, Eq>>;

  // Errors: InvalidArgument for an empty list or a null child.
  static absl::StatusOr<std::unique_ptr<RateLimiter<T, Hash, Eq>>> Create(
      std::vector<Child> children) {
    if (children.empty()) {
      return absl::InvalidArgumentError("MaxOfRateLimiter: children must not be empty");
    }
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i] == nullptr) {
        return absl::InvalidArgumentError("MaxOfRateLimiter: children[" + std::to_string(i) +
                                          "] is null");
      }
    }
    return std::unique_ptr<RateLimiter<T, Hash, Eq>>(new MaxOfRateLimiter(std::move(children)));
  }

  // Thread-safe; costs the sum of the children's When.
  absl::Duration When(const T& item) override {
    absl::Duration delay = children_[0]->When(item);
    for (size_t i = 1; i < children_.size(); ++i) delay = std::max(delay, children_[i]->When(item));
    return delay;
  }

  void Forget(const T& item) override {
    for (const Child& child : children_) child->Forget(item);
  }

  int NumRequeues(const T& item) override {
    int requeues = 0;
    for (const Child& child : children_) requeues = std::max(requeues, child->NumRequeues(item));
    return requeues;
  }

  size_t TrackedItems() const override {
    size_t items = 0;
    for (const Child& child : children_) items += child->TrackedItems();
    return items;
  }

  void Prefetch(uint32_t hash) override {
    for (const Child& child : children_) child->Prefetch(hash);
  }

  // By count when every child is, and the children that count agree on the idle horizon
  // and the clock (then one count serves them all).
  typename RateLimiter<T, Hash, Eq>::FailureCounting Counting() const override { return counting_; }

  absl::Duration WhenCounted(int64_t failures) override {
    absl::Duration delay = children_[0]->WhenCounted(failures);
    for (size_t i = 1; i < children_.size(); ++i) {
      delay = std::max(delay, children_[i]->WhenCounted(failures));
    }
    return delay;
  }

 private:
  using Counting_t = typename RateLimiter<T, Hash, Eq>::FailureCounting;

  explicit MaxOfRateLimiter(std::vector<Child> children)
      : children_(std::move(children)), counting_(Combine(children_)) {}

  static Counting_t Combine(const std::vector<Child>& children) {
    Counting_t all{.by_count = true};
    for (const Child& child : children) {
      const Counting_t c = child->Counting();
      if (!c.by_count) return {};
      if (!c.reports_count) continue;
      if (all.reports_count && (c.idle_horizon != all.idle_horizon || c.clock != all.clock)) {
        return {};
      }
      all = c;
    }
    return all;
  }

  const std::vector<Child> children_;  // never empty, no nulls; immutable after Create
  const Counting_t counting_;
};

// client-go's WithMaxWaitRateLimiter: When is min(child's When, max_wait); NumRequeues,
// Forget and TrackedItems are the child's.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
class WithMaxWaitRateLimiter final : public RateLimiter<T, Hash, Eq> {
 public:
  using Child = std::unique_ptr<RateLimiter<T, Hash, Eq>>;

  // Errors: InvalidArgument for a null child or a negative max_wait.
  static absl::StatusOr<std::unique_ptr<RateLimiter<T, Hash, Eq>>> Create(Child child,
                                                                          absl::Duration max_wait) {
    if (child == nullptr) {
      return absl::InvalidArgumentError("WithMaxWaitRateLimiter: child is null");
    }
    absl::Status status = internal::ValidateMaxWait(max_wait);
    if (!status.ok()) return status;
    return std::unique_ptr<RateLimiter<T, Hash, Eq>>(
        new WithMaxWaitRateLimiter(std::move(child), max_wait));
  }

  // Thread-safe; costs the child's When.
  absl::Duration When(const T& item) override { return std::min(child_->When(item), max_wait_); }
  void Forget(const T& item) override { child_->Forget(item); }
  int NumRequeues(const T& item) override { return child_->NumRequeues(item); }
  size_t TrackedItems() const override { return child_->TrackedItems(); }
  void Prefetch(uint32_t hash) override { child_->Prefetch(hash); }
  typename RateLimiter<T, Hash, Eq>::FailureCounting Counting() const override {
    return child_->Counting();
  }
  absl::Duration WhenCounted(int64_t failures) override {
    return std::min(child_->WhenCounted(failures), max_wait_);
  }

 private:
  WithMaxWaitRateLimiter(Child child, absl::Duration max_wait)
      : child_(std::move(child)), max_wait_(max_wait) {}

  const Child child_;
  const absl::Duration max_wait_;
};

// client-go's DefaultControllerRateLimiter: MaxOf(ExponentialFailure(base 5ms, max
// 1000s), Bucket(10 qps, burst 100)), so an item's retries back off exponentially per
// item and all retries together stay under 10 per second after a burst of 100. Both
// children read `clock` (nullptr: RealClock::Default()); the per-item table forgets an
// item after the default idle horizon, 2000 s. Cannot fail.
template <typename T, typename Hash = absl::Hash<T>, typename Eq = std::equal_to<T>>
std::unique_ptr<RateLimiter<T, Hash, Eq>> DefaultControllerRateLimiter(Clock* clock = nullptr) {
  ExponentialFailureRateLimiterOptions exponential;
  exponential.base = absl::Milliseconds(5);
  exponential.max = absl::Seconds(1000);
  exponential.clock = clock;
  BucketRateLimiterOptions bucket;
  bucket.qps = 10;
  bucket.burst = 100;
  bucket.clock = clock;
  std::vector<std::unique_ptr<RateLimiter<T, Hash, Eq>>> children;
  auto exponential_limiter = ExponentialFailureRateLimiter<T, Hash, Eq>::Create(exponential);
  auto bucket_limiter = BucketRateLimiter<T, Hash, Eq>::Create(bucket);
  KWQ_CHECK(exponential_limiter.ok() && bucket_limiter.ok(), "constant parameters are valid");
  children.push_back(*std::move(exponential_limiter));
  children.push_back(*std::move(bucket_limiter));
  auto limiter = MaxOfRateLimiter<T, Hash, Eq>::Create(std::move(children));
  KWQ_CHECK(limiter.ok(), "two non-null children");
  return *std::move(limiter);
}

}  // namespace kwq

#endif  // KWQ_RATE_LIMITER_H_
