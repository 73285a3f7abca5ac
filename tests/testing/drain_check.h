// Test helper: ExpectDrainWaitsForQueuedItem(q, draining) checks the promise that
// ShutDownWithDrain waits for queued items too (client-go's waits only for in-flight
// ones). `q` holds exactly one queued item, "a", and no active lease; `draining(q)` is the
// number of drains under way, read under the queue's lock (a test peer): a drainer counts
// itself in a hold of the lock before it waits, and a ShutDown from then on ends its wait
// (Queue counts in the hold in which it checks and goes to wait, PriorityQueue in the one
// that shuts the queue down). For Queue and PriorityQueue. ExpectShutDownAbortsEveryDrain, below,
// the same for several drainers and a ShutDown; DrainWhileTaking checks that drainers wait for a
// lease and for every queued item; ExpectDrainRunsTheDueItem that a drain queues and waits for
// a delayed item already due (DelayingQueue and PriorityQueue); ExpectContextEndsADrain
// that ShutDownWithDrain(ctx) ends, undrained, when ctx is done (every queue but
// ShardedQueue, which has its own test).

#ifndef KWQ_TESTS_TESTING_DRAIN_CHECK_H_
#define KWQ_TESTS_TESTING_DRAIN_CHECK_H_

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kwq/context.h"
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
  EXPECT_TRUE(Eventually([&] { return draining(q) > 0 || returned.load(); }));
  // Negative checks: they can only miss a failure.
  EXPECT_FALSE(Eventually([&] { return returned.load(); }, absl::Milliseconds(20)))
      << "the drain returned while an item was queued";
  auto lease = q.Get();
  EXPECT_TRUE(lease.has_value());
  if (lease.has_value()) {
    EXPECT_EQ(**lease, "a");
    EXPECT_FALSE(Eventually([&] { return returned.load(); }, absl::Milliseconds(20)))
        << "the drain returned when the item was taken, before its Done";
    lease->Done();
  }
  const bool finished = Eventually([&] { return returned.load(); });
  EXPECT_TRUE(finished) << "the drain did not return after the last Done";
  if (!finished) q.ShutDown();  // releases it, so the test fails instead of hanging
  drainer.join();
  EXPECT_TRUE(drained);
  EXPECT_FALSE(q.Get().has_value());
}

// ExpectGetWaitsForAnOwedRun(q, draining): `q` is empty. With "x" in flight and added
// again (owed a run at its Done), a drain starts; a Get on another thread (a dispatcher)
// must wait for the owed run instead of returning nullopt, get it once the lease ends on
// this thread, and the drain must then return drained. For Queue and PriorityQueue.
template <typename Q, typename Draining>
void ExpectGetWaitsForAnOwedRun(Q& q, Draining draining) {
  q.Add("x");
  auto in_flight = q.TryGet();
  ASSERT_TRUE(in_flight.has_value());
  q.Add("x");  // owed a run after this lease
  std::atomic<int> drained{-1};
  std::thread drainer([&] { drained = q.ShutDownWithDrain(); });
  EXPECT_TRUE(Eventually([&] { return draining(q) > 0; }));
  std::atomic<int> got{-1};
  std::thread dispatcher([&] { got = q.Get().has_value() ? 1 : 0; });
  // A negative check: it can only miss a failure.
  EXPECT_FALSE(Eventually([&] { return got.load() != -1; }, absl::Milliseconds(20)))
      << "the Get gave up while a run was owed";
  in_flight->Done();  // on this thread, not the dispatcher's
  EXPECT_TRUE(Eventually([&] { return got.load() != -1; }));
  dispatcher.join();
  EXPECT_EQ(got.load(), 1);
  const bool finished = Eventually([&] { return drained.load() != -1; });
  EXPECT_TRUE(finished) << "the drain did not return";
  if (!finished) q.ShutDown();  // releases it, so the test fails instead of hanging
  drainer.join();
  EXPECT_EQ(drained.load(), 1);
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
  EXPECT_TRUE(Eventually([&] { return draining(q) >= 3; })) << "the drainers never waited";
  q.ShutDown();
  EXPECT_TRUE(Eventually([&] { return returned.load() == 3; })) << "a drain went on after ShutDown";
  lease->Done();  // releases a drainer should the check above have failed
  for (auto& t : drainers) t.join();
  EXPECT_EQ(drained.load(), 0);  // all aborted
}

