#include "kwq/timer.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "internal/timer_waiter.h"
#include "kwq/context.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/periodic_timer.h"
#include "testing/eventually.h"
#include "testing/refuse_io_uring.h"
#include "testing/thread_state.h"

namespace kwq {
namespace {

// ---- real clock, both backends ----

// Each test gets `service_` on the backend under test, or is skipped where that is
// io_uring and the process may not use it (Docker's default seccomp profile, for one).
// Learns the service thread's id from a callback, then waits until that thread sleeps
// (where /proc can be read: state 'S', or '?' where it cannot). False when the callback
// never ran.
bool ServiceThreadSleeps(TimerService& service) {
  auto tid = std::make_shared<std::atomic<pid_t>>(0);
  service.Schedule(absl::InfinitePast(), [tid] { *tid = testing::CurrentTid(); });
  if (!testing::Eventually([&] { return tid->load() != 0; })) return false;
  EXPECT_TRUE(testing::Eventually([&] {
    const char state = testing::ThreadState(tid->load());
    return state == 'S' || state == '?';
  }));
  return true;
}

class RealTimerTest : public ::testing::TestWithParam<TimerService::Backend> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TimerService>> service =
        TimerService::Create({.backend = GetParam()});
    if (GetParam() == TimerService::Backend::kIoUring &&
        service.status().code() == absl::StatusCode::kUnavailable) {
      GTEST_SKIP() << "io_uring refused here: " << service.status();
    }
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(service).value();
  }

  std::unique_ptr<TimerService> service_;
};

TEST_P(RealTimerTest, UsesTheRequestedBackend) {
  auto& service = service_;
  EXPECT_EQ(service->backend(), GetParam());
}

TEST_P(RealTimerTest, FiresInDeadlineOrder) {
  auto& service = service_;
  std::mutex mu;
  std::vector<int> order;
  std::latch done(3);
  const absl::Time now = service->clock().Now();
  auto record = [&](int i) {
    return [&, i] {
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }
      done.count_down();
    };
  };
  // The service thread is held in a callback until all three are due, so the order
  // below is the heap's, not the scheduler's (a stalled test thread cannot reorder them).
  std::latch holding(1), release(1);
  service->Schedule(absl::InfinitePast(), [&] {
    holding.count_down();
    release.wait();
  });
  holding.wait();
  service->Schedule(now + absl::Milliseconds(3), record(3));
  service->Schedule(now + absl::Milliseconds(1), record(1));
  service->Schedule(now + absl::Milliseconds(2), record(2));
  while (service->clock().Now() <= now + absl::Milliseconds(3)) std::this_thread::yield();
  release.count_down();
  done.wait();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST_P(RealTimerTest, NeverFiresEarly) {
  auto& service = service_;
  std::latch done(1);
  const absl::Time deadline = service->clock().Now() + absl::Milliseconds(5);
  absl::Time fired;
  service->Schedule(deadline, [&] {
    fired = service->clock().Now();
    done.count_down();
  });
  done.wait();
  EXPECT_GE(fired, deadline);
}

TEST_P(RealTimerTest, EarlierTimerWakesASleepingService) {
  auto& service = service_;
  auto fired = std::make_shared<std::atomic<bool>>(false);
  service->ScheduleAfter(absl::Hours(1), [] { ADD_FAILURE() << "far timer fired"; });
  // The near one is scheduled while the service sleeps towards the far timer.
  ASSERT_TRUE(ServiceThreadSleeps(*service));
  service->ScheduleAfter(absl::Milliseconds(1), [fired] { *fired = true; });
  EXPECT_TRUE(testing::Eventually([&] { return fired->load(); }))
      << "the service kept sleeping towards the far timer";
  EXPECT_EQ(service->Pending(), 1u);
}

TEST_P(RealTimerTest, PastDeadlineRunsSoon) {
  auto& service = service_;
  auto fired = std::make_shared<std::atomic<bool>>(false);
  service->Schedule(absl::InfinitePast(), [fired] { *fired = true; });
  EXPECT_TRUE(testing::Eventually([&] { return fired->load(); }));
}

TEST_P(RealTimerTest, CancelPreventsRun) {
  auto& service = service_;
  std::atomic<bool> ran{false};
  // The service thread is held in a callback meanwhile, so the timer cannot fire before
  // the Cancel however the test thread is scheduled.
  std::latch holding(1), release(1);
  service->Schedule(absl::InfinitePast(), [&] {
    holding.count_down();
    release.wait();
  });
  holding.wait();
  const absl::Time now = service->clock().Now();
  const TimerId id = service->Schedule(now + absl::Milliseconds(1), [&] { ran = true; });
  EXPECT_TRUE(service->Cancel(id));
  EXPECT_FALSE(service->Cancel(id));  // cancel after cancel is a no-op
  // Timers run in deadline order: once a later one ran, the cancelled one would have too.
  std::latch done(1);
  service->Schedule(now + absl::Milliseconds(2), [&] { done.count_down(); });
  while (service->clock().Now() <= now + absl::Milliseconds(2)) std::this_thread::yield();
  release.count_down();
  done.wait();
  EXPECT_FALSE(ran.load());
}

