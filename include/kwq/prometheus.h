// File: kwq/prometheus.h
//
// PrometheusMetricsProvider: exports the metrics of kwq's work queues (kwq/metrics.h) to a
// prometheus-cpp registry, under the names and labels client-go's and controller-runtime's
// Prometheus providers use, so existing Kubernetes dashboards and alerts work unchanged:
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   auto metrics = kwq::PrometheusMetricsProvider::Create(registry).value();
//   kwq::RateLimitingQueue<std::string> q({.name = "pods", .metrics = metrics.get()});
//   prometheus::Exposer exposer("127.0.0.1:8080");  // prometheus-cpp's pull library
//   exposer.RegisterCollectable(registry);
//
// (The Exposer needs <prometheus/exposer.h> and prometheus-cpp's pull library: link
// prometheus-cpp::pull beside kwq::prometheus, which brings the core library only; this
// header declares prometheus::Registry without defining it, so include
// <prometheus/registry.h> too.)
//
// Part of the optional library kwq::prometheus (CMake target kwq::prometheus, built when
// prometheus-cpp is installed; Debian package prometheus-cpp-dev).
//
// Families (one series per queue name, label name="<QueueOptions::name>"):
//   workqueue_depth                                gauge (a PriorityQueue's also labelled
//                                                  priority="<n>": max_priority_series)
//   workqueue_adds_total                           counter
//   workqueue_queue_duration_seconds               histogram
//   workqueue_work_duration_seconds                histogram
//   workqueue_unfinished_work_seconds              gauge
//   workqueue_longest_running_processor_seconds    gauge
//   workqueue_retries_total                        counter
//   kwq_workqueue_delayed_items                    gauge (kwq's own: items waiting for
//                                                  their AddAfter delay)
// The histograms have controller-runtime's buckets: 10 ns to 1000 s in powers of ten
// (client-go's own component-base provider stops at 10 s).
//
// Contract:
//   - As in client-go, a queue with an empty name gets no series (every New* returns
//     nullptr): unnamed queues would otherwise share one.
//   - Queues with the same name share their series. A series leaves the registry when
//     the last queue using it is destroyed (unless PrometheusOptions::keep_series) (so a deleted
//     queue does not leave a stale depth behind); a later queue of that name starts it again from
//     zero, which Prometheus treats as a counter reset. Several providers may share one registry
//     (with the registry's default InsertBehavior::Merge) and then share series too.
//   - Give each queue its own name. Queues sharing one add up in the counters, depth and
//     delayed gauges and histograms (a destroyed queue takes what it still counted off
//     the gauges), but their in-flight gauges, each set every 500 ms, show one of the
//     queues' values, not their sum (as in client-go).
//   - The families belong to kwq: a series added to them by other code may be removed
//     when a queue of that name goes away.
//   - A queue records its metric changes in counters of its own (relaxed atomics only it
//     writes) and the provider pushes them into the series every flush_period, when the
//     queue is destroyed, and on Flush(). So queue operations never take prometheus-cpp's
//     locks or wait for a scrape, and a scrape may miss up to one period of changes.
//
// Thread safety: Create and every member may be called from any thread. A metric object
// from New* takes one call at a time (a queue serialises its calls, kwq/metrics.h): it
// buffers changes in counters only its user writes. The provider must outlive every
// queue that uses it (QueueOptions::metrics) and keeps the registry alive itself. Nothing
// here blocks except on short internal locks, and one longer one: building or
// destroying a queue that uses the provider waits for a flush in progress (a pass over
// every live queue metric of the provider), as do Flush() and the destructor.

#ifndef KWQ_PROMETHEUS_H_
#define KWQ_PROMETHEUS_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kwq/metrics.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace kwq {

class TimerService;

