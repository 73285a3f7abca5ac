// Test shim, LD_PRELOADed by ctest for realtime_step_test: once 100 ms of CLOCK_MONOTONIC
// have passed since the first CLOCK_REALTIME read, CLOCK_REALTIME reads come back
// $KWQ_TEST_REALTIME_STEP_S seconds earlier (the wall clock stepped back, as by
// settimeofday or an NTP step). Without the variable it changes nothing.

#include <dlfcn.h>
#include <time.h>

#include <cstdlib>

namespace {
using ClockGettime = int (*)(clockid_t, timespec*);
ClockGettime real_clock_gettime = nullptr;
timespec first_read;
bool have_first_read = false;
}  // namespace

extern "C" int clock_gettime(clockid_t id, timespec* ts) {
  if (real_clock_gettime == nullptr) {
    real_clock_gettime = reinterpret_cast<ClockGettime>(dlsym(RTLD_NEXT, "clock_gettime"));
  }
  const int rc = real_clock_gettime(id, ts);
  const char* step = std::getenv("KWQ_TEST_REALTIME_STEP_S");
  if (rc == 0 && id == CLOCK_REALTIME && step != nullptr) {
    timespec now;
    real_clock_gettime(CLOCK_MONOTONIC, &now);
    if (!have_first_read) {
      first_read = now;
      have_first_read = true;
    }
    const double elapsed = static_cast<double>(now.tv_sec - first_read.tv_sec) +
                           static_cast<double>(now.tv_nsec - first_read.tv_nsec) / 1e9;
    if (elapsed > 0.1) ts->tv_sec -= std::atol(step);
  }
  return rc;
}
