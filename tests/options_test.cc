// Options structs as users write them: designated initializers naming one member, in a
// file built with -Wall -Wextra -Wpedantic -Wmissing-field-initializers -Werror (as a
// user's strict build would be; tests/CMakeLists.txt). So this file fails to compile
// when a public header is not -Wpedantic clean (an __int128 without __extension__) or an
// options member has no default member initializer (gcc then warns at every designated
// initializer that omits it: QueueOptions::name did). The tests check that the members
// left out keep their documented defaults.

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kwq/clock.h"
#include "kwq/context.h"
#include "kwq/delaying_queue.h"
#include "kwq/metrics.h"
#include "kwq/parallelize.h"
#include "kwq/priority_queue.h"
#include "kwq/queue.h"
#include "kwq/rate_limiter.h"
#include "kwq/rate_limiting_queue.h"
#include "kwq/sharded_queue.h"
#include "kwq/stop_token.h"
#include "kwq/timer.h"
#include "kwq/topology.h"
#include "kwq/workqueue.h"
#ifdef KWQ_OPTIONS_TEST_PROMETHEUS
#include "kwq/prometheus.h"
#endif

namespace kwq {
namespace {

TEST(OptionsTest, QueueOptionsLeftOutKeepTheirDefaults) {
  FakeClock clock;
  const QueueOptions o{.clock = &clock};
  EXPECT_EQ(o.name, "");
  EXPECT_EQ(o.metrics, nullptr);
  EXPECT_EQ(o.timers, nullptr);
  EXPECT_EQ(o.polling_workers, 0);
  DelayingQueue<std::string> q({.clock = &clock});
  EXPECT_EQ(q.Len(), 0u);
}

// PriorityQueue::Options repeats QueueOptions' members (flat, so that a designated
// initializer can name them). The structured binding below stops compiling when
// QueueOptions gains or loses a member: mirror the change in PriorityQueue::Options.
TEST(OptionsTest, PriorityQueueOptionsMirrorQueueOptions) {
  FakeClock clock;
  QueueOptions base{.name = "pods", .clock = &clock, .polling_workers = 2};
  auto& [name, metrics, base_clock, timers, polling_workers] = base;
  PriorityQueue<std::string>::Options o{.name = name,
                                        .metrics = metrics,
                                        .clock = base_clock,
                                        .timers = timers,
                                        .polling_workers = polling_workers};
  EXPECT_EQ(o.name, "pods");
  EXPECT_EQ(o.clock, &clock);
  // And its copies of them default as QueueOptions' do.
  const QueueOptions q_defaults;
  const PriorityQueue<std::string>::Options pq_defaults;
  EXPECT_EQ(pq_defaults.name, q_defaults.name);
  EXPECT_EQ(pq_defaults.metrics, q_defaults.metrics);
  EXPECT_EQ(pq_defaults.clock, q_defaults.clock);
  EXPECT_EQ(pq_defaults.timers, q_defaults.timers);
  EXPECT_EQ(pq_defaults.polling_workers, q_defaults.polling_workers);
  EXPECT_EQ(o.polling_workers, 2);
  EXPECT_EQ(o.rate_limiter, nullptr);
  EXPECT_EQ(o.aging, absl::InfiniteDuration());
  EXPECT_FALSE(o.group);
  auto q = PriorityQueue<std::string>::Create(std::move(o));
  ASSERT_TRUE(q.ok()) << q.status();
  // One member named, as the guide writes it.
  auto aged = PriorityQueue<std::string>::Create({.aging = absl::Seconds(30)});
  ASSERT_TRUE(aged.ok()) << aged.status();
  (*aged)->Add("default/web", {.priority = 10});
  EXPECT_EQ((*aged)->Len(), 1u);
}

TEST(OptionsTest, LimiterOptionsLeftOutKeepTheirDefaults) {
  const ExponentialFailureRateLimiterOptions e{.base = absl::Milliseconds(1)};
  EXPECT_EQ(e.max, absl::Seconds(1000));
  EXPECT_EQ(e.jitter, 0);
  EXPECT_EQ(e.clock, nullptr);
  EXPECT_FALSE(e.idle_horizon.has_value());
  const FastSlowRateLimiterOptions f{.fast = absl::Milliseconds(1)};
  EXPECT_EQ(f.max_fast_attempts, 0);
  const BucketRateLimiterOptions b{.qps = 5};
  EXPECT_EQ(b.burst, 100);
  EXPECT_TRUE(ExponentialFailureRateLimiter<std::string>::Create(e).ok());
}

TEST(OptionsTest, TimerWorkqueueAndParallelizeOptionsLeftOutKeepTheirDefaults) {
  FakeClock clock;
  const TimerService::Options t{.clock = &clock};
  EXPECT_EQ(t.backend, TimerService::Backend::kAuto);
  const WorkqueueOptions w{.name = "events"};
  EXPECT_EQ(w.flags, 0u);
  EXPECT_EQ(w.max_active, 0);
  EXPECT_EQ(w.runtime, nullptr);
  const WorkqueueRuntime::Options r{.bind_workers = false};
  EXPECT_EQ(r.topology, nullptr);
  EXPECT_FALSE(r.stall_reporter);
  EXPECT_FALSE(r.fail_thread_creation);
  EXPECT_EQ(r.idle_timeout, absl::Minutes(5));
  const ParallelizeOptions p{.chunk_size = 4};
  EXPECT_EQ(p.workqueue, nullptr);
}

#ifdef KWQ_OPTIONS_TEST_PROMETHEUS
TEST(OptionsTest, PrometheusOptionsLeftOutKeepTheirDefaults) {
  const PrometheusOptions p{.controller_label = true};
  EXPECT_TRUE(p.const_labels.empty());
  EXPECT_FALSE(p.keep_series);
  EXPECT_EQ(p.flush_period, absl::Seconds(1));
  EXPECT_EQ(p.timers, nullptr);
}
#endif

}  // namespace
}  // namespace kwq
