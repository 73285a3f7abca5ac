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

// A pop from a full ring makes room at once: the producer's cached view of the consumer's
// end says full, and it must look again rather than refuse. TryPeekCached shows the oldest
// slot without removing it, for every slot pushed before the consumer's last TryPop.
TEST(SlotRingTest, APopFromAFullRingMakesRoomAndPeekShowsTheOldest) {
  SlotRing ring;
  uint32_t slot = 0;
  EXPECT_FALSE(ring.TryPeekCached(&slot));
  for (uint32_t i = 0; i < SlotRing::kCapacity; ++i) ASSERT_TRUE(ring.TryPush(i));
  ASSERT_FALSE(ring.TryPush(9999));
  ASSERT_TRUE(ring.TryPop(&slot));
  EXPECT_EQ(slot, 0u);
  EXPECT_TRUE(ring.TryPush(SlotRing::kCapacity));  // the freed cell
  EXPECT_FALSE(ring.TryPush(9999));                // full again
  EXPECT_EQ(ring.SizeHint(), SlotRing::kCapacity);
  for (uint32_t i = 1; i <= SlotRing::kCapacity; ++i) {
    if (i < SlotRing::kCapacity) {  // pushed before the last TryPop: seen
      ASSERT_TRUE(ring.TryPeekCached(&slot)) << i;
      ASSERT_EQ(slot, i);
      ASSERT_TRUE(ring.TryPeekCached(&slot)) << i;  // a peek removes nothing
      ASSERT_EQ(slot, i);
    } else if (ring.TryPeekCached(&slot)) {  // pushed since: may go unseen
      ASSERT_EQ(slot, i);
    }
    ASSERT_TRUE(ring.TryPop(&slot));
    ASSERT_EQ(slot, i);
  }
  EXPECT_FALSE(ring.TryPop(&slot));
  EXPECT_FALSE(ring.TryPeekCached(&slot));
  // Room again for a whole ring's worth, across the wrap-around.
  for (uint32_t i = 0; i < SlotRing::kCapacity; ++i) ASSERT_TRUE(ring.TryPush(i + 7));
  EXPECT_FALSE(ring.TryPush(9999));
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
