// kwq::PrometheusMetricsProvider (kwq/prometheus.h): the client-go metric set under
// client-go's names, series shared by name and removed with their last queue, and the
// errors of Create. Deterministic: queues run on a FakeClock.

#include "kwq/prometheus.h"

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <climits>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kwq/clock.h"
#include "kwq/priority_queue.h"
#include "kwq/queue.h"
#include "kwq/rate_limiter.h"
#include "kwq/rate_limiting_queue.h"
#include "kwq/sharded_queue.h"
#include "kwq/timer.h"
#include "prometheus/buffered_metrics.h"
#include "testing/counting_clock.h"

namespace kwq {

// Test access to a buffered histogram's two stores of an observation (friend of it).
struct prometheus_internal::HistogramPeer {
  static void Count(BufferedHistogram& h, double seconds) { h.Count(seconds); }
  static void AddToSum(BufferedHistogram& h, double seconds) { h.AddToSum(seconds); }
};

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using StringQueue = Queue<std::string>;

// A series a test looked up, or none. `->` and `*` on a missing series throw
// (std::bad_optional_access), which fails the test, instead of reading an empty optional.
struct Series : std::optional<prometheus::ClientMetric> {
  using std::optional<prometheus::ClientMetric>::optional;
  const prometheus::ClientMetric* operator->() const { return &value(); }
  const prometheus::ClientMetric& operator*() const { return value(); }
};

// The series of family `family` carrying every label of `labels`, in a fresh collection.
Series FindLabelled(prometheus::Registry& registry, const std::string& family,
                    const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      size_t matched = 0;
      for (const auto& [name, value] : labels) {
        for (const auto& l : m.label) matched += l.name == name && l.value == value;
      }
      if (matched == labels.size()) return m;
    }
  }
  return std::nullopt;
}

// The series of family `family` whose label `label` is `value`, in a fresh collection.
Series FindIn(prometheus::Registry& registry, const std::string& family, const std::string& value,
              const std::string& label = "name") {
  return FindLabelled(registry, family, {{label, value}});
}

// How many series carry name="<queue>", over every family.
int SeriesIn(prometheus::Registry& registry, const std::string& queue) {
  int n = 0;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const auto& l : m.label) n += l.name == "name" && l.value == queue;
    }
  }
  return n;
}

