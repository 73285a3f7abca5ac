// io_uring TimerService backend (liburing).
//
// One read of an eventfd stays posted on a private ring; Wake() writes the eventfd. The
// service thread waits in io_uring_enter with the time to its next deadline passed as the
// wait timeout (IORING_FEAT_EXT_ARG), so arming a deadline costs no extra submission.

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "internal/timer_waiter.h"

namespace kwq::internal {
namespace {

constexpr uint64_t kEventfdRead = 1;

class IoUringWaiter final : public TimerWaiter {
 public:
  IoUringWaiter() = default;
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
    const absl::Duration left = TimeLeft(deadline, clock);
    if (left <= absl::ZeroDuration()) return;
    mu->Unlock();
    if (!read_posted_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_read(sqe, efd_, &efd_value_, sizeof(efd_value_), 0);
      io_uring_sqe_set_data64(sqe, kEventfdRead);
      read_posted_ = true;
    }
    __kernel_timespec ts;
    ts.tv_sec = absl::ToInt64Seconds(left);
    ts.tv_nsec = absl::ToInt64Nanoseconds(left - absl::Seconds(ts.tv_sec));
    io_uring_cqe* cqe = nullptr;
    // -ETIME (deadline reached) and -EINTR are normal; the caller re-checks either way.
    io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      if (io_uring_cqe_get_data64(cqe) == kEventfdRead) read_posted_ = false;
      io_uring_cqe_seen(&ring_, cqe);
    }
    mu->Lock();
  }

  void Wake() override {
    const uint64_t one = 1;
    // The eventfd counter cannot overflow in practice (2^64 - 2 wakes); EINTR is retried.
    while (write(efd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  TimerService::Backend kind() const override { return TimerService::Backend::kIoUring; }

 private:
  // Set up by Init, then touched only by the service thread (Wait); efd_ is read-only
  // after Init and written to by Wake from any thread.
  io_uring ring_{};
  bool ring_ready_ = false;
  int efd_ = -1;
  uint64_t efd_value_ = 0;  // written by the kernel when the read completes
  bool read_posted_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TimerWaiter>> NewIoUringWaiter() {
  auto waiter = std::make_unique<IoUringWaiter>();
  if (absl::Status status = waiter->Init(); !status.ok()) return status;
  return waiter;
}

}  // namespace kwq::internal
