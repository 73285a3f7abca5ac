#include "kwq/parallelize.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kwq {
namespace {

// The state every runner of one call shares; it lives on the caller's stack, which
// outlives every helper (the caller cancels or waits for each before returning).
class Pieces {
 public:
  Pieces(const Context& ctx, int pieces, int chunk_size, absl::FunctionRef<void(int)> fn)
      : ctx_(ctx),
        pieces_(pieces),
        chunk_size_(chunk_size),
        chunks_((int64_t{pieces} + chunk_size - 1) / chunk_size),
        fn_(fn) {}

  int64_t chunks() const { return chunks_; }

  // Hands out no more chunks: every runner returns after its current one.
  void Stop() { next_chunk_.store(chunks_, std::memory_order_relaxed); }

  // Runs chunks until none is left, ctx is done or a piece threw. Checked before every
  // piece, as client-go checks its stop channel: pieces not yet started do not start.
  void Run() {
    for (;;) {
      // 64-bit: each runner takes one chunk past the end before it stops, which with
      // about 2^31 chunks would wrap a 32-bit counter (into negative piece numbers).
      const int64_t chunk = next_chunk_.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= chunks_) return;
      const int64_t begin = chunk * chunk_size_;
      const int64_t end = std::min<int64_t>(pieces_, begin + chunk_size_);
      for (int64_t piece = begin; piece < end; ++piece) {
        if (Stopped() || !RunPiece(static_cast<int>(piece))) {
          stopped_early_.store(true, std::memory_order_relaxed);
          return;
        }
      }
    }
  }

  // OK when every piece ran; otherwise why not. Called once every runner is done.
  absl::Status Result() {
    if (failed_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(error_mu_);
      try {
        return absl::InternalError(absl::StrCat(
            "ParallelizeUntil: a piece threw: ",
            message_lost_ ? "(its message could not be copied: out of memory)" : error_));
      } catch (const std::bad_alloc&) {
        return absl::Status(absl::StatusCode::kInternal, "");  // an empty message allocates nothing
      }
    }
    // A runner leaves a chunk unfinished only when a piece threw (above) or ctx is done.
    return stopped_early_.load(std::memory_order_relaxed) ? ctx_.Err() : absl::OkStatus();
  }

 private:
  bool Stopped() const { return failed_.load(std::memory_order_relaxed) || ctx_.IsCancelled(); }

  // Runs one piece; false when it threw (the first exception stops every runner).
  bool RunPiece(int piece) {
    try {
      fn_(piece);
      return true;
    } catch (const std::exception& e) {
      Fail(e.what());
    } catch (...) {
      Fail("non-std exception");
    }
    return false;
  }

  // Called in a catch block: it must not throw (a bad_alloc from copying the message once
  // left the runner before failed_ was set, so a helper's failure read as OK, and on the
  // calling thread the unwinding destroyed helpers still running). A message that cannot
  // be copied is left out; the failure is still reported.
  void Fail(const char* what) noexcept {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        error_ = what;
      } catch (const std::bad_alloc&) {
        message_lost_ = true;
      }
    }
    failed_.store(true, std::memory_order_release);
  }

  const Context& ctx_;
  const int pieces_;
  const int chunk_size_;
  const int64_t chunks_;
  const absl::FunctionRef<void(int)> fn_;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<bool> stopped_early_{false};  // a runner left a chunk unfinished
  std::atomic<bool> failed_{false};
  std::mutex error_mu_;
  std::string error_;          // the first exception's message, under error_mu_
  bool message_lost_ = false;  // under error_mu_: copying error_ ran out of memory
};

// Where helper i goes. A bound workqueue's per-CPU pool runs one work at a time unless
// it blocks, so helpers queued on the caller's CPU would run one after another: spread
// them over the topology's CPUs, starting with the one after the caller's. An unbound
// workqueue's pod pool runs them side by side: -1 (QueueOn's "the caller's choice").
class HelperCpus {
 public:
  explicit HelperCpus(const Workqueue& wq) {
    if ((wq.flags() & kUnbound) != 0) return;
    const std::vector<CpuInfo>& all = wq.topology().cpus();
    const int self = sched_getcpu();
    for (const CpuInfo& cpu : all) cpus_.push_back(cpu.cpu);
    // Rotate so that the CPU after the caller's comes first (the caller's own comes last).
    const auto it = std::find(cpus_.begin(), cpus_.end(), self);
    if (it != cpus_.end()) std::rotate(cpus_.begin(), it + 1, cpus_.end());
  }
  int ForHelper(int i) const {
    return cpus_.empty() ? -1 : cpus_[static_cast<size_t>(i) % cpus_.size()];
  }
  // The pools the helpers go to, each with its own max_active: one per CPU when bound,
  // the workqueue as a whole when unbound.
  int64_t pools() const { return cpus_.empty() ? 1 : static_cast<int64_t>(cpus_.size()); }

 private:
  std::vector<int> cpus_;
};

}  // namespace

absl::Status ParallelizeUntil(const Context& ctx, int workers, int pieces,
                              absl::FunctionRef<void(int)> fn, ParallelizeOptions options) {
  if (workers < 1 || pieces < 0 || options.chunk_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ParallelizeUntil: need workers >= 1, pieces >= 0, chunk_size >= 1; got ",
                     workers, ", ", pieces, ", ", options.chunk_size));
  }
  if (pieces == 0) return absl::OkStatus();
  Pieces shared(ctx, pieces, options.chunk_size, fn);
  Workqueue& wq = options.workqueue != nullptr ? *options.workqueue : SystemUnboundWq();
  const HelperCpus cpus(wq);
  // Helpers beyond what the workqueue runs at once (max_active per CPU pool when bound,
  // in all when unbound) could never start while the others hold its slots: they would
  // only be allocated, queued and cancelled (a million of them took 150 MB and 1.7 s for
  // nothing).
  const int64_t can_run = static_cast<int64_t>(wq.max_active()) * cpus.pools();
  const int helpers =
      static_cast<int>(std::min<int64_t>(std::min<int64_t>(workers, shared.chunks()) - 1, can_run));

  // The caller is one of the runners. So a call from a work item whose workqueue has no
  // slot left (nested calls), a frozen or draining workqueue that holds or refuses the
  // helpers, and workers = 1 all still finish: the caller runs what no helper takes.
  // Every helper is made before any is queued: an allocation that throws then unwinds
  // through no queued helper (destroying one that is pending or running, with `shared`
  // about to go, fails Work's check and aborts the process).
  std::vector<std::unique_ptr<Work>> items;
  items.reserve(helpers);
  for (int i = 0; i < helpers; ++i) {
    items.push_back(std::make_unique<Work>([&shared] { shared.Run(); }));
  }
  // Helpers still pending never started: take them back; wait for those that run (they
  // stop after their current piece once ctx is done or nothing is left to hand out).
  const auto take_back = [&] {
    BlockingScope blocking;  // a worker calling us must not hold up its pool
    for (auto& item : items) {
      if (!wq.Cancel(item.get())) wq.Flush(item.get());
    }
  };
  // One refused (a draining workqueue) never runs; take_back passes it by. A worker
  // thread that cannot be made is a spawn failure the pool records, not an exception
  // (40e1413); should QueueOn throw all the same, the helpers queued so far are taken
  // back before the exception leaves, since they use `shared`.
  try {
    for (int i = 0; i < helpers; ++i) wq.QueueOn(cpus.ForHelper(i), items[i].get());
  } catch (...) {
    shared.Stop();
    take_back();
    throw;
  }
  shared.Run();
  take_back();  // nothing is left to hand out
  return shared.Result();
}

}  // namespace kwq
