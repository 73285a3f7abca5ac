// File: kwq/internal/rate_limiter_impl.h
//
// Internals of kwq/rate_limiter.h: the bounded per-item failure table shared by the
// per-item limiters, the token bucket behind BucketRateLimiter, and the non-template
// arithmetic and validation helpers (defined in src/rate_limiter.cc). Internal: kwq users
// must not depend on this header.

#ifndef KWQ_INTERNAL_RATE_LIMITER_IMPL_H_
#define KWQ_INTERNAL_RATE_LIMITER_IMPL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/safe_growth.h"
#include "kwq/internal/spread_hash.h"

namespace kwq::internal {

// min(base * 2^exponent, max), exact (absl::Duration arithmetic, no floating point) and
// without overflow for every exponent >= 0: a product beyond absl::Duration's range
// saturates to `max`. Needs 0 <= base <= max; a negative exponent counts as 0.
absl::Duration ExponentialBackoff(absl::Duration base, absl::Duration max, int64_t exponent);

// ExponentialBackoff(base, max, n) for every n, precomputed (the values for n = 0, 1, ...
// until they stop changing, at most 129 of them): At(n) is one load instead of Duration
// multiplications with overflow checks on every failure. Needs 0 <= base <= max.
class BackoffSchedule {
 public:
  BackoffSchedule(absl::Duration base, absl::Duration max);
  // ExponentialBackoff(base, max, n).
  absl::Duration At(int64_t n) const {
    const int64_t last = static_cast<int64_t>(steps_.size()) - 1;
    return steps_[n <= 0 ? 0 : (n >= last ? last : n)];
  }

 private:
  std::vector<absl::Duration> steps_;  // never empty; constant past its end
};

// min(delay * factor, max) for a finite delay and factor >= 0; an infinite delay, or a
// factor of exactly 1, returns `delay` unchanged.
absl::Duration ApplyJitter(absl::Duration delay, absl::Duration max, double factor);

// A jitter factor drawn uniformly from [1 - jitter, 1 + jitter) with `rng` (a uniform
// random bit generator), jitter in [0, 1]. std::uniform_real_distribution can round up to
// its upper end (an engine's largest values, with jitter 0.1 or 0.5): that end is left
// out here, as ExponentialFailureRateLimiterOptions::jitter promises. 1 for jitter 0, and
// for a jitter so small that 1 + jitter rounds to 1 (below 2^-53): 1 is then the only
// double in the range (leaving the upper end out gave 1 - 2^-53, below 1 - jitter).
template <typename Rng>
double DrawJitterFactor(Rng& rng, double jitter) {
  const double upper = 1 + jitter;
  if (!(jitter > 0) || upper == 1) return 1;
  const double factor = std::uniform_real_distribution<double>(1 - jitter, upper)(rng);
  return factor < upper ? factor : std::nextafter(upper, 0.0);
}

// The idle horizon used when a per-item limiter's options leave it unset:
// max(2 * max_delay, 1 minute); absl::InfiniteDuration() (never evict) when max_delay is
// infinite.
absl::Duration DefaultIdleHorizon(absl::Duration max_delay);

// A seed for a jitter generator: `seed` itself when non-zero, else one drawn from
// std::random_device (from the time, where that throws). Never throws.
uint64_t JitterSeed(uint64_t seed);

// Parameter checks of the factories. Each returns OK or an InvalidArgument error naming
// the parameter and its value.
absl::Status ValidateExponentialFailure(absl::Duration base, absl::Duration max, double jitter,
                                        std::optional<absl::Duration> idle_horizon);
absl::Status ValidateFastSlow(absl::Duration fast, absl::Duration slow, int max_fast_attempts,
                              std::optional<absl::Duration> idle_horizon);
absl::Status ValidateMaxWait(absl::Duration max_wait);

// A token bucket with golang.org/x/time/rate reservation semantics, kept exactly in
// absl::Duration arithmetic: tokens are represented by `debt_`, how long after the last
// reservation the bucket would be full again, so that tokens = burst - debt_ / interval;
// time passing pays the debt down, and a reservation adds one interval to it (capped,
// see Reserve). Thread-safe; never blocks.
class TokenBucket {
 public:
  // Validates the parameters (see BucketRateLimiter::Create) and builds a full bucket.
  static absl::Status Validate(double qps, int burst);
  // Requires Validate(qps, burst).ok() and a non-null clock.
  TokenBucket(double qps, int burst, Clock* clock);
  TokenBucket(const TokenBucket&) = delete;
  TokenBucket& operator=(const TokenBucket&) = delete;

