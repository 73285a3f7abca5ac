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
// 526.9 to 428.1 ns per item in 7 interleaved rounds (docs/benchmark-history.md). The
// pages are the ones the writes would map anyway, except the unused tail of the last
// chunk: the mem scenario moved from 47.7 to 47.8 bytes per key.
//
// Best effort: a kernel without MADV_POPULATE_WRITE (or any refusal) leaves the pages to
// be faulted in as before; after the first EINVAL no further call is made. Never throws,
// never allocates. Out of line (src/internal/prefault.cc): it runs once per 4,096 new keys
// or per index growth, and keeps <sys/mman.h> out of the queue headers. Internal.

#ifndef KWQ_INTERNAL_PREFAULT_H_
#define KWQ_INTERNAL_PREFAULT_H_

#include <cstddef>

namespace kwq::internal {

// Maps the pages wholly inside [p, p + bytes) for writing, if the kernel can. Thread-safe;
// keeps errno.
void Prefault(void* p, size_t bytes) noexcept;

// False once the kernel has refused the advice as unknown (then Prefault does nothing).
bool PrefaultSupported() noexcept;

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_PREFAULT_H_
