#include "internal/timer_heap.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kwq::internal {

struct TimerHeapPeer {
  static void SetGeneration(TimerHeap& heap, uint32_t slot, uint32_t generation) {
    heap.slots_[slot].generation = generation;
  }
};

namespace {

absl::Time T(int64_t ms) { return absl::UnixEpoch() + absl::Milliseconds(ms); }

TEST(TimerHeapTest, PopsInDeadlineOrderFifoAmongEqual) {
  TimerHeap heap;
  std::vector<int> order;
  heap.Insert(T(30), [&] { order.push_back(3); });
  heap.Insert(T(10), [&] { order.push_back(1); });
  heap.Insert(T(20), [&] { order.push_back(2); });
  heap.Insert(T(10), [&] { order.push_back(11); });
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_FALSE(heap.PopDue(T(5), &id, &fn));
  while (heap.PopDue(T(100), &id, &fn)) fn();
  EXPECT_EQ(order, (std::vector<int>{1, 11, 2, 3}));
}

TEST(TimerHeapTest, StaleIdsAreRejected) {
  TimerHeap heap;
  const uint64_t a = heap.Insert(T(1), [] {});
  EXPECT_NE(a, 0u);
  EXPECT_TRUE(heap.Remove(a));
  EXPECT_FALSE(heap.Remove(a));
  const uint64_t b = heap.Insert(T(1), [] {});  // reuses the slot with a new generation
  EXPECT_NE(a, b);
  EXPECT_FALSE(heap.Update(a, T(2)));
  EXPECT_FALSE(heap.Contains(a));
  EXPECT_TRUE(heap.Contains(b));
  EXPECT_FALSE(heap.Remove(0));
  EXPECT_FALSE(heap.Remove(~0ull));
}

TEST(TimerHeapTest, IdsAreNeverReusedWhenASlotsGenerationRunsOut) {
  TimerHeap heap;
  const uint64_t first = heap.Insert(T(0), [] {});
  ASSERT_TRUE(heap.Remove(first));
  // As if slot 0 (the one a schedule-then-fire loop keeps reusing, the free list being
  // LIFO) had named 2^32 - 3 timers.
  TimerHeapPeer::SetGeneration(heap, 0, UINT32_MAX - 2);
  std::set<uint64_t> issued = {first};
  uint64_t id;
  TimerHeap::Callback fn;
  for (int i = 0; i < 8; ++i) {
    const uint64_t next = heap.Insert(T(0), [] {});
    EXPECT_NE(next, 0u);
    EXPECT_TRUE(issued.insert(next).second) << "id " << next << " issued twice, at " << i;
    if (i % 2 == 0) {
      ASSERT_TRUE(heap.Remove(next));
    } else {
      ASSERT_TRUE(heap.PopDue(T(0), &id, &fn));
      EXPECT_EQ(id, next);
    }
  }
  EXPECT_FALSE(heap.Remove(first));
  EXPECT_FALSE(heap.Contains(first));
}

TEST(TimerHeapTest, InfiniteDeadlineNeverPops) {
  TimerHeap heap;
  heap.Insert(absl::InfiniteFuture(), [] {});
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_FALSE(heap.PopDue(absl::InfiniteFuture(), &id, &fn));
  EXPECT_EQ(heap.NextDeadline(T(0)), absl::InfiniteFuture());
  heap.Insert(absl::InfinitePast(), [] {});
  EXPECT_TRUE(heap.PopDue(T(0), &id, &fn));
}

TEST(TimerHeapTest, DeadlineBetweenNanosecondsIsNotDueBeforeIt) {
  TimerHeap heap;
  const absl::Time deadline = T(1) + absl::Nanoseconds(0.5);
  heap.Insert(deadline, [] {});
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_FALSE(heap.PopDue(T(1), &id, &fn));     // half a nanosecond early
  EXPECT_GE(heap.NextDeadline(T(1)), deadline);  // the service must not wake before it
  EXPECT_TRUE(heap.PopDue(T(1) + absl::Nanoseconds(1), &id, &fn));
}

TEST(TimerHeapTest, DeadlinePastTheNanosecondRangeIsNotDueBeforeIt) {
  TimerHeap heap;  // keys count from the Unix epoch: year 2286 is out of range
  const absl::Time far = absl::FromUnixSeconds(10'000'000'000);
  heap.Insert(far + absl::Hours(1), [] {});
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_FALSE(heap.PopDue(far, &id, &fn));
  EXPECT_EQ(heap.NextDeadline(far), far + absl::Hours(1));
  EXPECT_TRUE(heap.PopDue(far + absl::Hours(1), &id, &fn));
  heap.Insert(absl::FromUnixSeconds(-10'000'000'000), [] {});  // before 1678
  EXPECT_FALSE(heap.PopDue(absl::FromUnixSeconds(-10'000'000'001), &id, &fn));
  EXPECT_TRUE(heap.PopDue(absl::FromUnixSeconds(-10'000'000'000), &id, &fn));
}

// While the time compared is within the key range, a timer past it is reported as due no
// earlier than the range's end, without a look at the saturated timers (which cost the
// service thread a pass over all of them each time it went back to sleep); from the
// range's end on, the exact deadline, so a caller woken there does not spin.
TEST(TimerHeapTest, TimersPastTheRangeReportTheRangesEndUntilTheTimeIsPastItToo) {
  TimerHeap heap;  // keys count from the Unix epoch: the range ends in 2043
  const absl::Time far = absl::FromUnixSeconds(10'000'000'000);  // 2286
  for (int i = 0; i < 3; ++i) heap.Insert(far + absl::Hours(3 - i), [] {});
  const absl::Time end = heap.NextDeadline(T(0));
  EXPECT_GT(end, absl::FromUnixSeconds(2'000'000'000));  // 2033: some 73 years out
  EXPECT_LT(end, absl::FromUnixSeconds(2'500'000'000));  // 2049: the range's end, not 2286
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_FALSE(heap.PopDue(end, &id, &fn));
  EXPECT_EQ(heap.NextDeadline(end), far + absl::Hours(1));
  EXPECT_EQ(heap.NextDeadline(end - absl::Nanoseconds(1)), end);  // the last instant in range
  heap.Insert(T(5), [] {});  // a timer in range goes first as ever
  EXPECT_EQ(heap.NextDeadline(T(0)), T(5));
}

// Equal deadlines past the key range keep FIFO order like any others (the scan of the
// saturated timers breaks ties by scheduling order).
TEST(TimerHeapTest, EqualDeadlinesPastTheKeyRangePopFifo) {
  TimerHeap heap;
  const absl::Time far = absl::UnixEpoch() + absl::Hours(24 * 365 * 300);
  std::vector<int> order;
  for (int i = 0; i < 6; ++i) heap.Insert(far, [&order, i] { order.push_back(i); });
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_FALSE(heap.PopDue(far - absl::Nanoseconds(1), &id, &fn));
  while (heap.PopDue(far, &id, &fn)) fn();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

// Deadlines more than 73 years before the origin share the key of absl::InfinitePast():
// among them the exact deadline decides, whatever the scheduling order, and the timers at
// absl::InfinitePast() itself go first, FIFO.
TEST(TimerHeapTest, DeadlinesBeforeTheKeyRangePopInDeadlineOrder) {
  const absl::Time origin = absl::FromUnixSeconds(10'000'000'000);  // 2286
  TimerHeap heap(origin);
  std::vector<std::string> order;
  auto record = [&order](std::string name) { return [&order, name] { order.push_back(name); }; };
  for (int h = 3; h >= 1; --h) {
    heap.Insert(absl::UnixEpoch() + absl::Hours(h), record(absl::StrCat("epoch+", h, "h")));
  }
  heap.Insert(absl::InfinitePast(), record("past0"));
  heap.Insert(absl::InfinitePast(), record("past1"));
  heap.Insert(origin, record("origin"));
  uint64_t id;
  TimerHeap::Callback fn;
  while (heap.PopDue(origin, &id, &fn)) fn();
  EXPECT_EQ(order, (std::vector<std::string>{"past0", "past1", "epoch+1h", "epoch+2h", "epoch+3h",
                                             "origin"}));
}

// A pre-range timer moved into the range, and one moved out of it, are ordered by their
// new deadlines; so are those freed and scheduled again.
TEST(TimerHeapTest, TimersMovedAcrossTheRangesStartKeepDeadlineOrder) {
  const absl::Time origin = absl::FromUnixSeconds(10'000'000'000);
  TimerHeap heap(origin);
  std::vector<std::string> order;
  auto record = [&order](std::string name) { return [&order, name] { order.push_back(name); }; };
  const uint64_t moved_in = heap.Insert(absl::UnixEpoch(), record("moved in"));
  ASSERT_TRUE(heap.Update(moved_in, origin + absl::Seconds(1)));
  ASSERT_TRUE(heap.Remove(heap.Insert(absl::UnixEpoch() - absl::Hours(1), [] {})));
  heap.Insert(absl::UnixEpoch() + absl::Hours(2), record("epoch+2h"));
  const uint64_t moved_out = heap.Insert(origin, record("moved out"));
  ASSERT_TRUE(heap.Update(moved_out, absl::UnixEpoch() + absl::Hours(1)));
  uint64_t id;
  TimerHeap::Callback fn;
  while (heap.PopDue(origin + absl::Seconds(1), &id, &fn)) fn();
  EXPECT_EQ(order, (std::vector<std::string>{"moved out", "epoch+2h", "moved in"}));
}

TEST(TimerHeapTest, KeysCountFromTheOriginSoFarTimesKeepDeadlineOrder) {
  const absl::Time far = absl::FromUnixSeconds(10'000'000'000);
  TimerHeap heap(far);
  std::vector<int> order;
  heap.Insert(far + absl::Hours(2), [&] { order.push_back(2); });
  heap.Insert(far + absl::Hours(1), [&] { order.push_back(1); });
  uint64_t id;
  TimerHeap::Callback fn;
  EXPECT_EQ(heap.NextDeadline(far), far + absl::Hours(1));
  while (heap.PopDue(far + absl::Hours(1), &id, &fn)) fn();
  EXPECT_EQ(order, (std::vector<int>{1}));
  while (heap.PopDue(far + absl::Hours(2), &id, &fn)) fn();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// Runs `steps` random operations on `heap` (half inserts, a quarter each removes and
// updates of a random pending timer), mirrored in `model` (id -> V): `next()` gives the
// deadline and model value of an insert or update. `check()` runs after each step.
template <typename V, typename Next, typename Check>
void RandomOperations(TimerHeap& heap, std::map<uint64_t, V>& model, std::mt19937& rng, int steps,
                      Next next, Check check) {
  for (int step = 0; step < steps; ++step) {
    const int op = rng() % 4;
    if (op <= 1 || model.empty()) {
      auto [deadline, value] = next();
      model[heap.Insert(deadline, [] {})] = value;
    } else if (op == 2) {
      auto it = std::next(model.begin(), rng() % model.size());
      ASSERT_TRUE(heap.Remove(it->first));
      model.erase(it);
    } else {
      auto it = std::next(model.begin(), rng() % model.size());
      auto [deadline, value] = next();
      ASSERT_TRUE(heap.Update(it->first, deadline));
      it->second = value;
    }
    check();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(TimerHeapTest, MatchesModelUnderRandomOperations) {
  std::mt19937 rng(42);
  TimerHeap heap;
  std::map<uint64_t, int64_t> model;  // id -> deadline ms
  auto next = [&rng] {
    const int64_t ms = rng() % 1000;
    return std::pair(T(ms), ms);
  };
  ASSERT_NO_FATAL_FAILURE(RandomOperations(heap, model, rng, 20000, next, [&] {
    ASSERT_EQ(heap.size(), model.size());
    int64_t min_ms = INT64_MAX;
    for (auto& [id, ms] : model) min_ms = std::min(min_ms, ms);
    if (!model.empty()) {
      ASSERT_EQ(heap.NextDeadline(T(0)), T(min_ms));
    }
  }));
  uint64_t id;
  TimerHeap::Callback fn;
  int64_t last = -1;
  while (heap.PopDue(T(1000), &id, &fn)) {
    ASSERT_EQ(model.count(id), 1u);
    ASSERT_GE(model[id], last);
    last = model[id];
    model.erase(id);
  }
  EXPECT_TRUE(model.empty());
}

// The same against a model over every kind of deadline: absl::InfinitePast(), before the
// key range, within it, past it and absl::InfiniteFuture(), with few distinct values so
// that many timers share each. Pops must come in (deadline, scheduling order) order, and
// only once due, while the time compared moves from inside the range to past its end.
TEST(TimerHeapTest, MatchesModelAcrossTheKeyRangeUnderRandomOperations) {
  const absl::Duration century = absl::Hours(24 * 365 * 100);
  const std::vector<absl::Time> deadlines = {absl::InfinitePast(),
                                             absl::UnixEpoch() - 3 * century,
                                             absl::UnixEpoch() - century,
                                             T(0),
                                             T(5),
                                             absl::UnixEpoch() + century,
                                             absl::UnixEpoch() + 3 * century,
                                             absl::InfiniteFuture()};
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    TimerHeap heap;
    struct Entry {
      absl::Time deadline;
      uint64_t seq;
    };
    std::map<uint64_t, Entry> model;  // id -> deadline, scheduling order
    uint64_t seq = 0;
    auto next = [&] {
      const absl::Time d = deadlines[rng() % deadlines.size()];
      return std::pair(d, Entry{d, seq++});
    };
    ASSERT_NO_FATAL_FAILURE(RandomOperations(heap, model, rng, 300, next, [] {}));
    for (const absl::Time now : {T(0), T(5), absl::UnixEpoch() + century,
                                 absl::UnixEpoch() + 3 * century, absl::InfiniteFuture()}) {
      for (;;) {
        auto first = model.end();
        for (auto it = model.begin(); it != model.end(); ++it) {
          if (it->second.deadline == absl::InfiniteFuture() || it->second.deadline > now) {
            continue;
          }
          if (first == model.end() || it->second.deadline < first->second.deadline ||
              (it->second.deadline == first->second.deadline &&
               it->second.seq < first->second.seq)) {
            first = it;
          }
        }
        uint64_t id;
        TimerHeap::Callback fn;
        const bool popped = heap.PopDue(now, &id, &fn);
        ASSERT_EQ(popped, first != model.end()) << "round " << round;
        if (!popped) break;
        ASSERT_EQ(id, first->first) << "round " << round;
        model.erase(first);
      }
    }
    EXPECT_EQ(heap.size(), model.size());  // only those at absl::InfiniteFuture() are left
  }
}

}  // namespace
}  // namespace kwq::internal
