// Fuzzer for RateLimitingQueue<int> with ExponentialFailure(1 ms, 64 ms, idle horizon
// 30 ms) on a FakeClock. The queue keeps the failure counts beside its keys (the limiter
// counts by failure number), so this checks them against a model: random Add /
// AddRateLimited and Forget (of a key, or of a leased item passed back, found by address)
// / NumRequeues / TryGet / Done / clock moves / a churn of thousands of other keys (idle
// keys are then evicted around the counted ones). Checks:
//   - NumRequeues is the model's count: failures since the last Forget, 0 once the key has
//     been idle (not waiting, owed a run or leased) for longer than the horizon, counted
//     from its last failure or from its last Done that left it idle, whichever is later;
//     a count that lapsed stays gone when the key is added again;
//   - AddRateLimited(k) is AddAfter(k, When): k waits min(1 ms * 2^failures, 64 ms), the
//     earliest wait winning; Add(k) ends the wait and owes k a run now. On a FakeClock
//     every due timer fires inside Advance, so the model knows which keys wait and which
//     are owed a run: every hand-out must be owed (none early, none twice), never of a
//     leased key, and Waiting() must match after every step;
//   - nothing is lost: once every delay has passed and the queue is drained, nothing is
//     owed or waiting.

#include <cstdint>
#include <iterator>
#include <map>
#include <set>

#include "fuzz_check.h"
#include "kwq/rate_limiting_queue.h"
#include "leases.h"
#include "waits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr absl::Duration kHorizon = absl::Milliseconds(30);
  constexpr int kChurnBase = 1000;  // churn keys are >= this; the fuzzed ones below 12
  kwq::FakeClock clock;
  auto timers = *kwq::TimerService::Create({.clock = &clock});
  auto limiter = *kwq::ExponentialFailureRateLimiter<int>::Create({.base = absl::Milliseconds(1),
                                                                   .max = absl::Milliseconds(64),
                                                                   .clock = &clock,
                                                                   .idle_horizon = kHorizon});
  kwq::RateLimitingQueue<int> q(std::move(limiter), {.clock = &clock, .timers = timers.get()});

  struct Count {
    int64_t failures = 0;
    absl::Time last;
  };
  std::map<int, Count> model;
  Waits waits(&clock);
  Leases<kwq::RateLimitingQueue<int>::Lease> leases;
  auto busy = [&](int k) { return waits.waits(k) || waits.owed(k) || leases.leased(k); };
  auto failures = [&](int k) -> int64_t {
    auto it = model.find(k);
    if (it == model.end()) return 0;
    if (!busy(k) && clock.Now() - it->second.last > kHorizon) return 0;
    return it->second.failures;
  };
  // Before an add: a count that lapsed while the key was idle is gone.
  auto settle = [&](int k) {
    if (failures(k) == 0) model.erase(k);
  };
  // After a lease of k ended: if that left k idle, its horizon starts now.
  auto done = [&](int k) {
    auto it = model.find(k);
    if (k >= 0 && it != model.end() && !busy(k)) it->second.last = clock.Now();
  };
  auto handed_out = [&](int k) { waits.HandedOut(k); };
  // AddRateLimited = AddAfter(When): min(1 ms * 2^failures before, 64 ms).
  auto wait = [&](int k, int64_t failures_before) {
    waits.AddAfter(k, failures_before >= 6 ? absl::Milliseconds(64)
                                           : absl::Milliseconds(int64_t{1} << failures_before));
  };

  int churned = 0;  // churn keys used so far: each churn adds fresh ones
  for (size_t i = 0; i + 2 < size; i += 3) {
    const int key = data[i + 1] % 12;
    const int arg = data[i + 2];
    // With arg odd and a lease active, the operation passes that lease's item back.
    const int* leased = nullptr;
    if (arg % 2 == 1) {
      if (const auto* lease = leases.Pick(arg / 2)) leased = &lease->item();
    }
    const int k = leased != nullptr ? *leased : key;
    switch (data[i] % 8) {
      case 0:
        q.Add(key);
        settle(key);
        waits.AddNow(key);
        break;
      case 1:
      case 2: {
        const int64_t before = failures(k);
        if (leased != nullptr) {
          q.AddRateLimited(*leased);
        } else {
          q.AddRateLimited(k);
        }
        model[k] = Count{before + 1, clock.Now()};
        wait(k, before);
        break;
      }
      case 3:
        if (leased != nullptr) {
          q.Forget(*leased);
        } else {
          q.Forget(k);
        }
        if (model.count(k)) model[k].failures = 0;
        break;
      case 4:
        FUZZ_CHECK(q.NumRequeues(leased != nullptr ? *leased : k) == failures(k));
        leases.Take(q.TryGet(), handed_out);
        break;
      case 5:
        done(leases.DoneOne(arg));
        break;
      case 6:
        clock.Advance(absl::Milliseconds(arg % 25));
        waits.Advanced();
        break;
      case 7:
        if (arg < 250) {
          FUZZ_CHECK(q.NumRequeues(k) == failures(k));
          break;
        }
        // Churn: keys through the queue, so idle keys are evicted. The first churn fills
        // the table past the idle keys it keeps (4,096) and the eviction batch; after it,
        // 300 fresh keys evict as many, mixed with 1,200 older ones (idle, or evicted
        // and inserted again in scattered slots). Each churn of 5,000 keys made the inputs
        // of a grown corpus so slow that 10 s ran only some 470 of them.
        if (churned == 0) {
          for (int c = 0; c < 5000; ++c) q.Add(kChurnBase + c);
          churned = 5000;
        } else {
          // More than the hand-out ring holds (1,024), so the overflow list holds
          // scattered slots, not runs.
          for (int c = 0; c < 1200; ++c) {
            if (c % 4 == 0) q.Add(kChurnBase + churned + c / 4);
            q.Add(kChurnBase + (c * 17 + churned) % churned);
          }
          churned += 300;
        }
        while (auto lease = q.TryGet()) {
          const int got = **lease;
          if (got >= kChurnBase) continue;
          handed_out(got);  // a fuzzed key: Done at once
          lease.reset();
          done(got);
        }
        for (int f = 0; f < 12; ++f) FUZZ_CHECK(q.NumRequeues(f) == failures(f));
        break;
    }
    FUZZ_CHECK(q.Waiting() == waits.waiting());
  }
  leases.Clear();
  clock.Advance(absl::Seconds(1));
  waits.EndAll();
  for (int n = 0; n < 10000; ++n) {
    auto lease = q.TryGet();
    if (!lease) break;
    if (**lease < kChurnBase) handed_out(**lease);
  }
  FUZZ_CHECK(waits.nothing_owed());
  FUZZ_CHECK(q.Waiting() == 0);
  FUZZ_CHECK(q.Len() == 0);
  return 0;
}
