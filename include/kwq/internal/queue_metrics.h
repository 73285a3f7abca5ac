// File: kwq/internal/queue_metrics.h
//
// QueueMetricsRecorder: the client-go metric set for one queue, fed by slot number so the
// templates in queue.h stay thin. Created only when the queue has a MetricsProvider.
// Every On* method is called with `queue_mu` held (a Queue's metrics lock, a
// PriorityQueue's only lock), and the recorder's refresh timer takes that lock itself, so
// each metric object of a queue is used under one lock (kwq/metrics.h's promise).
// Internal.

#ifndef KWQ_INTERNAL_QUEUE_METRICS_H_
#define KWQ_INTERNAL_QUEUE_METRICS_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/internal/mutex.h"
#include "kwq/metrics.h"
#include "kwq/timer.h"

namespace kwq::internal {

class QueueMetricsRecorder {
 public:
  // `queue_mu` is the owning queue's lock; `timers` refreshes the in-flight gauges every
  // 500 ms (nullptr: TimerService::Default()).
  QueueMetricsRecorder(MetricsProvider* provider, std::string_view name, Clock* clock,
                       TimerService* timers, Mutex* queue_mu);
  // Stops the refresh timer (waits for a refresh in progress). Call without queue_mu.
  ~QueueMetricsRecorder();

  void OnAdd(uint32_t slot);   // an add queued the item in `slot`
  void OnGet(uint32_t slot);   // the item was handed out
  void OnDone(uint32_t slot);  // its lease ended
  void OnRetry();              // AddRateLimited
  void OnDelayed(int delta);   // waiting items of a delaying queue: +1 / -1

  // Recomputes unfinished-work and longest-running gauges now (the timer calls it).
  void Refresh();

 private:
  void Arm();

  Mutex* const queue_mu_;
  Clock* const clock_;
  TimerService* const timers_;
  std::unique_ptr<GaugeMetric> depth_;
  std::unique_ptr<CounterMetric> adds_;
  std::unique_ptr<HistogramMetric> latency_;
  std::unique_ptr<HistogramMetric> work_duration_;
  std::unique_ptr<SettableGaugeMetric> unfinished_;
  std::unique_ptr<SettableGaugeMetric> longest_;
  std::unique_ptr<CounterMetric> retries_;
  std::unique_ptr<GaugeMetric> delayed_;

  // Guarded by *queue_mu_ (the analysis cannot name another object's lock here).
  std::vector<absl::Time> added_at_;    // per slot: when the queuing add happened
  std::vector<absl::Time> started_at_;  // per slot: when Get handed it out
  absl::flat_hash_set<uint32_t> in_flight_;

  Mutex timer_mu_;
  TimerId timer_ ABSL_GUARDED_BY(timer_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(timer_mu_) = false;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_QUEUE_METRICS_H_