TEST_P(RealTimerTest, CancelSyncWaitsForRunningCallback) {
  auto& service = service_;
  std::latch started(1);
  std::atomic<bool> release{false};
  std::atomic<bool> finished{false};
  const TimerId id = service->Schedule(absl::InfinitePast(), [&] {
    started.count_down();
    while (!release.load()) std::this_thread::yield();
    finished = true;
  });
  started.wait();
  EXPECT_FALSE(service->Cancel(id));  // running: Cancel does not stop or wait
  // The callback is released only once this thread sleeps in CancelSync (or after 2 s,
  // also where /proc cannot be read): one that returned without waiting would find the
  // callback unfinished.
  const pid_t waiter = testing::CurrentTid();
  std::thread releaser([&] {
    (void)testing::Eventually([&] { return testing::ThreadState(waiter) == 'S'; },
                              absl::Seconds(2));
    release = true;
  });
  EXPECT_FALSE(service->CancelSync(id));
  EXPECT_TRUE(finished.load());  // CancelSync returned only after the callback did
  releaser.join();
}

TEST_P(RealTimerTest, CancelSyncFromOwnCallbackDoesNotDeadlock) {
  auto& service = service_;
  std::latch done(1);
  TimerId id = 0;
  std::atomic<TimerId> id_seen{0};
  id = service->Schedule(absl::InfiniteFuture(), [&] {
    EXPECT_FALSE(service->CancelSync(id_seen.load()));
    done.count_down();
  });
  id_seen = id;
  ASSERT_TRUE(service->Reschedule(id, absl::InfinitePast()));
  done.wait();
}

TEST_P(RealTimerTest, RescheduleMovesAPendingTimer) {
  auto& service = service_;
  std::latch done(1);
  const TimerId id = service->ScheduleAfter(absl::Hours(1), [&] { done.count_down(); });
  EXPECT_TRUE(service->Reschedule(id, service->clock().Now() + absl::Milliseconds(1)));
  done.wait();
  EXPECT_FALSE(service->Reschedule(id, absl::InfiniteFuture()));  // already ran
}

// The same for a Reschedule that moves a pending timer earlier: the service sleeping
// towards its old deadline is woken. (The test above reschedules before the service
// sleeps, so a Reschedule that never woke it passed.)
TEST_P(RealTimerTest, RescheduleEarlierWakesASleepingService) {
  auto& service = service_;
  auto fired = std::make_shared<std::atomic<bool>>(false);
  const TimerId id = service->ScheduleAfter(absl::Hours(1), [fired] { *fired = true; });
  ASSERT_TRUE(ServiceThreadSleeps(*service));
  ASSERT_TRUE(service->Reschedule(id, service->clock().Now() + absl::Milliseconds(1)));
  EXPECT_TRUE(testing::Eventually([&] { return fired->load(); }))
      << "the service kept sleeping towards the old deadline";
}

TEST_P(RealTimerTest, DestructionDropsPendingTimersAndJoins) {
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) service_->ScheduleAfter(absl::Hours(1), [&] { ++ran; });
  EXPECT_EQ(service_->Pending(), 100u);
  service_.reset();
  EXPECT_EQ(ran.load(), 0);
}

// Destruction drops timers already due but not yet run, too: one scheduled while a
// callback runs is not run once the callback returns into a stopping service.
TEST_P(RealTimerTest, DestructionDropsDueTimersNotYetRun) {
  std::latch holding(1);
  std::atomic<bool> release{false}, second_ran{false};
  service_->Schedule(absl::InfinitePast(), [&] {
    holding.count_down();
    while (!release.load()) std::this_thread::yield();
  });
  holding.wait();
  service_->Schedule(absl::InfinitePast(), [&] { second_ran = true; });
  std::atomic<pid_t> destroyer{0};
  std::thread destroying([&] {
    destroyer = testing::CurrentTid();
    service_.reset();
  });
  ASSERT_TRUE(testing::Eventually([&] { return destroyer.load() != 0; }));
  // Until the destructor sleeps in the join, with the service marked stopping.
  (void)testing::Eventually([&] { return testing::ThreadState(destroyer.load()) == 'S'; },
                            absl::Seconds(2));
  release = true;
  destroying.join();
  EXPECT_FALSE(second_ran.load());
}

