// File: kwq/parallelize.h
//
// ParallelizeUntil: client-go's workqueue.ParallelizeUntil on kwq workqueues. Runs
// fn(piece) for every piece in [0, pieces) on up to `workers` runners at once, handing
// out `chunk_size` pieces at a time. Once `ctx` is done (or a piece threw) no further
// piece starts, as client-go checks its stop channel before each piece; pieces already
// started finish.
//
//   absl::Status s = kwq::ParallelizeUntil(ctx, /*workers=*/8, /*pieces=*/items.size(),
//                                          [&](int i) { Process(items[i]); });
//
// The calling thread is one of the runners and the other workers - 1 (at most what the
// workqueue runs at once: max_active per CPU when bound, max_active when unbound) are
// work items on the workqueue
// (client-go starts `workers` goroutines and only waits). So it always
// finishes, also when the workqueue cannot start the helpers: called from a work item of
// a workqueue with no free slot (nested calls), on a frozen workqueue, or while it
// drains (its Queue refuses). Helpers that never started are cancelled. With workers = 1
// every piece runs on the calling thread. On a bound (per-CPU) workqueue the helpers are
// spread over its topology's CPUs (QueueOn), one per CPU pool starting after the
// caller's, since a per-CPU pool runs one work at a time unless it blocks.
// Blocks until every helper that started has finished; the wait is a BlockingScope.
// Thread safety: fn is called concurrently from several threads, the caller's included.

#ifndef KWQ_PARALLELIZE_H_
#define KWQ_PARALLELIZE_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kwq/context.h"
#include "kwq/workqueue.h"

namespace kwq {

struct ParallelizeOptions {
  // Pieces handed to a worker at a time (client-go's WithChunkSize). Must be >= 1.
  int chunk_size = 1;
  // Where the workers run. nullptr: SystemUnboundWq().
  Workqueue* workqueue = nullptr;
};

// Returns OK when every piece ran; ctx.Err() when ctx ended it early; Internal (with the
// message, or without it when copying it runs out of memory) when fn threw — the first
// exception stops the hand-out like a cancel.
// InvalidArgument for workers < 1, pieces < 0 or chunk_size < 1. Throws std::bad_alloc
// when the helpers cannot be made (then before any piece runs, and no helper is queued).
// A worker thread the workqueue cannot start is not an exception: the workqueue counts a
// spawn failure, and the pieces are run by the helpers that did start and by the
// calling thread.
absl::Status ParallelizeUntil(const Context& ctx, int workers, int pieces,
                              absl::FunctionRef<void(int)> fn, ParallelizeOptions options = {});

}  // namespace kwq

#endif  // KWQ_PARALLELIZE_H_
