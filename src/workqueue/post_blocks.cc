// Recycled memory for posted Works: see post_blocks.h.

#include "workqueue/post_blocks.h"

#include <atomic>
#include <new>
#include <utility>

#include "kwq/internal/spin_lock.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KWQ_POST_BLOCKS_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KWQ_POST_BLOCKS_ASAN 1
#endif
#ifdef KWQ_POST_BLOCKS_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace kwq::internal {
namespace {

struct FreeBlock {
  FreeBlock* next;
};
constexpr size_t kSize = sizeof(Work);
static_assert(kSize >= sizeof(FreeBlock));
static_assert(alignof(Work) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
              "blocks come from the plain operator new, as `new Work` did");

// A cached block is poisoned except its link (AddressSanitizer only).
void Poison(FreeBlock* b) {
#ifdef KWQ_POST_BLOCKS_ASAN
  ASAN_POISON_MEMORY_REGION(reinterpret_cast<char*>(b) + sizeof(FreeBlock),
                            kSize - sizeof(FreeBlock));
#else
  (void)b;
#endif
}
void Unpoison(void* b) {
#ifdef KWQ_POST_BLOCKS_ASAN
  ASAN_UNPOISON_MEMORY_REGION(b, kSize);
#else
  (void)b;
#endif
}

void DeleteList(FreeBlock* b) {
  while (b != nullptr) {
    FreeBlock* next = b->next;
    Unpoison(b);
    ::operator delete(b);
    b = next;
  }
}

// Full batches (kBatch blocks each, linked through FreeBlock::next) on their way from the
// threads that free posted Works to the threads that post. Touched once per kBatch blocks.
class Depot {
 public:
  // Keeps `batch`; false when the depot is full (the caller frees it).
  bool Put(FreeBlock* batch) {
    SpinLockHolder lock(&mu_);
    if (n_ == PostBlocks::kMaxDepotBatches) return false;
    batches_[n_++] = batch;
    count_.store(n_, std::memory_order_relaxed);
    return true;
  }
  // A batch, or null when none is kept. A producer whose cache and the depot are both
  // empty allocates on every Post: it reads the count without the lock (a stale zero only
  // costs one operator new).
  FreeBlock* Take() {
    if (count_.load(std::memory_order_relaxed) == 0) return nullptr;
    SpinLockHolder lock(&mu_);
    if (n_ == 0) return nullptr;
    --n_;
    count_.store(n_, std::memory_order_relaxed);
    return batches_[n_];
  }

 private:
  SpinLock mu_;
  FreeBlock* batches_[PostBlocks::kMaxDepotBatches] ABSL_GUARDED_BY(mu_) = {};
  int n_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> count_{0};  // n_, written under mu_
};

// Never destroyed: a thread may exit (and hand its blocks over) after static destruction.
Depot& TheDepot() {
  static Depot* const depot = new Depot;
  return *depot;
}

// A thread's cache: `cur` holds fewer than kBatch blocks, `spare` none or exactly kBatch.
// Trivially destructible, so it stays readable until the thread ends; the Guard below
// empties it at the thread's exit and marks it gone (later frees go to operator delete).
struct Cache {
  FreeBlock* cur;
  int cur_n;
  FreeBlock* spare;
  bool enlisted;  // the Guard is registered
  bool gone;      // the Guard has run
};
thread_local Cache t_cache = {};

struct Guard {
  ~Guard() {
    Cache& c = t_cache;
    c.gone = true;
    FreeBlock* spare = std::exchange(c.spare, nullptr);
    FreeBlock* cur = std::exchange(c.cur, nullptr);
    c.cur_n = 0;
    if (spare != nullptr && !TheDepot().Put(spare)) DeleteList(spare);
    DeleteList(cur);
  }
};

// Registers this thread's Guard (its destructor runs at the thread's exit) before the
// cache first holds a block.
void Enlist(Cache& c) {
  static thread_local Guard guard;
  (void)&guard;
  c.enlisted = true;
}

}  // namespace

void* PostBlocks::Allocate() {
  Cache& c = t_cache;
  if (c.cur == nullptr) {
    if (c.spare != nullptr) {
      c.cur = std::exchange(c.spare, nullptr);
      c.cur_n = kBatch;
    } else if (!c.gone) {
      if (FreeBlock* batch = TheDepot().Take()) {
        if (!c.enlisted) Enlist(c);
        c.cur = batch;
        c.cur_n = kBatch;
      }
    }
    if (c.cur == nullptr) return ::operator new(kSize);
  }
  FreeBlock* b = c.cur;
  c.cur = b->next;
  --c.cur_n;
  Unpoison(b);
  return b;
}

void PostBlocks::Free(void* block) noexcept {
  Cache& c = t_cache;
  if (c.gone) {
    ::operator delete(block);
    return;
  }
  if (!c.enlisted) Enlist(c);
  auto* b = static_cast<FreeBlock*>(block);
  b->next = c.cur;
  Poison(b);
  c.cur = b;
  if (++c.cur_n < kBatch) return;
  FreeBlock* full = std::exchange(c.cur, nullptr);
  c.cur_n = 0;
  FreeBlock* out = std::exchange(c.spare, full);
  if (out != nullptr && !TheDepot().Put(out)) DeleteList(out);
}

int PostBlocks::CachedOnThisThread() {
  const Cache& c = t_cache;
  return c.cur_n + (c.spare != nullptr ? kBatch : 0);
}

}  // namespace kwq::internal
