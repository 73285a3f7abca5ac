// The metric objects kwq::PrometheusMetricsProvider hands to queues. Each keeps its
// changes in plain atomics that only its queue writes (a queue calls its metrics one call
// at a time: kwq/metrics.h), and a Flusher pushes them into the prometheus-cpp series
// every flush period, on a timer, and when the metric dies. So a queue operation costs a
// few relaxed loads and stores instead of prometheus-cpp's compare-and-swap loops and
// histogram mutex, and never waits for a scrape (docs/benchmarks.md has the figures).
// Internal to kwq::prometheus.
//
// Out of memory: a push that cannot allocate (a series' first push makes it) is retried
// at the next flush, except a metric's last push, from its destructor, whose changes are
// dropped (a destructor must not throw); the sets and maps grow through a reserve
// (kwq/internal/safe_growth.h), so a failed insert leaves them whole.

#ifndef KWQ_SRC_PROMETHEUS_BUFFERED_METRICS_H_
#define KWQ_SRC_PROMETHEUS_BUFFERED_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/safe_growth.h"
#include "kwq/metrics.h"
#include "series.h"

namespace kwq::prometheus_internal {

// A metric whose buffered changes a Flusher pushes into its series.
class Buffered {
 public:
  virtual ~Buffered() = default;
  // Pushes what changed since the last push. Called by the Flusher, under its lock. May
  // throw (std::bad_alloc); what it could not push is pushed by a later call.
  virtual void Push() = 0;
};

// The live metrics of one provider (shared with them, so a metric that outlives its
// provider can still push its last changes). Thread-safe.
class Flusher {
 public:
  // Throws std::bad_alloc with nothing changed.
  void Add(Buffered* m) {
    internal::MutexLock lock(&mu_);
    internal::ReserveGrowth(live_, growth_);
    live_.insert(m);
  }
  // Pushes `m`'s last changes (dropped if that throws: destructors call this) and
  // forgets it. Never throws.
  void Remove(Buffered* m) {
    internal::MutexLock lock(&mu_);
    TryPush(m);
    live_.erase(m);
  }
  // Pushes every metric's changes; one whose push throws is retried at the next flush.
  // Never throws.
  void FlushAll() {
    internal::MutexLock lock(&mu_);
    for (Buffered* m : live_) TryPush(m);
  }

 private:
  using Live = absl::flat_hash_set<Buffered*, absl::Hash<Buffered*>, std::equal_to<Buffered*>,
                                   internal::ReservingAllocator<Buffered*>>;
  static void TryPush(Buffered* m) {
    try {
      m->Push();
    } catch (...) {
    }
  }

  internal::Mutex mu_;
  internal::GrowthReserve growth_ ABSL_GUARDED_BY(mu_);  // before live_: its allocator's
  Live live_ ABSL_GUARDED_BY(mu_){0, Live::hasher(), Live::key_equal(),
                                  Live::allocator_type(&growth_)};
};

// What every buffered metric has: its series and its place in the Flusher. Subclasses
// call Register() at the end of their constructor and Unregister() first in their
// destructor (Push must not run on a half-built or half-destroyed object).
template <typename M>
class BufferedBase : public Buffered {
 protected:
  BufferedBase(std::shared_ptr<Flusher> flusher, std::unique_ptr<Series<M>> series)
      : flusher_(std::move(flusher)), series_(std::move(series)) {}
  void Register() { flusher_->Add(this); }
  void Unregister() { flusher_->Remove(this); }
  M& series() { return **series_; }

