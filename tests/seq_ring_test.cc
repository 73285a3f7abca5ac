#include "kwq/internal/seq_ring.h"

#include <deque>
#include <random>

#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

using Entry = SeqRing::Entry;

// Random pushes, pops and filters across wrap-arounds and growth, against a deque.
TEST(SeqRingTest, MatchesADeque) {
  SeqRing ring;
  std::deque<Entry> model;
  std::mt19937 rng(7);
  int64_t seq = 0;
  for (int step = 0; step < 20'000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      const Entry e{seq++, static_cast<uint32_t>(rng())};
      ring.push_back(e);
      model.push_back(e);
    } else if (op < 9) {
      if (model.empty()) continue;
      ASSERT_EQ(ring.front().seq, model.front().seq);
      ring.pop_front();
      model.pop_front();
    } else {
      auto keep = [](const Entry& e) { return e.slot % 3 != 0; };
      ring.Filter(keep);
      std::deque<Entry> kept;
      for (const Entry& e : model) {
        if (keep(e)) kept.push_back(e);
      }
      model.swap(kept);
    }
    ASSERT_EQ(ring.size(), model.size());
    if (!model.empty()) {
      ASSERT_EQ(ring.front().seq, model.front().seq);
      ASSERT_EQ(ring.back().seq, model.back().seq);
    }
  }
}

// Room set aside is kept: Reserve(n) lets the ring reach n entries, whatever its head.
TEST(SeqRingTest, ReservedRoomHoldsWithoutGrowing) {
  SeqRing ring;
  for (int i = 0; i < 5; ++i) ring.push_back({i, 0});
  for (int i = 0; i < 3; ++i) ring.pop_front();  // the head is no longer at 0
  ring.Reserve(40);
  const Entry* first = &ring.front();
  for (int i = 5; i < 43; ++i) ring.push_back({i, 0});
  EXPECT_EQ(ring.size(), 40u);
  EXPECT_EQ(&ring.front(), first);  // not moved: no growth
  for (int64_t i = 3; i < 43; ++i) {
    ASSERT_EQ(ring.front().seq, i);
    ring.pop_front();
  }
  ring.ReleaseIfEmpty();
  EXPECT_TRUE(ring.empty());
  ring.push_back({1, 1});  // usable after a release
  EXPECT_EQ(ring.front().seq, 1);
}

}  // namespace
}  // namespace kwq::internal
