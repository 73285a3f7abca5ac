// Uses the installed kwq::prometheus: a named queue's adds reach a prometheus-cpp
// registry under client-go's metric name. Exits 0 when they did.
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cstdio>
#include <memory>
#include <string>

#include "kwq/prometheus.h"
#include "kwq/queue.h"

int main() {
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = kwq::PrometheusMetricsProvider::Create(registry);
  if (!metrics.ok()) return 1;
  kwq::Queue<std::string> q({.name = "consumer", .metrics = metrics->get()});
  q.Add("a");
  (*metrics)->Flush();  // the queue's changes reach the registry every second otherwise
  const std::string text = prometheus::TextSerializer().Serialize(registry->Collect());
  const bool ok = text.find("workqueue_adds_total{name=\"consumer\"} 1") != std::string::npos;
  std::printf("consumer (prometheus): %s\n", ok ? "workqueue_adds_total exported" : text.c_str());
  return ok ? 0 : 1;
}
