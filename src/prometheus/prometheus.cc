#include "kwq/prometheus.h"

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <exception>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "buffered_metrics.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/periodic_timer.h"
#include "kwq/timer.h"
#include "series.h"

namespace kwq {

namespace {
// Registers (or, on a merging registry, finds) one family.
template <typename Builder>
auto* Register(Builder builder, const char* name, const char* help,
               const prometheus::Labels& labels, prometheus::Registry& registry) {
  return &builder.Name(name).Help(help).Labels(labels).Register(registry);
}

using prometheus_internal::BufferedCounter;
using prometheus_internal::BufferedGauge;
using prometheus_internal::BufferedHistogram;
using prometheus_internal::BufferedPriorityGauge;
using prometheus_internal::BufferedSettableGauge;
using prometheus_internal::Flusher;
using prometheus_internal::Series;
}  // namespace

struct PrometheusMetricsProvider::Families {
  prometheus::Family<prometheus::Gauge>* depth = nullptr;
  prometheus::Family<prometheus::Counter>* adds = nullptr;
  prometheus::Family<prometheus::Histogram>* latency = nullptr;
  prometheus::Family<prometheus::Histogram>* work_duration = nullptr;
  prometheus::Family<prometheus::Gauge>* unfinished = nullptr;
  prometheus::Family<prometheus::Gauge>* longest = nullptr;
  prometheus::Family<prometheus::Counter>* retries = nullptr;
  prometheus::Family<prometheus::Gauge>* delayed = nullptr;
};

absl::StatusOr<std::unique_ptr<PrometheusMetricsProvider>> PrometheusMetricsProvider::Create(
    std::shared_ptr<prometheus::Registry> registry, PrometheusOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("PrometheusMetricsProvider: the registry is null");
  }
  if (options.max_priority_series < 0 ||
      options.max_priority_series > PrometheusOptions::kMaxPrioritySeriesLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrometheusMetricsProvider: max_priority_series must be in [0, ",
        PrometheusOptions::kMaxPrioritySeriesLimit, "], not ", options.max_priority_series));
  }
  if (options.flush_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrometheusMetricsProvider: flush_period must be positive, not ",
                     absl::FormatDuration(options.flush_period)));
  }
  for (const auto& [label, value] : options.const_labels) {
    if (!prometheus::CheckLabelName(label)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PrometheusMetricsProvider: \"", label, "\" is not a valid label name"));
    }
    // "le" is the bucket label of histograms, "priority" that of a priority queue's depth.
    if (label == "name" || label == "le" || label == "priority" ||
        (options.controller_label && label == "controller")) {
      return absl::InvalidArgumentError(absl::StrCat("PrometheusMetricsProvider: the label name \"",
                                                     label, "\" is reserved for kwq's series"));
    }
  }
  const prometheus::Labels labels(options.const_labels.begin(), options.const_labels.end());
  auto families = std::make_unique<Families>();
  // A failure leaves the families registered before it in place: they may be shared
  // with another provider, and an empty family exports nothing.
  try {
    families->depth = Register(prometheus::BuildGauge(), "workqueue_depth",
                               "Items waiting in a kwq queue to be handed out", labels, *registry);
    families->adds = Register(prometheus::BuildCounter(), "workqueue_adds_total",
                              "Adds that queued an item in a kwq queue", labels, *registry);
    families->latency = Register(prometheus::BuildHistogram(), "workqueue_queue_duration_seconds",
                                 "Seconds an item waited in a kwq queue before it was handed out",
                                 labels, *registry);
    families->work_duration =
        Register(prometheus::BuildHistogram(), "workqueue_work_duration_seconds",
                 "Seconds from handing an item out to its Done", labels, *registry);
    families->unfinished = Register(prometheus::BuildGauge(), "workqueue_unfinished_work_seconds",
                                    "Sum of the running times of the items in flight; a value "
                                    "that keeps growing means stuck workers",
                                    labels, *registry);
    families->longest =
        Register(prometheus::BuildGauge(), "workqueue_longest_running_processor_seconds",
                 "Running time of the longest-running item in flight", labels, *registry);
    families->retries =
        Register(prometheus::BuildCounter(), "workqueue_retries_total",
                 "Retries of a kwq queue: AddAfter and AddRateLimited calls before ShutDown, "
                 "and the adds of a priority queue that wait",
                 labels, *registry);
    families->delayed =
        Register(prometheus::BuildGauge(), "kwq_workqueue_delayed_items",
                 "Items of a kwq delaying queue waiting for their delay", labels, *registry);
  } catch (const std::bad_alloc&) {
    throw;  // not a name clash (it read AlreadyExists)
  } catch (const std::exception& e) {
    return absl::AlreadyExistsError(absl::StrCat(
        "PrometheusMetricsProvider: cannot register the workqueue families: ", e.what()));
  }
  return std::unique_ptr<PrometheusMetricsProvider>(
      new PrometheusMetricsProvider(std::move(registry), std::move(options), std::move(families)));
}

