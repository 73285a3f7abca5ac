// io_uring TimerService backend (liburing).
//
// One read of an eventfd stays posted on a private ring; Wake() writes the eventfd. The
// service thread waits in io_uring_enter with the time to its next deadline passed as the
// wait timeout (IORING_FEAT_EXT_ARG), so arming a deadline costs no extra submission.
//
// If io_uring_enter fails with anything but ETIME (the timeout) or EINTR, or the eventfd
// read completes with an error, the waiter says so once on stderr and waits on a
// condition variable (the portable backend) for the rest of its life: retrying would
// return at once every time, and the service thread would spin.

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "internal/timer_waiter.h"

namespace kwq::internal {
namespace {

constexpr uint64_t kEventfdRead = 1;

// SetIoUringWaitHookForTest's hook, or null: io_uring_submit_and_wait_timeout itself.
std::atomic<int (*)()> wait_hook{nullptr};

class IoUringWaiter final : public TimerWaiter {
 public:
  IoUringWaiter() : fallback_(NewPortableWaiter()) {}
  ~IoUringWaiter() override {
    if (ring_ready_) io_uring_queue_exit(&ring_);
    if (efd_ >= 0) close(efd_);
  }

  // Sets up the ring and the eventfd; Unavailable (with the reason) when refused.
  absl::Status Init() {
    const int rc = io_uring_queue_init(4, &ring_, 0);
    if (rc < 0) {
      return absl::UnavailableError(
          absl::StrCat("io_uring_queue_init failed: ", std::strerror(-rc)));
    }
    ring_ready_ = true;
    if (!(ring_.features & IORING_FEAT_EXT_ARG)) {
      return absl::UnavailableError("io_uring lacks IORING_FEAT_EXT_ARG (Linux < 5.11)");
    }
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    const bool can_read = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ);
    if (probe != nullptr) io_uring_free_probe(probe);
    if (!can_read) return absl::UnavailableError("io_uring does not support IORING_OP_READ");
    efd_ = eventfd(0, EFD_CLOEXEC);
    if (efd_ < 0) {
      return absl::UnavailableError(absl::StrCat("eventfd failed: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  void Wait(Mutex* mu, absl::Time deadline, const Clock& clock) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (failed_.load(std::memory_order_relaxed)) {  // only this thread stores it
      fallback_->Wait(mu, deadline, clock);
      return;
    }
    const absl::Duration left = TimeLeft(deadline, clock);
    if (left <= absl::ZeroDuration()) return;
    mu->Unlock();
    int rc = 0;
    if (!read_posted_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        rc = -EBUSY;  // cannot happen with one read in flight on a ring of four
      } else {
        io_uring_prep_read(sqe, efd_, &efd_value_, sizeof(efd_value_), 0);
        io_uring_sqe_set_data64(sqe, kEventfdRead);
        read_posted_ = true;  // the kernel takes it from the ring at the next enter
      }
    }
    if (rc == 0) {
      __kernel_timespec ts;
      ts.tv_sec = absl::ToInt64Seconds(left);
      ts.tv_nsec = absl::ToInt64Nanoseconds(left - absl::Seconds(ts.tv_sec));
      io_uring_cqe* cqe = nullptr;
      int (*hook)() = wait_hook.load(std::memory_order_relaxed);
      rc = hook != nullptr ? hook()
                           : io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
      // -ETIME (deadline reached) and -EINTR are normal; the caller re-checks either way.
      if (rc == -ETIME || rc == -EINTR) rc = 0;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        if (io_uring_cqe_get_data64(cqe) == kEventfdRead) {
          read_posted_ = false;
          if (cqe->res < 0 && rc >= 0) rc = cqe->res;
        }
        io_uring_cqe_seen(&ring_, cqe);
      }
    }
    if (rc < 0) FallBack(rc);
    mu->Lock();
  }

  void Wake() override {
    // A Wake that reads failed_ as false while Wait falls back is not lost: it changed
    // the service's state under the service mutex before it got here, and Wait stores
    // failed_ before it takes that mutex again, so either the service thread sees the
    // change before it sleeps, or this load, made after the thread released the mutex
    // once more, sees true. Relaxed is enough: the mutex orders the two.
    if (failed_.load(std::memory_order_relaxed)) {
      fallback_->Wake();
      return;
    }
    const uint64_t one = 1;
    // The eventfd counter cannot overflow in practice (2^64 - 2 wakes); EINTR is retried.
    while (write(efd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  TimerService::Backend kind() const override {
    return failed_.load(std::memory_order_relaxed) ? TimerService::Backend::kPortable
                                                   : TimerService::Backend::kIoUring;
  }

 private:
  // io_uring stopped working (`error` is a negative errno): every later Wait and Wake
  // goes to the condition variable. Called by the service thread, without the mutex.
  void FallBack(int error) {
    std::fprintf(stderr,
                 "kwq: timer service: io_uring wait failed (%s); waiting on a condition "
                 "variable from now on\n",
                 std::strerror(-error));
    failed_.store(true, std::memory_order_relaxed);
  }

  // Set up by Init, then touched only by the service thread (Wait); efd_ is read-only
  // after Init and written to by Wake from any thread.
  io_uring ring_{};
  bool ring_ready_ = false;
  int efd_ = -1;
  uint64_t efd_value_ = 0;  // written by the kernel when the read completes
  bool read_posted_ = false;
  // The portable waiter, used once io_uring has failed. Read-only after construction.
  const std::unique_ptr<TimerWaiter> fallback_;
  // Set once, by the service thread (FallBack), never cleared; read by Wake and kind()
  // on any thread (see Wake for why relaxed suffices).
  std::atomic<bool> failed_{false};
};

}  // namespace

void SetIoUringWaitHookForTest(int (*hook)()) { wait_hook.store(hook, std::memory_order_relaxed); }

absl::StatusOr<std::unique_ptr<TimerWaiter>> NewIoUringWaiter() {
  auto waiter = std::make_unique<IoUringWaiter>();
  if (absl::Status status = waiter->Init(); !status.ok()) return status;
  return waiter;
}

}  // namespace kwq::internal
