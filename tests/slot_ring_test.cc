#include "kwq/internal/slot_ring.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

TEST(SlotRingTest, FillsToCapacityAndEmptiesInOrder) {
  SlotRing ring;
  uint32_t slot;
  EXPECT_FALSE(ring.TryPop(&slot));
  for (uint32_t i = 0; i < SlotRing::kCapacity; ++i) ASSERT_TRUE(ring.TryPush(i));
  EXPECT_FALSE(ring.TryPush(9999));
  EXPECT_EQ(ring.SizeHint(), SlotRing::kCapacity);
  for (uint32_t i = 0; i < SlotRing::kCapacity; ++i) {
    ASSERT_TRUE(ring.TryPop(&slot));
    ASSERT_EQ(slot, i);
  }
  EXPECT_FALSE(ring.TryPop(&slot));
  EXPECT_EQ(ring.SizeHint(), 0u);
}

TEST(SlotRingTest, WrapsAroundManyTimes) {
  SlotRing ring;
  uint32_t next_in = 0, next_out = 0, slot;
  for (int round = 0; round < 5000; ++round) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(ring.TryPush(next_in++));
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(ring.TryPop(&slot));
      ASSERT_EQ(slot, next_out++);
    }
  }
}

// One producer thread and one consumer thread (TSan): everything arrives once, in order.
TEST(SlotRingTest, ProducerAndConsumerThreads) {
  SlotRing ring;
  constexpr uint32_t kItems = 200000;
  std::thread producer([&] {
    for (uint32_t i = 0; i < kItems;) {
      if (ring.TryPush(i)) {
        ++i;
      } else {
        std::this_thread::yield();
      }
    }
  });
  uint32_t expected = 0, slot;
  while (expected < kItems) {
    if (ring.TryPop(&slot)) {
      ASSERT_EQ(slot, expected);
      ++expected;
    } else {
      std::this_thread::yield();
    }
  }
  producer.join();
  EXPECT_FALSE(ring.TryPop(&slot));
}

}  // namespace
}  // namespace kwq::internal
