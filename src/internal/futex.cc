#include "internal/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace kwq::internal {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "futex needs a plain 32-bit atomic");

void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts;
  timespec* tsp = nullptr;
  if (timeout != absl::InfiniteDuration()) {
    if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
    ts = absl::ToTimespec(timeout);
    tsp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, tsp,
          nullptr, 0);
}

void FutexWakeAll(const std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace kwq::internal
