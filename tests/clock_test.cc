#include "kwq/clock.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "internal/sleep_until.h"
#include "internal/tsc_timeline.h"
#include "testing/eventually.h"

namespace kwq {
namespace {

// Waits out the TSC calibration (about 10 ms from program start), so that the RealClock
// tests below run on the path RealClock takes for the rest of a program's life.
void AfterCalibration() { internal::SystemTscNanosPerTick(); }

TEST(RealClockTest, IsMonotonic) {
  AfterCalibration();
  RealClock* clock = RealClock::Default();
  absl::Time last = clock->Now();
  for (int i = 0; i < 10000; ++i) {
    const absl::Time now = clock->Now();
    ASSERT_GE(now, last);
    last = now;
  }
}

TEST(RealClockTest, CoarseNowIsNeverAheadOfNowAndAtMostATickBehind) {
  AfterCalibration();
  RealClock* clock = RealClock::Default();
  absl::Time last = clock->CoarseNow();
  for (int i = 0; i < 10000; ++i) {
    const absl::Time before = clock->Now();
    const absl::Time coarse = clock->CoarseNow();
    const absl::Time after = clock->Now();
    // Monotonic (with a microsecond of slack: older kernels could step the coarse clock
    // back by nanoseconds during NTP rate adjustment).
    ASSERT_GE(coarse, last - absl::Microseconds(1));
    ASSERT_LE(coarse, after);  // the same timeline as Now, never ahead of it
    // Behind by at most one kernel tick (CONFIG_HZ >= 100: 10 ms), with slack for this
    // thread being descheduled between the reads.
    ASSERT_GE(coarse, before - absl::Milliseconds(50));
    last = coarse;
  }
}

TEST(RealClockTest, KwqClockKernelKeepsClockGettime) {
  // ctest runs this binary once more with KWQ_CLOCK=kernel (clock_test_env_kernel).
  const char* env = std::getenv("KWQ_CLOCK");
  if (env == nullptr || std::string(env) != "kernel") GTEST_SKIP() << "KWQ_CLOCK unset";
  EXPECT_FALSE(RealClock::ReadsTsc());
}

// RealClock reads the TSC exactly where the kernel's clocksource is the TSC, the CPU
// says it is invariant, and KWQ_CLOCK does not say otherwise: a probe that silently
// fails would leave every TSC test passing on clock_gettime.
TEST(RealClockTest, ReadsTheTscWhereTheKernelDoes) {
  std::ifstream file("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  file >> source;
  bool invariant = false;
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  invariant = __get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) != 0 && (edx & (1u << 8)) != 0;
#endif
  const char* env = std::getenv("KWQ_CLOCK");
  const bool kernel_forced = env != nullptr && std::string(env) == "kernel";
  EXPECT_EQ(RealClock::ReadsTsc(), source == "tsc" && invariant && !kernel_forced)
      << "clocksource " << source << ", invariant TSC " << invariant;
  if (RealClock::ReadsTsc()) {
    EXPECT_GT(internal::SystemTscNanosPerTick(), 0);
  }
}

TEST(FakeClockTest, CoarseNowIsNow) {
  FakeClock clock;
  EXPECT_EQ(clock.CoarseNow(), clock.Now());
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(clock.CoarseNow(), clock.Now());
}

// That a reached deadline does not sleep at all is pinned through the seam
// (SleepUntilReachedTest, below); here, that the real clock's calls come back (a past
// deadline or a negative infinite duration must not turn into a sleep for ever).
TEST(RealClockTest, SleepUntilPastReturns) {
  RealClock* clock = RealClock::Default();
  EXPECT_TRUE(
      testing::ReturnsInTime([clock] { clock->SleepUntil(clock->Now() - absl::Hours(1)); }));
  EXPECT_TRUE(testing::ReturnsInTime([clock] { clock->SleepFor(-absl::InfiniteDuration()); }));
  EXPECT_TRUE(testing::ReturnsInTime([clock] { clock->SleepUntil(absl::InfinitePast()); }));
}

TEST(RealClockTest, SleepUntilNeverReturnsEarly) {
  AfterCalibration();
  RealClock* clock = RealClock::Default();
  for (int i = 0; i < 20; ++i) {
    const absl::Time deadline = clock->Now() + absl::Microseconds(100);
    clock->SleepUntil(deadline);
    ASSERT_GE(clock->Now(), deadline);
  }
}

// A reading that lags the sleep (the TSC timeline behind the kernel clock that times the
// sleep): one sleep is not enough, SleepUntil must sleep again until the reading gets there.
TEST(SleepUntilReachedTest, SleepsAgainWhileTheReadingLags) {
  absl::Time now = absl::UnixEpoch();
  int sleeps = 0;
  const absl::Time deadline = now + absl::Microseconds(8);
  internal::SleepUntilReached(
      deadline, [&] { return now; },
      [&](absl::Duration left) {
        ++sleeps;
        now += left / 2;  // the reading moved by only half the time slept
        if (left < absl::Nanoseconds(2)) now += left;
      });
  EXPECT_GE(now, deadline);
  EXPECT_GT(sleeps, 1);
  sleeps = 0;
  internal::SleepUntilReached(
      deadline, [&] { return now; }, [&](absl::Duration) { ++sleeps; });
  EXPECT_EQ(sleeps, 0);  // a deadline already reached does not sleep
}

TEST(RealClockTest, RefusesObservers) {
  struct Nop : ClockObserver {
    void OnClockMoved(absl::Time) override {}
  } observer;
  EXPECT_FALSE(RealClock::Default()->AddObserver(&observer));
}

TEST(FakeClockTest, MovesOnlyWhenTold) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(3));
  clock.Advance(-absl::Seconds(10));  // negative advance is a no-op
  EXPECT_EQ(clock.Now(), start + absl::Seconds(3));
  clock.SetTime(start - absl::Hours(1));  // jumps backwards when asked
  EXPECT_EQ(clock.Now(), start - absl::Hours(1));
}

