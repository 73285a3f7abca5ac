// File: kwq/internal/queue_metrics.h
//
// QueueMetricsRecorder: the client-go metric set for one queue, fed by slot number so the
// templates in queue.h stay thin. Created only when the queue has a MetricsProvider.
// Thread-safe: every On* method and the refresh timer take the recorder's own lock, so
// each metric object of a queue is used under one lock (kwq/metrics.h's promise). That
// lock is a SpinLock: its sections are short (a clock read, a few stores, the metric
// calls; a refresh walks the items in flight), and a pthread mutex's three lock pairs per
// item cost more than the rest of the bookkeeping (docs/benchmarks.md). Internal.

#ifndef KWQ_INTERNAL_QUEUE_METRICS_H_
#define KWQ_INTERNAL_QUEUE_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/periodic_timer.h"
#include "kwq/internal/safe_growth.h"
#include "kwq/internal/spin_lock.h"
#include "kwq/metrics.h"
#include "kwq/timer.h"

namespace kwq::internal {

class QueueMetricsRecorder {
 public:
  // `timers` refreshes the in-flight gauges every 500 ms (nullptr: TimerService::Default()).
  // With `by_priority` (priority queues) the depth goes to the provider's
  // NewDepthMetricWithPriority when it gives one, else to NewDepthMetric.
  QueueMetricsRecorder(MetricsProvider* provider, std::string_view name, Clock* clock,
                       TimerService* timers, bool by_priority = false);
  // The recorder a queue keeps: nullptr without a provider, or when the provider gives
  // the queue no metric at all (an unnamed queue on kwq::prometheus), so that such a queue
  // pays no clock reads and no lock for metrics.
  static std::unique_ptr<QueueMetricsRecorder> Make(MetricsProvider* provider,
                                                    std::string_view name, Clock* clock,
                                                    TimerService* timers, bool by_priority = false);
  // Stops the refresh timer (waits for a refresh in progress), then takes what this queue
  // still counts off the depth and delayed gauges (which queues of one name may share).
  // Call without any lock the metric objects may wait on.
  ~QueueMetricsRecorder();

  // `priority`: the priority the item waits at (priority queues; 0 elsewhere).
  // None of these throws: the queue calls them between changes of its own state, so an
  // exception from a metric object (or an allocation here) is caught and the update
  // dropped (reported once on stderr) instead of leaving an item half-queued.
  void OnAdd(uint32_t slot, int priority = 0) noexcept;  // an add queued the item in `slot`
  void OnGet(uint32_t slot, int priority = 0) noexcept;  // the item was handed out
  void OnDone(uint32_t slot) noexcept;                   // its lease ended
  void OnRetry() noexcept;                               // a retry (kwq/metrics.h says which)
  void OnDelayed(int delta) noexcept;  // waiting items of a delaying queue: +1 / -1
  // A queued (counted in the depth) item's priority was raised from `from` to `to`.
  void OnReprioritize(int from, int to) noexcept;

  // Recomputes unfinished-work and longest-running gauges now (the timer calls it).
  void Refresh() noexcept;

 private:
  // One item of `priority` left this queue's depth. Returns false (nothing changed) when
  // no item of `priority` was counted: the add's bookkeeping failed for memory.
  bool LeavePriorityLocked(int priority) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // clock_->Now(), or kUnknown when the clock (a user's) throws: times read so are left
  // out of the latency and work-duration figures and the in-flight gauges.
  absl::Time NowOrUnknown() noexcept;
  static constexpr absl::Time kUnknown = absl::InfinitePast();

  Clock* const clock_;
  TimerService* const timers_;
  // Before depth_, which is made only when this is not (as in controller-runtime).
  std::unique_ptr<PriorityGaugeMetric> depth_by_priority_;
  std::unique_ptr<GaugeMetric> depth_;
  std::unique_ptr<CounterMetric> adds_;
  std::unique_ptr<HistogramMetric> latency_;
  std::unique_ptr<HistogramMetric> work_duration_;
  std::unique_ptr<SettableGaugeMetric> unfinished_;
  std::unique_ptr<SettableGaugeMetric> longest_;
  std::unique_ptr<CounterMetric> retries_;
  std::unique_ptr<GaugeMetric> delayed_;

  SpinLock mu_;
  std::vector<absl::Time> added_at_ ABSL_GUARDED_BY(mu_);    // per slot: the queuing add
  std::vector<absl::Time> started_at_ ABSL_GUARDED_BY(mu_);  // per slot: the hand-out
  // The slots in flight, dense (a refresh walks them), and each slot's index in it (kOut
  // when not in flight): O(1) insert and erase without hashing.
  static constexpr uint32_t kOut = UINT32_MAX;
  std::vector<uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> in_flight_at_ ABSL_GUARDED_BY(mu_);
  int64_t depth_count_ ABSL_GUARDED_BY(mu_) = 0;    // this queue's share of depth_
  int64_t delayed_count_ ABSL_GUARDED_BY(mu_) = 0;  // and of delayed_
  // This queue's share of depth_by_priority_, by priority (no zero entries: a priority
  // whose items all left is forgotten).
  // Grown through a reserve (kwq/internal/safe_growth.h): an allocation that fails here is
  // caught, and the map must stay whole for the next call.
  GrowthReserve depth_growth_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t, absl::Hash<int>, std::equal_to<int>,
                      ReservingAllocator<std::pair<const int, int64_t>>>
      depth_by_priority_count_ ABSL_GUARDED_BY(mu_){
          0, absl::Hash<int>{}, std::equal_to<int>{},
          ReservingAllocator<std::pair<const int, int64_t>>(&depth_growth_)};

  // Refreshes the in-flight gauges (when the provider gave any). Last: stopped first.
  std::optional<PeriodicTimer> refresh_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_QUEUE_METRICS_H_
