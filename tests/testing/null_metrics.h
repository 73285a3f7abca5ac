// Test helper: NullMetricsProvider, a MetricsProvider that makes no metric (every New*
// returns nullptr, which a queue takes as "leave this metric out"), for tests that
// override the one or two they look at.

#ifndef KWQ_TESTS_TESTING_NULL_METRICS_H_
#define KWQ_TESTS_TESTING_NULL_METRICS_H_

#include <memory>
#include <string_view>

#include "kwq/metrics.h"

namespace kwq::testing {

class NullMetricsProvider : public MetricsProvider {
 public:
  std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view) override { return nullptr; }
  std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view) override { return nullptr; }
  std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view) override { return nullptr; }
  std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view) override {
    return nullptr;
  }
  std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(std::string_view) override {
    return nullptr;
  }
  std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view) override {
    return nullptr;
  }
  std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view) override { return nullptr; }
  std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view) override { return nullptr; }
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_NULL_METRICS_H_
