// Model-based fuzzer for Queue<int>: random Add / AddAll / TryGet / Done / ShutDown
// sequences, ShutDownWithDrain on a context already done (drained exactly when nothing
// waits or is in flight), and now and then a churn of 5,000 other keys through the queue
// (so idle keys are evicted around the fuzzed ones), checked after every step against a
// plain reference model of client-go's three sets. Any divergence aborts. Build: cmake
// -DKWQ_FUZZ=ON with clang; run: make fuzz.

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "fuzz_check.h"
#include "kwq/context.h"
#include "kwq/queue.h"

namespace {

struct Model {
  std::deque<int> ready;
  std::set<int> dirty;
  std::set<int> processing;
  bool shut = false;

  bool Add(int k) {
    if (shut || dirty.count(k)) return false;
    dirty.insert(k);
    if (!processing.count(k)) ready.push_back(k);
    return true;
  }
  std::optional<int> Get() {
    if (ready.empty()) return std::nullopt;
    const int k = ready.front();
    ready.pop_front();
    dirty.erase(k);
    processing.insert(k);
    return k;
  }
  void Done(int k) {
    processing.erase(k);
    if (dirty.count(k)) ready.push_back(k);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kwq::Queue<int> q;
  Model m;
  std::vector<kwq::Queue<int>::Lease> leases;
  std::vector<int> lease_keys;
  constexpr int kChurnBase = 1000;  // churn keys; the fuzzed ones are below 16
  bool churned = false;             // one churn per input: it costs 5,000 adds
  // A hand-out checked against the model: a fuzzed key's lease is kept, a churn key's
  // ends at once.
  auto take = [&]() -> bool {
    auto got = q.TryGet();
    auto want = m.Get();
    FUZZ_CHECK(got.has_value() == want.has_value());
    if (!got) return false;
    FUZZ_CHECK(**got == *want);
    if (*want >= kChurnBase) {
      got->Done();
      m.Done(*want);
    } else {
      lease_keys.push_back(*want);
      leases.push_back(std::move(*got));
    }
    return true;
  };
  for (size_t i = 0; i + 1 < size; i += 2) {
    const uint8_t op = data[i] % 8;
    const int key = data[i + 1] % 16;
    switch (op) {
      case 0:
      case 1:
      case 2:
        FUZZ_CHECK(q.Add(key) == m.Add(key));
        break;
      case 3:
      case 4:
        take();
        break;
      case 5:
      case 6:
        if (!leases.empty()) {
          const size_t j = key % leases.size();
          leases[j].Done();
          m.Done(lease_keys[j]);
          leases.erase(leases.begin() + j);
          lease_keys.erase(lease_keys.begin() + j);
        }
        break;
      case 7:
        if (key == 0) {  // rarely: shut down
          q.ShutDown();
          m.shut = true;
        } else if (key == 2) {  // rarely: a drain bounded by a context already done
          auto [ctx, cancel] = kwq::WithCancel(kwq::Background());
          cancel();
          FUZZ_CHECK(q.ShutDownWithDrain(ctx) == (m.dirty.empty() && m.processing.empty()));
          m.shut = true;
        } else if (key == 1 && !churned) {  // once at most: a churn of other keys, drained
          churned = true;                   // (evicts idle keys around the fuzzed ones)
          for (int c = 0; c < 5000; ++c) FUZZ_CHECK(q.Add(kChurnBase + c) == m.Add(kChurnBase + c));
          while (take()) {
          }
        } else {  // a batch: the next bytes' keys
          std::vector<int> batch;
          for (size_t b = i + 2; b < size && b < i + 2 + key % 5; ++b)
            batch.push_back(data[b] % 16);
          size_t want = 0;
          for (int k : batch) want += m.Add(k);
          FUZZ_CHECK(q.AddAll(batch) == want);
        }
        break;
    }
    FUZZ_CHECK(q.Len() == m.ready.size());
    FUZZ_CHECK(q.Depth() == m.dirty.size());
    FUZZ_CHECK(q.InFlight() == m.processing.size());
  }
  for (size_t j = 0; j < leases.size(); ++j) {
    leases[j].Done();
    m.Done(lease_keys[j]);
  }
  FUZZ_CHECK(q.InFlight() == 0);
  return 0;
}
