// File: kwq/internal/prefault.h
//
// Prefault(p, bytes): asks the kernel to map the whole pages of a block that is about to
// be written throughout, in one system call (madvise MADV_POPULATE_WRITE, Linux 5.14),
// instead of one page fault per 4 KiB page as the writes reach them. Used for the blocks a
// queue fills soon and whole: a key table's slab chunks after its first (a table past
// 4,096 keys is growing in bulk; a small queue maps nothing it does not use) and a hash
// index's next array when the growth takes it (Abseil's rehash then writes every page of
// it at once).
//
// Why: page faults were most of a bulk Add's time on the development VM, whose hypervisor
// charges 11-12 us per first touch in its slow hours (docs/benchmarks.md, Floors).
// Populating 64 MiB took 5.7 us per page there against 11.3 for touching it page by page
// (bench/machine_bench.cc, BM_FloorFirstTouch/BM_FloorPopulate), and fifo_1t went from
// 526.9 to 428.1 ns per item in 7 interleaved rounds (docs/benchmark-history.md). The pages are the
// ones the writes would map anyway, except the unused tail of the last chunk: the mem scenario
// moved from 47.7 to 47.8 bytes per key.
//
// Best effort: a kernel without MADV_POPULATE_WRITE (or any refusal) leaves the pages to
// be faulted in as before; after the first EINVAL no further call is made. Never throws,
// never allocates. Internal.

#ifndef KWQ_INTERNAL_PREFAULT_H_
#define KWQ_INTERNAL_PREFAULT_H_

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#endif

namespace kwq::internal {

#if defined(__linux__)
#ifdef MADV_POPULATE_WRITE
inline constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
inline constexpr int kMadvPopulateWrite = 23;  // Linux 5.14's value; older headers lack it
#endif
// Cleared once the kernel says it does not know the advice.
inline std::atomic<bool> prefault_supported{true};
#endif

// Maps the pages wholly inside [p, p + bytes) for writing, if the kernel can. Thread-safe.
inline void Prefault(void* p, size_t bytes) noexcept {
#if defined(__linux__)
  if (!prefault_supported.load(std::memory_order_relaxed)) return;
  constexpr uintptr_t kPage = 4096;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kPage - 1);
  if (end <= begin) return;
  const int saved_errno = errno;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, kMadvPopulateWrite) != 0 &&
      errno == EINVAL) {
    prefault_supported.store(false, std::memory_order_relaxed);
  }
  errno = saved_errno;
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_PREFAULT_H_
