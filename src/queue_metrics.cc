#include "kwq/internal/queue_metrics.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>

namespace kwq::internal {

namespace {
constexpr absl::Duration kRefreshPeriod = absl::Milliseconds(500);

// New entries are `unknown` (QueueMetricsRecorder::kUnknown), not the epoch: a slot whose
// own Grow failed and that a later Grow covers has no time to measure from.
void Grow(std::vector<absl::Time>& v, uint32_t slot, absl::Time unknown) {
  if (slot >= v.size()) v.resize(std::max<size_t>(slot + 1, v.size() * 2), unknown);
}
}  // namespace

QueueMetricsRecorder::QueueMetricsRecorder(MetricsProvider* provider, std::string_view name,
                                           Clock* clock, TimerService* timers, bool by_priority)
    : clock_(clock != nullptr ? clock : RealClock::Default()),
      timers_(timers != nullptr ? timers : &TimerService::Default()),
      depth_by_priority_(by_priority ? provider->NewDepthMetricWithPriority(name) : nullptr),
      depth_(depth_by_priority_ ? nullptr : provider->NewDepthMetric(name)),
      adds_(provider->NewAddsMetric(name)),
      latency_(provider->NewLatencyMetric(name)),
      work_duration_(provider->NewWorkDurationMetric(name)),
      unfinished_(provider->NewUnfinishedWorkSecondsMetric(name)),
      longest_(provider->NewLongestRunningProcessorSecondsMetric(name)),
      retries_(provider->NewRetriesMetric(name)),
      delayed_(provider->NewDelayedMetric(name)) {
  if (unfinished_ != nullptr || longest_ != nullptr) {
    refresh_.emplace(timers_, kRefreshPeriod, [this] { Refresh(); });
  }
}

std::unique_ptr<QueueMetricsRecorder> QueueMetricsRecorder::Make(MetricsProvider* provider,
                                                                 std::string_view name,
                                                                 Clock* clock, TimerService* timers,
                                                                 bool by_priority) {
  if (provider == nullptr) return nullptr;
  auto recorder =
      std::make_unique<QueueMetricsRecorder>(provider, name, clock, timers, by_priority);
  const QueueMetricsRecorder& r = *recorder;
  if (!r.depth_by_priority_ && !r.depth_ && !r.adds_ && !r.latency_ && !r.work_duration_ &&
      !r.unfinished_ && !r.longest_ && !r.retries_ && !r.delayed_) {
    return nullptr;
  }
  return recorder;
}

namespace {

// A metric object (or an allocation of the recorder) threw: the update is dropped. Said
// once per process on stderr; the queue's own state does not depend on its metrics.
void MetricThrew() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true, std::memory_order_relaxed)) {
    std::fprintf(stderr,
                 "kwq: a queue metric threw; its update was dropped (metric calls "
                 "must not throw)\n");
  }
}

// One call of one metric object: if it throws, only that update is lost. Each call is
// guarded on its own, apart from the recorder's bookkeeping, so one throwing metric
// neither skips the others nor leaves the times and in-flight list (which later updates
// read) behind.
template <typename F>
void Report(F&& update) noexcept {
  try {
    update();
  } catch (...) {
    MetricThrew();
  }
}

}  // namespace

QueueMetricsRecorder::~QueueMetricsRecorder() {
  refresh_.reset();  // waits for a refresh in progress
  SpinLockHolder lock(&mu_);
  // Nothing of this queue is in flight any more (another queue of the name, if any, sets
  // its own values at its next refresh).
  if (unfinished_) Report([&] { unfinished_->Set(0); });
  if (longest_) Report([&] { longest_->Set(0); });
  for (; depth_ && depth_count_ > 0; --depth_count_) Report([&] { depth_->Dec(); });
  for (auto& [priority, count] : depth_by_priority_count_) {
    for (; count > 0; --count) Report([&, p = priority] { depth_by_priority_->Dec(p); });
  }
  for (; delayed_ && delayed_count_ > 0; --delayed_count_) Report([&] { delayed_->Dec(); });
}

absl::Time QueueMetricsRecorder::NowOrUnknown() noexcept {
  try {
    return clock_->Now();
  } catch (...) {  // a user's clock
    MetricThrew();
    return kUnknown;
  }
}

void QueueMetricsRecorder::OnAdd(uint32_t slot, int priority) noexcept {
  SpinLockHolder lock(&mu_);
  ++depth_count_;
  if (depth_) Report([&] { depth_->Inc(); });
  if (depth_by_priority_) {
    try {
      // The gauge first: an Inc that throws (a user's metric) leaves the item uncounted
      // in both, and its Get takes nothing off (LeavePriorityLocked).
      ReserveGrowth(depth_by_priority_count_, depth_growth_);
      depth_by_priority_->Inc(priority);
      ++depth_by_priority_count_[priority];  // cannot fail: room reserved
    } catch (...) {
      MetricThrew();
    }
  }
  if (adds_) Report([&] { adds_->Inc(); });
  if (latency_) {
    try {
      Grow(added_at_, slot, kUnknown);
      added_at_[slot] = NowOrUnknown();
    } catch (...) {  // an allocation: the slot stays untimed (below added_at_'s size)
      MetricThrew();
    }
  }
}

