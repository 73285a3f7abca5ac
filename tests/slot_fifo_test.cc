#include "kwq/internal/slot_fifo.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <new>
#include <random>

#include "gtest/gtest.h"

// Counts array allocations (SlotFifo's buffer is a new[]), to check that reserved room
// is used without allocating. Replaces the global operator new[] for this binary only.
static std::atomic<int> g_array_news{0};  // atomic: gtest may allocate on its threads
void* operator new[](std::size_t n) {
  ++g_array_news;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kwq::internal {
namespace {

// Pops everything and returns it in order.
std::deque<uint32_t> Drain(SlotFifo& fifo) {
  std::deque<uint32_t> out;
  while (!fifo.empty()) {
    out.push_back(fifo.front());
    fifo.pop_front();
  }
  return out;
}

TEST(SlotFifoTest, ConsecutiveSlotsFormOneRunAndComeOutInOrder) {
  SlotFifo fifo;
  for (uint32_t s = 10; s < 15; ++s) fifo.push_back(s);
  fifo.push_back(3);
  fifo.push_back(4);
  fifo.push_back(20);
  EXPECT_EQ(fifo.size(), 8u);
  EXPECT_EQ(Drain(fifo), (std::deque<uint32_t>{10, 11, 12, 13, 14, 3, 4, 20}));
  EXPECT_EQ(fifo.size(), 0u);
}

TEST(SlotFifoTest, RunShrinkingToOneSlotAtTheTailStillExtends) {
  SlotFifo fifo;
  fifo.push_back(1);
  fifo.push_back(2);  // run [1, 3)
  fifo.pop_front();   // run shrinks to the single slot 2
  fifo.push_back(3);  // must extend to a run [2, 4)
  fifo.push_back(4);
  EXPECT_EQ(Drain(fifo), (std::deque<uint32_t>{2, 3, 4}));
  fifo.push_back(7);  // empty again: starts fresh
  fifo.push_back(8);
  EXPECT_EQ(Drain(fifo), (std::deque<uint32_t>{7, 8}));
}

TEST(SlotFifoTest, DescendingAndRepeatedSlotsAreSingles) {
  SlotFifo fifo;
  for (uint32_t s : {9u, 8u, 8u, 7u, 0u, 1u, 1u}) fifo.push_back(s);
  EXPECT_EQ(Drain(fifo), (std::deque<uint32_t>{9, 8, 8, 7, 0, 1, 1}));
}

TEST(SlotFifoTest, LargestSlotNumber) {
  SlotFifo fifo;
  fifo.push_back(SlotFifo::kRunBit - 2);
  fifo.push_back(SlotFifo::kRunBit - 1);
  EXPECT_EQ(Drain(fifo), (std::deque<uint32_t>{SlotFifo::kRunBit - 2, SlotFifo::kRunBit - 1}));
}

// Random pushes (often continuing a run) and pops against std::deque.
TEST(SlotFifoTest, MatchesADequeUnderRandomOperations) {
  std::mt19937 rng(42);
  SlotFifo fifo;
  std::deque<uint32_t> model;
  uint32_t next = 0;
  for (int op = 0; op < 200000; ++op) {
    const int r = static_cast<int>(rng() % 10);
    if (r < 6) {
      const uint32_t slot = r < 4 ? next++ : static_cast<uint32_t>(rng() % 64);
      if (r >= 4) next = slot + 1;
      fifo.push_back(slot);
      model.push_back(slot);
    } else if (!model.empty()) {
      ASSERT_EQ(fifo.front(), model.front()) << "op " << op;
      fifo.pop_front();
      model.pop_front();
    }
    ASSERT_EQ(fifo.size(), model.size());
    uint32_t front[20];
    const size_t want = rng() % 20;
    const size_t copied = fifo.CopyFront(front, want);
    ASSERT_EQ(copied, std::min(want, model.size())) << "op " << op;
    for (size_t i = 0; i < copied; ++i) ASSERT_EQ(front[i], model[i]) << "op " << op;
  }
  EXPECT_EQ(Drain(fifo), model);
}

// Reserve(n) makes room for n more push_backs, ReserveFor(n) for any n distinct slots in
// all: after them, the pushes do not allocate. Singles (no two consecutive) use a word
// each, the most a slot can take.
TEST(SlotFifoTest, ReservedRoomTakesPushesWithoutAllocating) {
  for (size_t n : {1u, 15u, 16u, 17u, 33u, 40u, 100u}) {
    SlotFifo fifo;
    fifo.Reserve(n);
    int before = g_array_news.load();
    for (uint32_t i = 0; i < n; ++i) fifo.push_back(2 * i);
    EXPECT_EQ(g_array_news.load(), before) << "Reserve(" << n << ")";
    // Full to the reserved size: ReserveFor(2n) in all from here.
    fifo.ReserveFor(2 * n);
    before = g_array_news.load();
    for (uint32_t i = 0; i < n; ++i) fifo.push_back(1000 + 2 * i);
    EXPECT_EQ(g_array_news.load(), before) << "ReserveFor(" << 2 * n << ")";
    SlotFifo fresh;
    fresh.ReserveFor(n);
    before = g_array_news.load();
    for (uint32_t i = 0; i < n; ++i) fresh.push_back(2 * i);
    EXPECT_EQ(g_array_news.load(), before) << "fresh ReserveFor(" << n << ")";
    EXPECT_EQ(fifo.size(), 2 * n);
    EXPECT_EQ(fresh.size(), n);
    EXPECT_EQ(Drain(fresh).back(), 2 * (n - 1));
  }
}

// ReleaseIfEmpty frees a large buffer only once the FIFO is empty: a FIFO that still holds
// slots keeps them.
TEST(SlotFifoTest, ReleaseIfEmptyKeepsAHoldingFifo) {
  SlotFifo fifo;
  std::deque<uint32_t> model;
  for (uint32_t i = 0; i < 3 * SlotFifo::kKeepWords; ++i) {
    fifo.push_back(2 * i);  // singles: a word each
    model.push_back(2 * i);
  }
  for (int i = 0; i < 5; ++i) {
    fifo.pop_front();
    model.pop_front();
  }
  fifo.ReleaseIfEmpty();  // not empty: nothing happens
  EXPECT_EQ(Drain(fifo), model);
  fifo.ReleaseIfEmpty();  // empty: freed, and usable again
  fifo.push_back(4);
  fifo.push_back(5);
  EXPECT_EQ(Drain(fifo), (std::deque<uint32_t>{4, 5}));
}

}  // namespace
}  // namespace kwq::internal
