#include "kwq/internal/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/internal/safe_growth.h"
#include "testing/resident_bytes.h"

namespace kwq::internal {
namespace {

constexpr size_t kPage = 4096;

// Fresh, untouched anonymous memory without huge pages; unmapped at the end.
struct FreshMap {
  explicit FreshMap(size_t pages) : bytes(pages * kPage) {
    base = static_cast<char*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base != MAP_FAILED) madvise(base, bytes, MADV_NOHUGEPAGE);
  }
  ~FreshMap() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  // Which pages are resident (mincore).
  std::vector<bool> Resident() const {
    std::vector<unsigned char> vec(bytes / kPage);
    std::vector<bool> out(vec.size());
    if (mincore(base, bytes, vec.data()) != 0) return out;
    for (size_t i = 0; i < vec.size(); ++i) out[i] = (vec[i] & 1) != 0;
    return out;
  }
  size_t bytes;
  char* base;
};

TEST(PrefaultTest, MapsEveryWholePageOfTheBlockAndNoneOutside) {
  ASSERT_EQ(sysconf(_SC_PAGESIZE), static_cast<long>(kPage));
  FreshMap map(8);
  ASSERT_NE(map.base, MAP_FAILED);
  for (bool resident : map.Resident()) ASSERT_FALSE(resident);
  // From the middle of page 1 to the middle of page 6: pages 2-5 are whole.
  Prefault(map.base + kPage + 100, 5 * kPage);
  if (!PrefaultSupported()) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
  const std::vector<bool> resident = map.Resident();
  const std::vector<bool> expected = {false, false, true, true, true, true, false, false};
  EXPECT_EQ(resident, expected);
  // Mapped for writing, zero-filled: a write needs no further allocation by the kernel.
  for (size_t i = 2 * kPage; i < 6 * kPage; i += kPage) EXPECT_EQ(map.base[i], 0);
}

TEST(PrefaultTest, ABlockWithNoWholePageMapsNothing) {
  FreshMap map(2);
  ASSERT_NE(map.base, MAP_FAILED);
  Prefault(map.base + 1, kPage);  // straddles the boundary: no whole page inside
  Prefault(map.base, 0);
  for (bool resident : map.Resident()) EXPECT_FALSE(resident);
}

TEST(PrefaultTest, KeepsErrno) {
  FreshMap map(2);
  ASSERT_NE(map.base, MAP_FAILED);
  errno = 1234;
  Prefault(map.base, 2 * kPage);
  EXPECT_EQ(errno, 1234);
}

// An index's growth block is mapped when the growth takes it (and writes it all), not
// when it is set aside: Abseil takes it only at 7/8 full, 25/32 is where it is set aside,
// and a set that stayed between kept the whole block resident unwritten.
TEST(PrefaultTest, AGrowthReserveMapsItsBlockWhenTakenNotWhenSetAside) {
  constexpr size_t kBytes = size_t{64} << 20;
  static_assert(kBytes >= GrowthReserve::kPrefaultBytes);
  GrowthReserve reserve;
  const size_t before = static_cast<size_t>(testing::ResidentBytes());
  reserve.Ensure(kBytes);
  const size_t set_aside = static_cast<size_t>(testing::ResidentBytes());
  EXPECT_LT(set_aside - before, kBytes / 2) << "the block was mapped when set aside";
  void* block = reserve.Take(kBytes);
  ASSERT_NE(block, nullptr);
  const size_t taken = static_cast<size_t>(testing::ResidentBytes());
  ::operator delete(block);
  if (!PrefaultSupported()) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
  EXPECT_GE(taken - set_aside, kBytes * 3 / 4) << "the block was not mapped when taken";
}

// A GrowthReserve hands out only a block of the size set aside, once; Ensure with another
// size replaces the block; a ReservingAllocator takes it only for that many bytes.
TEST(PrefaultTest, AGrowthReserveHandsOutItsBlockOnlyForItsSize) {
  GrowthReserve reserve;
  EXPECT_EQ(reserve.Take(64), nullptr);
  reserve.Ensure(64);
  EXPECT_TRUE(reserve.holds_block());
  EXPECT_EQ(reserve.Take(128), nullptr);  // another size: not this block
  EXPECT_TRUE(reserve.holds_block());
  reserve.Ensure(128);  // a block of the new size replaces it
  EXPECT_EQ(reserve.Take(64), nullptr);
  void* block = reserve.Take(128);
  ASSERT_NE(block, nullptr);
  EXPECT_FALSE(reserve.holds_block());
  EXPECT_EQ(reserve.Take(128), nullptr);  // taken once
  ::operator delete(block);

  reserve.Ensure(10 * sizeof(uint64_t));
  ReservingAllocator<uint64_t> alloc(&reserve);
  uint64_t* other = alloc.allocate(3);  // another size: an ordinary allocation
  EXPECT_TRUE(reserve.holds_block());
  uint64_t* taken = alloc.allocate(10);  // 80 bytes: the reserve's block
  EXPECT_FALSE(reserve.holds_block());
  EXPECT_NE(taken, other);
  alloc.deallocate(other, 3);
  alloc.deallocate(taken, 10);
}

}  // namespace
}  // namespace kwq::internal
