// ReadyLevels (the PriorityQueue's ready items) against a plain model, on random links,
// raises (an item unlinked and linked again with its old sequence: into the group's heap),
// unlinks out of turn (aging) and hand-outs, in phases that pile up dead FIFO entries and
// so force compactions; with the FIFOs' tickets starting at 0 and just before they wrap at
// 2^32 and at 2^31 (the bits a ready position keeps).

#include "kwq/internal/ready_levels.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/internal/ticket_ring.h"

namespace kwq::internal {
namespace {

// Ready slots with (priority, group key, sequence); per priority, the ring of groups in
// serving order.
class Model {
 public:
  explicit Model(int slots) : items_(slots) {}

  bool ready(uint32_t s) const { return items_[s].ready; }
  int priority(uint32_t s) const { return items_[s].priority; }
  uint64_t key(uint32_t s) const { return items_[s].key; }
  int64_t seq(uint32_t s) const { return items_[s].seq; }
  size_t size() const {
    return static_cast<size_t>(
        std::count_if(items_.begin(), items_.end(), [](const Item& i) { return i.ready; }));
  }

  void Link(uint32_t s, int priority, uint64_t key, int64_t seq) {
    items_[s] = {true, priority, key, seq};
    if (Count(priority, key) == 1) rings_[priority].push_back(key);
  }
  void Unlink(uint32_t s) {
    Item& i = items_[s];
    i.ready = false;
    if (Count(i.priority, i.key) == 0) Erase(rings_[i.priority], i.key);
  }
  // The slot served next (-1 when none is ready).
  int Next() const {
    int priority = 0;
    bool any = false;
    for (const Item& i : items_) {
      if (i.ready && (!any || i.priority > priority)) priority = i.priority, any = true;
    }
    if (!any) return -1;
    const uint64_t key = rings_.at(priority).front();
    int best = -1;
    for (size_t s = 0; s < items_.size(); ++s) {
      const Item& i = items_[s];
      if (i.ready && i.priority == priority && i.key == key &&
          (best < 0 || i.seq < items_[best].seq)) {
        best = static_cast<int>(s);
      }
    }
    return best;
  }
  // Takes Next() out and moves its group's turn on.
  int PopNext() {
    const int s = Next();
    const int priority = items_[s].priority;
    const uint64_t key = items_[s].key;
    Unlink(s);
    if (Count(priority, key) > 0) {
      Erase(rings_[priority], key);
      rings_[priority].push_back(key);
    }
    return s;
  }

