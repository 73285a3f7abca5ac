// What queue metrics cost per item: one key Add + TryGet + Done (no cache misses), with
// no MetricsProvider (the default), a provider whose metrics do nothing (the queue's own
// bookkeeping: clock reads, per-slot times, virtual calls), and kwq::prometheus
// (its buffered series on top). Every case runs in a process that has had a second
// thread, as any real program has: glibc's mutex unlock is then an atomic exchange rather
// than a plain store, and the Prometheus provider starts the timer service's thread
// anyway, so without this the cases would run in different modes (docs/benchmarks.md).

#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <thread>

#include "benchmark/benchmark.h"
#include "kwq/prometheus.h"
#include "kwq/queue.h"
#include "nop_metrics.h"

namespace kwq {
namespace {

// Arg: 0 = no metrics, 1 = nop provider, 2 = PrometheusMetricsProvider.
void BM_AddGetDoneHotMetrics(benchmark::State& state) {
  std::thread([] {}).join();  // leave glibc's single-threaded mode (see the top)
  NopProvider nop;
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<PrometheusMetricsProvider> prom;  // made only when measured
  QueueOptions options{.name = "bench"};
  if (state.range(0) == 1) options.metrics = &nop;
  if (state.range(0) == 2) {
    prom = *PrometheusMetricsProvider::Create(registry);
    options.metrics = prom.get();
  }
  Queue<std::string> q(options);
  const std::string key = "default/object-1";
  for (auto _ : state) {
    q.Add(key);
    q.TryGet();
  }
  state.SetLabel(state.range(0) == 0   ? "no metrics"
                 : state.range(0) == 1 ? "nop provider"
                                       : "prometheus");
}
BENCHMARK(BM_AddGetDoneHotMetrics)->Arg(0)->Arg(1)->Arg(2);

}  // namespace
}  // namespace kwq
