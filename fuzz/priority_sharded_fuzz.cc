// Fuzzer for PriorityQueue<int> (on a FakeClock, with aging and groups chosen by the
// input) and ShardedQueue<int>: random adds (priorities, delays; batches on the sharded
// queue), hand-outs, Dones and clock moves, against a model of each key's state. On a FakeClock
// every due timer fires inside Advance, so the model knows exactly which keys are ready, delayed or
// in flight (with the re-add an in-flight key carries: highest priority, earliest ready time).
// Checks, after every step:
//   - Add's result (true only for a key that was not waiting; false for a merge);
//   - every hand-out is of a ready key, never of a leased one, with the priority the model
//     gave it, and (without aging) no ready key has a higher priority;
//   - Len() is the number of ready keys; for the sharded queue the same with Queue's
//     rules (an add of an in-flight key runs it once more after its Done).
// At the end, with every lease ended and time past every deadline, both drain to nothing.

#include <algorithm>
#include <cstdint>
#include <map>

#include "fuzz_check.h"
#include "kwq/priority_queue.h"
#include "kwq/sharded_queue.h"

namespace {

struct PqKey {
  enum State { kNone, kReady, kDelayed, kInFlight } state = kNone;
  int priority = 0;
  absl::Time at;             // kDelayed: ready time
  bool pending = false;      // kInFlight: added again since its hand-out
  int pending_priority = 0;  // ... with the highest priority
  absl::Time pending_at;     // ... and the earliest ready time
};

struct SqKey {
  enum State { kNone, kReady, kInFlight } state = kNone;
  bool again = false;  // kInFlight: added again, runs once more after Done
};

}  // namespace

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
  // 1 to 32 shards: a 3-key AddAll sorts its shard numbers above 24, counts them below.
  auto sq = *kwq::ShardedQueue<int>::Create(1 + data[1] % 32);

  std::map<int, PqKey> pm;
  std::map<int, SqKey> sm;
  std::map<int, kwq::PriorityQueue<int>::Lease> pq_leases;
  std::map<int, kwq::ShardedQueue<int>::Lease> sq_leases;

  const auto ready_count = [](const auto& model, auto ready) {
    return static_cast<size_t>(std::count_if(
        model.begin(), model.end(), [&](const auto& e) { return e.second.state == ready; }));
  };
  const auto pq_ready_due = [&] {  // delayed keys whose time came: ready (timers fired)
    for (auto& [k, m] : pm) {
      if (m.state == PqKey::kDelayed && m.at <= clock.Now()) m.state = PqKey::kReady;
    }
  };
  const auto pq_hand_out = [&](kwq::PriorityQueue<int>::Lease& lease) {
    const int k = *lease;
    PqKey& m = pm[k];
    FUZZ_CHECK(!pq_leases.count(k));
    FUZZ_CHECK(m.state == PqKey::kReady);
    FUZZ_CHECK(lease.priority() == m.priority);
    if (!aging) {
      for (const auto& [other, o] : pm) {
        FUZZ_CHECK(o.state != PqKey::kReady || o.priority <= m.priority);
      }
    }
    m = PqKey{.state = PqKey::kInFlight};
  };
  const auto pq_done = [&](int k) {
    PqKey& m = pm[k];
    if (!m.pending) {
      m = PqKey{};
    } else if (m.pending_at <= clock.Now()) {
      m = PqKey{.state = PqKey::kReady, .priority = m.pending_priority};
    } else {
      m = PqKey{.state = PqKey::kDelayed, .priority = m.pending_priority, .at = m.pending_at};
    }
  };
  const auto sq_done = [&](int k) {
    SqKey& m = sm[k];
    m = m.again ? SqKey{.state = SqKey::kReady} : SqKey{};
  };

  for (size_t i = 2; i + 2 < size; i += 3) {
    const int key = data[i + 1] % 10;
    const int arg = data[i + 2];
    switch (data[i] % 8) {
      case 0:
      case 1: {
        const int priority = arg % 4;
        const absl::Duration after =
            (arg & 0x80) ? absl::Milliseconds(arg % 20) : absl::ZeroDuration();
        const absl::Time at = clock.Now() + std::max(after, absl::ZeroDuration());
        PqKey& m = pm[key];
        bool fresh = false;
        switch (m.state) {
          case PqKey::kNone:
            fresh = true;
            m.priority = priority;
            if (at <= clock.Now()) {
              m.state = PqKey::kReady;
            } else {
              m.state = PqKey::kDelayed;
              m.at = at;
            }
            break;
          case PqKey::kReady:
            m.priority = std::max(m.priority, priority);
            break;
          case PqKey::kDelayed:
            m.priority = std::max(m.priority, priority);
            m.at = std::min(m.at, at);
            if (m.at <= clock.Now()) m.state = PqKey::kReady;
            break;
          case PqKey::kInFlight:
            if (!m.pending) {
              fresh = true;
              m.pending = true;
              m.pending_priority = priority;
              m.pending_at = at;
            } else {
              m.pending_priority = std::max(m.pending_priority, priority);
              m.pending_at = std::min(m.pending_at, at);
            }
            break;
        }
        FUZZ_CHECK(pq->Add(key, {.priority = priority, .after = after}) == fresh);
        break;
      }
      case 2:
        if (auto lease = pq->TryGet()) {
          pq_hand_out(*lease);
          pq_leases.emplace(**lease, std::move(*lease));
        } else {
          FUZZ_CHECK(ready_count(pm, PqKey::kReady) == 0);
        }
        break;
      case 3:
        if (!pq_leases.empty()) {
          auto it = std::next(pq_leases.begin(), arg % pq_leases.size());
          const int k = it->first;
          pq_leases.erase(it);  // Done
          pq_done(k);
        }
        break;
      case 4: {
        const auto model_add = [&](int k) {  // whether an add of k queues it
          SqKey& m = sm[k];
          if (m.state == SqKey::kNone) {
            m.state = SqKey::kReady;
            return true;
          }
          if (m.state == SqKey::kInFlight && !m.again) {
            m.again = true;
            return true;
          }
          return false;
        };
        if (arg & 1) {  // a batch over the shards, with a duplicate: counted or sorted
          const int batch[3] = {key, (arg >> 1) % 10, key};
          size_t fresh = 0;
          for (int k : batch) fresh += model_add(k) ? 1 : 0;
          FUZZ_CHECK(sq->AddAll(batch) == fresh);
        } else {
          const bool fresh = model_add(key);
          FUZZ_CHECK(sq->Add(key) == fresh);
        }
        break;
      }
      case 5:
        if (auto lease = sq->TryGet(arg)) {
          const int k = **lease;
          FUZZ_CHECK(!sq_leases.count(k));
          FUZZ_CHECK(sm[k].state == SqKey::kReady);
          sm[k] = SqKey{.state = SqKey::kInFlight};
          sq_leases.emplace(k, std::move(*lease));
        } else {
          FUZZ_CHECK(ready_count(sm, SqKey::kReady) == 0);
        }
        break;
      case 6:
        if (!sq_leases.empty()) {
          auto it = std::next(sq_leases.begin(), arg % sq_leases.size());
          const int k = it->first;
          sq_leases.erase(it);  // Done
          sq_done(k);
        }
        break;
      case 7:
        clock.Advance(absl::Milliseconds(arg % 15));
        pq_ready_due();
        break;
    }
    FUZZ_CHECK(pq->Len() == ready_count(pm, PqKey::kReady));
    FUZZ_CHECK(sq->Len() == ready_count(sm, SqKey::kReady));
  }
  while (!pq_leases.empty()) {
    const int k = pq_leases.begin()->first;
    pq_leases.erase(pq_leases.begin());
    pq_done(k);
  }
  while (!sq_leases.empty()) {
    const int k = sq_leases.begin()->first;
    sq_leases.erase(sq_leases.begin());
    sq_done(k);
  }
  clock.Advance(absl::Seconds(1));
  pq_ready_due();
  for (int n = 0; n < 1000; ++n) {
    auto lease = pq->TryGet();
    if (!lease) break;
    pq_hand_out(*lease);
    pq_done(**lease);
  }
  for (int n = 0; n < 1000; ++n) {
    auto lease = sq->TryGet(n);
    if (!lease) break;
    FUZZ_CHECK(sm[**lease].state == SqKey::kReady);
    sm[**lease] = SqKey{};
  }
  FUZZ_CHECK(ready_count(pm, PqKey::kReady) == 0 && ready_count(pm, PqKey::kDelayed) == 0);
  FUZZ_CHECK(ready_count(sm, SqKey::kReady) == 0);
  FUZZ_CHECK(pq->Len() == 0 && pq->Waiting() == 0);
  FUZZ_CHECK(sq->Len() == 0);
  return 0;
}
