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

// ReleaseIfEmpty frees only an empty ring's buffer, and only a large one; a ring that
// still holds entries keeps them (and their tickets) whatever its buffer's size.
TEST(TicketRingTest, ReleaseIfEmptyKeepsAHoldingRingAndASmallBuffer) {
  TicketRing ring;
  for (uint32_t i = 0; i < 2 * TicketRing::kKeepEntries; ++i) ring.push_back(i);
  ring.pop_front();
  const size_t capacity = ring.capacity();
  ASSERT_GT(capacity, TicketRing::kKeepEntries);
  ring.ReleaseIfEmpty();  // not empty: nothing happens
  EXPECT_EQ(ring.capacity(), capacity);
  ASSERT_EQ(ring.size(), 2 * TicketRing::kKeepEntries - 1);
  for (uint32_t i = 1; i < 2 * TicketRing::kKeepEntries; ++i) {
    ASSERT_EQ(ring.front(), i);
    ASSERT_EQ(ring.front_ticket(), i);
    ring.pop_front();
  }
  ring.ReleaseIfEmpty();  // empty and large: freed
  EXPECT_EQ(ring.capacity(), 0u);
  EXPECT_EQ(ring.push_back(5), 2 * TicketRing::kKeepEntries);
  const size_t small = ring.capacity();
  ring.pop_front();
  ring.ReleaseIfEmpty();  // empty but small: kept for reuse
  EXPECT_EQ(ring.capacity(), small);
}

// A moved ring takes its entries and its tickets along; the moved-from ring is empty.
TEST(TicketRingTest, AMoveKeepsEntriesAndTickets) {
  TicketRing a;
  for (uint32_t i = 0; i < 10; ++i) a.push_back(100 + i);
  for (int i = 0; i < 4; ++i) a.pop_front();  // front ticket 4
  TicketRing b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b.front(), 104u);
  EXPECT_EQ(b.front_ticket(), 4u);
  EXPECT_EQ(b.push_back(7), 10u);
  TicketRing c;
  c.push_back(1);
  c = std::move(b);
  ASSERT_EQ(c.size(), 7u);
  EXPECT_EQ(c.front(), 104u);
  EXPECT_EQ(c.front_ticket(), 4u);
  EXPECT_EQ(c.back(), 7u);
  EXPECT_EQ(c.push_back(8), 11u);
}

// Filter asks `keep` with each entry's own ticket (the one push_back returned), not the
// ticket it would get if kept.
TEST(TicketRingTest, FilterAsksWithEachEntrysTicket) {
  TicketRing ring;
  for (uint32_t i = 0; i < 3; ++i) ring.push_back(90 + i);
  ring.pop_front();                                   // front ticket 1
  std::vector<std::pair<uint32_t, uint32_t>> pushed;  // (slot, ticket)
  for (uint32_t slot = 0; slot < 8; ++slot) pushed.emplace_back(slot, ring.push_back(slot));
  std::vector<std::pair<uint32_t, uint32_t>> asked;
  std::vector<std::pair<uint32_t, uint32_t>> renumbered;
  ring.Filter(
      [&](uint32_t slot, uint32_t ticket) {
        asked.emplace_back(slot, ticket);
        return slot != 91 && slot % 2 == 0;  // drops 91 and the odd slots
      },
      [&](uint32_t slot, uint32_t ticket) { renumbered.emplace_back(slot, ticket); });
  std::vector<std::pair<uint32_t, uint32_t>> want = {{91, 1}, {92, 2}};
  want.insert(want.end(), pushed.begin(), pushed.end());
  EXPECT_EQ(asked, want);
  // Kept: 92 (ticket 1, moved), 0 (2), 2 (3), 4 (4), 6 (5).
  EXPECT_EQ(renumbered,
            (std::vector<std::pair<uint32_t, uint32_t>>{{92, 1}, {0, 2}, {2, 3}, {4, 4}, {6, 5}}));
  EXPECT_EQ(ring.front_ticket(), 1u);
  EXPECT_EQ(ring.push_back(50), 6u);
}

}  // namespace
}  // namespace kwq::internal
