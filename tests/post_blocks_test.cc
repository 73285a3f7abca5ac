// PostBlocks (src/workqueue/post_blocks.h): the recycled memory of posted Works. Each test
// runs its allocations on a thread of its own, so a thread's cache starts empty (until its
// first Allocate takes a batch from the depot); the depot is process-wide, so tests look
// only at its newest batches. Order-independent (--gtest_shuffle).

#include "workqueue/post_blocks.h"

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

constexpr int kBatch = PostBlocks::kBatch;

template <typename F>
void OnNewThread(F f) {
  std::thread t(f);
  t.join();
}

TEST(PostBlocksTest, AFreedBlockIsReusedOnTheSameThread) {
  OnNewThread([] {
    void* a = PostBlocks::Allocate();  // may take a batch from the depot
    const int cached = PostBlocks::CachedOnThisThread();
    PostBlocks::Free(a);
    EXPECT_EQ(PostBlocks::CachedOnThisThread(), cached + 1);
    void* b = PostBlocks::Allocate();
    EXPECT_EQ(a, b);
    EXPECT_EQ(PostBlocks::CachedOnThisThread(), cached);
    PostBlocks::Free(b);
  });
}

// A block is writable over all of a Work, however it was obtained.
TEST(PostBlocksTest, BlocksHoldAWholeWork) {
  OnNewThread([] {
    std::vector<void*> blocks;
    for (int i = 0; i < 3 * kBatch; ++i) blocks.push_back(PostBlocks::Allocate());
    for (void* b : blocks) PostBlocks::Free(b);
    for (void*& b : blocks) {
      b = PostBlocks::Allocate();  // recycled ones now
      std::memset(b, 0xab, sizeof(Work));
    }
    for (void* b : blocks) PostBlocks::Free(b);
  });
}

// A thread keeps fewer than kBatch loose blocks and one full batch; the rest goes on to
// the depot.
TEST(PostBlocksTest, AThreadKeepsAtMostTwoBatches) {
  OnNewThread([] {
    std::vector<void*> blocks;
    for (int i = 0; i < 3 * kBatch + 5; ++i) blocks.push_back(PostBlocks::Allocate());
    const int before = PostBlocks::CachedOnThisThread();  // left of batches from the depot
    for (void* b : blocks) PostBlocks::Free(b);
    const int after = PostBlocks::CachedOnThisThread();
    EXPECT_LT(after, 2 * kBatch);
    EXPECT_EQ((before + static_cast<int>(blocks.size()) - after) % kBatch, 0)
        << "what the thread gave away is whole batches";
    // This thread takes nothing from the depot while it holds blocks.
    for (int i = 0; i < after; ++i) blocks[i] = PostBlocks::Allocate();
    EXPECT_EQ(PostBlocks::CachedOnThisThread(), 0);
    for (int i = 0; i < after; ++i) PostBlocks::Free(blocks[i]);
  });
}

// What a worker frees reaches a producer: in full batches through the depot, and a
// thread's full batch when it exits.
TEST(PostBlocksTest, BatchesPassFromTheFreeingThreadToAnAllocatingOne) {
  absl::flat_hash_set<uintptr_t> freed;
  OnNewThread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 2 * kBatch; ++i) blocks.push_back(PostBlocks::Allocate());
    for (void* b : blocks) {
      freed.insert(reinterpret_cast<uintptr_t>(b));
      PostBlocks::Free(b);
    }
    // One batch went to the depot, one stays here until this thread exits.
    EXPECT_EQ(PostBlocks::CachedOnThisThread(), kBatch);
  });
  OnNewThread([&] {
    // The newest batch in the depot is the exited thread's, the next one the batch it
    // put there while it ran.
    std::vector<void*> got;
    for (int i = 0; i < 2 * kBatch; ++i) got.push_back(PostBlocks::Allocate());
    int reused = 0;
    for (void* b : got) reused += freed.erase(reinterpret_cast<uintptr_t>(b));
    EXPECT_EQ(reused, 2 * kBatch);
    for (void* b : got) PostBlocks::Free(b);
  });
}

// After a thread's cache was torn down at its exit, a thread_local destroyed later may
// still allocate and free (as a Post from such a destructor does): the blocks go to
// operator new and delete, not to a cache nobody empties (LeakSanitizer would report them).
TEST(PostBlocksTest, AllocationsAfterTheThreadsCacheIsGoneAreNotCached) {
  struct AtExit {
    int* cached_after;
    ~AtExit() {
      void* b = PostBlocks::Allocate();
      std::memset(b, 0, sizeof(Work));
      PostBlocks::Free(b);
      *cached_after = PostBlocks::CachedOnThisThread();
    }
  };
  int cached_after = -1;
  OnNewThread([&] {
    // Constructed before the cache's guard, so destroyed after it.
    thread_local AtExit at_exit{nullptr};
    at_exit.cached_after = &cached_after;
    PostBlocks::Free(PostBlocks::Allocate());  // registers the guard
    EXPECT_GT(PostBlocks::CachedOnThisThread(), 0);
  });
  EXPECT_EQ(cached_after, 0);
}

// With the depot full, a thread that fills a batch keeps it as its spare and frees the
// older one: its next allocations are the blocks it freed last.
TEST(PostBlocksTest, WithTheDepotFullAThreadKeepsItsNewestBatch) {
  OnNewThread([] {
    constexpr int kBlocks = (PostBlocks::kMaxDepotBatches + 6) * kBatch;
    std::vector<void*> blocks;
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(PostBlocks::Allocate());
    for (void* b : blocks) PostBlocks::Free(b);  // fills the depot, frees the rest
    EXPECT_EQ(PostBlocks::CachedOnThisThread(), kBatch);
    absl::flat_hash_set<uintptr_t> newest;
    for (int i = kBlocks - kBatch; i < kBlocks; ++i) {
      newest.insert(reinterpret_cast<uintptr_t>(blocks[i]));
    }
    std::vector<void*> got;
    for (int i = 0; i < kBatch; ++i) got.push_back(PostBlocks::Allocate());
    int from_newest = 0;
    for (void* b : got) from_newest += newest.erase(reinterpret_cast<uintptr_t>(b));
    EXPECT_EQ(from_newest, kBatch);
    // Leave the depot empty for the other tests: its blocks go to operator delete.
    for (void* b : got) ::operator delete(b);
    for (int i = 0; i < PostBlocks::kMaxDepotBatches * kBatch; ++i) {
      ::operator delete(PostBlocks::Allocate());
    }
  });
}

#if defined(__SANITIZE_ADDRESS__)
#define KWQ_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KWQ_TEST_ASAN 1
#endif
#endif

#ifdef KWQ_TEST_ASAN
// A posted Work used after its free is still reported, though its block is kept.
TEST(PostBlocksDeathTest, AUseOfACachedBlockIsReported) {
  EXPECT_DEATH(
      {
        void* b = PostBlocks::Allocate();
        PostBlocks::Free(b);
        static_cast<volatile char*>(b)[sizeof(Work) - 1] = 1;
      },
      "use-after-poison");
}
#endif

}  // namespace
}  // namespace kwq::internal