std::string TextOf(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

class PrometheusTest : public ::testing::Test {
 protected:
  // A provider whose flushes the helpers below run before they read the registry
  // (its own flush timer is on the fake clock). Destroying it takes it off their list.
  using ProviderPtr =
      std::unique_ptr<PrometheusMetricsProvider, std::function<void(PrometheusMetricsProvider*)>>;
  ProviderPtr NewProvider(PrometheusOptions options = {}) {
    if (options.timers == nullptr) options.timers = timers.get();
    auto provider = PrometheusMetricsProvider::Create(registry, std::move(options));
    EXPECT_TRUE(provider.ok()) << provider.status();
    PrometheusMetricsProvider* p = provider->release();
    {
      std::lock_guard<std::mutex> lock(live_mu_);
      live_.insert(p);
    }
    return ProviderPtr(p, [this](PrometheusMetricsProvider* dying) {
      {
        std::lock_guard<std::mutex> lock(live_mu_);
        live_.erase(dying);
      }
      delete dying;
    });
  }
  QueueOptions On(MetricsProvider* metrics, std::string name) {
    return {.name = std::move(name), .metrics = metrics, .clock = &clock, .timers = timers.get()};
  }
  template <typename T>
  std::unique_ptr<PriorityQueue<T>> NewPriorityQueue(MetricsProvider* metrics, std::string name) {
    return *PriorityQueue<T>::Create(
        {.name = std::move(name), .metrics = metrics, .clock = &clock, .timers = timers.get()});
  }
  // Reads after flushing every live provider of the test.
  void FlushAll() {
    std::lock_guard<std::mutex> lock(live_mu_);
    for (PrometheusMetricsProvider* p : live_) p->Flush();
  }
  Series Find(prometheus::Registry& r, const std::string& family, const std::string& value,
              const std::string& label = "name") {
    FlushAll();
    return FindIn(r, family, value, label);
  }
  int SeriesOf(prometheus::Registry& r, const std::string& queue) {
    FlushAll();
    return SeriesIn(r, queue);
  }
  std::string Text(prometheus::Registry& r) {
    FlushAll();
    return TextOf(r);
  }

  FakeClock clock;
  std::unique_ptr<TimerService> timers = *TimerService::Create({.clock = &clock});
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

 private:
  std::mutex live_mu_;
  std::set<PrometheusMetricsProvider*> live_;
};

TEST_F(PrometheusTest, ExportsTheClientGoMetricSetUnderItsNames) {
  auto provider = NewProvider();
  StringQueue q(On(provider.get(), "q"));
  q.Add("a");
  q.Add("a");  // deduplicated: not an add
  q.Add("b");
  EXPECT_EQ(Find(*registry, "workqueue_depth", "q")->gauge.value, 2);
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "q")->counter.value, 2);

  clock.Advance(absl::Seconds(2));
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(Find(*registry, "workqueue_depth", "q")->gauge.value, 1);
  const prometheus::ClientMetric latency =
      *Find(*registry, "workqueue_queue_duration_seconds", "q");
  EXPECT_EQ(latency.histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(latency.histogram.sample_sum, 2.0);
  // controller-runtime's buckets: 1e-8 .. 1e3 in powers of ten (and +Inf).
  ASSERT_EQ(latency.histogram.bucket.size(), 13u);
  EXPECT_DOUBLE_EQ(latency.histogram.bucket[0].upper_bound, 1e-8);
  EXPECT_DOUBLE_EQ(latency.histogram.bucket[11].upper_bound, 1e3);
  EXPECT_EQ(latency.histogram.bucket[8].cumulative_count, 0u);  // le=1
  EXPECT_EQ(latency.histogram.bucket[9].cumulative_count, 1u);  // le=10

  clock.Advance(absl::Seconds(3));  // the 500 ms refresh runs inside Advance
  EXPECT_NEAR(Find(*registry, "workqueue_unfinished_work_seconds", "q")->gauge.value, 3.0, 0.5);
  EXPECT_NEAR(Find(*registry, "workqueue_longest_running_processor_seconds", "q")->gauge.value, 3.0,
              0.5);
  lease->Done();
  const prometheus::ClientMetric work = *Find(*registry, "workqueue_work_duration_seconds", "q");
  EXPECT_EQ(work.histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(work.histogram.sample_sum, 3.0);
}

TEST_F(PrometheusTest, CountsRetriesAndDelayedItems) {
  auto provider = NewProvider();
  auto limiter = ExponentialFailureRateLimiter<std::string>::Create(
      {.base = absl::Seconds(1), .max = absl::Seconds(10), .clock = &clock});
  ASSERT_TRUE(limiter.ok());
  RateLimitingQueue<std::string> q(std::move(*limiter), On(provider.get(), "r"));
  q.AddRateLimited("x");  // waits 1 s
  EXPECT_EQ(Find(*registry, "workqueue_retries_total", "r")->counter.value, 1);
  EXPECT_EQ(Find(*registry, "kwq_workqueue_delayed_items", "r")->gauge.value, 1);
  EXPECT_EQ(Find(*registry, "workqueue_depth", "r")->gauge.value, 0);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(Find(*registry, "kwq_workqueue_delayed_items", "r")->gauge.value, 0);
  EXPECT_EQ(Find(*registry, "workqueue_depth", "r")->gauge.value, 1);
}

TEST_F(PrometheusTest, TextExpositionHasClientGoLines) {
  auto provider = NewProvider();
  StringQueue q(On(provider.get(), "pods"));
  q.Add("a");
  const std::string text = Text(*registry);
  EXPECT_THAT(text, HasSubstr("# TYPE workqueue_depth gauge"));
  EXPECT_THAT(text, HasSubstr("workqueue_depth{name=\"pods\"} 1"));
  EXPECT_THAT(text, HasSubstr("workqueue_adds_total{name=\"pods\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("workqueue_queue_duration_seconds_bucket{name=\"pods\",le=\"+Inf\"}"));
}

TEST_F(PrometheusTest, SeriesLeaveWithTheLastQueueOfTheirName) {
  auto provider = NewProvider();
  auto first = std::make_unique<StringQueue>(On(provider.get(), "same"));
  auto second = std::make_unique<StringQueue>(On(provider.get(), "same"));
  first->Add("a");
  second->Add("b");
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "same")->counter.value, 2);  // shared
  EXPECT_EQ(SeriesOf(*registry, "same"), 8);                                     // one per family
  EXPECT_EQ(Find(*registry, "workqueue_depth", "same")->gauge.value, 2);
  first.reset();
  EXPECT_EQ(SeriesOf(*registry, "same"), 8);  // `second` still reports to them
  // The destroyed queue's waiting item left the shared depth with it.
  EXPECT_EQ(Find(*registry, "workqueue_depth", "same")->gauge.value, 1);
  second->Add("c");
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "same")->counter.value, 3);
  second.reset();
  EXPECT_EQ(SeriesOf(*registry, "same"), 0);  // no stale depth of a deleted queue
  StringQueue again(On(provider.get(), "same"));
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "same")->counter.value, 0);  // a reset
}

