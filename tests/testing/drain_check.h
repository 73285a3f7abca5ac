// Test helper: ExpectDrainWaitsForQueuedItem(q, draining) checks the promise that
// ShutDownWithDrain waits for queued items too (client-go's waits only for in-flight
// ones). `q` holds exactly one queued item, "a", and no active lease; `draining(q)` is the
// number of drainers waiting, read under the queue's lock (a test peer): a drainer counts
// itself in the hold of the lock in which it checks and goes to wait, so a non-zero count
// means it waits. For Queue and PriorityQueue.

#ifndef KWQ_TESTS_TESTING_DRAIN_CHECK_H_
#define KWQ_TESTS_TESTING_DRAIN_CHECK_H_

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

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

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_DRAIN_CHECK_H_
