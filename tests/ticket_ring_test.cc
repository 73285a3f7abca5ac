#include "kwq/internal/ticket_ring.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

// Random pushes, pops, clears and filters across wrap-arounds and growth, against a deque
// of (slot, ticket): each push's ticket is the count of pushes before it, and a filter
// renumbers the kept entries from the front's ticket, reporting each one it moved.
TEST(TicketRingTest, MatchesADeque) {
  TicketRing ring;
  std::deque<std::pair<uint32_t, uint32_t>> model;  // (slot, ticket)
  uint32_t next_ticket = 0;
  std::mt19937 rng(7);
  for (int step = 0; step < 20'000; ++step) {
    const int op = static_cast<int>(rng() % 20);
    if (op < 10) {
      const uint32_t slot = static_cast<uint32_t>(rng());
      ASSERT_EQ(ring.push_back(slot), next_ticket);
      model.emplace_back(slot, next_ticket++);
    } else if (op < 18) {
      if (model.empty()) continue;
      ASSERT_EQ(ring.front(), model.front().first);
      ring.pop_front();
      model.pop_front();
    } else if (op < 19) {
      ring.clear();
      model.clear();
    } else {
      auto keep = [](uint32_t slot, uint32_t) { return slot % 3 != 0; };
      std::deque<std::pair<uint32_t, uint32_t>> kept;
      size_t moved = 0;
      const uint32_t first = model.empty() ? next_ticket : model.front().second;
      for (size_t i = 0; i < model.size(); ++i) {
        if (!keep(model[i].first, model[i].second)) continue;
        if (kept.size() != i) ++moved;
        kept.emplace_back(model[i].first, first + static_cast<uint32_t>(kept.size()));
      }
      std::vector<std::pair<uint32_t, uint32_t>> reported;
      ring.Filter(keep,
                  [&](uint32_t slot, uint32_t ticket) { reported.emplace_back(slot, ticket); });
      EXPECT_EQ(reported.size(), moved);  // each entry that moved, with its new ticket
      for (const auto& r : reported) {
        EXPECT_NE(std::find(kept.begin(), kept.end(), r), kept.end());
      }
      model.swap(kept);
      next_ticket = first + static_cast<uint32_t>(model.size());
    }
    ASSERT_EQ(ring.size(), model.size());
    if (!model.empty()) {
      ASSERT_EQ(ring.front(), model.front().first);
      ASSERT_EQ(ring.front_ticket(), model.front().second);
      ASSERT_EQ(ring.back(), model.back().first);
      const size_t i = rng() % model.size();
      ASSERT_EQ(ring.at(i), model[i].first) << "entry " << i;
    }
  }
}

// Room set aside is kept: Reserve(n) lets the ring reach n entries, whatever its head,
// and growth keeps the tickets.
TEST(TicketRingTest, ReservedRoomHoldsWithoutGrowing) {
  TicketRing ring;
  for (uint32_t i = 0; i < 5; ++i) ring.push_back(i);
  for (int i = 0; i < 3; ++i) ring.pop_front();  // the head is no longer at 0
  ring.Reserve(40);
  const size_t capacity = ring.capacity();
  for (uint32_t i = 5; i < 43; ++i) EXPECT_EQ(ring.push_back(i), i);
  EXPECT_EQ(ring.size(), 40u);
  EXPECT_EQ(ring.capacity(), capacity);  // no growth
  for (uint32_t i = 3; i < 43; ++i) {
    ASSERT_EQ(ring.front(), i);
    ASSERT_EQ(ring.front_ticket(), i);
    ring.pop_front();
  }
  ring.ReleaseIfEmpty();
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.push_back(1), 43u);  // usable after a release; tickets go on
  EXPECT_EQ(ring.front(), 1u);
}

}  // namespace
}  // namespace kwq::internal