namespace {
// The seconds from `then` to `now` a duration metric records: 0 where the clock went back
// (a FakeClock set back, or TSC readings of two CPUs a little apart), which gave negative
// observations (-3600 s after SetTime an hour back); nullopt where the span is infinite
// (a FakeClock at an infinite time), which is not observed at all.
std::optional<double> ElapsedSeconds(absl::Time then, absl::Time now) {
  const absl::Duration d = now - then;
  if (d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) return std::nullopt;
  return d < absl::ZeroDuration() ? 0.0 : absl::ToDoubleSeconds(d);
}
}  // namespace

void QueueMetricsRecorder::OnGet(uint32_t slot, int priority) noexcept {
  SpinLockHolder lock(&mu_);
  --depth_count_;
  if (depth_) Report([&] { depth_->Dec(); });
  // Only an item whose add was counted (its bookkeeping may have failed for memory) is
  // taken off, so that the gauge comes back to 0 with the count.
  if (depth_by_priority_ && LeavePriorityLocked(priority)) {
    Report([&] { depth_by_priority_->Dec(priority); });
  }
  const absl::Time now = NowOrUnknown();
  if (latency_ && slot < added_at_.size()) {
    const absl::Time added_at = added_at_[slot];
    const std::optional<double> s =
        now != kUnknown && added_at != kUnknown ? ElapsedSeconds(added_at, now) : std::nullopt;
    if (s) Report([&] { latency_->Observe(*s); });
  }
  try {
    Grow(started_at_, slot, kUnknown);
    started_at_[slot] = now;
    if (slot >= in_flight_at_.size()) {
      in_flight_at_.resize(std::max<size_t>(slot + 1, in_flight_at_.size() * 2), kOut);
    }
    if (in_flight_at_[slot] == kOut) {
      in_flight_.push_back(slot);  // first: a throw leaves the index unset
      in_flight_at_[slot] = static_cast<uint32_t>(in_flight_.size() - 1);
    }
  } catch (...) {  // an allocation: this lease is left out of the in-flight gauges
    MetricThrew();
  }
}

void QueueMetricsRecorder::OnDone(uint32_t slot) noexcept {
  SpinLockHolder lock(&mu_);
  if (slot < in_flight_at_.size() && in_flight_at_[slot] != kOut) {
    const uint32_t at = in_flight_at_[slot];
    const uint32_t last = in_flight_.back();
    in_flight_[at] = last;
    in_flight_at_[last] = at;
    in_flight_.pop_back();
    in_flight_at_[slot] = kOut;
  }
  if (work_duration_ && slot < started_at_.size() && started_at_[slot] != kUnknown) {
    const absl::Time started = started_at_[slot];
    const absl::Time now = NowOrUnknown();
    const std::optional<double> s = now != kUnknown ? ElapsedSeconds(started, now) : std::nullopt;
    if (s) Report([&] { work_duration_->Observe(*s); });
  }
}

void QueueMetricsRecorder::OnReprioritize(int from, int to) noexcept {
  if (!depth_by_priority_ || from == to) return;
  SpinLockHolder lock(&mu_);
  if (!LeavePriorityLocked(from)) return;  // never counted: stays so
  Report([&] { depth_by_priority_->Dec(from); });
  try {
    // Counted at `to` as OnAdd counts: a growth or an Inc that throws leaves the item
    // uncounted in both, and its Get takes nothing off. (The growth failed before the
    // move, which left the item counted at `from` for good, since its Get leaves `to`;
    // an Inc that threw after the count left the gauge at -1 after the Get.)
    ReserveGrowth(depth_by_priority_count_, depth_growth_);
    depth_by_priority_->Inc(to);
    ++depth_by_priority_count_[to];  // cannot fail: room reserved
  } catch (...) {
    MetricThrew();
  }
}

bool QueueMetricsRecorder::LeavePriorityLocked(int priority) {
  auto it = depth_by_priority_count_.find(priority);
  if (it == depth_by_priority_count_.end()) return false;
  if (--it->second == 0) depth_by_priority_count_.erase(it);
  return true;
}

void QueueMetricsRecorder::OnRetry() noexcept {
  if (!retries_) return;
  SpinLockHolder lock(&mu_);
  Report([&] { retries_->Inc(); });
}

void QueueMetricsRecorder::OnDelayed(int delta) noexcept {
  if (!delayed_) return;
  SpinLockHolder lock(&mu_);
  delayed_count_ += delta > 0 ? 1 : -1;
  Report([&] {
    if (delta > 0) {
      delayed_->Inc();
    } else {
      delayed_->Dec();
    }
  });
}

void QueueMetricsRecorder::Refresh() noexcept {
  SpinLockHolder lock(&mu_);
  const absl::Time now = NowOrUnknown();
  if (now == kUnknown) return;
  double total = 0, longest = 0;
  for (uint32_t slot : in_flight_) {
    if (started_at_[slot] == kUnknown) continue;  // its start was not read
    const std::optional<double> s = ElapsedSeconds(started_at_[slot], now);
    if (!s) continue;
    total += *s;
    longest = std::max(longest, *s);
  }
  if (unfinished_) Report([&] { unfinished_->Set(total); });
  if (longest_) Report([&] { longest_->Set(longest); });
}

}  // namespace kwq::internal