TEST_P(RealTimerTest, ManyThreadsScheduleAndCancel) {
  auto& service = service_;
  constexpr int kThreads = 4, kPerThread = 2000;
  std::atomic<int> fired{0};
  std::atomic<int> cancelled{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const TimerId id =
            service->ScheduleAfter(absl::Microseconds((i * 7 + t) % 500), [&] { ++fired; });
        if (i % 2 == 0 && service->Cancel(id)) ++cancelled;
      }
    });
  }
  for (auto& th : threads) th.join();
  // Every timer either fired or was cancelled: wait for the rest to fire (a lost one fails
  // here with the count, not as the test run's timeout).
  EXPECT_TRUE(testing::Eventually(
      [&] { return fired.load() + cancelled.load() == kThreads * kPerThread; }, absl::Seconds(10)))
      << fired.load() << " fired + " << cancelled.load() << " cancelled of "
      << kThreads * kPerThread;
  EXPECT_EQ(service->Pending(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, RealTimerTest,
                         ::testing::Values(TimerService::Backend::kPortable,
                                           TimerService::Backend::kIoUring),
                         [](const auto& info) {
                           return info.param == TimerService::Backend::kPortable ? "portable"
                                                                                 : "io_uring";
                         });

// ---- fake clock ----

TEST(FakeTimerTest, RunsDueTimersInsideAdvanceInOrder) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  std::vector<int> order;
  const absl::Time start = clock.Now();
  service->Schedule(start + absl::Seconds(2), [&] { order.push_back(2); });
  service->Schedule(start + absl::Seconds(1), [&] { order.push_back(1); });
  service->Schedule(start + absl::Seconds(1), [&] { order.push_back(11); });
  service->Schedule(start + absl::Seconds(3), [&] { order.push_back(3); });
  clock.Advance(absl::Milliseconds(999));
  EXPECT_TRUE(order.empty());
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(order, (std::vector<int>{1, 11}));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(order, (std::vector<int>{1, 11, 2, 3}));
}

// Id 0 is never a timer's: CancelSync(0) returns false at once. It waited for the
// running callback's id, which reads 0 while none runs, to change: for ever.
TEST(FakeTimerTest, CancelSyncOfIdZeroReturnsAtOnce) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  EXPECT_FALSE(service->CancelSync(0));
  service->ScheduleAfter(absl::Seconds(1), [] {});
  EXPECT_FALSE(service->CancelSync(0));
  clock.Advance(absl::Seconds(1));
  EXPECT_FALSE(service->CancelSync(0));
}

// An empty callable or a null function makes a timer that runs nothing; it was called
// when due (at address 0).
TEST(FakeTimerTest, AnEmptyCallableOrANullFunctionRunsNothing) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  const absl::Time due = clock.Now() + absl::Seconds(1);
  EXPECT_NE(service->Schedule(due, absl::AnyInvocable<void()>()), 0u);
  EXPECT_NE(service->ScheduleAfter(absl::Seconds(1), absl::AnyInvocable<void()>()), 0u);
  EXPECT_NE(service->Schedule(due, nullptr, nullptr), 0u);
  const TimerId cancelled = service->Schedule(due, absl::AnyInvocable<void()>());
  EXPECT_EQ(service->Pending(), 4u);
  EXPECT_TRUE(service->Cancel(cancelled));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(service->Pending(), 0u);
}

// The plain-function form: fn(arg) runs in deadline order with the callables (ties in
// scheduling order), a cancelled one never runs, and a rescheduled one runs at its new
// time; its slot is then reused by a callable, whose captures are destroyed as usual.
TEST(FakeTimerTest, PlainFunctionTimersRunLikeCallables) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  struct Log {
    std::vector<int> order;
  } log;
  struct Entry {
    Log* log;
    int value;
  };
  auto record = [](void* arg) {
    auto* e = static_cast<Entry*>(arg);
    e->log->order.push_back(e->value);
  };
  Entry one{&log, 1}, two{&log, 2}, cancelled{&log, -1}, moved{&log, 5};
  const absl::Time start = clock.Now();
  service->Schedule(start + absl::Seconds(2), record, &two);
  service->Schedule(start + absl::Seconds(1), record, &one);
  service->Schedule(start + absl::Seconds(1), [&] { log.order.push_back(11); });
  const TimerId c = service->Schedule(start + absl::Seconds(1), record, &cancelled);
  const TimerId m = service->Schedule(start + absl::Seconds(1), record, &moved);
  EXPECT_TRUE(service->Cancel(c));
  EXPECT_FALSE(service->Cancel(c));
  EXPECT_TRUE(service->Reschedule(m, start + absl::Seconds(5)));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(log.order, (std::vector<int>{1, 11, 2}));
  auto alive = std::make_shared<int>(0);
  service->Schedule(start + absl::Seconds(3), [&log, alive] { log.order.push_back(3); });
  EXPECT_EQ(alive.use_count(), 2);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(log.order, (std::vector<int>{1, 11, 2, 3, 5}));
  EXPECT_EQ(alive.use_count(), 1);  // the callable was destroyed after it ran
  EXPECT_EQ(service->Pending(), 0u);
}

