#include "kwq/parallelize.h"

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kwq {

absl::Status ParallelizeUntil(const Context& ctx, int workers, int pieces,
                              absl::FunctionRef<void(int)> fn, ParallelizeOptions options) {
  if (workers < 1 || pieces < 0 || options.chunk_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ParallelizeUntil: need workers >= 1, pieces >= 0, chunk_size >= 1; got ",
                     workers, ", ", pieces, ", ", options.chunk_size));
  }
  if (pieces == 0) return absl::OkStatus();
  const int chunks = (pieces + options.chunk_size - 1) / options.chunk_size;
  workers = std::min(workers, chunks);
  Workqueue& wq = options.workqueue != nullptr ? *options.workqueue : SystemUnboundWq();

  std::atomic<int> next_chunk{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::string error;
  auto run = [&] {
    while (!ctx.IsCancelled() && !failed.load(std::memory_order_relaxed)) {
      const int chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= chunks) return;
      const int end = std::min(pieces, (chunk + 1) * options.chunk_size);
      for (int piece = chunk * options.chunk_size; piece < end; ++piece) {
        try {
          fn(piece);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!failed.exchange(true)) error = e.what();
          return;
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!failed.exchange(true)) error = "non-std exception";
          return;
        }
      }
    }
  };
  std::vector<std::unique_ptr<Work>> items;
  items.reserve(workers);
  for (int i = 0; i < workers; ++i) {
    items.push_back(std::make_unique<Work>(run));
    wq.Queue(items.back().get());
  }
  {
    BlockingScope blocking;  // a worker calling us must not hold up its pool
    for (auto& item : items) wq.Flush(item.get());
  }
  if (failed.load()) {
    std::lock_guard<std::mutex> lock(error_mu);
    return absl::InternalError(absl::StrCat("ParallelizeUntil: a piece threw: ", error));
  }
  if (next_chunk.load() < chunks && ctx.IsCancelled()) return ctx.Err();
  return absl::OkStatus();
}

}  // namespace kwq
