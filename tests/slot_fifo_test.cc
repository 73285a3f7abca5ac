#include "kwq/internal/slot_fifo.h"

#include <algorithm>
#include <deque>
#include <random>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace kwq::internal
