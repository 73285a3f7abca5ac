// File: kwq/metrics.h
//
// Metrics of kwq's work queues, with the metric set of client-go's workqueue package so
// that existing Kubernetes dashboards can keep working, plus the number of items waiting
// in a delaying queue. kwq/prometheus.h exports them to Prometheus under client-go's
// names (workqueue_depth, workqueue_adds_total, ...). Durations are in seconds.
//
// A queue built without a MetricsProvider (the default) records nothing and does not read
// the clock for metrics: the cost is one predictable branch per operation.
//
// Thread safety: a queue calls its metric objects one call at a time (under a short
// internal spin lock, from its producers, workers and timer thread), so a metric used by
// one queue needs no locking of its own; implementations must be thread-safe when one
// provider serves several queues. Metric calls must be short and must not call back into
// the queue: other threads of the queue spin while one runs. They must not throw either:
// an exception from one is caught and that one update dropped (said once on stderr): the
// queue's own state, its other metrics and the later updates of this one (times, the
// in-flight list) stay whole; only the throwing metric's value may then be off.
//
// When a queue is destroyed, it takes what it still counts (items waiting or delayed) off
// its depth and delayed gauges, so a gauge shared by queues of one name stays right.

#ifndef KWQ_METRICS_H_
#define KWQ_METRICS_H_

#include <memory>
#include <string_view>

namespace kwq {

class CounterMetric {
 public:
  virtual ~CounterMetric() = default;
  virtual void Inc() = 0;
};

class GaugeMetric {
 public:
  virtual ~GaugeMetric() = default;
  virtual void Inc() = 0;
  virtual void Dec() = 0;
};

class SettableGaugeMetric {
 public:
  virtual ~SettableGaugeMetric() = default;
  virtual void Set(double value) = 0;
};

// A gauge with one value per priority: the depth of a PriorityQueue by the priority its
// items wait at (controller-runtime's DepthMetricWithPriority).
class PriorityGaugeMetric {
 public:
  virtual ~PriorityGaugeMetric() = default;
  virtual void Inc(int priority) = 0;
  virtual void Dec(int priority) = 0;
};

// Observes durations in seconds.
class HistogramMetric {
 public:
  virtual ~HistogramMetric() = default;
  virtual void Observe(double seconds) = 0;
};

// Creates the metrics of one named queue. Each New* is called once per queue, when the
// queue is built, on the thread that builds it (so concurrently when queues are built
// concurrently); returning nullptr disables that metric. An exception a New* throws
// leaves the queue's constructor (PriorityQueue::Create: that call), and no queue is
// made.
class MetricsProvider {
 public:
  virtual ~MetricsProvider() = default;
  // Items ready or requeued (client-go's depth): dirty items, not counting in-flight ones.
  virtual std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view queue) = 0;
  // Adds that queued an item (deduplicated adds are not counted).
  virtual std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view queue) = 0;
  // Time from the add that queued an item to the Get that handed it out.
  virtual std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view queue) = 0;
  // Time from Get to Done.
  virtual std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view queue) = 0;
  // Sum of the running times of all items in flight, refreshed every 500 ms.
  virtual std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(
      std::string_view queue) = 0;
  // Running time of the longest item in flight, refreshed every 500 ms.
  virtual std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view queue) = 0;
  // Retries, as client-go and controller-runtime count them: every AddAfter and
  // AddRateLimited call before ShutDown (delaying and rate-limiting queues, also with no
  // delay); in a PriorityQueue, every add whose delay (or rate-limited backoff) is
  // positive, as controller-runtime counts them (also one that merges into an item
  // already ready, and so does not wait).
  virtual std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view queue) = 0;
  // Items waiting for their AddAfter delay (delaying queues; kwq's addition).
  virtual std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view queue) = 0;
  // The depth of a PriorityQueue by priority (controller-runtime's
  // MetricsProviderWithPriority). A PriorityQueue asks for it first and, given one,
  // reports its depth there and does not call NewDepthMetric. An item counts at the
  // priority it waits at: raising a waiting item's priority moves it from one value to
  // the other. Other queues never call it. The default returns nullptr, so a provider
  // without it gets a priority queue's depth through NewDepthMetric.
  virtual std::unique_ptr<PriorityGaugeMetric> NewDepthMetricWithPriority(std::string_view queue) {
    (void)queue;
    return nullptr;
  }
};

}  // namespace kwq

#endif  // KWQ_METRICS_H_