TEST(FakeClockTest, AdvanceSaturatesAtInfinity) {
  FakeClock clock;
  clock.Advance(absl::InfiniteDuration());
  EXPECT_EQ(clock.Now(), absl::InfiniteFuture());
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(clock.Now(), absl::InfiniteFuture());
}

TEST(FakeClockTest, AdvanceWakesSleeperThatBecameDue) {
  FakeClock clock;
  const absl::Time deadline = clock.Now() + absl::Seconds(5);
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepUntil(deadline);
    woke = true;
  });
  EXPECT_TRUE(testing::Eventually([&] { return clock.NumSleepers() == 1; }))
      << "the sleeper never slept";
  clock.Advance(absl::Seconds(4));
  // Not due yet: give a sleeper woken by any move every chance to (wrongly) return; a
  // negative check, which can only miss a failure.
  EXPECT_FALSE(testing::Eventually([&] { return woke.load(); }, absl::Milliseconds(20)));
  EXPECT_EQ(clock.NumSleepers(), 1u);
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(testing::Eventually([&] { return woke.load(); })) << "the due sleeper was not woken";
  if (!woke.load()) clock.Advance(absl::Hours(1));  // releases it, so the test fails, not hangs
  sleeper.join();
  EXPECT_EQ(clock.NumSleepers(), 0u);
}

// A move that reaches a sleeper's deadline wakes it even when the clock is set back
// before the sleeper runs again (it re-read the clock alone and slept on, in 19 of 20
// rounds in a review, until a later move passed its deadline), and a sleeper not yet due
// stays asleep through both moves. Two sleepers, so the list holds more than one.
TEST(FakeClockTest, AMoveThatReachedTheDeadlineWakesTheSleeperDespiteAJumpBack) {
  for (int round = 0; round < 3; ++round) {
    FakeClock clock(absl::FromUnixSeconds(100));
    std::atomic<bool> due_returned{false}, later_returned{false};
    std::thread due([&] {
      clock.SleepUntil(absl::FromUnixSeconds(110));
      due_returned = true;
    });
    std::thread later([&] {
      clock.SleepUntil(absl::FromUnixSeconds(130));
      later_returned = true;
    });
    ASSERT_TRUE(testing::Eventually([&] { return clock.NumSleepers() == 2; }));
    clock.SetTime(absl::FromUnixSeconds(120));  // past the first deadline only
    clock.SetTime(absl::FromUnixSeconds(100));  // and back at once
    EXPECT_TRUE(testing::Eventually([&] { return due_returned.load(); }, absl::Seconds(2)))
        << "round " << round << ": the sleeper whose deadline was reached sleeps on";
    EXPECT_FALSE(later_returned.load());
    EXPECT_EQ(clock.NumSleepers(), due_returned.load() ? 1u : 2u);
    clock.SetTime(absl::FromUnixSeconds(200));  // releases both
    due.join();
    later.join();
    EXPECT_EQ(clock.NumSleepers(), 0u);
  }
}

// Records every time an observed clock reports.
struct MoveRecorder : ClockObserver {
  std::vector<absl::Time> seen;
  void OnClockMoved(absl::Time now) override { seen.push_back(now); }
};

