// Test helper: a MetricsProvider that records every metric of a queue into a map, by
// the short names "depth", "adds", "latency", "work", "unfinished", "longest",
// "retries", "delayed" (and "depth/<priority>" when asked to). Counters and gauges accumulate;
// histograms sum their observations (and count them); settable gauges keep their last value.
// ThrowNext makes a metric's next calls throw instead (the update is not recorded).
// Thread-safe.

#ifndef KWQ_TESTS_TESTING_RECORDING_METRICS_H_
#define KWQ_TESTS_TESTING_RECORDING_METRICS_H_

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kwq/metrics.h"

namespace kwq::testing {

class RecordedMetrics {
 public:
  void Add(const std::string& name, double delta) {
    std::lock_guard<std::mutex> lock(mu_);
    MaybeThrowLocked(name);
    values_[name] += delta;
  }
  void Observe(const std::string& name, double value) {
    std::lock_guard<std::mutex> lock(mu_);
    MaybeThrowLocked(name);
    ++observations_[name];
    values_[name] += value;
  }
  void Set(const std::string& name, double value) {
    std::lock_guard<std::mutex> lock(mu_);
    MaybeThrowLocked(name);
    values_[name] = value;
  }
  // The next `calls` calls of metric `name` throw std::runtime_error.
  void ThrowNext(const std::string& name, int calls) {
    std::lock_guard<std::mutex> lock(mu_);
    throws_[name] = calls;
  }
  double Get(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return values_[name];
  }
  int Observations(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return observations_[name];
  }

 private:
  void MaybeThrowLocked(const std::string& name) {
    auto it = throws_.find(name);
    if (it != throws_.end() && it->second > 0) {
      --it->second;
      throw std::runtime_error("metric " + name + " throws (ThrowNext)");
    }
  }

  std::mutex mu_;
  std::map<std::string, double> values_;
  std::map<std::string, int> observations_;
  std::map<std::string, int> throws_;  // calls left to throw, by metric
};

class RecordingProvider : public MetricsProvider {
 public:
  // `refresh_gauges` false: no unfinished/longest gauges (so the queue arms no refresh
  // timer).
  // `by_priority`: also a priority depth, recorded as "depth/<priority>".
  explicit RecordingProvider(RecordedMetrics* out, bool refresh_gauges = true,
                             bool by_priority = false)
      : out_(out), refresh_gauges_(refresh_gauges), by_priority_(by_priority) {}

  std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view) override {
    return Make<Gauge>("depth");
  }
  std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view) override {
    return Make<Counter>("adds");
  }
  std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view) override {
    return Make<Histogram>("latency");
  }
  std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view) override {
    return Make<Histogram>("work");
  }
  std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(std::string_view) override {
    return refresh_gauges_ ? Make<Settable>("unfinished") : nullptr;
  }
  std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view) override {
    return refresh_gauges_ ? Make<Settable>("longest") : nullptr;
  }
  std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view) override {
    return Make<Counter>("retries");
  }
  std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view) override {
    return Make<Gauge>("delayed");
  }
  std::unique_ptr<PriorityGaugeMetric> NewDepthMetricWithPriority(std::string_view) override {
    return by_priority_ ? Make<PriorityGauge>("depth/") : nullptr;
  }

 private:
  struct Named {
    RecordedMetrics* out;
    std::string name;
  };
  struct Counter : CounterMetric, Named {
    void Inc() override { out->Add(name, 1); }
  };
  struct Gauge : GaugeMetric, Named {
    void Inc() override { out->Add(name, 1); }
    void Dec() override { out->Add(name, -1); }
  };
  struct PriorityGauge : PriorityGaugeMetric, Named {
    void Inc(int priority) override { out->Add(name + std::to_string(priority), 1); }
    void Dec(int priority) override { out->Add(name + std::to_string(priority), -1); }
  };
  struct Settable : SettableGaugeMetric, Named {
    void Set(double v) override { out->Set(name, v); }
  };
  struct Histogram : HistogramMetric, Named {
    void Observe(double v) override { out->Observe(name, v); }
  };
  template <typename M>
  std::unique_ptr<M> Make(std::string name) {
    auto m = std::make_unique<M>();
    m->out = out_;
    m->name = std::move(name);
    return m;
  }

  RecordedMetrics* const out_;
  const bool refresh_gauges_;
  const bool by_priority_;
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_RECORDING_METRICS_H_
