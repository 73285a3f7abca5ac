#include "kwq/timer.h"

#include <pthread.h>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/timer_heap.h"
#include "internal/timer_waiter.h"
#include "kwq/internal/check.h"
#include "kwq/internal/mutex.h"

namespace kwq {
namespace internal {

// The state behind a TimerService. With a waiter it runs a service thread; without one
// (manual clock) it is driven by OnClockMoved.
class TimerCore final : public ClockObserver {
 public:
  TimerCore(Clock* clock, std::unique_ptr<TimerWaiter> waiter)
      : clock_(clock), waiter_(std::move(waiter)), heap_(clock->Now()) {}

  absl::Status Start() {
    if (waiter_ == nullptr) {
      // Nothing else would ever run the timers of a clock that refuses observers.
      if (!clock_->AddObserver(this)) {
        return absl::FailedPreconditionError(
            "TimerService: the manual clock does not accept observers (Clock::AddObserver "
            "returned false), so its timers could never run");
      }
      observing_ = true;
      return absl::OkStatus();
    }
    try {
      thread_ = std::thread([this] { Loop(); });
    } catch (const std::system_error& e) {
      return absl::InternalError(absl::StrCat("cannot start timer thread: ", e.what()));
    }
    return absl::OkStatus();
  }

  ~TimerCore() override {
    if (observing_) {
      {
        MutexLock lock(&mu_);
        // RemoveObserver below would not wait (the move in progress is this thread's),
        // and RunDue would then go on in a freed service.
        KWQ_CHECK(running_thread_ != std::this_thread::get_id(),
                  "TimerService destroyed from inside one of its own callbacks");
      }
      clock_->RemoveObserver(this);  // waits for an Advance in progress (on other threads)
    } else if (thread_.joinable()) {
      {
        MutexLock lock(&mu_);
        stopping_ = true;
      }
      waiter_->Wake();
      thread_.join();
    }
    TimerHeap doomed;  // destroyed after the lock is released: callbacks' captures may
    {                  // call back into this service (Cancel) from their destructors
      MutexLock lock(&mu_);
      stopping_ = true;
      std::swap(doomed, heap_);
    }
  }

  // `fn` by reference: it is read (moved into the heap) only under the lock, after the
  // caller's stores that built it have drained (no store-forwarding stall).
  TimerId Schedule(absl::Time deadline, TimerHeap::Fn&& fn) {
    return ScheduleWith(deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return heap_.Insert(deadline, std::move(fn));
    });
  }
  TimerId ScheduleRaw(absl::Time deadline, void (*fn)(void*), void* arg) {
    return ScheduleWith(deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return heap_.InsertRaw(deadline, fn, arg);
    });
  }

  // Inserts with `insert` (called under mu_) and wakes the service thread when the new
  // timer is the earliest.
  template <typename Insert>
  TimerId ScheduleWith(absl::Time deadline, Insert insert) {
    bool wake = false;
    TimerId id;
    {
      MutexLock lock(&mu_);
      id = insert();
      if (deadline < armed_) {
        armed_ = deadline;
        wake = true;
      }
    }
    if (wake && waiter_ != nullptr) waiter_->Wake();
    return id;
  }

  // The cancelled callback is destroyed after the lock is released (declared first): its
  // captures' destructors may call back into this service (a Context's last handle
  // cancels its deadline timer), which would deadlock on mu_.
  bool Cancel(TimerId id) {
    TimerHeap::Callback doomed;
    MutexLock lock(&mu_);
    return heap_.Remove(id, &doomed);
  }

  bool CancelSync(TimerId id) {
    // Id 0 is never a timer's, and running_id_ reads 0 while no callback runs: waiting
    // for it to change hung for ever.
    if (id == 0) return false;
    TimerHeap::Callback doomed;
    MutexLock lock(&mu_);
    if (heap_.Remove(id, &doomed)) return true;
    while (running_id_ == id && running_thread_ != std::this_thread::get_id()) {
      running_done_.Wait(&mu_);
    }
    return false;
  }

  bool Reschedule(TimerId id, absl::Time deadline) {
    bool wake = false;
    {
      MutexLock lock(&mu_);
      if (!heap_.Update(id, deadline)) return false;
      if (deadline < armed_) {
        armed_ = deadline;
        wake = true;
      }
    }
    if (wake && waiter_ != nullptr) waiter_->Wake();
    return true;
  }

  size_t Pending() const {
    MutexLock lock(&mu_);
    return heap_.size();
  }

  // A callback's exception leaves the move (Advance/SetTime) after the service's state is
  // restored; the timers still due run at the next move.
  void OnClockMoved(absl::Time now) override {
    mu_.Lock();
    std::exception_ptr thrown = RunDue(now);
    mu_.Unlock();
    if (thrown) std::rethrow_exception(thrown);
  }

  Clock& clock() const { return *clock_; }
  TimerService::Backend backend() const {
    return waiter_ == nullptr ? TimerService::Backend::kPortable : waiter_->kind();
  }

 private:
  // Runs every timer due at `now`, one at a time, without the lock while each runs. A
  // callback that throws stops the run: its exception is returned (the record of the
  // running callback cleared first, so CancelSync does not wait for it for ever).
  std::exception_ptr RunDue(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t id;
    TimerHeap::Callback fn;
    while (!stopping_ && heap_.PopDue(now, &id, &fn)) {
      running_id_ = id;
      running_thread_ = std::this_thread::get_id();
      mu_.Unlock();
      std::exception_ptr thrown;
      try {
        fn();
      } catch (...) {
        thrown = std::current_exception();
      }
      fn.Reset();  // destroy captured state outside the lock too
      mu_.Lock();
      running_id_ = 0;
      running_thread_ = std::thread::id();
      running_done_.SignalAll();
      if (thrown) return thrown;
    }
    return nullptr;
  }

