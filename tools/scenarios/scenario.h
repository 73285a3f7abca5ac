// kwq-scenarios: the peer scenarios of shared/bench/SCENARIOS.md, one line of output each:
//   <scenario> key=value key=value ...

#ifndef KWQ_TOOLS_SCENARIOS_SCENARIO_H_
#define KWQ_TOOLS_SCENARIOS_SCENARIO_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/resident_bytes.h"

namespace kwq::scenarios {

struct Scenario {
  std::string name;
  int64_t default_n;
  // Runs the scenario with `n` and returns the key=value part of its output line.
  std::function<std::string(int64_t n)> run;
};

// Every scenario, grouped by the file that defines it.
std::vector<Scenario> ContextScenarios();
std::vector<Scenario> QueueScenarios();
std::vector<Scenario> DelayScenarios();
std::vector<Scenario> WorkqueueScenarios();
std::vector<Scenario> ChurnScenarios();
std::vector<Scenario> ScaleScenarios();

// Helpers shared by the scenario files.
std::vector<std::string> MakeKeys(int64_t n);  // "default/object-<i>", i < n
using kwq::testing::ResidentBytes;             // this process's RSS
// CPUs this process may run on (its affinity mask, so `taskset -c 0-3` gives 4): the
// thread count of the scenarios that use one thread per CPU.
int AllowedCpus();
// The CPUs of that mask, in order.
std::vector<int> CpuList();
// Pins the calling thread to cpus[index % cpus.size()] (nothing when `cpus` is empty).
void PinTo(const std::vector<int>& cpus, int index);
// --polling_workers (QueueOptions::polling_workers of the queue scenarios; 0: default).
int PollingWorkersFlag();

// Records a failed check of a scenario's result (items lost or run twice, a wrong count):
// kwq-scenarios then reports `what` on stderr and exits 1, so no figure of a broken run
// is taken for a result. (A scenario that blocks on a lost item is ended by --timeout_s.)
void Check(bool ok, const std::string& what);

// Monotonic stopwatch (std::chrono::steady_clock: a wall-clock step cannot skew it).
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  absl::Duration Elapsed() const {
    return absl::FromChrono(std::chrono::steady_clock::now() - start_);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Keeps the compiler from deleting or hoisting a computation.
template <typename T>
inline void KeepAlive(T const& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

}  // namespace kwq::scenarios

#endif  // KWQ_TOOLS_SCENARIOS_SCENARIO_H_
