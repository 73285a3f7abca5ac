#include "kwq/internal/spin_lock.h"

#include <time.h>

#include <thread>

namespace kwq::internal {
namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void SpinLock::LockSlow() {
  for (int attempt = 0;; ++attempt) {
    // Test before test-and-set: waiters read a shared line instead of fighting over it.
    while (locked_.load(std::memory_order_relaxed)) {
      if (attempt < 64) {
        CpuRelax();
      } else if (attempt < 1024) {
        std::this_thread::yield();
      } else {
        const timespec nap{0, 50'000};  // 50 us: a long critical section (a big cancel)
        nanosleep(&nap, nullptr);
      }
      ++attempt;
    }
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
  }
}

}  // namespace kwq::internal
