#include "kwq/internal/spin.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace kwq::internal {
namespace {

TEST(PollUntilTest, ReturnsAtTheFirstPollThatFindsItReady) {
  int calls = 0;
  PollUntil([&] { return ++calls == 3; });
  EXPECT_EQ(calls, 3);
}

// With no time cap in reach (a busy CPU can make a yield outlast kGetPollLimit, which
// would end the polls first).
TEST(PollUntilTest, MakesAtMostTheGivenPolls) {
  int calls = 0;
  PollUntil([&] { return ++calls < 0; }, kBriefPolls, std::chrono::hours(1));
  // One look per poll.
  EXPECT_EQ(calls, kBriefPolls);
}

// The time cap ends the polls at the second yield once `limit` has passed since the
// first, whatever the count left: exactly two yields' worth with no time at all.
TEST(PollUntilTest, AZeroLimitEndsThePollsAtTheSecondYield) {
  int calls = 0;
  PollUntil([&] { return ++calls < 0; }, kGetPolls, std::chrono::nanoseconds(0));
  EXPECT_EQ(calls, 2 * kGetYieldEvery);
}

// A busy machine makes each yield slow; here each look takes a millisecond. The polls'
// count alone (kGetPolls) would keep the caller for over eight seconds; the time cap ends
// them at the second yield that finds kGetPollLimit gone since the first.
TEST(PollUntilTest, EndsOnceItsTimeIsUpWhateverThePollsLeft) {
  static_assert(kGetPollLimit < std::chrono::milliseconds(kGetYieldEvery));
  int calls = 0;
  PollUntil([&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return false;
  });
  EXPECT_EQ(calls, 2 * kGetYieldEvery);
}

}  // namespace
}  // namespace kwq::internal
