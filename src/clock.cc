#include "kwq/clock.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <thread>

#include "internal/sleep_until.h"
#include "internal/tsc_timeline.h"
#include "kwq/internal/check.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace kwq {

namespace {

// Whether RealClock may read the TSC: an invariant TSC (CPUID 0x80000007, EDX bit 8) that
// the kernel itself uses for CLOCK_MONOTONIC (clocksource "tsc": it judged the counter
// synchronised across CPUs and stable), and KWQ_CLOCK is not "kernel".
bool TscUsable() {
#if defined(__x86_64__)
  if (const char* env = std::getenv("KWQ_CLOCK"); env != nullptr && std::string(env) == "kernel") {
    return false;
  }
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 8)) == 0) {
    return false;
  }
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(source >> name) && name == "tsc";
#else
  return false;
#endif
}

#if defined(__x86_64__)
using SystemTimeline = internal::TscTimeline<internal::SystemTimeSource>;
#else
struct SystemTimeline {  // never built: TscUsable() is false
  int64_t Now() { return 0; }
  double NanosPerTick() const { return 0; }
};
#endif

// The process's timeline, or null when the TSC is not used. Never destroyed.
SystemTimeline* MakeTimeline() {
#if defined(__x86_64__)
  if (!TscUsable()) return nullptr;
  static SystemTimeline* const timeline = new SystemTimeline();
  // A child forked while another thread resyncs would find the write section open (every
  // Now() spinning) or the lock taken for ever: hold the lock across fork().
  pthread_atfork([] { timeline->BeforeFork(); }, [] { timeline->AfterFork(); },
                 [] { timeline->AfterFork(); });
  return timeline;
#else
  return nullptr;
#endif
}

SystemTimeline* Timeline() {
  static SystemTimeline* const timeline = MakeTimeline();
  return timeline;
}

// Starts the calibration when the program starts, so that it is done (10 ms later) by the
// time a program's first timed work begins rather than during it.
[[maybe_unused]] const bool kCalibrationStarted = [] {
  if (SystemTimeline* timeline = Timeline()) timeline->Now();
  return true;
}();

int64_t KernelNanos() { return internal::SystemTimeSource().KernelNanos(); }

}  // namespace

