#include "kwq/internal/prefault.h"

#include <atomic>
#include <cerrno>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kwq::internal {
namespace {

#if defined(__linux__)
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14's value; older headers lack it
#endif
#endif

// Cleared once the kernel says it does not know the advice.
std::atomic<bool> supported{true};

}  // namespace

void Prefault(void* p, size_t bytes) noexcept {
#if defined(__linux__)
  if (!supported.load(std::memory_order_relaxed)) return;
  constexpr uintptr_t kPage = 4096;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kPage - 1);
  if (end <= begin) return;
  const int saved_errno = errno;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, kMadvPopulateWrite) != 0 &&
      errno == EINVAL) {
    supported.store(false, std::memory_order_relaxed);
  }
  errno = saved_errno;
#else
  (void)p;
  (void)bytes;
  supported.store(false, std::memory_order_relaxed);
#endif
}

bool PrefaultSupported() noexcept { return supported.load(std::memory_order_relaxed); }

}  // namespace kwq::internal
