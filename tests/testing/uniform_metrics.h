// Test helper: UniformProvider<M>, a MetricsProvider whose every metric is a new M (M
// implements CounterMetric, GaugeMetric, SettableGaugeMetric and HistogramMetric), for
// tests that need all of a queue's metrics to behave one way (throw, say).

#ifndef KWQ_TESTS_TESTING_UNIFORM_METRICS_H_
#define KWQ_TESTS_TESTING_UNIFORM_METRICS_H_

#include <memory>
#include <string_view>

#include "kwq/metrics.h"

namespace kwq::testing {

template <typename M>
class UniformProvider final : public MetricsProvider {
 public:
  std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view) override { return New(); }
  std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view) override { return New(); }
  std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view) override { return New(); }
  std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view) override {
    return New();
  }
  std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(std::string_view) override {
    return New();
  }
  std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view) override {
    return New();
  }
  std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view) override { return New(); }
  std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view) override { return New(); }

 private:
  static std::unique_ptr<M> New() { return std::make_unique<M>(); }
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_UNIFORM_METRICS_H_