namespace internal {
double SystemTscNanosPerTick() {
  SystemTimeline* timeline = Timeline();
  if (timeline == nullptr) return 0;
  // Calibrating: about 20 ms after the first read (two agreeing windows). Bounded: on a
  // machine whose windows never agree the timeline stays on clock_gettime, and the
  // caller measures the counter's rate itself.
  for (int i = 0; i < 1000 && timeline->NanosPerTick() == 0; ++i) {
    timeline->Now();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return timeline->NanosPerTick();
}
}  // namespace internal

bool RealClock::ReadsTsc() { return Timeline() != nullptr; }

bool Clock::AddObserver(ClockObserver*) { return false; }
void Clock::RemoveObserver(ClockObserver*) {}

RealClock* RealClock::Default() {
  static RealClock* const clock = new RealClock();
  return clock;
}

absl::Time RealClock::Now() const {
  SystemTimeline* timeline = Timeline();
  return absl::FromUnixNanos(timeline != nullptr ? timeline->Now() : KernelNanos());
}

absl::Time RealClock::CoarseNow() const {
  // The TSC timeline is within a microsecond of CLOCK_MONOTONIC, not exactly on it, so
  // the kernel's coarse clock could be ahead of it; and it costs little more.
  if (Timeline() != nullptr) return Now();
  // CLOCK_MONOTONIC as of the last kernel tick.
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return absl::UnixEpoch() + absl::DurationFromTimespec(ts);
}

void RealClock::SleepUntil(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
  }
  internal::SleepUntilReached(
      deadline, [this] { return Now(); },
      [](absl::Duration left) { std::this_thread::sleep_for(absl::ToChronoNanoseconds(left)); });
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

FakeClock::~FakeClock() = default;

absl::Time FakeClock::Now() const {
  internal::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepUntil(absl::Time deadline) {
  internal::MutexLock lock(&mu_);
  KWQ_CHECK(now_ >= deadline || !CalledByObserver(),
            "FakeClock::SleepUntil called from inside one of its observers (a timer callback) "
            "for a time still ahead; no other thread can move the clock before it returns.");
  if (now_ >= deadline) return;
  // Listed so a move to or past `deadline` marks it due under mu_: the clock may be set
  // back before this thread wakes, and re-reading now_ alone would then sleep on through
  // a move that reached the deadline.
  Sleeper me{.deadline = deadline, .next = sleepers_head_};
  if (me.next != nullptr) me.next->prev = &me;
  sleepers_head_ = &me;
  ++sleepers_;
  while (!me.due && now_ < deadline) moved_.Wait(&mu_);
  --sleepers_;
  if (me.prev != nullptr) {
    me.prev->next = me.next;
  } else {
    sleepers_head_ = me.next;
  }
  if (me.next != nullptr) me.next->prev = me.prev;
}

void FakeClock::Advance(absl::Duration d) {
  KWQ_CHECK(!CalledByObserver(),
            "FakeClock::Advance called from inside one of its observers (a timer callback "
            "moving its own clock); the move in progress cannot finish first. Move the "
            "clock from the test's thread.");
  internal::MutexLock move_lock(&move_mu_);
  absl::Time target;
  {
    internal::MutexLock lock(&mu_);
    target = now_ + std::max(d, absl::ZeroDuration());
  }
  MoveTo(target);
}

void FakeClock::SetTime(absl::Time t) {
  KWQ_CHECK(!CalledByObserver(),
            "FakeClock::SetTime called from inside one of its observers (a timer callback "
            "moving its own clock); the move in progress cannot finish first. Move the "
            "clock from the test's thread.");
  internal::MutexLock move_lock(&move_mu_);
  MoveTo(t);
}

void FakeClock::MoveTo(absl::Time t) {
  // Called with move_mu_ held (by Advance/SetTime).
  absl::Time from;
  {
    internal::MutexLock lock(&mu_);
    from = now_;
    now_ = t;
    if (t >= from) {
      for (Sleeper* s = sleepers_head_; s != nullptr; s = s->next) {
        if (s->deadline <= t) s->due = true;
      }
    }
  }
  // Going back, nothing comes due that was not due before: no sleeper wakes, and the
  // observers are not told, so no timer fires (a timer already due runs at the next
  // move that does not go back, such as Advance(absl::ZeroDuration())).
  if (t < from) return;
  moved_.SignalAll();
  // Observers may add and remove observers (FakeClock::AddObserver/RemoveObserver see
  // mover_): one added now is first called for the next move (the loop stops at the
  // old size), one removed now is nulled here and erased below.
  // An observer's exception (a timer callback's) does not keep the move from the other
  // observers: the first one is rethrown once every observer was told.
  std::exception_ptr thrown;
  mover_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  const size_t n = observers_.size();
  for (size_t i = 0; i < n; ++i) {
    if (ClockObserver* observer = observers_[i]) {
      try {
        observer->OnClockMoved(t);
      } catch (...) {
        if (!thrown) thrown = std::current_exception();
      }
    }
  }
  mover_.store(std::thread::id(), std::memory_order_relaxed);
  if (removed_ > 0) CompactObservers();
  if (thrown) std::rethrow_exception(thrown);
}

void FakeClock::CompactObservers() {
  std::erase(observers_, nullptr);
  for (size_t i = 0; i < observers_.size(); ++i) index_.find(observers_[i])->second = i;
  removed_ = 0;
}

size_t FakeClock::NumSleepers() const {
  internal::MutexLock lock(&mu_);
  return sleepers_;
}

bool FakeClock::AddObserver(ClockObserver* observer) {
  if (observer == nullptr) return false;  // nothing to call (and null marks removed entries)
  auto add = [this, observer] {
    move_mu_.AssertHeld();
    if (index_.contains(observer)) return;
    observers_.push_back(observer);  // may throw: before index_ changes
    try {
      index_.emplace(observer, observers_.size() - 1);
    } catch (...) {
      observers_.pop_back();
      throw;
    }
  };
  if (CalledByObserver()) {
    move_mu_.AssertHeld();  // by this thread, in MoveTo, which calls `observer` from the next move
    add();
    return true;
  }
  internal::MutexLock move_lock(&move_mu_);
  add();
  return true;
}

void FakeClock::RemoveObserver(ClockObserver* observer) {
  if (observer == nullptr) return;
  auto remove = [this, observer] {
    move_mu_.AssertHeld();
    const auto it = index_.find(observer);
    if (it == index_.end()) return;
    observers_[it->second] = nullptr;
    index_.erase(it);
    ++removed_;
  };
  if (CalledByObserver()) {
    move_mu_.AssertHeld();  // by this thread, in MoveTo, which compacts the list afterwards
    remove();
    return;
  }
  internal::MutexLock move_lock(&move_mu_);
  remove();
  if (2 * removed_ > observers_.size()) CompactObservers();
}

}  // namespace kwq