  // Takes one token (the count may go negative) and returns how long until that token
  // would have been available: zero while tokens remain.
  absl::Duration Reserve();

 private:
  enum class Mode {
    kUnlimited,  // qps = +infinity: every reservation is free.
    kNoRefill,   // qps so small that no token is ever refilled: burst free, then forever.
    kRefill,     // the ordinary bucket.
  };

  Clock* const clock_;
  Mode mode_;
  absl::Duration interval_;  // 1 / qps, rounded to absl::Duration's quarter-nanosecond.
  absl::Duration capacity_;  // burst * interval_.
  // The most debt_ holds: about 146 billion years, or a full bucket's worth plus one
  // token when that is more (finite: Validate rejects rates where it is not).
  absl::Duration max_debt_;
  Mutex mu_;
  int64_t no_refill_left_ ABSL_GUARDED_BY(mu_) = 0;  // kNoRefill: tokens left.
  // How long after last_now_ the bucket is full again (zero: full).
  absl::Duration debt_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time last_now_ ABSL_GUARDED_BY(mu_);  // the clock at the previous reservation.
};

// A key's hash as kwq's tables keep it: FoldHash of Hash{}(key). Queue's key table
// stores it per key, and the failure table hashes with it too, so a queue can tell a
// limiter where to prefetch an item's entry without reading or hashing the item
// (RateLimiter::Prefetch). The tables spread the 32 bits over 64 (SpreadHash).
template <typename T, typename Hash>
uint32_t TableHash(const T& key) {
  return FoldHash(Hash{}(key));
}

// The per-item failure table of ExponentialFailureRateLimiter and FastSlowRateLimiter.
// Each entry holds an item's failure count and the time of its last recorded failure, and
// sits on an intrusive list ordered by that time (coldest first). An entry idle for longer
// than the horizon counts as absent, and every RecordFailure/Failures call first removes
// the idle entries at the cold end of the list, so the table holds only items that failed
// within the horizon (as of the last call). Each entry is removed at most once, so the
// eviction cost is O(1) amortised per call. Not thread-safe: the owner locks.
template <typename T, typename Hash, typename Eq>
class FailureTable {
 public:
  // `idle_horizon` >= 0; absl::InfiniteDuration() never evicts.
  explicit FailureTable(absl::Duration idle_horizon) : horizon_(idle_horizon) {}
  FailureTable(const FailureTable&) = delete;
  FailureTable& operator=(const FailureTable&) = delete;

  // Records one failure of `item` at `now` and returns the failures recorded before it
  // (0 for an item not in the table, or idle past the horizon).
  int64_t RecordFailure(const T& item, absl::Time now) {
    EvictIdle(now);
    const uint32_t hash = TableHash<T, Hash>(item);
    auto it = entries_.find(Probe{&item, hash});
    Entry* entry;
    if (it == entries_.end()) {
      // The entry (with its copy of the key) is made, and the index grown, before the
      // table changes: a key copy or an allocation that throws leaves the table as it
      // was. (Debian's Abseil marks a node map's slot full before it builds the node: a
      // throw there left a garbage node that a later lookup or the destructor
      // dereferenced.)
      auto fresh = std::make_unique<Entry>(item, hash);
      ReserveGrowth(entries_, growth_);  // kwq/internal/safe_growth.h
      entry = fresh.get();
      entries_.insert(std::move(fresh));  // room was made: no allocation
    } else {
      entry = it->get();
      Unlink(entry);
      if (IsIdle(*entry, now)) entry->failures = 0;  // possible only after a clock jump back
    }
    const int64_t before = entry->failures;
    if (entry->failures < std::numeric_limits<int64_t>::max()) ++entry->failures;
    entry->last = now;
    PushHot(entry);
    return before;
  }

  // The failures recorded for `item` (0 when absent or idle past the horizon). An entry
  // found idle is erased, wherever it is on the list: after a clock jump back the list is
  // out of time order, and one left behind a newer cold end came back to life when the
  // clock moved back again.
  int64_t Failures(const T& item, absl::Time now) {
    EvictIdle(now);
    auto it = entries_.find(Probe{&item, TableHash<T, Hash>(item)});
    if (it == entries_.end()) return 0;
    if (IsIdle(**it, now)) {
      Unlink(it->get());
      entries_.erase(it);
      return 0;
    }
    return (*it)->failures;
  }

