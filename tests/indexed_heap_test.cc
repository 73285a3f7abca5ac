#include "kwq/internal/indexed_heap.h"

#include <cstdint>
#include <map>
#include <new>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace kwq::internal {

struct IndexedHeapPeer {
  // Moves the sequence counter (it must stay above every present entry's number).
  static void SetNextSeq(IndexedHeap& heap, uint32_t seq) { heap.seq_ = seq; }
  static uint32_t NextSeq(const IndexedHeap& heap) { return heap.seq_; }
};

namespace {

// The promised order, with a 64-bit sequence: (key, insertion order), and an id's place.
class Model {
 public:
  void Push(uint32_t id, int64_t key) {
    entries_.insert({key, seq_, id});
    keys_[id] = {key, seq_++};
  }
  void Update(uint32_t id, int64_t key) {
    Remove(id);
    Push(id, key);
  }
  void Remove(uint32_t id) {
    auto [key, seq] = keys_.at(id);
    entries_.erase({key, seq, id});
    keys_.erase(id);
  }
  bool Contains(uint32_t id) const { return keys_.count(id) > 0; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  uint32_t TopId() const { return std::get<2>(*entries_.begin()); }
  int64_t TopKey() const { return std::get<0>(*entries_.begin()); }

 private:
  std::set<std::tuple<int64_t, uint64_t, uint32_t>> entries_;
  std::map<uint32_t, std::pair<int64_t, uint64_t>> keys_;
  uint64_t seq_ = 0;
};

// Random pushes, re-keys, removals and pops over few distinct keys (so ties are common),
// checked against the model after every step. `wrap_every` > 0: every that many steps the
// heap's sequence counter is moved to within a few numbers of its end, so the run
// renumbers the heap many times.
void RunAgainstModel(int steps, int wrap_every, uint32_t seed) {
  std::mt19937 rng(seed);
  IndexedHeap heap;
  Model model;
  constexpr uint32_t kIds = 64;
  for (int step = 0; step < steps; ++step) {
    if (wrap_every > 0 && step % wrap_every == 0) {
      IndexedHeapPeer::SetNextSeq(heap, UINT32_MAX - rng() % 4);
    }
    const uint32_t id = rng() % kIds;
    const int64_t key = rng() % 5;
    switch (rng() % 4) {
      case 0:
      case 1:
        if (model.Contains(id)) {
          heap.Update(id, key);
          model.Update(id, key);
        } else {
          heap.Push(id, key);
          model.Push(id, key);
        }
        break;
      case 2:
        if (model.Contains(id)) {
          heap.Remove(id);
          model.Remove(id);
        }
        break;
      case 3:
        if (!model.empty()) {
          const uint32_t top = model.TopId();
          ASSERT_EQ(heap.TopId(), top) << "step " << step;
          heap.Pop();
          model.Remove(top);
        }
        break;
    }
    ASSERT_EQ(heap.size(), model.size()) << "step " << step;
    ASSERT_EQ(heap.Contains(id), model.Contains(id)) << "step " << step;
    if (!model.empty()) {
      ASSERT_EQ(heap.TopId(), model.TopId()) << "step " << step;
      ASSERT_EQ(heap.TopKey(), model.TopKey()) << "step " << step;
    }
  }
  while (!model.empty()) {
    ASSERT_EQ(heap.TopId(), model.TopId());
    heap.Pop();
    model.Remove(model.TopId());
  }
  EXPECT_TRUE(heap.empty());
}

TEST(IndexedHeapTest, MatchesTheModel) { RunAgainstModel(200'000, 0, 1); }

TEST(IndexedHeapTest, MatchesTheModelAcrossManyRenumberings) { RunAgainstModel(200'000, 50, 2); }

TEST(IndexedHeapTest, TiesStayFifoWhenTheSequenceRunsOut) {
  IndexedHeap heap;
  heap.Push(0, 10);  // the oldest of the ties, pushed long before the counter runs out
  IndexedHeapPeer::SetNextSeq(heap, UINT32_MAX - 2);
  heap.Push(1, 10);
  heap.Push(2, 5);
  heap.Push(3, 10);  // the counter's last number: the next push renumbers
  heap.Push(4, 10);
  heap.Update(2, 10);                              // re-keyed: behind every entry already at 10
  EXPECT_LT(IndexedHeapPeer::NextSeq(heap), 10u);  // renumbered to 0..n-1
  for (uint32_t want : {0u, 1u, 3u, 4u, 2u}) {
    ASSERT_FALSE(heap.empty());
    EXPECT_EQ(heap.TopId(), want);
    EXPECT_EQ(heap.TopKey(), 10);
    heap.Pop();
  }
  EXPECT_TRUE(heap.empty());
}

// ForEachWithTopKey visits exactly the entries with the smallest key, wherever they sit
// in the heap; Before is the heap's own order.
TEST(IndexedHeapTest, ForEachWithTopKeyVisitsExactlyTheTopKeysEntries) {
  IndexedHeap heap;
  std::mt19937 rng(7);
  std::set<uint32_t> top;
  for (uint32_t id = 0; id < 500; ++id) {
    const int64_t key = static_cast<int64_t>(rng() % 5);  // about 100 entries per key
    heap.Push(id, key);
    if (key == 0) top.insert(id);
  }
  ASSERT_EQ(heap.TopKey(), 0);
  std::set<uint32_t> seen;
  heap.ForEachWithTopKey([&](uint32_t id) { EXPECT_TRUE(seen.insert(id).second) << id; });
  EXPECT_EQ(seen, top);
  const uint32_t first = heap.TopId();
  for (uint32_t id : top) EXPECT_EQ(heap.Before(id, first), false) << id;
  heap.Push(1000, -1);
  EXPECT_TRUE(heap.Before(1000, first));
}

// A realloc that always fails: a PodVector growth under it throws std::bad_alloc.
void* FailingRealloc(void*, size_t) { return nullptr; }

// Reserve(ids) makes room for every id below `ids`, ReserveOneMore(ids) for one more entry
// of an id below `ids`: the pushes after them allocate nothing (so cannot fail).
TEST(IndexedHeapTest, ReservedRoomTakesPushesWithoutAllocating) {
  IndexedHeap heap;
  heap.Reserve(40);
  auto* const saved = pod_vector_realloc;
  bool threw = false;
  pod_vector_realloc = &FailingRealloc;
  try {
    for (uint32_t i = 0; i < 40; ++i) heap.Push(39 - i, i % 3);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  pod_vector_realloc = saved;
  ASSERT_FALSE(threw) << "a push after Reserve allocated";
  ASSERT_EQ(heap.size(), 40u);
  for (uint32_t extra = 0; extra < 3; ++extra) {  // each one more, past the reserved ids
    heap.ReserveOneMore(45 + extra);
    pod_vector_realloc = &FailingRealloc;
    try {
      heap.Push(44 + extra, -1);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    pod_vector_realloc = saved;
    ASSERT_FALSE(threw) << "a push after ReserveOneMore allocated";
  }
  EXPECT_EQ(heap.size(), 43u);
  EXPECT_EQ(heap.TopId(), 44u);
  EXPECT_EQ(heap.TopKey(), -1);
}

}  // namespace
}  // namespace kwq::internal
