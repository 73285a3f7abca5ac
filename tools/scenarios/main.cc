// kwq-scenarios --scenario=NAME [--n=N]   runs one scenario, prints one line
// kwq-scenarios --list                    names every scenario

#include <unistd.h>
#include <chrono>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kwq/clock.h"
#include "scenario.h"

ABSL_FLAG(std::string, scenario, "", "scenario to run (see --list)");
ABSL_FLAG(int64_t, n, 0, "problem size; 0 means the scenario's default");
ABSL_FLAG(bool, list, false, "print the scenario names and default sizes");
ABSL_FLAG(bool, other_thread, true,
          "start and join one thread before the scenario: glibc then leaves its "
          "single-threaded mode (pthread_mutex_unlock becomes an atomic exchange), as in "
          "any program with a second thread and as in the Go peer's runtime; "
          "--other_thread=false shows the single-threaded mode (fifo_1t and the ctx "
          "scenarios start no thread of their own)");
ABSL_FLAG(int, timeout_s, 600,
          "a scenario still running after this many seconds fails the run (exit 1): a lost "
          "item leaves the blocking scenarios waiting for ever; 0 means no limit");
ABSL_FLAG(int, polling_workers, 0,
          "QueueOptions::polling_workers of the queue scenarios (0: the default)");

namespace kwq::scenarios {
int PollingWorkersFlag() { return absl::GetFlag(FLAGS_polling_workers); }

namespace {
std::vector<std::string>& Failures() {
  static std::vector<std::string> failures;
  return failures;
}
}  // namespace

void Check(bool ok, const std::string& what) {
  if (!ok) Failures().push_back(what);
}
}  // namespace kwq::scenarios

namespace {
// SIGALRM after --timeout_s: async-signal-safe calls only.
extern "C" void TimedOut(int) {
  static const char kMessage[] =
      "kwq-scenarios: check failed: the scenario was still running after --timeout_s\n";
  (void)!write(2, kMessage, sizeof(kMessage) - 1);
  _exit(1);
}
}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<kwq::scenarios::Scenario> all = kwq::scenarios::ContextScenarios();
  for (auto& s : kwq::scenarios::QueueScenarios()) all.push_back(std::move(s));
  for (auto& s : kwq::scenarios::DelayScenarios()) all.push_back(std::move(s));
  for (auto& s : kwq::scenarios::WorkqueueScenarios()) all.push_back(std::move(s));
  for (auto& s : kwq::scenarios::ChurnScenarios()) all.push_back(std::move(s));
  for (auto& s : kwq::scenarios::ScaleScenarios()) all.push_back(std::move(s));
  if (absl::GetFlag(FLAGS_list)) {
    for (const auto& s : all) std::printf("%s n=%lld\n", s.name.c_str(), (long long)s.default_n);
    return 0;
  }
  const std::string name = absl::GetFlag(FLAGS_scenario);
  for (const auto& s : all) {
    if (s.name != name) continue;
    const int64_t n = absl::GetFlag(FLAGS_n) > 0 ? absl::GetFlag(FLAGS_n) : s.default_n;
    if (absl::GetFlag(FLAGS_other_thread)) std::thread([] {}).join();
    // A signal, not a thread: a second thread would end glibc's single-threaded mode,
    // which --other_thread=false is there to show.
    if (absl::GetFlag(FLAGS_timeout_s) > 0) {
      std::signal(SIGALRM, TimedOut);
      alarm(static_cast<unsigned>(absl::GetFlag(FLAGS_timeout_s)));
    }
    // RealClock reads clock_gettime until the TSC's calibration ends (two agreeing 10 ms
    // windows, each ended by a read): read it through 30 ms first, as any long-running
    // program has, so that a scenario reading the clock is not timed partly on the
    // calibration's slower reads.
    if (kwq::RealClock::ReadsTsc()) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
      while (std::chrono::steady_clock::now() < end) {
        (void)kwq::RealClock::Default()->Now();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    const std::string result = s.run(n);
    std::printf("%s %s\n", s.name.c_str(), result.c_str());
    for (const std::string& failure : kwq::scenarios::Failures()) {
      std::fprintf(stderr, "kwq-scenarios: %s: check failed: %s\n", s.name.c_str(),
                   failure.c_str());
    }
    return kwq::scenarios::Failures().empty() ? 0 : 1;
  }
  std::fprintf(stderr, "kwq-scenarios: unknown --scenario='%s' (try --list)\n", name.c_str());
  return 2;
}