TEST(FakeClockTest, ObserversSeeEveryMoveInOrder) {
  FakeClock clock;
  MoveRecorder recorder;
  ASSERT_TRUE(clock.AddObserver(&recorder));
  const absl::Time start = clock.Now();
  clock.Advance(absl::Seconds(1));
  clock.SetTime(start + absl::Seconds(5));
  clock.RemoveObserver(&recorder);
  clock.Advance(absl::Seconds(1));
  ASSERT_EQ(recorder.seen.size(), 2u);
  EXPECT_EQ(recorder.seen[0], start + absl::Seconds(1));
  EXPECT_EQ(recorder.seen[1], start + absl::Seconds(5));
}

// An observer that calls `on_move` (if set) and counts its calls.
struct CallbackObserver : ClockObserver {
  std::function<void()> on_move;
  int calls = 0;
  void OnClockMoved(absl::Time) override {
    ++calls;
    if (on_move) on_move();
  }
};

// Moves from several threads are serialised: an observer never sees two at once, and the
// times it sees never go back.
TEST(FakeClockTest, ConcurrentMovesAreSerialised) {
  struct Recorder : ClockObserver {
    std::atomic<bool> inside{false};
    std::atomic<bool> overlapped{false};
    std::vector<absl::Time> seen;  // written one move at a time (checked by `inside`)
    void OnClockMoved(absl::Time now) override {
      if (inside.exchange(true)) overlapped = true;
      seen.push_back(now);
      for (int i = 0; i < 50; ++i) std::this_thread::yield();  // widen the window
      inside = false;
    }
  } recorder;
  FakeClock clock;
  ASSERT_TRUE(clock.AddObserver(&recorder));
  std::vector<std::thread> movers;
  for (int t = 0; t < 3; ++t) {
    movers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) clock.Advance(absl::Nanoseconds(1));
    });
  }
  for (auto& m : movers) m.join();
  clock.RemoveObserver(&recorder);
  EXPECT_FALSE(recorder.overlapped.load());
  ASSERT_EQ(recorder.seen.size(), 900u);
  for (size_t i = 1; i < recorder.seen.size(); ++i) {
    ASSERT_LE(recorder.seen[i - 1], recorder.seen[i]) << "move " << i;
  }
  EXPECT_EQ(recorder.seen.back() - recorder.seen.front(), absl::Nanoseconds(899));
}

// Observers are called in the order they were added, also after others were removed
// (the list is compacted once half of it is removed, and renumbered), and one added twice
// is called once per move and gone after one removal.
TEST(FakeClockTest, ObserversKeepTheirOrderAcrossRemovals) {
  FakeClock clock;
  std::vector<int> order;
  std::vector<std::unique_ptr<CallbackObserver>> observers;
  for (int i = 0; i < 10; ++i) {
    observers.push_back(std::make_unique<CallbackObserver>());
    observers.back()->on_move = [&order, i] { order.push_back(i); };
    ASSERT_TRUE(clock.AddObserver(observers.back().get()));
  }
  for (int i : {0, 2, 3, 5, 6, 8}) clock.RemoveObserver(observers[i].get());  // compacts
  clock.RemoveObserver(observers[0].get());                                   // gone already
  ASSERT_TRUE(clock.AddObserver(observers[2].get()));                         // back, last
  ASSERT_TRUE(clock.AddObserver(observers[4].get()));                         // observing already
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(order, (std::vector<int>{1, 4, 7, 9, 2}));
  clock.RemoveObserver(observers[4].get());
  order.clear();
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(order, (std::vector<int>{1, 7, 9, 2}));
  for (auto& o : observers) clock.RemoveObserver(o.get());
  order.clear();
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(order.empty());
}

// A null observer is refused, and removing one does nothing (null entries mark removed
// observers: a null added and then removed wrote past the list once it was compacted).
TEST(FakeClockTest, ANullObserverIsRefused) {
  FakeClock clock;
  CallbackObserver a, b;
  ASSERT_TRUE(clock.AddObserver(&a));
  EXPECT_FALSE(clock.AddObserver(nullptr));
  ASSERT_TRUE(clock.AddObserver(&b));
  clock.RemoveObserver(&a);  // half removed: compacted
  clock.RemoveObserver(nullptr);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(a.calls, 0);
  EXPECT_EQ(b.calls, 1);
  clock.RemoveObserver(&b);
}

