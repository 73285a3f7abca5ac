// Recycled memory for the Works that Workqueue::Post makes and its workers free.
//
// A posted Work is made on the producer's thread and freed on a worker's: with malloc,
// every free of a block that another thread allocated goes back to that thread's arena
// under the arena's lock once the freeing thread's small per-size cache is full, and the
// producer's next allocation takes the same lock. Measured: Post cost about 200 ns per
// item against 60-75 for queueing a Work made beforehand (kwq-scenarios --scenario=wq_tiny,
// docs/benchmarks.md). PostBlocks keeps freed blocks instead, in a cache per thread of up
// to two batches of kBatch blocks, and passes whole batches between threads through one
// process-wide depot: a worker that has freed a batch more than it holds puts it there,
// and a producer whose cache is empty takes one. So a Post and its free touch no lock on
// kBatch - 1 of kBatch items.
//
// Why not a library: the packages kwq may use (docs/design.md) have no such allocator
// (tcmalloc and jemalloc would replace malloc process-wide, which a library must not do),
// and this one serves a single block size.
//
// Bounds: a thread keeps fewer than 2 * kBatch blocks; the depot at most kMaxDepotBatches
// batches; everything beyond goes back to operator delete. A thread's blocks go to the
// depot (a full batch) or operator delete when it exits; frees after that (from a
// thread_local destroyed later) go to operator delete. A thread whose cache is first used
// after its thread_local destructors ran (the main thread during static destruction)
// keeps it until the process ends. The depot is never destroyed (threads may exit after
// static destruction), and holds its blocks until the process ends.
//
// Under AddressSanitizer a cached block is poisoned except its link (its first 8 bytes),
// so a use of a posted Work after its free is reported until the block is reused (blocks
// are reused newest first, with no quarantine).
//
// Thread-safe: each thread uses its own cache; the depot has a lock.

#ifndef KWQ_SRC_WORKQUEUE_POST_BLOCKS_H_
#define KWQ_SRC_WORKQUEUE_POST_BLOCKS_H_

#include <cstddef>

#include "kwq/workqueue.h"

namespace kwq::internal {

class PostBlocks {
 public:
  static constexpr int kBatch = 64;
  static constexpr int kMaxDepotBatches = 64;

  // Memory for one Work (sizeof(Work) bytes, aligned for it). Throws std::bad_alloc like
  // operator new when none is cached and none can be allocated.
  static void* Allocate();
  // Gives back a block from Allocate, whose Work has been destroyed.
  static void Free(void* block) noexcept;

  // For tests: the blocks this thread's cache holds now.
  static int CachedOnThisThread();
};

// Destroys a Work that Workqueue::Post made and frees its block.
inline void DestroyPosted(Work* w) {
  w->~Work();
  PostBlocks::Free(w);
}

}  // namespace kwq::internal

#endif  // KWQ_SRC_WORKQUEUE_POST_BLOCKS_H_