  // The single writer's update of a value only it writes: no read-modify-write needed.
  template <typename V, typename D>
  static void Bump(std::atomic<V>& v, D by) {
    v.store(v.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

 private:
  const std::shared_ptr<Flusher> flusher_;
  const std::unique_ptr<Series<M>> series_;
};

// A count changed by the queue and pushed as the change since the last push (queues of
// one name share a series, so each adds its own changes): `M` is prometheus::Gauge or
// prometheus::Counter, whose Increment takes the change.
template <typename M>
class BufferedDelta : public BufferedBase<M> {
 protected:
  using BufferedBase<M>::BufferedBase;
  void Add(int64_t by) { this->Bump(value_, by); }
  void Push() override {
    const int64_t v = value_.load(std::memory_order_relaxed);
    if (v != pushed_) this->series().Increment(static_cast<double>(v - pushed_));
    pushed_ = v;
  }

 private:
  std::atomic<int64_t> value_{0};
  int64_t pushed_ = 0;  // the Flusher's lock
};

// depth, delayed.
class BufferedGauge final : public GaugeMetric, BufferedDelta<prometheus::Gauge> {
 public:
  BufferedGauge(std::shared_ptr<Flusher> f, std::unique_ptr<Series<prometheus::Gauge>> s)
      : BufferedDelta(std::move(f), std::move(s)) {
    Register();
  }
  ~BufferedGauge() override { Unregister(); }
  void Inc() override { Add(1); }
  void Dec() override { Add(-1); }
};

// adds, retries.
class BufferedCounter final : public CounterMetric, BufferedDelta<prometheus::Counter> {
 public:
  BufferedCounter(std::shared_ptr<Flusher> f, std::unique_ptr<Series<prometheus::Counter>> s)
      : BufferedDelta(std::move(f), std::move(s)) {
    Register();
  }
  ~BufferedCounter() override { Unregister(); }
  void Inc() override { Add(1); }
};

// unfinished work, longest running: Set, pushed as the last value set.
class BufferedSettableGauge final : public SettableGaugeMetric, BufferedBase<prometheus::Gauge> {
 public:
  BufferedSettableGauge(std::shared_ptr<Flusher> f, std::unique_ptr<Series<prometheus::Gauge>> s)
      : BufferedBase(std::move(f), std::move(s)) {
    Register();
  }
  ~BufferedSettableGauge() override { Unregister(); }
  void Set(double value) override {
    value_.store(value, std::memory_order_relaxed);
    set_.store(true, std::memory_order_release);
  }
  void Push() override {
    if (set_.exchange(false, std::memory_order_acquire)) {
      series().Set(value_.load(std::memory_order_relaxed));
    }
  }

 private:
  std::atomic<double> value_{0};
  std::atomic<bool> set_{false};
};

// queue and work durations: the observations sorted into the buckets here, pushed with
// ObserveMultiple.
struct HistogramPeer;

class BufferedHistogram final : public HistogramMetric, BufferedBase<prometheus::Histogram> {
 public:
  static constexpr int kBounds = 12;  // 1e-8 .. 1e3 s, then +Inf

  static prometheus::Histogram::BucketBoundaries Bounds() {
    prometheus::Histogram::BucketBoundaries bounds;
    double bound = 1e-8;
    for (int i = 0; i < kBounds; ++i, bound *= 10) bounds.push_back(bound);
    return bounds;
  }

  BufferedHistogram(std::shared_ptr<Flusher> f, std::unique_ptr<Series<prometheus::Histogram>> s)
      : BufferedBase(std::move(f), std::move(s)), bounds_(Bounds()), deltas_(kBounds + 1) {
    Register();
  }
  ~BufferedHistogram() override { Unregister(); }

  void Observe(double seconds) override {
    Count(seconds);
    AddToSum(seconds);  // after the count: Push reads them in the same order
  }

  // Allocates nothing here (the deltas' vector is the metric's own); marks the counts
  // pushed only once ObserveMultiple has returned.
  void Push() override {
    std::array<uint64_t, kBounds + 1> counts;
    bool any = false;
    for (int i = 0; i <= kBounds; ++i) {
      counts[i] = counts_[i].load(std::memory_order_relaxed);
      deltas_[i] = static_cast<double>(counts[i] - pushed_counts_[i]);
      any |= counts[i] != pushed_counts_[i];
    }
    // Observe bumps a count and then the sum, and this reads them in the same order, so a
    // push may carry an observation's count without its value (or, read the other way
    // round, its value without its count). The sum is pushed whenever it moved, also with
    // no count: the value of an observation whose count went out with an earlier push
    // must follow, even if no observation comes after it.
    const double sum = sum_.load(std::memory_order_relaxed);
    if (any || sum != pushed_sum_) {
      series().ObserveMultiple(deltas_, sum - pushed_sum_);
      pushed_counts_ = counts;
      pushed_sum_ = sum;
    }
  }

 private:
  friend struct HistogramPeer;  // tests: a push between an observation's two stores

  // Observe's two stores.
  void Count(double seconds) {
    int i = 0;
    // The first bucket with le >= seconds; NaN goes to +Inf, as prometheus-cpp's Observe
    // puts it.
    while (i < kBounds && !(seconds <= bounds_[i])) ++i;
    Bump(counts_[i], 1);
  }
  void AddToSum(double seconds) { Bump(sum_, seconds); }

  const prometheus::Histogram::BucketBoundaries bounds_;
  std::array<std::atomic<uint64_t>, kBounds + 1> counts_{};
  std::atomic<double> sum_{0};
  std::array<uint64_t, kBounds + 1> pushed_counts_{};  // the Flusher's lock
  double pushed_sum_ = 0;                              // the Flusher's lock
  std::vector<double> deltas_;                         // the Flusher's lock: Push's
};

// depth of a priority queue: one series per priority (label priority="<n>") for the first
// `max_series` priorities the queue uses, then one shared series for every other
// priority (priority="exceeded_cardinality_limit", controller-runtime's placeholder). A
// priority keeps the series it first got, so every series stays exact; controller-runtime
// moves all priorities to the placeholder once the limit is passed, which leaves the
// earlier series stuck at their last values.
//
// The queue (single writer) only maps a priority to a slot and bumps its count; the
// Flusher creates a slot's series the first time it pushes it, so a queue operation never
// takes a registry lock.
class BufferedPriorityGauge final : public PriorityGaugeMetric, Buffered {
 public:
  // `make_series(label)` makes the series of priority label `label`; called by the
  // Flusher, under its lock.
  using SeriesMaker =
      std::function<std::unique_ptr<Series<prometheus::Gauge>>(const std::string& label)>;
  static constexpr const char* kPlaceholder = "exceeded_cardinality_limit";

  BufferedPriorityGauge(std::shared_ptr<Flusher> flusher, int max_series, SeriesMaker make_series)
      : flusher_(std::move(flusher)),
        make_series_(std::move(make_series)),
        max_series_(max_series),
        slots_(std::make_unique<Slot[]>(max_series + 1)) {
    slot_of_.reserve(max_series);  // so that SlotOf, under a queue's Inc, never allocates
    flusher_->Add(this);
  }
  ~BufferedPriorityGauge() override { flusher_->Remove(this); }

  void Inc(int priority) override { Bump(SlotOf(priority), 1); }
  void Dec(int priority) override { Bump(SlotOf(priority), -1); }

  // A slot whose series cannot be made is skipped (and retried at the next push), the
  // others pushed; the first such failure is rethrown at the end.
  void Push() override {
    const int used = used_.load(std::memory_order_acquire);
    std::exception_ptr failed;
    for (int i = 0; i <= max_series_; ++i) {
      if (i >= used && i != max_series_) continue;  // not handed out yet
      if (i == max_series_ && !overflowed_.load(std::memory_order_acquire)) continue;
      Slot& slot = slots_[i];
      const int64_t v = slot.value.load(std::memory_order_relaxed);
      if (slot.series == nullptr) {
        try {
          slot.series = make_series_(i == max_series_ ? std::string(kPlaceholder)
                                                      : std::to_string(slot.priority));
        } catch (...) {
          if (!failed) failed = std::current_exception();
          continue;
        }
      }
      if (v != slot.pushed) (**slot.series).Increment(static_cast<double>(v - slot.pushed));
      slot.pushed = v;
    }
    if (failed) std::rethrow_exception(failed);
  }

 private:
  struct Slot {
    std::atomic<int64_t> value{0};  // written by the queue only
    int priority = 0;               // written once, before used_ covers the slot
    int64_t pushed = 0;             // the Flusher's lock
    std::unique_ptr<Series<prometheus::Gauge>> series;  // the Flusher's lock
  };

  // The queue's slot for `priority`: its own while fewer than max_series_ are taken, else
  // the placeholder's. Only priorities with their own slot are remembered, so a queue
  // whose priorities are computed (timestamps, hashes) does not grow a map entry per
  // priority ever used. Single writer.
  // Allocates nothing: the map has room for max_series_ entries from the start.
  int SlotOf(int priority) {
    if (auto it = slot_of_.find(priority); it != slot_of_.end()) return it->second;
    const int used = used_.load(std::memory_order_relaxed);
    if (used == max_series_) {
      overflowed_.store(true, std::memory_order_release);
      return max_series_;
    }
    slot_of_.emplace(priority, used);
    slots_[used].priority = priority;
    used_.store(used + 1, std::memory_order_release);
    return used;
  }
  void Bump(int slot, int64_t by) {
    std::atomic<int64_t>& v = slots_[slot].value;
    v.store(v.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

  const std::shared_ptr<Flusher> flusher_;
  const SeriesMaker make_series_;
  const int max_series_;
  const std::unique_ptr<Slot[]> slots_;    // max_series_ own slots, then the placeholder's
  std::atomic<int> used_{0};               // own slots handed out
  std::atomic<bool> overflowed_{false};    // a priority got the placeholder's slot
  absl::flat_hash_map<int, int> slot_of_;  // the queue's only; reserved for max_series_
};

}  // namespace kwq::prometheus_internal

#endif  // KWQ_SRC_PROMETHEUS_BUFFERED_METRICS_H_
