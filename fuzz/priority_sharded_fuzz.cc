// Fuzzer for PriorityQueue<int> (on a FakeClock, with aging and groups chosen by the
// input) and ShardedQueue<int>: random adds (priorities, delays), hand-outs and Dones.
// Checks what holds whatever the order: a key is never handed out while its previous
// lease is active; a PriorityQueue hands out no key of lower priority while a ready key
// of higher priority waits (without aging); and nothing is lost — every add is owed a
// hand-out after it, and after all deadlines pass and both queues drain, nothing is owed.

#include <cstdint>
#include <map>
#include <set>

#include "fuzz_check.h"
#include "kwq/priority_queue.h"
#include "kwq/sharded_queue.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  kwq::FakeClock clock;
  auto timers = *kwq::TimerService::Create({.clock = &clock});
  kwq::PriorityQueue<int>::Options options;
  options.clock = &clock;
  options.timers = timers.get();
  const bool aging = data[0] & 1;
  if (aging) options.aging = absl::Milliseconds(30);
  if (data[0] & 2) options.group = [](const int& k) { return static_cast<uint64_t>(k % 3); };
  auto pq = *kwq::PriorityQueue<int>::Create(std::move(options));
  auto sq = *kwq::ShardedQueue<int>::Create(1 + data[1] % 4);

  std::set<int> pq_owed, sq_owed;
  std::map<int, int> pq_ready_priority;  // keys added without delay and not handed out
  std::map<int, kwq::PriorityQueue<int>::Lease> pq_leases;
  std::map<int, kwq::ShardedQueue<int>::Lease> sq_leases;

  for (size_t i = 2; i + 2 < size; i += 3) {
    const int key = data[i + 1] % 10;
    const int arg = data[i + 2];
    switch (data[i] % 8) {
      case 0:
      case 1: {
        const int priority = arg % 4;
        const absl::Duration after =
            (arg & 0x80) ? absl::Milliseconds(arg % 20) : absl::ZeroDuration();
        pq->Add(key, {.priority = priority, .after = after});
        pq_owed.insert(key);
        if (after <= absl::ZeroDuration() && !pq_leases.count(key)) {
          auto [it, inserted] = pq_ready_priority.emplace(key, priority);
          if (!inserted) it->second = std::max(it->second, priority);
        }
        break;
      }
      case 2:
        if (auto lease = pq->TryGet()) {
          const int k = **lease;
          FUZZ_CHECK(!pq_leases.count(k));
          if (!aging && pq_ready_priority.count(k)) {
            // No ready key known to have a higher priority may be waiting.
            for (auto& [other, p] : pq_ready_priority) FUZZ_CHECK(p <= lease->priority());
          }
          pq_ready_priority.erase(k);
          pq_owed.erase(k);
          pq_leases.emplace(k, std::move(*lease));
        }
        break;
      case 3:
        if (!pq_leases.empty())
          pq_leases.erase(std::next(pq_leases.begin(), arg % pq_leases.size()));
        break;
      case 4:
        sq->Add(key);
        sq_owed.insert(key);
        break;
      case 5:
        if (auto lease = sq->TryGet(arg)) {
          const int k = **lease;
          FUZZ_CHECK(!sq_leases.count(k));
          sq_owed.erase(k);
          sq_leases.emplace(k, std::move(*lease));
        }
        break;
      case 6:
        if (!sq_leases.empty())
          sq_leases.erase(std::next(sq_leases.begin(), arg % sq_leases.size()));
        break;
      case 7:
        clock.Advance(absl::Milliseconds(arg % 15));
        break;
    }
  }
  pq_leases.clear();
  sq_leases.clear();
  clock.Advance(absl::Seconds(1));
  for (int n = 0; n < 1000; ++n) {
    auto lease = pq->TryGet();
    if (!lease) break;
    pq_owed.erase(**lease);
  }
  for (int n = 0; n < 1000; ++n) {
    auto lease = sq->TryGet(n);
    if (!lease) break;
    sq_owed.erase(**lease);
  }
  FUZZ_CHECK(pq_owed.empty());
  FUZZ_CHECK(sq_owed.empty());
  FUZZ_CHECK(pq->Len() == 0 && pq->Waiting() == 0);
  FUZZ_CHECK(sq->Len() == 0);
  return 0;
}
