// kwq::PrometheusMetricsProvider running out of memory: a queue's metrics torn down, a
// flush and a priority's first series without memory. A binary of its own: it replaces
// the global operator new (testing/failing_new.h).

#include <prometheus/registry.h>

#include <cmath>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/clock.h"
#include "kwq/priority_queue.h"
#include "kwq/prometheus.h"
#include "kwq/queue.h"
#include "kwq/timer.h"
#include "testing/failing_new.h"

namespace kwq {
namespace {

using testing::FailAllocation;
using testing::FailureUsed;

// The value of workqueue_depth{name=`queue`, priority=`priority`} (NaN: no such series).
double DepthAt(prometheus::Registry& registry, const std::string& queue,
               const std::string& priority) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != "workqueue_depth") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool name = false, prio = false;
      for (const auto& l : m.label) {
        name |= l.name == "name" && l.value == queue;
        prio |= l.name == "priority" && l.value == priority;
      }
      if (name && prio) return m.gauge.value;
    }
  }
  return std::nan("");
}

struct Fixture {
  FakeClock clock;
  std::unique_ptr<TimerService> timers = *TimerService::Create({.clock = &clock});
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<PrometheusMetricsProvider> provider = *PrometheusMetricsProvider::Create(
      registry, {.flush_period = absl::InfiniteDuration(), .timers = timers.get()});
  QueueOptions Options(const std::string& name) {
    return {.name = name, .metrics = provider.get(), .clock = &clock, .timers = timers.get()};
  }
};

// A Create that runs out of memory throws std::bad_alloc, whichever allocation fails; it
// reported one inside the family registrations as AlreadyExists (a name clash that is
// not there). Once memory is back, Create succeeds on the same registry.
TEST(PrometheusAllocTest, ACreateWithoutMemoryThrowsBadAlloc) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (int k = 1;; ++k) {
    ASSERT_LT(k, 10'000) << "Create never succeeded";
    FailAllocation(k);
    absl::StatusOr<std::unique_ptr<PrometheusMetricsProvider>> provider;
    bool threw = false;
    try {
      provider = PrometheusMetricsProvider::Create(registry);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool used = FailureUsed();
    if (threw) {
      EXPECT_TRUE(used);
      continue;
    }
    EXPECT_TRUE(provider.ok()) << "allocation " << k << ": " << provider.status();
    if (!used) break;  // no allocation failed: done
  }
}

// Destroying a queue pushes its metrics' last changes; each allocation of that teardown
// fails in turn, and the process goes on (the changes of a push that fails there are
// dropped). A histogram's push allocated, from the metric's destructor: std::terminate.
TEST(PrometheusAllocTest, AQueuesMetricsAreTornDownWithoutMemory) {
  int failures = 0;
  for (int k = 1;; ++k) {
    Fixture f;
    auto q = std::make_unique<Queue<std::string>>(f.Options("torn"));
    for (int i = 0; i < 10; ++i) q->Add("k" + std::to_string(i));
    f.clock.Advance(absl::Milliseconds(1));
    while (auto lease = q->TryGet()) f.clock.Advance(absl::Milliseconds(1));
    FailAllocation(k);
    q.reset();
    if (!FailureUsed()) break;
    ++failures;
    f.provider->Flush();
  }
  // The teardown may allocate nothing at all (then the loop ends at once): the test only
  // asks that it survive whichever allocation fails.
  SUCCEED() << failures << " allocations failed in turn";
}

// A flush that cannot allocate (a priority's series is made at its first push) loses
// nothing: every change reaches the registry at a later flush, once. Before, the
// exception left Flush (and a timer's flush ended the process).
TEST(PrometheusAllocTest, AFlushWithoutMemoryLosesNothing) {
  Fixture f;
  auto q = *PriorityQueue<std::string>::Create(
      {.name = "pq", .metrics = f.provider.get(), .clock = &f.clock, .timers = f.timers.get()});
  for (int i = 0; i < 6; ++i) q->Add("k" + std::to_string(i), {.priority = i % 3});
  int failures = 0;
  for (int k = 1; k < 1000; ++k) {
    FailAllocation(k);
    EXPECT_NO_THROW(f.provider->Flush());
    if (!FailureUsed()) break;
    ++failures;
    q->Add("k" + std::to_string(6 + k), {.priority = 1});  // a change between flushes
  }
  EXPECT_GT(failures, 0);
  f.provider->Flush();
  const double at1 = DepthAt(*f.registry, "pq", "1");
  EXPECT_EQ(DepthAt(*f.registry, "pq", "0"), 2);
  EXPECT_EQ(at1, static_cast<double>(q->Depth()) - 4);
  EXPECT_EQ(DepthAt(*f.registry, "pq", "2"), 2);
}

// Each allocation of a raise of a waiting item's priority fails in turn; once the queue
// is empty both priorities' depths read 0 (or were never made). Before, a raise whose
// bookkeeping could not grow left the item counted at its old priority, which its Get
// (at the new one) never took off: depth{priority="1"} read 1 on an empty queue.
TEST(PrometheusAllocTest, ARaiseWithoutMemoryLeavesNoPriorityCounted) {
  int failures = 0;
  for (int k = 1; k < 1000; ++k) {
    Fixture f;
    auto q = *PriorityQueue<std::string>::Create({.name = "raise",
                                                  .metrics = f.provider.get(),
                                                  .clock = &f.clock,
                                                  .timers = f.timers.get()});
    q->Add("a", {.priority = 1});
    FailAllocation(k);
    try {
      q->Add("a", {.priority = 5});
    } catch (const std::bad_alloc&) {  // the queue's own room: the raise did not happen
    }
    if (!FailureUsed()) break;
    ++failures;
    ASSERT_EQ(q->Depth(), 1u);
    q->TryGet()->Done();
    f.provider->Flush();
    for (const char* priority : {"1", "5"}) {
      const double depth = DepthAt(*f.registry, "raise", priority);
      EXPECT_TRUE(std::isnan(depth) || depth == 0)
          << "allocation " << k << ": depth{priority=" << priority << "} = " << depth;
    }
  }
  EXPECT_GT(failures, 0);
}

// Each allocation of adds at new priorities fails in turn. The metric's map of
// priorities never grows (room for every series is made with the metric), the
// recorder's count by priority stays whole, and once the queue is empty every
// priority's depth reads 0: an add whose bookkeeping failed is not taken off at its Get
// either (it was, and the gauge stayed at -1).
TEST(PrometheusAllocTest, NewPrioritiesWithoutMemoryLeaveTheMetricWhole) {
  Fixture f;
  auto q = *PriorityQueue<int>::Create(
      {.name = "prios", .metrics = f.provider.get(), .clock = &f.clock, .timers = f.timers.get()});
  int item = 0;
  for (int priority = 0; priority < 24; ++priority) {
    for (int k = 1;; ++k) {
      FailAllocation(k);
      try {
        q->Add(item, {.priority = priority});
      } catch (const std::bad_alloc&) {
        continue;
      }
      ++item;
      if (!FailureUsed()) break;
    }
  }
  for (int priority = 0; priority < 24; ++priority) q->Add(item++, {.priority = priority});
  while (auto lease = q->TryGet()) {
  }
  f.provider->Flush();
  for (int priority = 0; priority < 24; ++priority) {
    EXPECT_EQ(DepthAt(*f.registry, "prios", std::to_string(priority)), 0) << priority;
  }
}

}  // namespace
}  // namespace kwq
