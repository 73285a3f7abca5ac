// Fuzzer for DelayingQueue<int> on a FakeClock: random Add / AddAfter (of a key, or of a
// leased item passed back) / CancelAfter / TryGet / Done / clock moves. When due items become ready
// depends on the timer's coalescing, and a delayed add merges into a waiting entry (earliest ready
// time wins), so rather than model the order it checks what holds whatever the timing:
//   - a key is never handed out while its previous lease is active;
//   - nothing is lost: every add is owed a hand-out after it; a successful CancelAfter
//     releases what delayed adds of the key were owed; a plain add of a waiting key
//     replaces its delayed entry (it runs once). Once time passes every deadline and the
//     queue is drained, nothing may still be owed, and nothing may still wait.
// (Ready-time exactness is pinned by tests/delaying_queue_test.cc on exact scenarios.)

#include <cstdint>
#include <iterator>
#include <map>
#include <set>

#include "fuzz_check.h"
#include "kwq/delaying_queue.h"
#include "leases.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kwq::FakeClock clock;
  auto timers = *kwq::TimerService::Create({.clock = &clock});
  kwq::DelayingQueue<int> q({.clock = &clock, .timers = timers.get()});
  std::set<int> owed_plain;    // keys added without delay, not handed out since
  std::set<int> owed_delayed;  // keys added with a delay, not handed out since
  Leases<kwq::DelayingQueue<int>::Lease> leases;

  auto handed_out = [&](int k) {
    leases.CheckNotLeased(k);  // never two leases of one key
    owed_plain.erase(k);
    owed_delayed.erase(k);
  };

  for (size_t i = 0; i + 2 < size; i += 3) {
    const int key = data[i + 1] % 12;
    const int arg = data[i + 2];
    switch (data[i] % 8) {
      case 0:
        q.Add(key);
        owed_plain.insert(key);
        break;
      case 1:
      case 2: {
        const absl::Duration d = absl::Milliseconds(arg % 40);
        q.AddAfter(key, d);
        (d <= absl::ZeroDuration() ? owed_plain : owed_delayed).insert(key);
        break;
      }
      case 3:
        if (q.CancelAfter(key)) owed_delayed.erase(key);
        break;
      case 4:
        leases.Take(q.TryGet(), handed_out);
        break;
      case 5:
        leases.DoneOne(arg);
        break;
      case 6:
        clock.Advance(absl::Milliseconds(arg % 25));
        break;
      case 7:
        // A retry of an item being processed, passed back as the leased object (the last
        // hand-out's is found by its address, the others by value).
        if (const auto* lease = leases.Pick(arg)) {
          const absl::Duration d = absl::Milliseconds(key % 3 == 0 ? 0 : arg % 40);
          q.AddAfter(lease->item(), d);
          (d <= absl::ZeroDuration() ? owed_plain : owed_delayed).insert(lease->item());
        }
        break;
    }
  }
  leases.Clear();
  clock.Advance(absl::Seconds(1));
  for (int n = 0; n < 1000; ++n) {
    auto lease = q.TryGet();
    if (!lease) break;
    handed_out(**lease);
  }
  FUZZ_CHECK(owed_plain.empty());
  FUZZ_CHECK(owed_delayed.empty());
  FUZZ_CHECK(q.Waiting() == 0);
  FUZZ_CHECK(q.Len() == 0);
  return 0;
}
