// Fuzzer for DelayingQueue<int> on a FakeClock: random Add / AddAfter (of a key, or of a
// leased item passed back) / CancelAfter / TryGet / Done / clock moves, against a model of
// which runs are owed. On a FakeClock every timer due by the new time fires inside
// Advance, and delays here are whole milliseconds (past the 50 us coalescing), so after
// each step the model knows exactly which keys wait and which are owed a run:
//   - Add(k) (or AddAfter with d <= 0) owes k a run and ends k's wait (it runs once, now:
//     kubernetes#126027);
//   - AddAfter(k, d > 0) makes k wait until now + d, the earliest such time winning;
//   - a clock move owes a run to every key whose wait ended; CancelAfter(k) returns
//     whether k waited, and ends the wait;
//   - every hand-out must be owed (none early, none twice) and never of a leased key;
//   - Waiting() is the number of keys waiting, after every step.
// At the end, with every lease ended and time past every deadline, the queue drains to
// nothing owed and nothing waiting. (The order of hand-out is pinned by
// tests/delaying_queue_test.cc.)

#include <cstdint>

#include "fuzz_check.h"
#include "kwq/delaying_queue.h"
#include "leases.h"
#include "waits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kwq::FakeClock clock;
  auto timers = *kwq::TimerService::Create({.clock = &clock});
  kwq::DelayingQueue<int> q({.clock = &clock, .timers = timers.get()});
  Waits waits(&clock);
  Leases<kwq::DelayingQueue<int>::Lease> leases;
  auto handed_out = [&](int k) { waits.HandedOut(k); };

  for (size_t i = 0; i + 2 < size; i += 3) {
    const int key = data[i + 1] % 12;
    const int arg = data[i + 2];
    switch (data[i] % 8) {
      case 0:
        q.Add(key);
        waits.AddNow(key);
        break;
      case 1:
      case 2: {
        const absl::Duration d = absl::Milliseconds(arg % 40);
        q.AddAfter(key, d);
        waits.AddAfter(key, d);
        break;
      }
      case 3:
        FUZZ_CHECK(q.CancelAfter(key) == waits.Cancel(key));
        break;
      case 4:
        leases.Take(q.TryGet(), handed_out);
        break;
      case 5:
        leases.DoneOne(arg);
        break;
      case 6:
        clock.Advance(absl::Milliseconds(arg % 25));
        waits.Advanced();
        break;
      case 7:
        // A retry of an item being processed, passed back as the leased object (the last
        // hand-out's is found by its address, the others by value).
        if (const auto* lease = leases.Pick(arg)) {
          const absl::Duration d = absl::Milliseconds(key % 3 == 0 ? 0 : arg % 40);
          const int k = lease->item();
          q.AddAfter(lease->item(), d);
          waits.AddAfter(k, d);
        }
        break;
    }
    FUZZ_CHECK(q.Waiting() == waits.waiting());
  }
  leases.Clear();
  clock.Advance(absl::Seconds(1));
  waits.EndAll();
  for (int n = 0; n < 1000; ++n) {
    auto lease = q.TryGet();
    if (!lease) break;
    handed_out(**lease);
  }
  FUZZ_CHECK(waits.nothing_owed());
  FUZZ_CHECK(q.Waiting() == 0);
  FUZZ_CHECK(q.Len() == 0);
  return 0;
}
