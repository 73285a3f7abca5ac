// internal::Mutex's spinning lock (LockSpinning / SpinningMutexLock): mutual exclusion
// with plain Lock users, waiting past the spin for a holder that keeps the lock, and the
// lock-word hint it polls. That it saves sleeping is a performance claim, measured by the
// delay scenario (docs/design.md), not here.

#include "kwq/internal/mutex.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "testing/eventually.h"
#include "testing/thread_state.h"

namespace kwq::internal {

struct MutexPeer {
  static bool LockedHint(const Mutex& mu) { return mu.LockedHint(); }
};

namespace {

// Whether `mu` can be taken right now (taking and releasing it).
bool IsFree(Mutex& mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!mu.TryLock()) return false;
  mu.Unlock();
  return true;
}

TEST(MutexTest, LockSpinningTakesAFreeLock) {
  Mutex mu;
  mu.LockSpinning(absl::ZeroDuration());
  EXPECT_FALSE(IsFree(mu));
  mu.Unlock();
  {
    SpinningMutexLock lock(&mu, absl::Microseconds(25));
    EXPECT_FALSE(IsFree(mu));
  }
  EXPECT_TRUE(IsFree(mu));
}

TEST(MutexTest, SpinningAndPlainLockersExcludeEachOther) {
  Mutex mu;
  int64_t count = 0;  // guarded by mu (a data race here is what TSan would report)
  constexpr int kRounds = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        if (t % 2 == 0) {
          SpinningMutexLock lock(&mu, absl::Microseconds(t == 0 ? 0 : 25));
          ++count;
        } else {
          MutexLock lock(&mu);
          ++count;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  MutexLock lock(&mu);
  EXPECT_EQ(count, 4 * kRounds);
}

using ::kwq::testing::ThreadState;

// A holder that keeps the lock past the spin: the spinner then sleeps in the kernel and
// gets the lock only after the holder's release. The holder releases once the spinner
// sleeps (its state in /proc is 'S') or has returned, so no sleep is needed in the test;
// a spinner that gave up without the lock would have returned and seen nothing.
TEST(MutexTest, SpinnerWaitsPastItsSpinForTheHolder) {
  if (ThreadState(static_cast<pid_t>(syscall(SYS_gettid))) == '?') {
    GTEST_SKIP() << "/proc/self/task/*/stat is not readable here";
  }
  Mutex mu;
  mu.Lock();
  std::atomic<pid_t> tid{0};
  std::atomic<bool> done{false};
  bool released = false;  // written by the holder before its Unlock
  bool seen = false;
  std::thread spinner([&] {
    tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
    mu.LockSpinning(absl::Nanoseconds(1));
    seen = released;
    mu.Unlock();
    done.store(true);
  });
  EXPECT_TRUE(testing::Eventually([&] { return tid.load() != 0; }));
  EXPECT_TRUE(testing::Eventually([&] { return done.load() || ThreadState(tid.load()) == 'S'; }));
  released = true;
  mu.Unlock();
  spinner.join();
  EXPECT_TRUE(seen);
}

#ifdef __GLIBC__
TEST(MutexTest, LockedHintFollowsTheLockWord) {
  Mutex mu;
  EXPECT_FALSE(MutexPeer::LockedHint(mu));
  mu.Lock();
  EXPECT_TRUE(MutexPeer::LockedHint(mu));
  mu.Unlock();
  EXPECT_FALSE(MutexPeer::LockedHint(mu));
}
#endif

}  // namespace
}  // namespace kwq::internal
