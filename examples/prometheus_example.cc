// Queue metrics in Prometheus: a RateLimitingQueue reports the client-go metric set to a
// prometheus-cpp registry through kwq::PrometheusMetricsProvider, a PriorityQueue its
// depth by priority (controller-runtime's label), and the example prints what a scrape
// would return. In a real program, serve the registry with prometheus-cpp's
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

#include "kwq/priority_queue.h"
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
  // A retry far enough out that it is still waiting at the scrape below, however slow the
  // machine (with 1 ms, a loaded machine took the retry inside the TryGet loop: 6 adds
  // and 2 retries, and the example failed).
  auto limiter = kwq::ExponentialFailureRateLimiter<std::string>::Create(
      {.base = absl::Seconds(30), .max = absl::Minutes(5)});
  if (!limiter.ok()) return 1;
  {
    // The queues must not outlive the provider; their series leave the registry with them.
    kwq::RateLimitingQueue<std::string> queue(std::move(*limiter),
                                              {.name = "deployments", .metrics = metrics->get()});
    auto pods =
        kwq::PriorityQueue<std::string>::Create({.name = "pods", .metrics = metrics->get()});
    if (!pods.ok()) return 1;
    (*pods)->Add("default/new-pod", {.priority = 10});  // an edge-triggered event
    (*pods)->Add("default/old-pod-1");                  // the initial list, priority 0
    (*pods)->Add("default/old-pod-2");
    for (int i = 0; i < 5; ++i) queue.Add("default/web-" + std::to_string(i));
    queue.Add("default/web-0");  // deduplicated: not an add
    int reconciled = 0;
    while (auto item = queue.TryGet()) {
      ++reconciled;
      if (**item == "default/web-3") queue.AddRateLimited(**item);  // one failed reconcile
    }
    std::printf("reconciled %d keys, 1 of them failed and waits for its retry\n", reconciled);

    // What a scrape returns now: the workqueue families, deployments' and pods' series.
    // The queue records its metrics in counters of its own; the provider pushes them into
    // the registry every second (PrometheusOptions::flush_period). Push them now.
    (*metrics)->Flush();
    const std::string text = prometheus::TextSerializer().Serialize(registry->Collect());
    std::istringstream lines(text);
    bool adds = false, retries = false, by_priority = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind('#', 0) == 0 || line.find("_bucket{") != std::string::npos) continue;
      std::printf("  %s\n", line.c_str());
      adds |= line == "workqueue_adds_total{controller=\"deployments\",name=\"deployments\"} 5";
      retries |=
          line == "workqueue_retries_total{controller=\"deployments\",name=\"deployments\"} 1";
      by_priority |= line == "workqueue_depth{controller=\"pods\",name=\"pods\",priority=\"0\"} 2";
    }
    if (!adds || !retries || !by_priority) {
      std::fprintf(stderr, "the scrape lacks the adds, the retry or the depth by priority\n");
      return 1;
    }
    queue.ShutDown();
    (*pods)->ShutDown();
  }
  const std::string after = prometheus::TextSerializer().Serialize(registry->Collect());
  const bool gone = after.find("deployments") == std::string::npos &&
                    after.find("name=\"pods\"") == std::string::npos;
  std::printf("queues destroyed: their series %s\n", gone ? "left the registry" : "remain (wrong)");
  return gone ? 0 : 1;
}