TEST_F(PrometheusTest, KeptSeriesOutliveTheirQueues) {
  auto provider = NewProvider({.keep_series = true});
  auto q = std::make_unique<StringQueue>(On(provider.get(), "kept"));
  q->Add("a");
  q.reset();
  EXPECT_EQ(SeriesOf(*registry, "kept"), 8);
  EXPECT_EQ(Find(*registry, "workqueue_depth", "kept")->gauge.value, 0);  // its share left
  StringQueue again(On(provider.get(), "kept"));
  again.Add("b");
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "kept")->counter.value, 2);  // continued
}

// Providers with and without keep_series sharing a registry: a series one of them keeps
// stays, whichever queue of the name goes last (it used to follow the last one's setting).
TEST_F(PrometheusTest, ASeriesKeptByOneProviderStaysWhateverGoesLast) {
  auto keeping = NewProvider({.keep_series = true});
  auto plain = NewProvider();
  for (bool keeper_last : {false, true}) {
    const std::string name = keeper_last ? "keeper-last" : "keeper-first";
    auto kept = std::make_unique<StringQueue>(On(keeping.get(), name));
    auto not_kept = std::make_unique<StringQueue>(On(plain.get(), name));
    if (keeper_last) {
      not_kept.reset();
      kept.reset();
    } else {
      kept.reset();
      not_kept.reset();
    }
    EXPECT_EQ(SeriesOf(*registry, name), 8) << name;
  }
  // Also when the keeper's queue is gone before the other provider's queue of the name
  // comes: the last of them used to remove the series.
  { StringQueue kept(On(keeping.get(), "one-after-another")); }
  { StringQueue not_kept(On(plain.get(), "one-after-another")); }
  EXPECT_EQ(SeriesOf(*registry, "one-after-another"), 8);
}

// A series kept by a keep_series provider stays for its registry's life, also through
// the sweeps of SeriesUsers' map (each time it doubles), which drop only the unused
// entries of dead registries: a sweep that dropped the kept entry of a live registry let
// the next queue of its name through a provider that does not keep series remove it.
TEST_F(PrometheusTest, AKeptSeriesSurvivesTheSweepOfUnusedEntries) {
  auto keeping = NewProvider({.keep_series = true});
  auto plain = NewProvider();
  { StringQueue kept(On(keeping.get(), "swept")); }  // its entries: kept, unused
  // Enough series at once that the map doubles (and sweeps) at least once.
  std::vector<std::unique_ptr<CounterMetric>> many;
  for (int i = 0; i < 4096; ++i)
    many.push_back(plain->NewAddsMetric("filler-" + std::to_string(i)));
  many.clear();
  { StringQueue not_kept(On(plain.get(), "swept")); }
  EXPECT_EQ(SeriesOf(*registry, "swept"), 8);
}

// The in-flight gauges come back to 0 in the registry: when the lease ends (the next
// refresh sets 0) and when the queue is destroyed (with keep_series the series stays,
// and must not keep the last refresh's age for good). A push that skipped a Set(0)
// left both stuck at the last nonzero age.
TEST_F(PrometheusTest, InFlightGaugesComeBackToZero) {
  auto provider = NewProvider({.keep_series = true});
  auto q = std::make_unique<StringQueue>(On(provider.get(), "idle"));
  q->Add("a");
  {
    auto lease = q->TryGet();
    clock.Advance(absl::Seconds(2));  // the 500 ms refreshes see it 2 s in flight
  }
  EXPECT_NEAR(Find(*registry, "workqueue_unfinished_work_seconds", "idle")->gauge.value, 2.0, 0.01);
  EXPECT_NEAR(Find(*registry, "workqueue_longest_running_processor_seconds", "idle")->gauge.value,
              2.0, 0.01);
  clock.Advance(absl::Seconds(1));  // refreshes with nothing in flight
  EXPECT_EQ(Find(*registry, "workqueue_unfinished_work_seconds", "idle")->gauge.value, 0);
  EXPECT_EQ(Find(*registry, "workqueue_longest_running_processor_seconds", "idle")->gauge.value, 0);

  q->Add("b");
  {
    auto lease = q->TryGet();
    clock.Advance(absl::Seconds(3));
  }
  EXPECT_NEAR(Find(*registry, "workqueue_unfinished_work_seconds", "idle")->gauge.value, 3.0, 0.01);
  q.reset();  // before the next refresh: its destructor sets 0
  EXPECT_EQ(Find(*registry, "workqueue_unfinished_work_seconds", "idle")->gauge.value, 0);
  EXPECT_EQ(Find(*registry, "workqueue_longest_running_processor_seconds", "idle")->gauge.value, 0);
}