// A service made while the clock reads between two nanoseconds: a timer runs once the
// clock reads exactly its deadline, whether that is a whole nanosecond (it fell on the
// key after the clock's and waited for the next move) or as fractional as the clock
// (ScheduleAfter, WithTimeout: a fix that made the service's origin whole broke those).
TEST(FakeTimerTest, AServiceStartedBetweenTwoNanosecondsRunsTimersAtTheirTime) {
  FakeClock clock(absl::UnixEpoch() + absl::Seconds(100) + absl::Nanoseconds(1) / 4);
  auto service = *TimerService::Create({.clock = &clock});
  int whole = 0, relative = 0;
  const absl::Time deadline = absl::UnixEpoch() + absl::Seconds(101);
  service->Schedule(deadline, [&] { ++whole; });
  service->ScheduleAfter(absl::Seconds(2), [&] { ++relative; });
  auto [ctx, cancel] = WithTimeout(BackgroundWithTimers(service.get()), absl::Seconds(3));
  clock.SetTime(deadline - absl::Nanoseconds(1) / 4);
  EXPECT_EQ(whole, 0);  // never early
  clock.SetTime(deadline);
  EXPECT_EQ(whole, 1);
  clock.Advance(absl::Seconds(1));  // a quarter nanosecond before 2 s after the start
  EXPECT_EQ(relative, 0);
  clock.Advance(absl::Nanoseconds(1) / 4);  // 2 s after the start, fractional
  EXPECT_EQ(relative, 1);
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(ctx.IsCancelled());
}

TEST(FakeTimerTest, CallbackSchedulingADueTimerRunsInTheSameAdvance) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  int runs = 0;
  service->ScheduleAfter(absl::Seconds(1), [&] {
    ++runs;
    service->Schedule(clock.Now(), [&] { ++runs; });
  });
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(runs, 2);
}

// A callback may cancel a timer due in the same clock move: it is still pending, so the
// cancel succeeds and it does not run.
TEST(FakeTimerTest, CallbackCancelsATimerDueInTheSameMove) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  bool second_ran = false;
  TimerId second = 0;
  service->ScheduleAfter(absl::Seconds(1), [&] { EXPECT_TRUE(service->Cancel(second)); });
  second = service->ScheduleAfter(absl::Seconds(1), [&] { second_ran = true; });
  clock.Advance(absl::Seconds(1));
  EXPECT_FALSE(second_ran);
}

// Cancel and CancelSync destroy the cancelled callback after releasing the service's lock:
// a capture's destructor may call back into the same service (dropping the last handle of
// a Context cancels that context's deadline timer there). Under the lock it deadlocked.
TEST(FakeTimerTest, ACancelledCallbacksCapturesMayCallBackIntoTheService) {
  struct State {
    FakeClock clock;
    std::unique_ptr<TimerService> service;
  };
  auto state = std::make_shared<State>();
  state->service = *TimerService::Create({.clock = &state->clock});
  struct CallsBack {
    explicit CallsBack(TimerService* s) : service(s) {}
    ~CallsBack() {
      service->ScheduleAfter(absl::Seconds(1), [] {});
    }
    TimerService* service;
  };
  for (bool sync : {false, true}) {
    const bool returned = testing::ReturnsInTime([state, sync] {
      auto capture = std::make_shared<CallsBack>(state->service.get());
      const TimerId id = state->service->ScheduleAfter(absl::Seconds(1), [capture] {});
      capture.reset();  // the callback holds the last reference
      EXPECT_TRUE(sync ? state->service->CancelSync(id) : state->service->Cancel(id));
    });
    // A hung call holds the service's lock: touch the service no more.
    ASSERT_TRUE(returned) << "CancelSync: " << sync;
  }
  EXPECT_EQ(state->service->Pending(), 2u);  // what the destructors scheduled
}

// Destroying a fake-clock service from another thread waits for a callback running on
// the thread that moves the clock.
TEST(FakeTimerTest, DestroyWaitsForACallbackRunningOnTheMovingThread) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  std::latch in_callback(1), release(1);
  std::atomic<bool> destroyed{false};
  bool destroyed_seen_in_callback = true;
  service->ScheduleAfter(absl::Seconds(1), [&] {
    in_callback.count_down();
    release.wait();
    destroyed_seen_in_callback = destroyed.load();
  });
  std::thread mover([&] { clock.Advance(absl::Seconds(1)); });
  in_callback.wait();
  std::atomic<pid_t> destroyer_tid{0};
  std::thread destroyer([&] {
    destroyer_tid = testing::CurrentTid();
    service.reset();
    destroyed = true;
  });
  // Release the callback once the destroyer sleeps in the destructor (or after 2 s, also
  // where /proc cannot be read): a destructor that did not wait would have finished.
  (void)testing::Eventually(
      [&] {
        return (destroyer_tid.load() != 0 && testing::ThreadState(destroyer_tid.load()) == 'S') ||
               destroyed.load();
      },
      absl::Seconds(2));
  release.count_down();
  mover.join();
  destroyer.join();
  EXPECT_FALSE(destroyed_seen_in_callback);
}

