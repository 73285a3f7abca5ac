// Test helper: ExpectCancelWakesASleepingGet(q, asleep) checks that a cancel that comes
// while a Get(ctx) sleeps (not before it looked) wakes it, and that it returns nullopt.
// `q` is empty; `asleep(q)` is the number of Gets asleep on it (a test peer). For Queue
// and PriorityQueue.

#ifndef KWQ_TESTS_TESTING_CANCEL_CHECK_H_
#define KWQ_TESTS_TESTING_CANCEL_CHECK_H_

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "kwq/context.h"
#include "testing/eventually.h"

namespace kwq::testing {

template <typename Q, typename Asleep>
void ExpectCancelWakesASleepingGet(Q& q, Asleep asleep) {
  auto [ctx, cancel] = WithCancel(Background());
  std::atomic<bool> returned{false}, got{false};
  std::thread getter([&, c = ctx] {
    got = q.Get(c).has_value();
    returned = true;
  });
  EXPECT_TRUE(Eventually([&] { return asleep(q) > 0; }));
  cancel();
  EXPECT_TRUE(Eventually([&] { return returned.load(); }))
      << "a Get(ctx) asleep slept through the cancel";
  q.ShutDown();  // releases the getter should the check above have failed
  getter.join();
  EXPECT_FALSE(got.load());
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_CANCEL_CHECK_H_