// A NaN observation counts in the +Inf bucket only, as prometheus-cpp's own Observe puts
// it (it went to the first bucket, le=1e-8).
TEST_F(PrometheusTest, ANanObservationCountsOnlyInTheInfBucket) {
  auto provider = NewProvider();
  std::unique_ptr<HistogramMetric> latency = provider->NewLatencyMetric("nan");
  latency->Observe(std::nan(""));
  const prometheus::ClientMetric m = *Find(*registry, "workqueue_queue_duration_seconds", "nan");
  ASSERT_EQ(m.histogram.bucket.size(), 13u);
  EXPECT_EQ(m.histogram.bucket[11].cumulative_count, 0u);  // le=1e3
  EXPECT_EQ(m.histogram.bucket[12].cumulative_count, 1u);  // le=+Inf
}

TEST_F(PrometheusTest, UnnamedQueuesHaveNoSeries) {
  auto provider = NewProvider();
  StringQueue q(On(provider.get(), ""));
  q.Add("a");
  EXPECT_EQ(provider->NewDepthMetric(""), nullptr);
  for (const prometheus::MetricFamily& f : registry->Collect()) {
    EXPECT_TRUE(f.metric.empty()) << f.name;
  }
}

// A queue the provider gives no metric (an unnamed one) keeps no recorder: it reads no
// clock and takes no lock for metrics, as a queue without a provider.
TEST_F(PrometheusTest, UnnamedQueuesReadNoClockForMetrics) {
  auto provider = NewProvider();
  FakeClock fake;
  testing::CountingClock clock(&fake);
  auto counting_timers = *TimerService::Create({.clock = &clock});
  for (const char* name : {"", "named"}) {
    StringQueue q(StringQueue::Options{
        .name = name, .metrics = provider.get(), .clock = &clock, .timers = counting_timers.get()});
    const int before = clock.reads();
    q.Add("a");
    q.TryGet();
    EXPECT_EQ(clock.reads() > before, *name != '\0') << "queue \"" << name << "\"";
  }
}

// A ShardedQueue's shards report as "<name>/<index>"; an unnamed one's not at all.
TEST_F(PrometheusTest, ShardsReportUnderTheirOwnNames) {
  auto provider = NewProvider();
  auto named = ShardedQueue<std::string>::Create(2, On(provider.get(), "pods"));
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(SeriesOf(*registry, "pods/0"), 8);
  EXPECT_EQ(SeriesOf(*registry, "pods/1"), 8);
  EXPECT_EQ(SeriesOf(*registry, "pods"), 0);
  named->reset();
  auto unnamed = ShardedQueue<std::string>::Create(2, On(provider.get(), ""));
  ASSERT_TRUE(unnamed.ok());
  for (const prometheus::MetricFamily& f : registry->Collect()) {
    EXPECT_TRUE(f.metric.empty()) << f.name;
  }
}

TEST_F(PrometheusTest, ControllerAndConstantLabels) {
  auto provider = NewProvider({.const_labels = {{"cluster", "eu-1"}}, .controller_label = true});
  StringQueue q(On(provider.get(), "deployment"));
  q.Add("a");
  const std::string text = Text(*registry);
  EXPECT_THAT(text, HasSubstr("workqueue_depth{cluster=\"eu-1\",controller=\"deployment\",name="
                              "\"deployment\"} 1"));
}

TEST_F(PrometheusTest, ProvidersSharingARegistryShareSeries) {
  auto one = NewProvider();
  auto two = NewProvider();
  auto a = std::make_unique<StringQueue>(On(one.get(), "s"));
  StringQueue b(On(two.get(), "s"));
  a->Add("x");
  b.Add("y");
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "s")->counter.value, 2);
  a.reset();
  one.reset();
  b.Add("z");  // its series survived the other provider's queue and the provider
  EXPECT_EQ(Find(*registry, "workqueue_adds_total", "s")->counter.value, 3);
}