struct PrometheusOptions {
  // Labels added to every series of every family (prometheus-cpp's constant labels), for
  // example {{"cluster", "eu-1"}}. Names must be valid Prometheus label names and must not
  // be "name", "priority" or "le" (or "controller" with controller_label).
  std::map<std::string, std::string> const_labels = {};
  // Also label each series controller="<queue name>", as controller-runtime does (its
  // queues are named after their controllers), so its dashboards' selectors match.
  bool controller_label = false;
  // Keep each series for the life of the registry, as client-go and controller-runtime
  // do, instead of removing it with the last queue of its name: a queue made again under
  // that name then continues its counters rather than restarting them. Providers sharing
  // a registry: a series any keep_series provider used stays, also through later queues
  // of its name made by providers that do not keep series (providers share a registry by
  // copies of one std::shared_ptr to it: the mark follows its control block).
  bool keep_series = false;
  // How often the queues' metric changes reach the registry. A queue records them in
  // plain counters of its own; the provider pushes them into the prometheus-cpp series
  // every flush_period on a timer (and at once when a queue is destroyed, or on Flush()),
  // so queue operations never wait on prometheus-cpp's locks. A scrape may therefore
  // miss up to one period of changes. Must be positive; InfiniteDuration() pushes only on
  // Flush() and queue destruction.
  absl::Duration flush_period = absl::Seconds(1);
  // A PriorityQueue's depth is exported per priority, as controller-runtime does:
  // workqueue_depth{name, priority="<n>"}. Each queue gets its own series for the first
  // max_priority_series priorities it uses (25: controller-runtime's limit) and one
  // series, priority="exceeded_cardinality_limit", for all the others. Unlike
  // controller-runtime, a priority keeps its series once the limit is reached, so each
  // series stays exact. In [0, kMaxPrioritySeriesLimit] (0: every priority goes to the
  // shared one); each priority queue keeps a slot per series and every flush walks them.
  int max_priority_series = 25;
  static constexpr int kMaxPrioritySeriesLimit = 1024;
  // The timer service for the flushes; nullptr: TimerService::Default(). Must outlive the
  // provider. Each flush runs as a callback on that service's thread and pushes every
  // live queue metric into its series: with many queues it delays the service's other
  // timers (on the default one: context deadlines and queue delays).
  TimerService* timers = nullptr;
};

class PrometheusMetricsProvider final : public MetricsProvider {
 public:
  // Registers the families above on `registry`. Errors: InvalidArgument for a null
  // registry, an invalid or reserved label name, max_priority_series outside
  // [0, kMaxPrioritySeriesLimit] or a flush_period that is not positive; AlreadyExists
  // when the registry holds a family of one of these names that cannot be shared
  // (another metric type or other constant labels, or a registry built with
  // InsertBehavior::Throw that has it already). Throws std::bad_alloc when memory lacks
  // (the families registered by then stay in the registry; a later Create shares them).
  static absl::StatusOr<std::unique_ptr<PrometheusMetricsProvider>> Create(
      std::shared_ptr<prometheus::Registry> registry, PrometheusOptions options = {});

  // Stops the flush timer (waiting for a flush in progress) and flushes once more. The
  // queues using it should be gone first (see Thread safety).
  ~PrometheusMetricsProvider() override;
  PrometheusMetricsProvider(const PrometheusMetricsProvider&) = delete;
  PrometheusMetricsProvider& operator=(const PrometheusMetricsProvider&) = delete;

  // MetricsProvider (kwq/metrics.h). Each returns nullptr for an empty queue name.
  std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view queue) override;
  std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view queue) override;
  std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view queue) override;
  std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view queue) override;
  std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(
      std::string_view queue) override;
  std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view queue) override;
  std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view queue) override;
  std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view queue) override;
  // A PriorityQueue's depth: workqueue_depth series with a priority="<n>" label
  // (controller-runtime's), see PrometheusOptions::max_priority_series.
  std::unique_ptr<PriorityGaugeMetric> NewDepthMetricWithPriority(std::string_view queue) override;

  // Pushes every change the queues have recorded into the registry now (before a push to
  // a gateway, or in tests). Waits for a flush in progress.
  void Flush();

  // The registry the families are on.
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  struct Families;  // src/prometheus/prometheus.cc
  struct Flushing;  // the flush timer
  PrometheusMetricsProvider(std::shared_ptr<prometheus::Registry> registry,
                            PrometheusOptions options, std::unique_ptr<Families> families);

  const std::shared_ptr<prometheus::Registry> registry_;
  const PrometheusOptions options_;
  const std::unique_ptr<Families> families_;
  const std::unique_ptr<Flushing> flushing_;
};

}  // namespace kwq

#endif  // KWQ_PROMETHEUS_H_
