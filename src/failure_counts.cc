#include "kwq/internal/failure_counts.h"

#include <algorithm>
#include <cstdint>
#include <memory>

namespace kwq::internal {

FailureCounts::FailureCounts(absl::Duration idle_horizon, Clock* clock)
    : clock_(clock),
      lapse_ns_([idle_horizon] {
        const uint64_t whole = SpanNanos(absl::Floor(idle_horizon, absl::Nanoseconds(1)));
        return whole == kNeverSpan ? kNeverSpan : whole + 1;
      }()),
      last_now_(absl::ToUnixNanos(clock->CoarseNow())) {}

void FailureCounts::Reset(uint32_t slot) {
  Reserve(slot + 1);
  Entry& e = At(slot);
  e.failures.store(0, std::memory_order_relaxed);
  e.last.store(0, std::memory_order_relaxed);
}

void FailureCounts::Reserve(uint32_t limit) {
  if (limit == 0) return;
  const size_t chunk = (limit - 1) / kChunk;
  while (chunks_.size() <= chunk) {
    // Every allocation first, so that one that throws leaves the counts as they were (the
    // directory's capacity was doubled before its allocation: after a failed one, readers
    // of the next chunk read past the old directory's end).
    const size_t n = chunks_.size();
    auto entries = std::make_unique<Entry[]>(kChunk);
    // Doubling: reserving n + 1 each time reallocated (and copied) the list of chunks
    // for every new chunk.
    if (chunks_.capacity() == n) chunks_.reserve(std::max<size_t>(4, 2 * n));
    if (n == dir_capacity_) {
      const size_t capacity = dir_capacity_ == 0 ? 4 : dir_capacity_ * 2;
      auto dir = std::make_unique<Entry*[]>(capacity);
      dirs_.reserve(dirs_.size() + 1);
      for (size_t i = 0; i < n; ++i) dir[i] = chunks_[i].get();
      dir[n] = entries.get();
      chunks_.push_back(std::move(entries));
      dir_.store(dir.get(), std::memory_order_release);
      dirs_.push_back(std::move(dir));
      dir_capacity_ = capacity;
    } else {
      // Not yet visible to readers: no slot of this chunk has been handed out.
      dirs_.back()[n] = entries.get();
      chunks_.push_back(std::move(entries));
    }
  }
}

}  // namespace kwq::internal
