#include "kwq/prometheus.h"

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kwq/internal/mutex.h"

namespace kwq {

namespace {

// controller-runtime's buckets for both histograms: 10 ns to 1000 s, one per power of ten.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  prometheus::Histogram::BucketBoundaries buckets;
  double bound = 1e-8;
  for (int i = 0; i < 12; ++i, bound *= 10) buckets.push_back(bound);
  return buckets;
}

// How many live queue metrics use each series. Family::Add hands out the existing series
// for labels it has already, so queues of one name (through one provider or through
// several sharing a registry) share a series, which must stay until the last of them
// goes. Keyed by the series object; process-wide because providers may share a registry.
class SeriesUsers {
 public:
  static SeriesUsers& Get() {
    static SeriesUsers* const users = new SeriesUsers;  // never destroyed: see ~Series
    return *users;
  }

  template <typename M, typename... Args>
  M* Acquire(prometheus::Family<M>& family, const prometheus::Labels& labels, Args&&... args) {
    internal::MutexLock lock(&mu_);
    M* series = &family.Add(labels, std::forward<Args>(args)...);
    ++users_[series];
    return series;
  }

  // Counts one user less; the last one removes the series unless `keep`.
  template <typename M>
  void Release(prometheus::Family<M>& family, M* series, bool keep) {
    internal::MutexLock lock(&mu_);
    auto it = users_.find(series);
    if (it == users_.end() || --it->second > 0) return;
    users_.erase(it);
    if (!keep) family.Remove(series);  // takes the family's lock, never ours: no cycle
  }

 private:
  internal::Mutex mu_;
  absl::flat_hash_map<const void*, int> users_ ABSL_GUARDED_BY(mu_);
};

// One queue's use of one series. Holds the registry, which owns the family, so a series
// is removed safely even if the provider is gone first.
template <typename M>
class Series {
 public:
  template <typename... Args>
  Series(std::shared_ptr<prometheus::Registry> registry, prometheus::Family<M>* family, bool keep,
         const prometheus::Labels& labels, Args&&... args)
      : registry_(std::move(registry)),
        family_(family),
        keep_(keep),
        series_(SeriesUsers::Get().Acquire(*family, labels, std::forward<Args>(args)...)) {}
  ~Series() { SeriesUsers::Get().Release(*family_, series_, keep_); }
  Series(const Series&) = delete;
  Series& operator=(const Series&) = delete;

  M& operator*() const { return *series_; }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<M>* const family_;
  const bool keep_;
  M* const series_;
};

class Gauge final : public GaugeMetric {
 public:
  explicit Gauge(std::unique_ptr<Series<prometheus::Gauge>> s) : s_(std::move(s)) {}
  void Inc() override { (**s_).Increment(); }
  void Dec() override { (**s_).Decrement(); }

 private:
  const std::unique_ptr<Series<prometheus::Gauge>> s_;
};

class SettableGauge final : public SettableGaugeMetric {
 public:
  explicit SettableGauge(std::unique_ptr<Series<prometheus::Gauge>> s) : s_(std::move(s)) {}
  void Set(double value) override { (**s_).Set(value); }

 private:
  const std::unique_ptr<Series<prometheus::Gauge>> s_;
};

class Counter final : public CounterMetric {
 public:
  explicit Counter(std::unique_ptr<Series<prometheus::Counter>> s) : s_(std::move(s)) {}
  void Inc() override { (**s_).Increment(); }

 private:
  const std::unique_ptr<Series<prometheus::Counter>> s_;
};

class Histogram final : public HistogramMetric {
 public:
  explicit Histogram(std::unique_ptr<Series<prometheus::Histogram>> s) : s_(std::move(s)) {}
  void Observe(double seconds) override { (**s_).Observe(seconds); }