TEST_F(PrometheusTest, SeriesOutliveTheirProviderSafely) {
  // QueueOptions::metrics must outlive the queue, but a metric holds the registry and the
  // flusher itself, so one used and released after the provider is gone still pushes its
  // last change and leaves its series safely (ASan checks the safety).
  auto provider = NewProvider({.keep_series = true});  // kept: the last push can be read
  std::unique_ptr<GaugeMetric> depth = provider->NewDepthMetric("orphan");
  EXPECT_EQ(Find(*registry, "workqueue_depth", "orphan")->gauge.value, 0);
  provider.reset();
  depth->Inc();
  depth.reset();
  EXPECT_EQ(FindIn(*registry, "workqueue_depth", "orphan")->gauge.value, 1);
}

// Changes reach the registry on the flush timer (or Flush), not at once: a queue operation
// does not touch prometheus-cpp's series.
TEST_F(PrometheusTest, ChangesReachTheRegistryOnTheFlushTimer) {
  auto provider = NewProvider({.flush_period = absl::Seconds(2)});
  StringQueue q(On(provider.get(), "timed"));
  q.Add("a");
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "timed")->counter.value, 0);  // buffered
  clock.Advance(absl::Seconds(2));  // the flush timer runs inside Advance
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "timed")->counter.value, 1);
  q.Add("b");
  provider->Flush();
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "timed")->counter.value, 2);
  EXPECT_EQ(PrometheusMetricsProvider::Create(registry, {.flush_period = absl::ZeroDuration()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// flush_period = InfiniteDuration(): no flush timer at all; changes reach the registry on
// Flush() and when a queue goes.
TEST_F(PrometheusTest, InfiniteFlushPeriodPushesOnlyOnFlushAndDestruction) {
  auto provider = NewProvider({.keep_series = true, .flush_period = absl::InfiniteDuration()});
  auto q = std::make_unique<StringQueue>(On(provider.get(), "manual"));
  q->Add("a");
  clock.Advance(absl::Hours(24));
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "manual")->counter.value, 0);
  provider->Flush();
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "manual")->counter.value, 1);
  q->Add("b");
  q.reset();  // its last push
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "manual")->counter.value, 2);
}

// The depth series of `queue` at `priority`.
Series FindPriority(prometheus::Registry& registry, const std::string& queue,
                    const std::string& priority) {
  return FindLabelled(registry, "workqueue_depth", {{"name", queue}, {"priority", priority}});
}

// A priority queue's depth has controller-runtime's priority label, one series per
// priority, and no unlabelled depth series; they leave with the queue.
TEST_F(PrometheusTest, PriorityQueueDepthIsLabelledByPriority) {
  auto provider = NewProvider({.controller_label = true});
  auto q = NewPriorityQueue<std::string>(provider.get(), "pq");
  q->Add("a");
  q->Add("b", {.priority = 10});
  q->Add("c", {.priority = 10});
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "pq", "0")->gauge.value, 1);
  EXPECT_EQ(FindPriority(*registry, "pq", "10")->gauge.value, 2);
  EXPECT_EQ(SeriesIn(*registry, "pq"), 2 + 7);  // two depth series, one per other family
  q->Add("a", {.priority = 10});                // raised: moves
  auto lease = q->TryGet();
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "pq", "0")->gauge.value, 0);
  EXPECT_EQ(FindPriority(*registry, "pq", "10")->gauge.value, 2);
  EXPECT_THAT(Text(*registry),
              HasSubstr("workqueue_depth{controller=\"pq\",name=\"pq\",priority=\"10\"} 2"));
  lease->Done();
  q.reset();
  EXPECT_EQ(SeriesOf(*registry, "pq"), 0);
}

// Past max_priority_series priorities, the others share the placeholder series, and the
// series handed out before stay exact (controller-runtime's would stop moving).
TEST_F(PrometheusTest, PrioritiesPastTheLimitShareOneSeries) {
  auto provider = NewProvider({.max_priority_series = 2});
  auto q = NewPriorityQueue<int>(provider.get(), "many");
  for (int p = 1; p <= 4; ++p) q->Add(p, {.priority = p});
  q->Add(5, {.priority = 1});
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "many", "1")->gauge.value, 2);
  EXPECT_EQ(FindPriority(*registry, "many", "2")->gauge.value, 1);
  EXPECT_EQ(FindPriority(*registry, "many", "exceeded_cardinality_limit")->gauge.value, 2);
  EXPECT_FALSE(FindPriority(*registry, "many", "3").has_value());
  for (int i = 0; i < 4; ++i) q->TryGet()->Done();  // 4, 3, 2, then one of priority 1
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "many", "exceeded_cardinality_limit")->gauge.value, 0);
  EXPECT_EQ(FindPriority(*registry, "many", "2")->gauge.value, 0);
  EXPECT_EQ(FindPriority(*registry, "many", "1")->gauge.value, 1);  // still exact
}