// internal::PeriodicTimer (the metric refreshes and flushes): runs every period until
// stopped, and not after Stop returned.
TEST(FakeTimerTest, PeriodicTimerRunsEveryPeriodUntilStopped) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  int runs = 0;
  internal::PeriodicTimer timer(service.get(), absl::Seconds(1), [&] { ++runs; });
  clock.Advance(absl::Milliseconds(999));
  EXPECT_EQ(runs, 0);
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs, 1);
  clock.Advance(absl::Seconds(1));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(runs, 3);
  timer.Stop();
  timer.Stop();  // idempotent
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(service->Pending(), 0u);
}

// A run that throws is dropped and the runs go on: the exception left the timer callback
// (which ends the process on a real clock's service) before the timer was re-armed.
TEST(FakeTimerTest, PeriodicTimerRunsOnAfterARunThrows) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  int runs = 0;
  internal::PeriodicTimer timer(service.get(), absl::Seconds(1), [&] {
    if (++runs == 1) throw std::runtime_error("flush failed");
  });
  EXPECT_NO_THROW(clock.Advance(absl::Seconds(1)));
  EXPECT_EQ(runs, 1);
  EXPECT_NO_THROW(clock.Advance(absl::Seconds(1)));
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(service->Pending(), 1u);
}

TEST(FakeTimerTest, PastTimerRunsOnNextAdvance) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  bool ran = false;
  service->Schedule(clock.Now() - absl::Seconds(1), [&] { ran = true; });
  EXPECT_FALSE(ran);
  clock.Advance(absl::ZeroDuration());
  EXPECT_TRUE(ran);
}

TEST(FakeTimerTest, BackwardJumpFiresNothing) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  bool ran = false;
  service->ScheduleAfter(absl::Seconds(1), [&] { ran = true; });
  clock.SetTime(clock.Now() - absl::Hours(1));
  EXPECT_FALSE(ran);
  clock.Advance(absl::Hours(1));
  EXPECT_FALSE(ran);
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(ran);
}

TEST(FakeTimerTest, BackwardJumpFiresNothingEvenIfAlreadyDue) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  bool ran = false;
  service->Schedule(clock.Now() - absl::Hours(2), [&] { ran = true; });
  clock.SetTime(clock.Now() - absl::Hours(1));  // still after the deadline, but backwards
  EXPECT_FALSE(ran);
  clock.Advance(absl::ZeroDuration());  // the next move that does not go back runs it
  EXPECT_TRUE(ran);
}

TEST(FakeTimerTest, DeadlineBetweenNanosecondsDoesNotFireEarly) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  const absl::Time deadline = clock.Now() + absl::Nanoseconds(0.5);
  bool ran = false;
  service->Schedule(deadline, [&] {
    EXPECT_GE(clock.Now(), deadline);
    ran = true;
  });
  clock.Advance(absl::ZeroDuration());
  EXPECT_FALSE(ran);
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(ran);
}

// Deadlines in one nanosecond run in deadline order and each as soon as it is due: the
// service keyed them by the nanosecond, in scheduling order, so "a" (10.75 ns, scheduled
// first) hid "b" (10.25 ns): at 10.5 ns nothing ran, and at 11 ns "a" ran before "b".
TEST(FakeTimerTest, DeadlinesInOneNanosecondRunInDeadlineOrder) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  auto service = *TimerService::Create({.clock = &clock});
  const absl::Duration quarter = absl::Nanoseconds(1) / 4;
  const absl::Time t0 = clock.Now();
  std::string order;
  service->Schedule(t0 + absl::Nanoseconds(10) + 3 * quarter, [&] { order += 'a'; });
  service->Schedule(t0 + absl::Nanoseconds(10) + quarter, [&] { order += 'b'; });
  service->Schedule(t0 + absl::Nanoseconds(10) + 2 * quarter, [&] { order += 'c'; });
  service->Schedule(t0 + absl::Nanoseconds(10) + quarter, [&] { order += 'd'; });
  clock.SetTime(t0 + absl::Nanoseconds(10) + 2 * quarter);
  EXPECT_EQ(order, "bdc");  // due ones only, by deadline, FIFO at equal ones
  clock.SetTime(t0 + absl::Nanoseconds(11));
  EXPECT_EQ(order, "bdca");
  // And when a later one is scheduled first, all due at one move: deadline order.
  order.clear();
  service->Schedule(t0 + absl::Nanoseconds(20) + 3 * quarter, [&] { order += 'x'; });
  service->Schedule(t0 + absl::Nanoseconds(20) + quarter, [&] { order += 'y'; });
  clock.SetTime(t0 + absl::Nanoseconds(30));
  EXPECT_EQ(order, "yx");
}

