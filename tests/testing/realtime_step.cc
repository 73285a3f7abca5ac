// Test shim, LD_PRELOADed by ctest for realtime_step_test. After the test calls
// kwq_test_step_realtime_after_next_read(s) (found with dlsym), the next CLOCK_REALTIME read
// in the process is left alone and every later one comes back `s` seconds earlier: the wall
// clock stepped back (as by settimeofday or an NTP step) right after a wait computed its
// end from it. Until then it changes nothing.

#include <dlfcn.h>
#include <time.h>

#include <atomic>

namespace {
using ClockGettime = int (*)(clockid_t, timespec*);
std::atomic<ClockGettime> real_clock_gettime{nullptr};
std::atomic<long> pending_step{0};  // applied after the next realtime read
std::atomic<long> step{0};          // applied now
}  // namespace

extern "C" void kwq_test_step_realtime_after_next_read(long seconds) {
  step.store(0);
  pending_step.store(seconds);
}

extern "C" int clock_gettime(clockid_t id, timespec* ts) {
  ClockGettime real = real_clock_gettime.load();
  if (real == nullptr) {
    real = reinterpret_cast<ClockGettime>(dlsym(RTLD_NEXT, "clock_gettime"));
    real_clock_gettime.store(real);
  }
  const int rc = real(id, ts);
  if (rc == 0 && id == CLOCK_REALTIME) {
    ts->tv_sec -= step.load();
    if (const long s = pending_step.exchange(0); s != 0) step.store(s);
  }
  return rc;
}
