// PausePoints: the workqueue test hooks (include/kwq/internal/test_hooks.h) as a test uses them.
//
// Arm(point, subject) stops the first thread that reaches `point` with `subject` after
// the call; the test waits for it with WaitPaused and lets it go with Resume. Every other
// arrival passes, and is counted: WaitSeen waits until `point` was reached with
// `subject` at least once (from any thread). The waits are bounded only so that a broken
// promise fails the test instead of hanging it. Built on std::mutex, which TSan
// understands (Debian's Abseil is not instrumented).
//
// Let every paused thread go before the PausePoints dies (~ScopedTestHooks waits for the
// threads inside At()).

#ifndef KWQ_TESTS_TESTING_PAUSE_POINTS_H_
#define KWQ_TESTS_TESTING_PAUSE_POINTS_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "kwq/internal/test_hooks.h"

namespace kwq::testing {

class PausePoints : public internal::TestHooks {
 public:
  using Point = internal::HookPoint;

  // One armed stop.
  class Pause {
   public:
    // Whether a thread stopped here within `limit`.
    bool WaitPaused(absl::Duration limit = absl::Seconds(5)) {
      std::unique_lock<std::mutex> lock(owner_->mu_);
      return owner_->cv_.wait_for(lock, absl::ToChronoNanoseconds(limit),
                                  [this] { return paused_; });
    }
    // Lets the stopped thread (or the one that will stop here) go on.
    void Resume() {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      resumed_ = true;
      owner_->cv_.notify_all();
    }

   private:
    friend class PausePoints;
    Pause(PausePoints* owner, Point point, const void* subject)
        : owner_(owner), point_(point), subject_(subject) {}
    PausePoints* const owner_;
    const Point point_;
    const void* const subject_;
    bool taken_ = false;  // guarded by owner_->mu_, as the two below
    bool paused_ = false;
    bool resumed_ = false;
  };

  PausePoints() : installed_(this) {}

  Pause& Arm(Point point, const void* subject) {
    std::lock_guard<std::mutex> lock(mu_);
    pauses_.push_back(std::unique_ptr<Pause>(new Pause(this, point, subject)));
    return *pauses_.back();
  }

  // How often `point` was reached with `subject`.
  int Seen(Point point, const void* subject) {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_[{point, subject}];
  }
  bool WaitSeen(Point point, const void* subject, absl::Duration limit = absl::Seconds(5)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(limit), [&] {
      return seen_[{point, subject}] > 0;
    });
  }

  void At(Point point, const void* subject) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++seen_[{point, subject}];
    cv_.notify_all();
    for (size_t i = 0; i < pauses_.size(); ++i) {
      Pause* p = pauses_[i].get();  // stays put while Arm grows pauses_
      if (p->taken_ || p->point_ != point || p->subject_ != subject) continue;
      p->taken_ = true;
      p->paused_ = true;
      cv_.notify_all();
      cv_.wait(lock, [p] { return p->resumed_; });
      return;
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Pause>> pauses_;
  std::map<std::pair<Point, const void*>, int> seen_;
  internal::ScopedTestHooks installed_;  // last: uninstalled before the rest goes
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_PAUSE_POINTS_H_