struct PrometheusMetricsProvider::Flushing {
  const std::shared_ptr<Flusher> flusher = std::make_shared<Flusher>();
  std::optional<internal::PeriodicTimer> timer;  // none with an infinite flush_period
};

PrometheusMetricsProvider::PrometheusMetricsProvider(std::shared_ptr<prometheus::Registry> registry,
                                                     PrometheusOptions options,
                                                     std::unique_ptr<Families> families)
    : registry_(std::move(registry)),
      options_(std::move(options)),
      families_(std::move(families)),
      flushing_(std::make_unique<Flushing>()) {
  if (options_.flush_period != absl::InfiniteDuration()) {
    flushing_->timer.emplace(
        options_.timers != nullptr ? options_.timers : &TimerService::Default(),
        options_.flush_period, [this] { Flush(); });
  }
}

PrometheusMetricsProvider::~PrometheusMetricsProvider() {
  flushing_->timer.reset();  // waits for a flush in progress
  // Metrics still alive (the queues should be gone first) keep the flusher and push their
  // changes when they die; what the others buffered is in the series already.
  Flush();
}

void PrometheusMetricsProvider::Flush() { flushing_->flusher->FlushAll(); }

namespace {

// The labels of `queue`'s series.
prometheus::Labels QueueLabels(const PrometheusOptions& options, std::string_view queue) {
  prometheus::Labels labels{{"name", std::string(queue)}};
  if (options.controller_label) labels.emplace("controller", std::string(queue));
  return labels;
}

// The buffered metric of `queue` on `family` (nullptr for an unnamed queue, as client-go).
template <typename Metric, typename M, typename... Args>
std::unique_ptr<Metric> Make(const std::shared_ptr<prometheus::Registry>& registry,
                             const std::shared_ptr<Flusher>& flusher, prometheus::Family<M>* family,
                             const PrometheusOptions& options, std::string_view queue,
                             Args&&... args) {
  if (queue.empty()) return nullptr;
  const prometheus::Labels labels = QueueLabels(options, queue);
  return std::make_unique<Metric>(
      flusher, std::make_unique<Series<M>>(registry, family, options.keep_series, labels,
                                           std::forward<Args>(args)...));
}

}  // namespace

std::unique_ptr<GaugeMetric> PrometheusMetricsProvider::NewDepthMetric(std::string_view queue) {
  return Make<BufferedGauge>(registry_, flushing_->flusher, families_->depth, options_, queue);
}

std::unique_ptr<PriorityGaugeMetric> PrometheusMetricsProvider::NewDepthMetricWithPriority(
    std::string_view queue) {
  if (queue.empty()) return nullptr;
  return std::make_unique<BufferedPriorityGauge>(
      flushing_->flusher, options_.max_priority_series,
      [registry = registry_, family = families_->depth, keep = options_.keep_series,
       labels = QueueLabels(options_, queue)](const std::string& priority) {
        prometheus::Labels with_priority = labels;
        with_priority.emplace("priority", priority);
        return std::make_unique<Series<prometheus::Gauge>>(registry, family, keep, with_priority);
      });
}

std::unique_ptr<CounterMetric> PrometheusMetricsProvider::NewAddsMetric(std::string_view queue) {
  return Make<BufferedCounter>(registry_, flushing_->flusher, families_->adds, options_, queue);
}

std::unique_ptr<HistogramMetric> PrometheusMetricsProvider::NewLatencyMetric(
    std::string_view queue) {
  return Make<BufferedHistogram>(registry_, flushing_->flusher, families_->latency, options_, queue,
                                 BufferedHistogram::Bounds());
}

std::unique_ptr<HistogramMetric> PrometheusMetricsProvider::NewWorkDurationMetric(
    std::string_view queue) {
  return Make<BufferedHistogram>(registry_, flushing_->flusher, families_->work_duration, options_,
                                 queue, BufferedHistogram::Bounds());
}

std::unique_ptr<SettableGaugeMetric> PrometheusMetricsProvider::NewUnfinishedWorkSecondsMetric(
    std::string_view queue) {
  return Make<BufferedSettableGauge>(registry_, flushing_->flusher, families_->unfinished, options_,
                                     queue);
}

std::unique_ptr<SettableGaugeMetric>
PrometheusMetricsProvider::NewLongestRunningProcessorSecondsMetric(std::string_view queue) {
  return Make<BufferedSettableGauge>(registry_, flushing_->flusher, families_->longest, options_,
                                     queue);
}

std::unique_ptr<CounterMetric> PrometheusMetricsProvider::NewRetriesMetric(std::string_view queue) {
  return Make<BufferedCounter>(registry_, flushing_->flusher, families_->retries, options_, queue);
}

std::unique_ptr<GaugeMetric> PrometheusMetricsProvider::NewDelayedMetric(std::string_view queue) {
  return Make<BufferedGauge>(registry_, flushing_->flusher, families_->delayed, options_, queue);
}

}  // namespace kwq