// DrainWhileTaking(q, draining, drainers, in_flight): `q` has items queued and
// `in_flight` is an active lease of it. Starts `drainers` ShutDownWithDrain calls and,
// once they all wait, checks that none returns while the lease is active, ends it, and
// then takes every item with Get, checking that none returns while an item is still
// queued or in flight; then that all of them return, drained. Returns the items taken.
template <typename Q, typename Draining, typename Lease>
std::vector<std::string> DrainWhileTaking(Q& q, Draining draining, int drainers, Lease& in_flight) {
  std::atomic<int> drained{0}, returned{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < drainers; ++i) {
    threads.emplace_back([&] {
      drained += q.ShutDownWithDrain();
      ++returned;
    });
  }
  auto any_returned = [&] { return returned.load() > 0; };
  EXPECT_TRUE(Eventually([&] { return draining(q) >= drainers || any_returned(); }));
  // Negative checks: they can only miss a failure.
  EXPECT_FALSE(Eventually(any_returned, absl::Milliseconds(20)))
      << "a drain returned while a lease was active";
  in_flight->Done();
  std::vector<std::string> seen;
  while (auto lease = q.Get()) {
    EXPECT_FALSE(Eventually(any_returned, absl::Milliseconds(5)))
        << "a drain returned while " << lease->item() << " was in flight";
    seen.push_back(lease->item());
  }
  const bool all_returned = Eventually([&] { return returned.load() == drainers; });
  EXPECT_TRUE(all_returned) << "a drain did not return once everything was done";
  if (!all_returned) q.ShutDown();  // releases them, so the test fails instead of hanging
  for (auto& t : threads) t.join();
  EXPECT_EQ(drained.load(), all_returned ? drainers : 0);
  return seen;
}

// ExpectDrainRunsTheDueItem(q): `q` (a DelayingQueue or PriorityQueue) holds a delayed
// item "due" that is due but not yet moved (its timer is late) and one "later" that is
// not due. A drain queues the due one and waits for it: a worker still gets it after
// ShutDownWithDrain has begun, the drain returns once it is Done, and "later" is dropped.
template <typename Q>
void ExpectDrainRunsTheDueItem(Q& q) {
  std::atomic<bool> drained{false};
  std::thread drainer([&] { drained = q.ShutDownWithDrain(); });
  ASSERT_TRUE(Eventually([&] { return q.ShuttingDown(); }));
  auto lease = q.TryGet();
  EXPECT_TRUE(lease.has_value()) << "the due item was dropped";
  if (lease) {
    EXPECT_EQ(lease->item(), "due");
    lease->Done();
  }
  drainer.join();
  EXPECT_TRUE(drained.load());
  EXPECT_FALSE(q.TryGet().has_value());  // "later" was dropped
}

// ExpectContextEndsADrain(q, draining, done_first): `q` is empty. With "a" in flight and
// "b" queued, ShutDownWithDrain(ctx) waits until `ctx` is cancelled (at once when
// `done_first`: cancelled before the call) and then returns false. Without `done_first`
// the cancel comes once the drainer waits (`draining(q)`, as above), so the wake-up on
// the context is what must end the wait. The queue is then shut
// down as by ShutDown(): adds are refused, "b" is still handed out, and then nothing is
// left.
template <typename Q, typename Draining>
void ExpectContextEndsADrain(Q& q, Draining draining, bool done_first) {
  q.Add("a");
  auto in_flight = q.TryGet();
  ASSERT_TRUE(in_flight.has_value());
  q.Add("b");
  auto [ctx, cancel] = WithCancel(Background());
  if (done_first) cancel();
  std::atomic<int> drained{-1};
  std::thread drainer([&q, &drained, c = ctx] { drained = q.ShutDownWithDrain(c) ? 1 : 0; });
  if (!done_first) {
    EXPECT_TRUE(Eventually([&] { return draining(q) > 0 || drained.load() != -1; }));
    EXPECT_EQ(drained.load(), -1) << "the drain returned before its context was done";
    cancel();
  }
  const bool finished = Eventually([&] { return drained.load() != -1; });
  EXPECT_TRUE(finished) << "a done context did not end the drain";
  if (!finished) q.ShutDown();  // releases it, so the test fails instead of hanging
  drainer.join();
  EXPECT_EQ(drained.load(), 0);
  EXPECT_FALSE(q.Add("c")) << "an add was taken after the drain";
  auto queued = q.TryGet();
  ASSERT_TRUE(queued.has_value());
  EXPECT_EQ(**queued, "b");
  queued->Done();
  in_flight->Done();
  EXPECT_FALSE(q.TryGet().has_value());
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_DRAIN_CHECK_H_
