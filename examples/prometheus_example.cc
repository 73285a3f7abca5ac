// Queue metrics in Prometheus: a RateLimitingQueue reports the client-go metric set to a
// prometheus-cpp registry through kwq::PrometheusMetricsProvider, and the example prints
// what a scrape would return. In a real program, serve the registry with prometheus-cpp's
// pull library instead:
//
//   prometheus::Exposer exposer("0.0.0.0:9100");
//   exposer.RegisterCollectable(registry);
//
// Exits non-zero if the scrape lacks what the queue did.

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "kwq/prometheus.h"
#include "kwq/rate_limiter.h"
#include "kwq/rate_limiting_queue.h"

int main() {
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = kwq::PrometheusMetricsProvider::Create(registry, {.controller_label = true});
  if (!metrics.ok()) {
    std::fprintf(stderr, "%s\n", metrics.status().ToString().c_str());
    return 1;
  }
  auto limiter = kwq::ExponentialFailureRateLimiter<std::string>::Create(
      {.base = absl::Milliseconds(1), .max = absl::Milliseconds(10)});
  if (!limiter.ok()) return 1;
  {
    // The queue must not outlive the provider; its series leave the registry with it.
    kwq::RateLimitingQueue<std::string> queue(std::move(*limiter),
                                              {.name = "deployments", .metrics = metrics->get()});
    for (int i = 0; i < 5; ++i) queue.Add("default/web-" + std::to_string(i));
    queue.Add("default/web-0");  // deduplicated: not an add
    int reconciled = 0;
    while (auto item = queue.TryGet()) {
      ++reconciled;
      if (**item == "default/web-3") queue.AddRateLimited(**item);  // one failed reconcile
    }
    std::printf("reconciled %d keys, 1 of them failed and waits for its retry\n", reconciled);

    // What a scrape returns now: the workqueue families, deployments' series.
    // The queue records its metrics in counters of its own; the provider pushes them into
    // the registry every second (PrometheusOptions::flush_period). Push them now.
    (*metrics)->Flush();
    const std::string text = prometheus::TextSerializer().Serialize(registry->Collect());
    std::istringstream lines(text);
    bool adds = false, retries = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind('#', 0) == 0 || line.find("_bucket{") != std::string::npos) continue;
      std::printf("  %s\n", line.c_str());
      adds |= line == "workqueue_adds_total{controller=\"deployments\",name=\"deployments\"} 5";
      retries |=
          line == "workqueue_retries_total{controller=\"deployments\",name=\"deployments\"} 1";
    }
    if (!adds || !retries) {
      std::fprintf(stderr, "the scrape lacks the adds or the retry\n");
      return 1;
    }
    queue.ShutDown();
  }
  const bool gone =
      prometheus::TextSerializer().Serialize(registry->Collect()).find("deployments") ==
      std::string::npos;
  std::printf("queue destroyed: its series %s\n", gone ? "left the registry" : "remain (wrong)");
  return gone ? 0 : 1;
}
