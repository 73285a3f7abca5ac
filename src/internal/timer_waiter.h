// How a TimerService thread sleeps until its next deadline: the backend seam.

#ifndef KWQ_SRC_INTERNAL_TIMER_WAITER_H_
#define KWQ_SRC_INTERNAL_TIMER_WAITER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/internal/mutex.h"
#include "kwq/timer.h"

namespace kwq::internal {

class TimerWaiter {
 public:
  virtual ~TimerWaiter() = default;
  // Called by the service thread with `*mu` held. Releases it while sleeping and holds it
  // again on return. Returns once `deadline` (read on `clock`) has passed, after Wake(),
  // or spuriously; the caller re-checks.
  virtual void Wait(Mutex* mu, absl::Time deadline, const Clock& clock)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // Ends the current or next Wait early. Any thread, with or without `*mu`. A Wake that
  // comes before the Wait it targets is not lost.
  virtual void Wake() = 0;
  virtual TimerService::Backend kind() const = 0;
};

std::unique_ptr<TimerWaiter> NewPortableWaiter();
// Unavailable (with the reason) when io_uring cannot be used in this process. If waiting
// on the ring fails later (io_uring_enter failing with anything but ETIME or EINTR), the
// waiter reports it once on stderr and waits on a condition variable from then on; its
// kind() then says kPortable.
absl::StatusOr<std::unique_ptr<TimerWaiter>> NewIoUringWaiter();

// Tests: while `hook` is set, every io_uring waiter calls it instead of
// io_uring_submit_and_wait_timeout and takes its result (a negative errno fakes a failing
// io_uring_enter). nullptr restores the real call. Any thread.
void SetIoUringWaitHookForTest(int (*hook)());

// The time left until `deadline`, clamped to [0, 1 day]: waits are re-armed at least daily
// so a far deadline never overflows a kernel timespec.
absl::Duration TimeLeft(absl::Time deadline, const Clock& clock);

}  // namespace kwq::internal

#endif  // KWQ_SRC_INTERNAL_TIMER_WAITER_H_
