#include "kwq/internal/pod_vector.h"

#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

struct Entry {
  int64_t key;
  uint32_t id;
};

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

}  // namespace
}  // namespace kwq::internal