// Deadlines more than 73 years after the service was made share its one saturated key:
// they too run in deadline order, each when due (a later one scheduled first hid an
// earlier one until its own deadline). The test below starts its service at year 2286,
// where its deadlines stay inside the range.
TEST(FakeTimerTest, DeadlinesBeyondTheKeyRangeRunInDeadlineOrder) {
  FakeClock clock(absl::UnixEpoch());
  auto service = *TimerService::Create({.clock = &clock});
  const absl::Time far = absl::FromUnixSeconds(10'000'000'000);  // year 2286
  std::vector<int> order;
  service->Schedule(far + absl::Hours(2), [&] { order.push_back(2); });
  service->Schedule(far + absl::Hours(1), [&] { order.push_back(1); });
  clock.SetTime(far + absl::Minutes(59));
  EXPECT_TRUE(order.empty());
  clock.SetTime(far + absl::Hours(1));
  EXPECT_EQ(order, (std::vector<int>{1}));
  clock.SetTime(far + absl::Hours(2));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(FakeTimerTest, DeadlinesPastYear2262AreNotEarlyAndKeepTheirOrder) {
  FakeClock clock(absl::FromUnixSeconds(10'000'000'000));  // year 2286
  auto service = *TimerService::Create({.clock = &clock});
  std::vector<int> order;
  service->ScheduleAfter(absl::Hours(2), [&] { order.push_back(2); });
  service->ScheduleAfter(absl::Hours(1), [&] { order.push_back(1); });
  clock.Advance(absl::ZeroDuration());
  EXPECT_TRUE(order.empty());
  clock.Advance(absl::Minutes(59));
  EXPECT_TRUE(order.empty());
  clock.Advance(absl::Minutes(1));
  EXPECT_EQ(order, (std::vector<int>{1}));
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(FakeTimerTest, HugeDelaysSaturate) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  bool ran = false;
  const TimerId id = service->ScheduleAfter(absl::InfiniteDuration(), [&] { ran = true; });
  service->ScheduleAfter(absl::Hours(1e9), [&] {});
  clock.Advance(absl::Hours(24 * 365 * 100));
  EXPECT_FALSE(ran);
  EXPECT_TRUE(service->Cancel(id));
}

TEST(FakeTimerTest, ServiceDestroyedBeforeClockIsRemoved) {
  FakeClock clock;
  bool ran = false;
  {
    auto service = *TimerService::Create({.clock = &clock});
    service->ScheduleAfter(absl::Seconds(1), [&] { ran = true; });
  }
  clock.Advance(absl::Seconds(2));  // must not touch the destroyed service
  EXPECT_FALSE(ran);
}

TEST(FakeTimerTest, CallbackMayCreateAndDestroyServicesOnTheSameClock) {
  FakeClock clock;
  auto first = *TimerService::Create({.clock = &clock});
  auto doomed = *TimerService::Create({.clock = &clock});
  std::unique_ptr<TimerService> created;
  bool created_ran = false, doomed_ran = false;
  doomed->ScheduleAfter(absl::Seconds(2), [&] { doomed_ran = true; });
  first->ScheduleAfter(absl::Seconds(1), [&] {
    auto service = TimerService::Create({.clock = &clock});  // used to hang here
    ASSERT_TRUE(service.ok()) << service.status();
    created = std::move(service).value();
    created->Schedule(clock.Now(), [&] { created_ran = true; });
    doomed.reset();  // and here
  });
  clock.Advance(absl::Seconds(1));
  EXPECT_NE(created, nullptr);
  EXPECT_EQ(doomed, nullptr);
  EXPECT_FALSE(created_ran);  // a service created during a move sees the next one
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(created_ran);
  EXPECT_FALSE(doomed_ran);
}

// Runs `in_callback(clock, service)` inside a timer callback of a service on a FakeClock
// (for the death tests of what such a callback must not do).
template <typename Fn>
void FromFakeTimerCallback(Fn in_callback) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  service->ScheduleAfter(absl::Seconds(1), [&] { in_callback(clock, service); });
  clock.Advance(absl::Seconds(1));
}

TEST(FakeTimerDeathTest, CallbackMovingItsOwnClockFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(FromFakeTimerCallback([](FakeClock& clock, std::unique_ptr<TimerService>&) {
                 clock.Advance(absl::Seconds(1));
               }),
               "FakeClock::Advance called from inside one of its");
}

// Destroying a fake-clock service from its own callback used to free it under its own
// RunDue (a silent use-after-free); it now fails a check.
TEST(FakeTimerDeathTest, DestroyingTheServiceFromItsOwnCallbackFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(FromFakeTimerCallback(
                   [](FakeClock&, std::unique_ptr<TimerService>& service) { service.reset(); }),
               "TimerService destroyed from inside one of its own");
}

// A sleep on the fake clock from its callback could never end; it fails a check.
TEST(FakeTimerDeathTest, SleepingOnTheClockFromACallbackFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(FromFakeTimerCallback([](FakeClock& clock, std::unique_ptr<TimerService>&) {
                 clock.SleepFor(absl::Seconds(1));
               }),
               "FakeClock::SleepUntil called from inside one of its");
}

// A callback that throws leaves Advance with its exception; the service is left sound:
// CancelSync of that timer returns, and the timers still due run at the next move.
TEST(FakeTimerTest, CallbackExceptionLeavesTheServiceUsable) {
  FakeClock clock;
  auto service = *TimerService::Create({.clock = &clock});
  const TimerId thrower =
      service->ScheduleAfter(absl::Seconds(1), [] { throw std::runtime_error("boom"); });
  bool later_ran = false;
  service->ScheduleAfter(absl::Seconds(1), [&] { later_ran = true; });
  EXPECT_THROW(clock.Advance(absl::Seconds(1)), std::runtime_error);
  std::atomic<bool> returned{false};
  std::thread canceller([&] {
    service->CancelSync(thrower);  // used to wait for ever for the "running" callback
    returned = true;
  });
  for (int i = 0; i < 5000 && !returned.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool ok = returned.load();
  EXPECT_TRUE(ok) << "CancelSync waits for a callback that threw";
  if (ok) {
    canceller.join();
  } else {
    canceller.detach();  // failing anyway; do not hang the binary
    return;
  }
  EXPECT_FALSE(later_ran);
  clock.Advance(absl::ZeroDuration());
  EXPECT_TRUE(later_ran);
}

// One service's throwing callback does not keep the move from the other services on the
// same clock: their due timers still run in that Advance, which then rethrows.
TEST(FakeTimerTest, CallbackExceptionDoesNotStopOtherServicesTimers) {
  FakeClock clock;
  auto a = *TimerService::Create({.clock = &clock});
  auto b = *TimerService::Create({.clock = &clock});
  a->ScheduleAfter(absl::Seconds(1), [] { throw std::runtime_error("boom"); });
  bool b_ran = false;
  b->ScheduleAfter(absl::Seconds(1), [&] { b_ran = true; });
  EXPECT_THROW(clock.Advance(absl::Seconds(1)), std::runtime_error);
  EXPECT_TRUE(b_ran);
  EXPECT_EQ(b->Pending(), 0u);
}

TEST(FakeTimerTest, ManualClockRefusingObserversIsFailedPrecondition) {
  // A manual clock that keeps Clock's AddObserver, which refuses every observer.
  class DeafClock final : public Clock {
   public:
    absl::Time Now() const override { return absl::UnixEpoch(); }
    void SleepUntil(absl::Time) override {}
    bool is_manual() const override { return true; }
  } clock;
  auto service = TimerService::Create({.clock = &clock});
  EXPECT_EQ(service.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- backend selection ----

class EnvGuard {
 public:
  explicit EnvGuard(const char* value) {
    const char* old = getenv("KWQ_TIMER_BACKEND");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("KWQ_TIMER_BACKEND", value, 1);
  }
  ~EnvGuard() {
    if (had_) {
      setenv("KWQ_TIMER_BACKEND", old_.c_str(), 1);
    } else {
      unsetenv("KWQ_TIMER_BACKEND");
    }
  }

 private:
  bool had_;
  std::string old_;
};

TEST(TimerBackendTest, EnvironmentForcesPortable) {
  EnvGuard env("portable");
  auto service = TimerService::Create();
  ASSERT_TRUE(service.ok());
  EXPECT_EQ((*service)->backend(), TimerService::Backend::kPortable);
  EXPECT_EQ((*service)->backend_name(), "portable");
}

TEST(TimerBackendTest, ExplicitOptionBeatsEnvironment) {
  EnvGuard env("portable");
  auto service = TimerService::Create({.backend = TimerService::Backend::kIoUring});
  if (service.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "io_uring refused here: " << service.status();
  }
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_EQ((*service)->backend(), TimerService::Backend::kIoUring);
}

TEST(TimerBackendTest, ManualClockIgnoresTheBackendVariableAndOption) {
  EnvGuard env("epoll-please");  // would be InvalidArgument on a real clock
  FakeClock clock;
  auto service =
      TimerService::Create({.clock = &clock, .backend = TimerService::Backend::kIoUring});
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_EQ((*service)->backend(), TimerService::Backend::kPortable);
}

// Runs in a child process (EXPECT_EXIT), since Default() is created once per process.
void DefaultWithUnknownBackendVariable() {
  setenv("KWQ_TIMER_BACKEND", "epoll-please", 1);
  TimerService& service = TimerService::Default();
  if (service.backend() != TimerService::Backend::kPortable) _exit(4);
  std::latch done(1);
  service.ScheduleAfter(absl::Milliseconds(1), [&] { done.count_down(); });
  done.wait();
  _exit(0);
}

TEST(TimerBackendTest, DefaultFallsBackToPortableOnABadVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(DefaultWithUnknownBackendVariable(), ::testing::ExitedWithCode(0),
              "falling back to the portable backend");
}

TEST(TimerBackendTest, UnknownEnvironmentValueIsInvalidArgument) {
  EnvGuard env("epoll-please");
  auto service = TimerService::Create();
  EXPECT_EQ(service.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(service.status().message().find("epoll-please"), std::string::npos);
}

// Runs in a child process (EXPECT_EXIT): exits 0 when, with io_uring refused, kAuto falls
// back to the portable backend and works, and an explicit kIoUring is Unavailable.
void FallbackWhenIoUringRefused() {
  if (!testing::RefuseIoUring()) _exit(3);
  auto forced = TimerService::Create({.backend = TimerService::Backend::kIoUring});
  if (forced.ok() || forced.status().code() != absl::StatusCode::kUnavailable) _exit(4);
  unsetenv("KWQ_TIMER_BACKEND");
  auto service = TimerService::Create();
  if (!service.ok() || (*service)->backend() != TimerService::Backend::kPortable) _exit(5);
  std::latch done(1);
  (*service)->ScheduleAfter(absl::Milliseconds(1), [&] { done.count_down(); });
  done.wait();
  _exit(0);
}

TEST(TimerBackendTest, RefusedIoUringFallsBackToPortable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(FallbackWhenIoUringRefused(), ::testing::ExitedWithCode(0), "");
}

std::atomic<int> failed_io_uring_waits{0};
int FailIoUringWait() {
  ++failed_io_uring_waits;
  return -EBADF;
}

// Sets SetIoUringWaitHookForTest's hook for one scope.
class IoUringWaitHook {
 public:
  explicit IoUringWaitHook(int (*hook)()) { internal::SetIoUringWaitHookForTest(hook); }
  ~IoUringWaitHook() { internal::SetIoUringWaitHookForTest(nullptr); }
};

TEST(TimerBackendTest, FailingIoUringWaitFallsBackToTheConditionVariable) {
  absl::StatusOr<std::unique_ptr<internal::TimerWaiter>> waiter = internal::NewIoUringWaiter();
  if (!waiter.ok()) GTEST_SKIP() << waiter.status();
  failed_io_uring_waits = 0;
  IoUringWaitHook hook(&FailIoUringWait);
  RealClock& clock = *RealClock::Default();
  internal::Mutex mu;
  mu.Lock();
  // The waits below end early (a failure, a Wake) or the test fails: a 5 s deadline, so a
  // regression fails it instead of stalling the binary.
  const absl::Time start = clock.Now();
  (*waiter)->Wait(&mu, clock.Now() + absl::Seconds(5), clock);  // fails: returns at once
  EXPECT_EQ(failed_io_uring_waits.load(), 1);
  EXPECT_EQ((*waiter)->kind(), TimerService::Backend::kPortable);
  // From now on it waits on the condition variable: a Wake made before the Wait ends it
  // (not lost), and io_uring is not tried again, so the service thread cannot spin on it.
  (*waiter)->Wake();
  (*waiter)->Wait(&mu, clock.Now() + absl::Seconds(5), clock);
  (*waiter)->Wait(&mu, clock.Now() - absl::Seconds(1), clock);  // deadline passed
  mu.Unlock();
  EXPECT_LT(clock.Now() - start, absl::Seconds(4)) << "a wait ran to its deadline";
  EXPECT_EQ(failed_io_uring_waits.load(), 1);
}

TEST(TimerBackendTest, ServiceKeepsRunningTimersAfterIoUringFails) {
  failed_io_uring_waits = 0;
  IoUringWaitHook hook(&FailIoUringWait);
  auto service = TimerService::Create({.backend = TimerService::Backend::kIoUring});
  if (!service.ok() && service.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << service.status();
  }
  ASSERT_TRUE(service.ok()) << service.status();
  for (int i = 0; i < 3; ++i) {
    std::latch done(1);
    (*service)->ScheduleAfter(absl::Milliseconds(1), [&] { done.count_down(); });
    done.wait();
  }
  // Three 1 ms timers make the service wait at least once: that wait failed, and the
  // service went on (on the portable backend, as it now says) without trying again.
  EXPECT_EQ(failed_io_uring_waits.load(), 1);
  EXPECT_EQ((*service)->backend(), TimerService::Backend::kPortable);
}

TEST(TimerBackendTest, DefaultServiceWorks) {
  auto fired = std::make_shared<std::atomic<bool>>(false);
  TimerService::Default().ScheduleAfter(absl::Milliseconds(1), [fired] { *fired = true; });
  EXPECT_TRUE(testing::Eventually([&] { return fired->load(); }));
}

}  // namespace
}  // namespace kwq