TEST(FakeClockTest, ObserversMayAddAndRemoveObserversDuringAMove) {
  FakeClock clock;
  CallbackObserver a, b, c, d;
  a.on_move = [&] {
    if (a.calls > 1) return;
    clock.AddObserver(&d);     // called from the next move on
    clock.RemoveObserver(&c);  // not called in this move, though it comes after
  };
  b.on_move = [&] {
    if (b.calls == 2) clock.RemoveObserver(&b);  // from inside its own call
  };
  for (CallbackObserver* o : {&a, &b, &c}) ASSERT_TRUE(clock.AddObserver(o));
  clock.Advance(absl::Seconds(1));  // hung for ever when observers could not do this
  EXPECT_EQ(a.calls, 1);
  EXPECT_EQ(b.calls, 1);
  EXPECT_EQ(c.calls, 0);
  EXPECT_EQ(d.calls, 0);
  clock.Advance(absl::Seconds(1));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(a.calls, 3);
  EXPECT_EQ(b.calls, 2);  // removed itself during its second call
  EXPECT_EQ(c.calls, 0);
  EXPECT_EQ(d.calls, 2);
  clock.RemoveObserver(&a);
  clock.RemoveObserver(&d);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(a.calls, 3);
  EXPECT_EQ(d.calls, 2);
}

TEST(FakeClockDeathTest, MovingTheClockFromItsObserverFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto move_from_observer = [](bool set_time) {
    FakeClock clock;
    CallbackObserver observer;
    observer.on_move = [&] {
      if (set_time) {
        clock.SetTime(clock.Now());
      } else {
        clock.Advance(absl::Seconds(1));
      }
    };
    clock.AddObserver(&observer);
    clock.Advance(absl::Seconds(1));
  };
  EXPECT_DEATH(move_from_observer(false), "FakeClock::Advance called from inside one of its");
  EXPECT_DEATH(move_from_observer(true), "FakeClock::SetTime called from inside one of its");
}

TEST(FakeClockTest, BackwardJumpCallsNoObserver) {
  FakeClock clock;
  MoveRecorder recorder;
  ASSERT_TRUE(clock.AddObserver(&recorder));
  const absl::Time start = clock.Now();
  clock.SetTime(start - absl::Hours(1));
  EXPECT_TRUE(recorder.seen.empty());
  clock.SetTime(start - absl::Hours(1));  // staying put is reported, like Advance(0)
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(recorder.seen, (std::vector<absl::Time>{start - absl::Hours(1),
                                                    start - absl::Hours(1) + absl::Seconds(1)}));
  clock.RemoveObserver(&recorder);
}

// An observer's exception does not keep the move from the observers after it: the move
// completes, every observer is told, and the first exception is rethrown once they were.
// The clock is usable again afterwards (the mover is reset).
TEST(FakeClockTest, AnObserversExceptionIsRethrownAfterEveryObserverWasTold) {
  FakeClock clock;
  CallbackObserver first, second, third;
  first.on_move = [] { throw std::runtime_error("first"); };
  second.on_move = [] { throw std::runtime_error("second"); };
  for (CallbackObserver* o : {&first, &second, &third}) ASSERT_TRUE(clock.AddObserver(o));
  const absl::Time start = clock.Now();
  std::string what;
  try {
    clock.Advance(absl::Seconds(1));
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  EXPECT_EQ(what, "first");
  EXPECT_EQ(first.calls, 1);
  EXPECT_EQ(second.calls, 1);
  EXPECT_EQ(third.calls, 1);  // told despite the two before it throwing
  EXPECT_EQ(clock.Now(), start + absl::Seconds(1));
  first.on_move = nullptr;
  second.on_move = nullptr;
  clock.Advance(absl::Seconds(1));  // a later move from this thread is no "move from inside"
  EXPECT_EQ(third.calls, 2);
  for (CallbackObserver* o : {&first, &second, &third}) clock.RemoveObserver(o);
}

// From inside an observer, SleepUntil for a deadline the clock has reached returns at
// once; for one still ahead it fails a check rather than block for ever.
TEST(FakeClockDeathTest, SleepUntilFromAnObserverReturnsIfDueAndFailsLoudlyIfNot) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  {
    FakeClock clock;
    CallbackObserver observer;
    observer.on_move = [&] { clock.SleepUntil(clock.Now()); };
    ASSERT_TRUE(clock.AddObserver(&observer));
    clock.Advance(absl::Seconds(1));
    EXPECT_EQ(observer.calls, 1);
    clock.RemoveObserver(&observer);
  }
  auto sleep_from_observer = [] {
    alarm(10);  // a sleep that blocks instead of failing is killed, and fails the test
    FakeClock clock;
    CallbackObserver observer;
    observer.on_move = [&] { clock.SleepUntil(clock.Now() + absl::Seconds(1)); };
    clock.AddObserver(&observer);
    clock.Advance(absl::Seconds(1));
  };
  EXPECT_DEATH(sleep_from_observer(), "FakeClock::SleepUntil called from inside one of its");
}

}  // namespace
}  // namespace kwq
