// Bench helper: a MetricsProvider whose metrics do nothing, to measure what a queue's
// metric calls cost without any metric's own cost.

#ifndef KWQ_BENCH_NOP_METRICS_H_
#define KWQ_BENCH_NOP_METRICS_H_

#include <memory>
#include <string_view>

#include "kwq/metrics.h"

namespace kwq {

// Metrics that do nothing (the virtual calls and clock reads still happen).
struct NopMetric : CounterMetric, GaugeMetric, SettableGaugeMetric, HistogramMetric {
  void Inc() override {}
  void Dec() override {}
  void Set(double) override {}
  void Observe(double) override {}
};
struct NopProvider : MetricsProvider {
  std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
  std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view) override {
    return std::make_unique<NopMetric>();
  }
};

}  // namespace kwq

#endif  // KWQ_BENCH_NOP_METRICS_H_
