#include "kwq/internal/pod_vector.h"

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

struct Entry {
  int64_t key;
  uint32_t id;
};

// A realloc that always moves the block and scribbles over the old one before freeing
// it, so that a read of the old block after the growth cannot pass by luck.
void* MovingRealloc(void* old, size_t n) {
  void* grown = std::malloc(n);
  if (grown == nullptr || old == nullptr) return grown;
  const size_t had = malloc_usable_size(old);
  std::memcpy(grown, old, std::min(had, n));
  std::memset(old, 0xab, had);
  std::free(old);
  return grown;
}

// push_back and resize of one of the vector's own elements, across growths: the value
// was read after the growth had freed the block it lived in (as std::vector allows).
TEST(PodVectorTest, AddingOneOfItsOwnElementsAcrossAGrowthCopiesIt) {
  auto* const saved = pod_vector_realloc;
  pod_vector_realloc = &MovingRealloc;
  PodVector<Entry> v;
  v.push_back(Entry{7, 1});
  for (int i = 0; i < 100; ++i) v.push_back(v[0]);  // grows at 16, 32 and 64
  v.resize(500, v[99]);
  pod_vector_realloc = saved;
  ASSERT_EQ(v.size(), 500u);
  for (const Entry& e : v) {
    ASSERT_EQ(e.key, 7);
    ASSERT_EQ(e.id, 1u);
  }
}

TEST(PodVectorTest, KeepsItsElementsThroughGrowthPastTheMmapThreshold) {
  PodVector<Entry> v;
  EXPECT_TRUE(v.empty());
  constexpr uint32_t kN = 300'000;  // 4.8 MB: grown by realloc (mremap) many times
  for (uint32_t i = 0; i < kN; ++i) v.push_back(Entry{int64_t{i} * 3, i});
  ASSERT_EQ(v.size(), kN);
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_EQ(v[i].key, int64_t{i} * 3);
    ASSERT_EQ(v[i].id, i);
  }
  v.pop_back();
  EXPECT_EQ(v.size(), kN - 1);
  EXPECT_EQ((v.end() - 1)->id, kN - 2);
  v.clear();
  EXPECT_TRUE(v.empty());
}

TEST(PodVectorTest, ResizeFillsOnlyTheNewElements) {
  PodVector<uint32_t> v;
  v.resize(3, 7);
  v[1] = 1;
  v.resize(100'000, 9);
  EXPECT_EQ(v[0], 7u);
  EXPECT_EQ(v[1], 1u);
  EXPECT_EQ(v[2], 7u);
  EXPECT_EQ(v[3], 9u);
  EXPECT_EQ(v[99'999], 9u);
  v.resize(2, 0);
  EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(v[1], 1u);
}

TEST(PodVectorTest, CopiesAndMoves) {
  PodVector<uint32_t> a;
  for (uint32_t i = 0; i < 1000; ++i) a.push_back(i);
  PodVector<uint32_t> b = a;
  b[0] = 42;
  EXPECT_EQ(a[0], 0u);
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_EQ(b[999], 999u);
  PodVector<uint32_t> c = std::move(b);
  EXPECT_EQ(c[0], 42u);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  a = c;
  EXPECT_EQ(a[0], 42u);
  a = std::move(c);
  EXPECT_EQ(a.size(), 1000u);
  uint64_t sum = 0;
  for (uint32_t x : a) sum += x;
  EXPECT_EQ(sum, 999u * 1000u / 2 + 42u);
}

// A realloc that fails: a growth throws std::bad_alloc and leaves the vector as it was.
void* FailingRealloc(void*, size_t) { return nullptr; }
// A realloc that records the largest size asked of it.
size_t g_largest_realloc = 0;
void* RecordingRealloc(void* old, size_t n) {
  g_largest_realloc = std::max(g_largest_realloc, n);
  return std::realloc(old, n);
}

TEST(PodVectorTest, AFailedGrowthThrowsAndKeepsTheElements) {
  PodVector<uint32_t> v;
  for (uint32_t i = 0; i < 16; ++i) v.push_back(i);  // full: 16 is the least capacity
  auto* const saved = pod_vector_realloc;
  pod_vector_realloc = &FailingRealloc;
  bool push_threw = false, resize_threw = false;
  try {
    v.push_back(99);
  } catch (const std::bad_alloc&) {
    push_threw = true;
  }
  try {
    v.resize(1000, 7);
  } catch (const std::bad_alloc&) {
    resize_threw = true;
  }
  pod_vector_realloc = saved;
  EXPECT_TRUE(push_threw);
  EXPECT_TRUE(resize_threw);
  ASSERT_EQ(v.size(), 16u);
  for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(v[i], i);
  v.push_back(16);  // usable after the failures
  EXPECT_EQ(v[16], 16u);
}

// resize to one past the capacity grows the block to hold it.
TEST(PodVectorTest, ResizeOnePastTheCapacityGrows) {
  PodVector<uint64_t> v;
  v.Reserve(16);  // exactly 16: the least capacity
  v.resize(16, 1);
  auto* const saved = pod_vector_realloc;
  g_largest_realloc = 0;
  pod_vector_realloc = &RecordingRealloc;
  v.resize(17, 2);
  pod_vector_realloc = saved;
  EXPECT_GE(g_largest_realloc, 17 * sizeof(uint64_t));
  ASSERT_EQ(v.size(), 17u);
  EXPECT_EQ(v[15], 1u);
  EXPECT_EQ(v[16], 2u);
}

// A vector moved from, by construction or assignment, is empty (and usable).
TEST(PodVectorTest, AMovedFromVectorIsEmpty) {
  PodVector<uint32_t> a;
  for (uint32_t i = 0; i < 100; ++i) a.push_back(i);
  PodVector<uint32_t> b;
  b.push_back(5);
  b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(a.begin(), a.end());
  ASSERT_EQ(b.size(), 100u);
  EXPECT_EQ(b[99], 99u);
  PodVector<uint32_t> c(std::move(b));
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  ASSERT_EQ(c.size(), 100u);
  a.push_back(3);
  EXPECT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0], 3u);
}

}  // namespace
}  // namespace kwq::internal
