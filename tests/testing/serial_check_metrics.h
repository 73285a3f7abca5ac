// Test helper: a MetricsProvider whose metrics are not thread-safe, as kwq/metrics.h
// allows for a provider that serves one queue. Every metric of the queue bumps one plain
// (non-atomic) counter, so two calls that the queue does not serialise are a data race
// that ThreadSanitizer reports even when they do not overlap in time; and an atomic flag
// held across a short pause counts the calls that do overlap, for builds without TSan.

#ifndef KWQ_TESTS_TESTING_SERIAL_CHECK_METRICS_H_
#define KWQ_TESTS_TESTING_SERIAL_CHECK_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kwq/metrics.h"

namespace kwq::testing {

class SerialCheckProvider : public MetricsProvider {
 public:
  // Calls made to the metrics (read once the queue is gone).
  int64_t calls() const { return state_.calls; }
  // Calls that began while another was in progress.
  int overlaps() const { return state_.overlaps.load(); }

  std::unique_ptr<GaugeMetric> NewDepthMetric(std::string_view) override {
    return std::make_unique<Gauge>(&state_);
  }
  std::unique_ptr<CounterMetric> NewAddsMetric(std::string_view) override {
    return std::make_unique<Counter>(&state_);
  }
  std::unique_ptr<HistogramMetric> NewLatencyMetric(std::string_view) override {
    return std::make_unique<Histogram>(&state_);
  }
  std::unique_ptr<HistogramMetric> NewWorkDurationMetric(std::string_view) override {
    return std::make_unique<Histogram>(&state_);
  }
  std::unique_ptr<SettableGaugeMetric> NewUnfinishedWorkSecondsMetric(std::string_view) override {
    return nullptr;
  }
  std::unique_ptr<SettableGaugeMetric> NewLongestRunningProcessorSecondsMetric(
      std::string_view) override {
    return nullptr;
  }
  std::unique_ptr<CounterMetric> NewRetriesMetric(std::string_view) override {
    return std::make_unique<Counter>(&state_);
  }
  std::unique_ptr<GaugeMetric> NewDelayedMetric(std::string_view) override {
    return std::make_unique<Gauge>(&state_);
  }

 private:
  struct State {
    int64_t calls = 0;  // deliberately not atomic
    std::atomic<bool> inside{false};
    std::atomic<int> overlaps{0};
    void Call() {
      if (inside.exchange(true, std::memory_order_acquire)) overlaps.fetch_add(1);
      ++calls;
      for (int i = 0; i < 16; ++i) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      inside.store(false, std::memory_order_release);
    }
  };
  struct Counter : CounterMetric {
    explicit Counter(State* s) : state(s) {}
    void Inc() override { state->Call(); }
    State* state;
  };
  struct Gauge : GaugeMetric {
    explicit Gauge(State* s) : state(s) {}
    void Inc() override { state->Call(); }
    void Dec() override { state->Call(); }
    State* state;
  };
  struct Histogram : HistogramMetric {
    explicit Histogram(State* s) : state(s) {}
    void Observe(double) override { state->Call(); }
    State* state;
  };

  State state_;
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_SERIAL_CHECK_METRICS_H_
