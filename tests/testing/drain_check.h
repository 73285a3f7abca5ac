// Test helper: ExpectDrainWaitsForQueuedItem(q, draining) checks the promise that
// ShutDownWithDrain waits for queued items too (client-go's waits only for in-flight
// ones). `q` holds exactly one queued item, "a", and no active lease; `draining(q)` is the
// number of drainers waiting, read under the queue's lock (a test peer): a drainer counts
// itself in the hold of the lock in which it checks and goes to wait, so a non-zero count
// means it waits. For Queue and PriorityQueue. ExpectShutDownAbortsEveryDrain, below, the
// same for several drainers and a ShutDown.

#ifndef KWQ_TESTS_TESTING_DRAIN_CHECK_H_
#define KWQ_TESTS_TESTING_DRAIN_CHECK_H_

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/eventually.h"

namespace kwq::testing {

template <typename Q, typename Draining>
void ExpectDrainWaitsForQueuedItem(Q& q, Draining draining) {
  std::atomic<bool> returned{false};
  bool drained = false;
  std::thread drainer([&] {
    drained = q.ShutDownWithDrain();
    returned = true;
  });
  while (draining(q) == 0 && !returned.load()) std::this_thread::yield();
  EXPECT_FALSE(returned.load()) << "the drain returned while an item was queued";
  auto lease = q.Get();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(**lease, "a");
  EXPECT_FALSE(returned.load());
  lease->Done();
  drainer.join();
  EXPECT_TRUE(drained);
  EXPECT_FALSE(q.Get().has_value());
}

// ExpectShutDownAbortsEveryDrain(q, draining): `q` holds one item, "a", and no lease.
// With that item in flight, three drainers wait; a ShutDown must end all three (false:
// aborted, not drained), not only one.
template <typename Q, typename Draining>
void ExpectShutDownAbortsEveryDrain(Q& q, Draining draining) {
  auto lease = q.TryGet();
  ASSERT_TRUE(lease.has_value());
  std::vector<std::thread> drainers;
  std::atomic<int> drained{0}, returned{0};
  for (int i = 0; i < 3; ++i) {
    drainers.emplace_back([&] {
      drained += q.ShutDownWithDrain();
      ++returned;
    });
  }
  while (draining(q) < 3) std::this_thread::yield();
  q.ShutDown();
  EXPECT_TRUE(Eventually([&] { return returned.load() == 3; })) << "a drain went on after ShutDown";
  lease->Done();  // releases a drainer should the check above have failed
  for (auto& t : drainers) t.join();
  EXPECT_EQ(drained.load(), 0);  // all aborted
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_DRAIN_CHECK_H_