 private:
  struct Item {
    bool ready = false;
    int priority = 0;
    uint64_t key = 0;
    int64_t seq = 0;
  };
  size_t Count(int priority, uint64_t key) const {
    return static_cast<size_t>(std::count_if(items_.begin(), items_.end(), [&](const Item& i) {
      return i.ready && i.priority == priority && i.key == key;
    }));
  }
  static void Erase(std::vector<uint64_t>& ring, uint64_t key) {
    ring.erase(std::find(ring.begin(), ring.end(), key));
  }
  std::vector<Item> items_;
  std::map<int, std::vector<uint64_t>> rings_;
};

void AgreesWithTheModel(uint32_t seed, int slots, int priorities, int keys, int steps) {
  ReadyLevels levels;
  Model model(slots);
  levels.ReserveSlots(slots);
  std::mt19937 rng(seed);
  int64_t next_seq = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(step);
    const int phase = (step / 3000) % 3;  // fill; unlinks out of turn; mixed
    const int link_weight = phase == 0 ? 70 : phase == 1 ? 15 : 40;
    const int unlink_weight = phase == 1 ? 70 : 25;
    const int op = static_cast<int>(rng() % 100);
    if (op < link_weight) {
      const uint32_t s = rng() % slots;
      if (model.ready(s)) {  // a raise: to any (priority, group), with its old sequence
        const int p = static_cast<int>(rng() % priorities);
        const uint64_t k = rng() % 4 == 0 ? model.key(s) : rng() % keys;
        const uint32_t g = levels.Pin(p, k, /*late=*/true);
        const int64_t seq = levels.Unlink(s);
        ASSERT_EQ(seq, model.seq(s));
        model.Unlink(s);
        levels.Link(s, g, seq);
        model.Link(s, p, k, seq);
      } else {
        const int p = static_cast<int>(rng() % priorities);
        const uint64_t k = rng() % keys;
        const uint32_t g = levels.Pin(p, k);
        if (rng() % 20 == 0) {
          levels.Unpin(g);
          continue;
        }
        levels.Link(s, g, next_seq);
        model.Link(s, p, k, next_seq++);
      }
    } else if (op < link_weight + unlink_weight) {  // out of turn, as an aged item
      std::vector<uint32_t> ready;
      for (int s = 0; s < slots; ++s) {
        if (model.ready(s)) ready.push_back(s);
      }
      if (ready.empty()) continue;
      const uint32_t s = ready[rng() % ready.size()];
      ASSERT_EQ(levels.Unlink(s), model.seq(s));
      model.Unlink(s);
    } else {
      if (model.Next() < 0) {
        ASSERT_TRUE(levels.empty());
        continue;
      }
      ASSERT_EQ(static_cast<int>(levels.PopNext()), model.PopNext());
    }
    ASSERT_EQ(levels.size(), model.size());
    if (model.size() != 0) {
      ASSERT_EQ(static_cast<int>(levels.Next()), model.Next());
    }
  }
}

// Upcoming(k) names the slot k places behind the front of the group served next: with
// in-order links in one group per priority, the k-th hand-out from now, and kNoSlot past
// the group's end or when nothing is ready.
TEST(ReadyLevelsUpcomingTest, NamesTheSlotServedKHandOutsFromNow) {
  ReadyLevels levels;
  levels.ReserveSlots(16);
  EXPECT_EQ(levels.Upcoming(0), ReadyLevels::kNoSlot);
  for (uint32_t s = 0; s < 10; ++s) levels.Link(s, levels.Pin(/*priority=*/1, 0), s);
  for (uint32_t s = 10; s < 13; ++s) levels.Link(s, levels.Pin(/*priority=*/5, 0), s);
  EXPECT_EQ(levels.Upcoming(0), 10u);  // the higher priority's group is served first
  EXPECT_EQ(levels.Upcoming(2), 12u);
  EXPECT_EQ(levels.Upcoming(3), ReadyLevels::kNoSlot);  // past its group, not into the next
  for (uint32_t s = 10; s < 13; ++s) EXPECT_EQ(levels.PopNext(), s);
  for (uint32_t served = 0; served < 10; ++served) {
    EXPECT_EQ(levels.Upcoming(0), served);
    EXPECT_EQ(levels.Upcoming(4), served + 4 < 10 ? served + 4 : ReadyLevels::kNoSlot);
    EXPECT_EQ(levels.PopNext(), served);
  }
  EXPECT_EQ(levels.Upcoming(0), ReadyLevels::kNoSlot);
}

class ReadyLevelsTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override { ticket_ring_first_ticket = GetParam(); }
  void TearDown() override { ticket_ring_first_ticket = 0; }
};

TEST_P(ReadyLevelsTest, OneGroupAgreesWithTheModel) {
  for (uint32_t seed = 0; seed < 2; ++seed) AgreesWithTheModel(seed, 300, 1, 1, 20'000);
}
TEST_P(ReadyLevelsTest, PrioritiesAndGroupsAgreeWithTheModel) {
  for (uint32_t seed = 0; seed < 2; ++seed) AgreesWithTheModel(seed, 300, 3, 4, 20'000);
}
TEST_P(ReadyLevelsTest, ManyGroupsAgreeWithTheModel) {  // sweeps and reused groups
  AgreesWithTheModel(7, 300, 4, 100, 20'000);
}

INSTANTIATE_TEST_SUITE_P(FirstTickets, ReadyLevelsTest,
                         ::testing::Values(0u, 0xFFFF'F000u, 0x7FFF'F000u));

}  // namespace
}  // namespace kwq::internal
