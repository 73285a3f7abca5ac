// PoolWorkers(runtime, cpu): the number of workers of `cpu`'s bound pool, read from the
// runtime's Dump() ("cpu <n> cpus ... workers=<k>"), for tests that watch workers come
// and go (idle reaping). GrowPool(wq, runtime, cpu, n): makes that pool grow to `n`
// workers and then leaves them all idle.

#ifndef KWQ_TESTS_TESTING_POOL_WORKERS_H_
#define KWQ_TESTS_TESTING_POOL_WORKERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kwq/workqueue.h"
#include "testing/eventually.h"
#include "testing/gate.h"

namespace kwq::testing {

inline int PoolWorkers(const WorkqueueRuntime& runtime, int cpu) {
  const std::string dump = runtime.Dump();
  const size_t at = dump.find(absl::StrCat("cpu ", cpu, " cpus"));
  const size_t w = dump.find("workers=", at);
  return std::stoi(dump.substr(w + 8));
}

// Queues `n` works of `wq` on `cpu`, each blocking in a BlockingScope (so the pool wakes
// or makes another worker for each) until all `n` workers run one; then lets them finish
// and flushes `wq`. False when the pool did not reach `n` workers (within Eventually's
// limit; the works are let go and flushed either way).
inline bool GrowPool(Workqueue& wq, const WorkqueueRuntime& runtime, int cpu, int n) {
  Gate gate;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < n; ++i) {
    works.push_back(std::make_unique<Work>([&gate] {
      BlockingScope blocking;
      gate.Wait();
    }));
    wq.QueueOn(cpu, works.back().get());
  }
  const bool grown = Eventually([&] { return PoolWorkers(runtime, cpu) >= n; });
  gate.Open();
  wq.Flush();
  return grown;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_POOL_WORKERS_H_
