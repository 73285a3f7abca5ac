// The delay scenario of SCENARIOS.md: AddAfter n keys with delays uniform in [0, 1 s);
// one consumer records lateness = hand-out time - ready time.

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "kwq/delaying_queue.h"
#include "kwq/rate_limiting_queue.h"
#include "scenario.h"

namespace kwq::scenarios {
namespace {

int64_t IndexOf(const std::string& key) {
  int64_t i = 0;
  const size_t dash = key.rfind('-');
  std::from_chars(key.data() + dash + 1, key.data() + key.size(), i);
  return i;
}

// The calling thread's context switches of one kind, from /proc/thread-self/status:
// `which` is "voluntary_ctxt_switches" (it went to sleep) or "nonvoluntary_ctxt_switches"
// (it was preempted); -1 where it cannot be read.
int64_t Switches(const char* which) {
  FILE* f = std::fopen("/proc/thread-self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long long switches = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, which, std::strlen(which)) == 0 &&
        std::sscanf(line + std::strlen(which), ": %lld", &switches) == 1) {
      break;
    }
  }
  std::fclose(f);
  return switches;
}

std::string Delay(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  std::vector<absl::Duration> delays(n);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> us(0, 999'999);
  for (auto& d : delays) d = absl::Microseconds(us(rng));
  std::vector<absl::Time> ready(n);
  std::vector<double> late_us(n);
  std::vector<char> seen(n);  // each key handed out once
  Clock* clock = RealClock::Default();
  DelayingQueue<std::string> q;

  std::thread consumer([&] {
    for (int64_t got = 0; got < n; ++got) {
      auto lease = q.Get();
      const absl::Time now = clock->Now();
      const int64_t i = IndexOf(lease->item());
      late_us[i] = absl::ToDoubleMicroseconds(now - ready[i]);
      ++seen[i];
    }
  });
  const int64_t sleeps_before = Switches("voluntary_ctxt_switches");
  const int64_t preempted_before = Switches("nonvoluntary_ctxt_switches");
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) {
    ready[i] = clock->Now() + delays[i];
    q.AddAfter(std::move(keys[i]), delays[i]);
  }
  const absl::Duration add_time = sw.Elapsed();
  // How often the producer slept during its adds (on the delaying queue's lock, mostly),
  // and how often another thread took its CPU.
  const int64_t sleeps =
      sleeps_before < 0 ? -1 : Switches("voluntary_ctxt_switches") - sleeps_before;
  const int64_t preempted =
      preempted_before < 0 ? -1 : Switches("nonvoluntary_ctxt_switches") - preempted_before;
  consumer.join();
  Check(std::all_of(seen.begin(), seen.end(), [](char c) { return c == 1; }),
        "a key was not handed out exactly once");
  std::sort(late_us.begin(), late_us.end());
  return absl::StrFormat(
      "ns_per_addafter=%.1f late_p50_us=%.1f late_p99_us=%.1f late_max_us=%.1f n=%d "
      "producer_sleeps=%d producer_preempted=%d",
      absl::ToDoubleNanoseconds(add_time) / n, late_us[n / 2], late_us[n * 99 / 100],
      late_us.back(), n, sleeps, preempted);
}

// Rate-limiting queue with ExponentialFailure(1 us, 1 ms); one thread: Get; if the key
// failed < 3 times AddRateLimited, else Forget; Done. Total / (4n).
std::string RateLimited(int64_t n) {
  std::vector<std::string> keys = MakeKeys(n);
  auto limiter = *ExponentialFailureRateLimiter<std::string>::Create(
      {.base = absl::Microseconds(1), .max = absl::Milliseconds(1)});
  RateLimitingQueue<std::string> q(std::move(limiter));
  Stopwatch sw;
  for (auto& k : keys) q.Add(std::move(k));  // one Add per key, as client-go has no batch add
  int64_t forgotten = 0, handed_out = 0;
  while (forgotten < n) {
    auto lease = q.Get();
    ++handed_out;
    const std::string& key = lease->item();
    if (q.NumRequeues(key) < 3) {
      q.AddRateLimited(key);
    } else {
      q.Forget(key);
      ++forgotten;
    }
  }
  const absl::Duration d = sw.Elapsed();
  Check(handed_out == 4 * n, "reconciles != 4n");
  return absl::StrFormat("ns_per_reconcile=%.1f n=%d reconciles=%d",
                         absl::ToDoubleNanoseconds(d) / (4 * n), n, handed_out);
}

}  // namespace

std::vector<Scenario> DelayScenarios() {
  return {{"delay", 200'000, Delay}, {"ratelimited", 1'000'000, RateLimited}};
}

}  // namespace kwq::scenarios