 private:
  const std::unique_ptr<Series<prometheus::Histogram>> s_;
};

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
  for (const auto& [label, value] : options.const_labels) {
    if (!prometheus::CheckLabelName(label)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PrometheusMetricsProvider: \"", label, "\" is not a valid label name"));
    }
    // "le" is the bucket label of histograms.
    if (label == "name" || label == "le" || (options.controller_label && label == "controller")) {
      return absl::InvalidArgumentError(absl::StrCat("PrometheusMetricsProvider: the label name \"",
                                                     label, "\" is reserved for kwq's series"));
    }
  }
  const prometheus::Labels labels(options.const_labels.begin(), options.const_labels.end());
  auto families = std::make_unique<Families>();
  // A failure leaves the families registered before it in place: they may be shared
  // with another provider, and an empty family exports nothing.
  try {
    families->depth = &prometheus::BuildGauge()
                           .Name("workqueue_depth")
                           .Help("Items waiting in a kwq queue to be handed out")
                           .Labels(labels)
                           .Register(*registry);
    families->adds = &prometheus::BuildCounter()
                          .Name("workqueue_adds_total")
                          .Help("Adds that queued an item in a kwq queue")
                          .Labels(labels)
                          .Register(*registry);
    families->latency = &prometheus::BuildHistogram()
                             .Name("workqueue_queue_duration_seconds")
                             .Help("Seconds an item waited in a kwq queue before it was handed out")
                             .Labels(labels)
                             .Register(*registry);
    families->work_duration = &prometheus::BuildHistogram()
                                   .Name("workqueue_work_duration_seconds")
                                   .Help("Seconds from handing an item out to its Done")
                                   .Labels(labels)
                                   .Register(*registry);
    families->unfinished =
        &prometheus::BuildGauge()
             .Name("workqueue_unfinished_work_seconds")
             .Help(
                 "Sum of the running times of the items in flight; a value that keeps "
                 "growing means stuck workers")
             .Labels(labels)
             .Register(*registry);
    families->longest = &prometheus::BuildGauge()
                             .Name("workqueue_longest_running_processor_seconds")
                             .Help("Running time of the longest-running item in flight")
                             .Labels(labels)
                             .Register(*registry);
    families->retries = &prometheus::BuildCounter()
                             .Name("workqueue_retries_total")
                             .Help("Rate-limited re-adds (AddRateLimited) of a kwq queue")
                             .Labels(labels)
                             .Register(*registry);
    families->delayed = &prometheus::BuildGauge()
                             .Name("kwq_workqueue_delayed_items")
                             .Help("Items of a kwq delaying queue waiting for their delay")
                             .Labels(labels)
                             .Register(*registry);
  } catch (const std::exception& e) {
    return absl::AlreadyExistsError(absl::StrCat(
        "PrometheusMetricsProvider: cannot register the workqueue families: ", e.what()));
  }
  return std::unique_ptr<PrometheusMetricsProvider>(
      new PrometheusMetricsProvider(std::move(registry), std::move(options), std::move(families)));
}

PrometheusMetricsProvider::PrometheusMetricsProvider(std::shared_ptr<prometheus::Registry> registry,
                                                     PrometheusOptions options,
                                                     std::unique_ptr<Families> families)
    : registry_(std::move(registry)),
      options_(std::move(options)),
      families_(std::move(families)) {}

PrometheusMetricsProvider::~PrometheusMetricsProvider() = default;

namespace {

template <typename Metric, typename M, typename... Args>
std::unique_ptr<Metric> Make(const std::shared_ptr<prometheus::Registry>& registry,
                             prometheus::Family<M>* family, const PrometheusOptions& options,
                             std::string_view queue, Args&&... args) {
  if (queue.empty()) return nullptr;  // client-go: unnamed queues have no metrics
  prometheus::Labels labels{{"name", std::string(queue)}};
  if (options.controller_label) labels.emplace("controller", std::string(queue));
  return std::make_unique<Metric>(std::make_unique<Series<M>>(registry, family, options.keep_series,
                                                              labels, std::forward<Args>(args)...));
}

}  // namespace

std::unique_ptr<GaugeMetric> PrometheusMetricsProvider::NewDepthMetric(std::string_view queue) {
  return Make<Gauge>(registry_, families_->depth, options_, queue);
}

std::unique_ptr<CounterMetric> PrometheusMetricsProvider::NewAddsMetric(std::string_view queue) {
  return Make<Counter>(registry_, families_->adds, options_, queue);
}

std::unique_ptr<HistogramMetric> PrometheusMetricsProvider::NewLatencyMetric(
    std::string_view queue) {
  return Make<Histogram>(registry_, families_->latency, options_, queue, DurationBuckets());
}

std::unique_ptr<HistogramMetric> PrometheusMetricsProvider::NewWorkDurationMetric(
    std::string_view queue) {
  return Make<Histogram>(registry_, families_->work_duration, options_, queue, DurationBuckets());
}

std::unique_ptr<SettableGaugeMetric> PrometheusMetricsProvider::NewUnfinishedWorkSecondsMetric(
    std::string_view queue) {
  return Make<SettableGauge>(registry_, families_->unfinished, options_, queue);
}

std::unique_ptr<SettableGaugeMetric>
PrometheusMetricsProvider::NewLongestRunningProcessorSecondsMetric(std::string_view queue) {
  return Make<SettableGauge>(registry_, families_->longest, options_, queue);
}

std::unique_ptr<CounterMetric> PrometheusMetricsProvider::NewRetriesMetric(std::string_view queue) {
  return Make<Counter>(registry_, families_->retries, options_, queue);
}

std::unique_ptr<GaugeMetric> PrometheusMetricsProvider::NewDelayedMetric(std::string_view queue) {
  return Make<Gauge>(registry_, families_->delayed, options_, queue);
}

}  // namespace kwq
