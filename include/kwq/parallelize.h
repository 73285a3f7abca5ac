// File: kwq/parallelize.h
//
// ParallelizeUntil: client-go's workqueue.ParallelizeUntil on kwq workqueues. Runs
// fn(piece) for every piece in [0, pieces) on up to `workers` concurrent work items,
// handing out `chunk_size` pieces at a time, and stops handing out pieces once `ctx` is
// done (pieces already started finish).
//
//   absl::Status s = kwq::ParallelizeUntil(ctx, /*workers=*/8, /*pieces=*/items.size(),
//                                          [&](int i) { Process(items[i]); });
//
// Blocks the caller until every worker has finished; the caller's wait is a
// BlockingScope, so calling it from a work item does not starve the pool.
// Thread safety: fn is called concurrently from several threads.

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
// message) when fn threw — the first exception stops the hand-out like a cancel.
// InvalidArgument for workers < 1, pieces < 0 or chunk_size < 1.
absl::Status ParallelizeUntil(const Context& ctx, int workers, int pieces,
                              absl::FunctionRef<void(int)> fn, ParallelizeOptions options = {});

}  // namespace kwq

#endif  // KWQ_PARALLELIZE_H_
