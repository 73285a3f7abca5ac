#include "kwq/internal/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

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
  if (!prefault_supported.load()) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
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

}  // namespace
}  // namespace kwq::internal