  void Loop() {
    pthread_setname_np(pthread_self(), "kwq-timer");
    // The default 50 us timer slack would be added to every wait of the portable backend.
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    mu_.Lock();
    while (!stopping_) {
      armed_ = absl::InfinitePast();  // awake: nobody needs to wake us
      // A real clock's callbacks must not throw: as on any thread, that terminates.
      if (std::exception_ptr thrown = RunDue(clock_->Now())) std::rethrow_exception(thrown);
      if (stopping_) break;
      const absl::Time now = clock_->Now();
      armed_ = heap_.NextDeadline(now);
      if (armed_ <= now) continue;
      waiter_->Wait(&mu_, armed_, *clock_);
    }
    mu_.Unlock();
  }

  Clock* const clock_;                         // I: set at construction
  const std::unique_ptr<TimerWaiter> waiter_;  // I: null for a manual clock
  std::thread thread_;                         // I: started by Start, joined by ~TimerCore
  bool observing_ = false;                     // I: set by Start once the clock took us

  mutable Mutex mu_;
  CondVar running_done_;
  TimerHeap heap_ ABSL_GUARDED_BY(mu_);
  // The deadline the service thread sleeps until; InfinitePast while it is awake, so
  // Schedule wakes it only for a new earliest deadline.
  absl::Time armed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t running_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread::id running_thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

namespace {

absl::StatusOr<TimerService::Backend> BackendFromEnv(TimerService::Backend requested) {
  if (requested != TimerService::Backend::kAuto) return requested;
  const char* env = std::getenv("KWQ_TIMER_BACKEND");
  if (env == nullptr || *env == '\0') return requested;
  const std::string value(env);
  if (value == "auto") return TimerService::Backend::kAuto;
  if (value == "portable") return TimerService::Backend::kPortable;
  if (value == "io_uring") return TimerService::Backend::kIoUring;
  return absl::InvalidArgumentError(
      absl::StrCat("KWQ_TIMER_BACKEND='", value, "' is not one of: auto, portable, io_uring"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TimerService>> TimerService::Create(Options options) {
  Clock* clock = options.clock != nullptr ? options.clock : RealClock::Default();
  std::unique_ptr<internal::TimerWaiter> waiter;
  // A manual clock drives the timers itself: no thread, no backend.
  if (!clock->is_manual()) {
    absl::StatusOr<Backend> backend = BackendFromEnv(options.backend);
    if (!backend.ok()) return backend.status();
    if (*backend != Backend::kPortable) {
      absl::StatusOr<std::unique_ptr<internal::TimerWaiter>> uring = internal::NewIoUringWaiter();
      if (uring.ok()) {
        waiter = std::move(*uring);
      } else if (*backend == Backend::kIoUring) {
        return uring.status();
      }
    }
    if (waiter == nullptr) waiter = internal::NewPortableWaiter();
  }
  auto core = std::make_unique<internal::TimerCore>(clock, std::move(waiter));
  if (absl::Status status = core->Start(); !status.ok()) return status;
  return std::unique_ptr<TimerService>(new TimerService(std::move(core)));
}

TimerService& TimerService::Default() {
  static TimerService* const service = [] {
    absl::StatusOr<std::unique_ptr<TimerService>> s = Create();
    if (!s.ok()) {
      std::fprintf(stderr, "kwq: default timer service: %s; falling back to the portable backend\n",
                   s.status().ToString().c_str());
      Options options;
      options.backend = Backend::kPortable;
      s = Create(options);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "kwq: cannot start the default timer service: %s\n",
                   s.status().ToString().c_str());
      std::abort();
    }
    return s->release();
  }();
  return *service;
}

TimerService::TimerService(std::unique_ptr<internal::TimerCore> core) : core_(std::move(core)) {}
TimerService::~TimerService() = default;

namespace {
// What a timer with an empty callable (or a null function) runs.
void RunNothing(void*) {}
}  // namespace

TimerId TimerService::Schedule(absl::Time deadline, absl::AnyInvocable<void()> fn) {
  if (!fn) return core_->ScheduleRaw(deadline, &RunNothing, nullptr);
  return core_->Schedule(deadline, std::move(fn));
}

TimerId TimerService::ScheduleAfter(absl::Duration delay, absl::AnyInvocable<void()> fn) {
  return Schedule(core_->clock().Now() + delay, std::move(fn));
}

TimerId TimerService::Schedule(absl::Time deadline, void (*fn)(void*), void* arg) {
  return core_->ScheduleRaw(deadline, fn != nullptr ? fn : &RunNothing, arg);
}

bool TimerService::Cancel(TimerId id) { return core_->Cancel(id); }
bool TimerService::CancelSync(TimerId id) { return core_->CancelSync(id); }
bool TimerService::Reschedule(TimerId id, absl::Time deadline) {
  return core_->Reschedule(id, deadline);
}
size_t TimerService::Pending() const { return core_->Pending(); }
Clock& TimerService::clock() const { return core_->clock(); }
TimerService::Backend TimerService::backend() const { return core_->backend(); }

std::string_view TimerService::backend_name() const {
  return backend() == Backend::kIoUring ? "io_uring" : "portable";
}

}  // namespace kwq
