// PoolWorkers(runtime, cpu): the number of workers of `cpu`'s bound pool, read from the
// runtime's Dump() ("cpu <n> cpus ... workers=<k>"), for tests that watch workers come
// and go (idle reaping).

#ifndef KWQ_TESTS_TESTING_POOL_WORKERS_H_
#define KWQ_TESTS_TESTING_POOL_WORKERS_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "kwq/workqueue.h"

namespace kwq::testing {

inline int PoolWorkers(const WorkqueueRuntime& runtime, int cpu) {
  const std::string dump = runtime.Dump();
  const size_t at = dump.find(absl::StrCat("cpu ", cpu, " cpus"));
  const size_t w = dump.find("workers=", at);
  return std::stoi(dump.substr(w + 8));
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_POOL_WORKERS_H_