  // Fetches the index lines where an item with TableHash `hash` would be found into the
  // cache, when the table is too large to stay cached anyway (kPrefetchMin entries).
  //
  // g++ (12, with NDEBUG) takes a function that only prefetches for one without side
  // effects and drops calls to it; flatten inlines absl's prefetch here, and the empty
  // volatile asm makes this function one with side effects, so the prefetch stays.
  [[gnu::flatten]] void Prefetch(uint32_t hash) const {
    if (entries_.size() < kPrefetchMin) return;
    entries_.prefetch(Prehashed{hash});
    asm volatile("");
  }

  // Removes `item`'s entry, if any.
  void Forget(const T& item) {
    auto it = entries_.find(Probe{&item, TableHash<T, Hash>(item)});
    if (it == entries_.end()) return;
    Unlink(it->get());
    entries_.erase(it);
  }

  size_t size() const { return entries_.size(); }

 private:
  // Below this many entries the table likely sits in the cache, and a prefetch would
  // only cost time.
  static constexpr size_t kPrefetchMin = 8192;

  // An item's entry: its key (a copy), the key's TableHash, and its place on the list.
  struct Entry {
    Entry(const T& item, uint32_t h) : key(item), hash(h) {}
    const T key;
    const uint32_t hash;
    int64_t failures = 0;
    absl::Time last;
    Entry* colder = nullptr;
    Entry* hotter = nullptr;
  };
  // A key being looked up, with its TableHash.
  struct Probe {
    const T* key;
    uint32_t hash;
  };
  // A hash without its key: a probe position for prefetch(), never compared.
  struct Prehashed {
    uint32_t hash;
  };
  // The index holds the entries by pointer (stable addresses for the list) and hashes them
  // by their stored TableHash: growing it reads no key, and erasing an entry found on the
  // list looks it up by address, calling no user hash or equality.
  struct EntryHash {
    using is_transparent = void;
    size_t operator()(const std::unique_ptr<Entry>& e) const { return SpreadHash(e->hash); }
    size_t operator()(const Entry* e) const { return SpreadHash(e->hash); }
    size_t operator()(const Probe& p) const { return SpreadHash(p.hash); }
    size_t operator()(Prehashed p) const { return SpreadHash(p.hash); }
  };
  struct EntryEq {
    using is_transparent = void;
    bool operator()(const std::unique_ptr<Entry>& a, const std::unique_ptr<Entry>& b) const {
      return a == b;
    }
    bool operator()(const std::unique_ptr<Entry>& a, const Entry* b) const { return a.get() == b; }
    bool operator()(const std::unique_ptr<Entry>& a, const Probe& p) const {
      return a->hash == p.hash && Eq{}(a->key, *p.key);
    }
    // Only prefetch() takes a Prehashed, and it compares nothing.
    bool operator()(const std::unique_ptr<Entry>&, Prehashed) const { return false; }
  };

  bool IsIdle(const Entry& entry, absl::Time now) const {
    return horizon_ != absl::InfiniteDuration() && now - entry.last > horizon_;
  }

  void EvictIdle(absl::Time now) {
    while (cold_ != nullptr && IsIdle(*cold_, now)) {
      Entry* entry = cold_;
      const auto it = entries_.find(static_cast<const Entry*>(entry));  // by address
      Unlink(entry);
      entries_.erase(it);
    }
  }

  void Unlink(Entry* entry) {
    (entry->colder != nullptr ? entry->colder->hotter : cold_) = entry->hotter;
    (entry->hotter != nullptr ? entry->hotter->colder : hot_) = entry->colder;
    entry->colder = entry->hotter = nullptr;
  }

  void PushHot(Entry* entry) {
    entry->colder = hot_;
    entry->hotter = nullptr;
    (hot_ != nullptr ? hot_->hotter : cold_) = entry;
    hot_ = entry;
  }

  const absl::Duration horizon_;
  GrowthReserve growth_;  // before entries_, whose allocator points at it
  absl::flat_hash_set<std::unique_ptr<Entry>, EntryHash, EntryEq,
                      ReservingAllocator<std::unique_ptr<Entry>>>
      entries_{0, EntryHash{}, EntryEq{}, ReservingAllocator<std::unique_ptr<Entry>>(&growth_)};
  Entry* cold_ = nullptr;  // least recently failed
  Entry* hot_ = nullptr;   // most recently failed
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_RATE_LIMITER_IMPL_H_