TEST_F(PrometheusTest, CreateRejectsBadInput) {
  EXPECT_EQ(PrometheusMetricsProvider::Create(nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrometheusMetricsProvider::Create(registry, {.const_labels = {{"1abc", "v"}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrometheusMetricsProvider::Create(registry, {.const_labels = {{"name", "v"}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PrometheusMetricsProvider::Create(registry, {.const_labels = {{"le", "v"}}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrometheusMetricsProvider::Create(registry, {.const_labels = {{"priority", "v"}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PrometheusMetricsProvider::Create(registry, {.max_priority_series = -1}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PrometheusMetricsProvider::Create(registry, {.max_priority_series = INT_MAX}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PrometheusMetricsProvider::Create(
                  registry, {.max_priority_series = PrometheusOptions::kMaxPrioritySeriesLimit})
                  .ok());
  EXPECT_EQ(PrometheusMetricsProvider::Create(
                registry, {.const_labels = {{"controller", "v"}}, .controller_label = true})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // "controller" is free without controller_label.
  EXPECT_TRUE(PrometheusMetricsProvider::Create(std::make_shared<prometheus::Registry>(),
                                                {.const_labels = {{"controller", "v"}}})
                  .ok());
}

TEST_F(PrometheusTest, CreateReportsFamiliesThatCannotBeShared) {
  // Another metric type under one of the names.
  auto taken = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("workqueue_depth").Help("not ours").Register(*taken);
  auto status = PrometheusMetricsProvider::Create(taken).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("workqueue"));
  // Other constant labels on a merging registry.
  ASSERT_TRUE(PrometheusMetricsProvider::Create(registry, {.const_labels = {{"a", "1"}}}).ok());
  EXPECT_EQ(
      PrometheusMetricsProvider::Create(registry, {.const_labels = {{"a", "2"}}}).status().code(),
      absl::StatusCode::kAlreadyExists);
  // A registry that refuses a second registration of a name.
  auto strict = std::make_shared<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw);
  ASSERT_TRUE(PrometheusMetricsProvider::Create(strict).ok());
  EXPECT_EQ(PrometheusMetricsProvider::Create(strict).status().code(),
            absl::StatusCode::kAlreadyExists);
}

// Flushes racing the observations lose none of them, in the counts or the sum (a push
// once moved its sum on even when it pushed no count: an observation landing between its
// reads of the counts and of the sum was left out of the sum for good).
TEST_F(PrometheusTest, FlushesRacingObservationsLoseNothing) {
  auto provider = NewProvider({.keep_series = true});
  std::unique_ptr<HistogramMetric> histogram = provider->NewLatencyMetric("raced");
  constexpr int kObservations = 200000;
  std::atomic<bool> done{false};
  std::thread flusher([&] {
    while (!done.load()) provider->Flush();
  });
  for (int i = 0; i < kObservations; ++i) {
    histogram->Observe(1.0);
    if (i % 64 == 0) std::this_thread::yield();  // idle moments, as between a queue's items
  }
  done = true;
  flusher.join();
  histogram.reset();  // the last push
  const prometheus::ClientMetric m =
      *FindIn(*registry, "workqueue_queue_duration_seconds", "raced");
  EXPECT_EQ(m.histogram.sample_count, static_cast<uint64_t>(kObservations));
  EXPECT_DOUBLE_EQ(m.histogram.sample_sum, kObservations);
}

// Queues of one name made and destroyed on several threads while another thread scrapes:
// no series is lost while a queue uses it, and none is left behind (run under TSan too).
TEST_F(PrometheusTest, ConcurrentQueuesAndScrapes) {
  auto provider = NewProvider();
  std::atomic<bool> stop{false};
  std::thread scraper([&] {
    while (!stop.load()) (void)Text(*registry);
  });
  std::vector<std::thread> makers;
  for (int t = 0; t < 3; ++t) {
    makers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        Queue<int> q(On(provider.get(), "busy"));
        q.Add(i);
        auto lease = q.TryGet();
        // This queue's series exists while it lives, whatever the others do.
        ASSERT_TRUE(Find(*registry, "workqueue_adds_total", "busy").has_value());
      }
    });
  }
  for (auto& m : makers) m.join();
  stop = true;
  scraper.join();
  EXPECT_EQ(SeriesOf(*registry, "busy"), 0);
  EXPECT_THAT(Text(*registry), Not(HasSubstr("busy")));
}

// A priority queue's producers and workers on other threads while the provider flushes
// and a scraper reads: the per-priority series appear while the queue runs (the Flusher
// makes them) and every one ends at zero once everything is handed out (run under TSan).
TEST_F(PrometheusTest, PriorityDepthUnderConcurrentFlushes) {
  auto provider = NewProvider({.max_priority_series = 4});
  auto q = NewPriorityQueue<int>(provider.get(), "prio");
  std::atomic<bool> stop{false};
  std::thread flusher([&] {
    while (!stop.load()) (void)Text(*registry);  // flushes every provider, then scrapes
  });
  constexpr int kKeys = 2000;
  std::thread producer([&] {
    for (int k = 0; k < kKeys; ++k) q->Add(k, {.priority = k % 7});  // 4 own series + shared
  });
  int got = 0;
  while (got < kKeys) {
    if (auto lease = q->TryGet()) {
      ++got;
    } else {
      std::this_thread::yield();
    }
  }
  producer.join();
  stop = true;
  flusher.join();
  FlushAll();
  double total = 0;
  int series = 0;
  for (const prometheus::MetricFamily& f : registry->Collect()) {
    if (f.name != "workqueue_depth") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      total += std::abs(m.gauge.value);
      ++series;
    }
  }
  EXPECT_EQ(series, 5);  // priorities first seen get their own 4, the rest share one
  EXPECT_EQ(total, 0);
}

// Unfinished (sum of ages) and longest running (max) each in their own family: two leases.
TEST_F(PrometheusTest, UnfinishedAndLongestRunningGoToTheirOwnFamilies) {
  auto provider = NewProvider();
  StringQueue q(On(provider.get(), "two"));
  q.Add("a");
  q.Add("b");
  auto first = q.TryGet();
  clock.Advance(absl::Seconds(2));
  auto second = q.TryGet();
  clock.Advance(absl::Seconds(1));  // ages 3 s and 1 s
  EXPECT_NEAR(Find(*registry, "workqueue_unfinished_work_seconds", "two")->gauge.value, 4.0, 0.01);
  EXPECT_NEAR(Find(*registry, "workqueue_longest_running_processor_seconds", "two")->gauge.value,
              3.0, 0.01);
}

// le is inclusive: a queue latency of exactly 1 s counts in le="1".
TEST_F(PrometheusTest, AnObservationOnABucketBoundCountsInThatBucket) {
  auto provider = NewProvider();
  StringQueue q(On(provider.get(), "bound"));
  q.Add("a");
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(q.TryGet().has_value());
  const prometheus::ClientMetric m = *Find(*registry, "workqueue_queue_duration_seconds", "bound");
  ASSERT_EQ(m.histogram.bucket.size(), 13u);
  ASSERT_EQ(m.histogram.bucket[8].upper_bound, 1.0);
  EXPECT_EQ(m.histogram.bucket[7].cumulative_count, 0u);  // le=0.1
  EXPECT_EQ(m.histogram.bucket[8].cumulative_count, 1u);  // le=1
}

// Any int is a priority (kwq/priority_queue.h): a negative one's depth series comes back
// to 0 when its item is handed out, as a positive one's does.
TEST_F(PrometheusTest, ANegativePrioritysDepthComesBackToZero) {
  auto provider = NewProvider();
  auto q = NewPriorityQueue<std::string>(provider.get(), "neg");
  q->Add("a", {.priority = -3});
  q->Add("b", {.priority = 2});
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "neg", "-3")->gauge.value, 1);
  EXPECT_EQ(FindPriority(*registry, "neg", "2")->gauge.value, 1);
  q->TryGet()->Done();  // b
  q->TryGet()->Done();  // a
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "neg", "2")->gauge.value, 0);
  EXPECT_EQ(FindPriority(*registry, "neg", "-3")->gauge.value, 0);
}

// The first priority past max_priority_series goes to the placeholder, also alone.
TEST_F(PrometheusTest, TheFirstPriorityPastTheLimitGoesToThePlaceholder) {
  auto provider = NewProvider({.max_priority_series = 2});
  auto q = NewPriorityQueue<int>(provider.get(), "three");
  for (int p = 1; p <= 3; ++p) q->Add(p, {.priority = p});
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "three", "1")->gauge.value, 1);
  EXPECT_EQ(FindPriority(*registry, "three", "2")->gauge.value, 1);
  EXPECT_FALSE(FindPriority(*registry, "three", "3").has_value());
  EXPECT_EQ(FindPriority(*registry, "three", "exceeded_cardinality_limit")->gauge.value, 1);
}

// max_priority_series = 0 is valid: every priority goes to the placeholder series.
TEST_F(PrometheusTest, ZeroPrioritySeriesPutsEveryPriorityInThePlaceholder) {
  ASSERT_TRUE(PrometheusMetricsProvider::Create(registry,
                                                {.max_priority_series = 0, .timers = timers.get()})
                  .ok());
  auto provider = NewProvider({.max_priority_series = 0});
  auto q = NewPriorityQueue<int>(provider.get(), "none");
  q->Add(1, {.priority = 1});
  q->Add(2, {.priority = 2});
  FlushAll();
  EXPECT_EQ(FindPriority(*registry, "none", "exceeded_cardinality_limit")->gauge.value, 2);
  EXPECT_FALSE(FindPriority(*registry, "none", "1").has_value());
  EXPECT_EQ(SeriesIn(*registry, "none"), 1 + 7);
}

// A negative flush_period is refused like a zero one ("must be positive").
TEST_F(PrometheusTest, CreateRejectsANegativeFlushPeriod) {
  EXPECT_EQ(PrometheusMetricsProvider::Create(
                registry, {.flush_period = -absl::Seconds(1), .timers = timers.get()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// An unnamed priority queue gets no series either, its depth by priority included.
TEST_F(PrometheusTest, UnnamedPriorityQueuesHaveNoSeries) {
  auto provider = NewProvider();
  EXPECT_EQ(provider->NewDepthMetricWithPriority(""), nullptr);
  auto q = NewPriorityQueue<std::string>(provider.get(), "");
  q->Add("a", {.priority = 1});
  FlushAll();
  for (const prometheus::MetricFamily& f : registry->Collect()) {
    EXPECT_TRUE(f.metric.empty()) << f.name;
  }
}

// keep_series keeps a priority queue's depth series too, at 0 once the queue is gone.
TEST_F(PrometheusTest, KeptPrioritySeriesOutliveTheirQueue) {
  auto provider = NewProvider({.keep_series = true});
  auto q = NewPriorityQueue<std::string>(provider.get(), "kept-pq");
  q->Add("a", {.priority = 3});
  q.reset();
  EXPECT_EQ(SeriesOf(*registry, "kept-pq"), 8);
  EXPECT_EQ(FindPriority(*registry, "kept-pq", "3")->gauge.value, 0);  // its share left
}

// Changes wait for the flush period: none reaches the registry before it ends.
TEST_F(PrometheusTest, NoChangeReachesTheRegistryBeforeTheFlushPeriod) {
  auto provider = NewProvider({.flush_period = absl::Seconds(2)});
  StringQueue q(On(provider.get(), "period"));
  q.Add("a");
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "period")->counter.value, 0);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "period")->counter.value, 1);
}

// A flush that lands between an observation's two stores (its count, then its value)
// pushes the count alone; the value must follow at the next flush, also when no
// observation comes after it (a push made only when a count moved never sent it).
TEST_F(PrometheusTest, AValueFlushedAfterItsCountStillReachesTheSum) {
  auto provider = NewProvider();
  std::unique_ptr<HistogramMetric> latency = provider->NewLatencyMetric("torn");
  auto& histogram = dynamic_cast<prometheus_internal::BufferedHistogram&>(*latency);
  prometheus_internal::HistogramPeer::Count(histogram, 0.25);
  Series m = Find(*registry, "workqueue_queue_duration_seconds", "torn");
  EXPECT_EQ(m->histogram.sample_count, 1u);
  EXPECT_EQ(m->histogram.sample_sum, 0);
  prometheus_internal::HistogramPeer::AddToSum(histogram, 0.25);
  m = Find(*registry, "workqueue_queue_duration_seconds", "torn");
  EXPECT_EQ(m->histogram.sample_count, 1u);
  EXPECT_EQ(m->histogram.sample_sum, 0.25);
}

// The destructor flushes once more: a change buffered by a metric still alive (its queue
// should be gone first, but the metric keeps the flusher) reaches the registry. Nothing
// pinned it: without that flush every test here passed.
TEST(PrometheusProviderTest, TheDestructorFlushesOnceMore) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto provider =
      *PrometheusMetricsProvider::Create(registry, {.flush_period = absl::InfiniteDuration()});
  std::unique_ptr<CounterMetric> adds = provider->NewAddsMetric("late");
  adds->Inc();
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "late")->counter.value, 0);
  provider.reset();
  EXPECT_EQ(FindIn(*registry, "workqueue_adds_total", "late")->counter.value, 1);
}

}  // namespace
}  // namespace kwq
