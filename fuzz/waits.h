// Waits: the model the delaying and rate-limiting queue fuzzers share of which keys wait
// for a delay (until when) and which are owed a run. On a FakeClock every timer due by the
// new time fires inside Advance, and the fuzzers' delays are whole milliseconds (past the
// queue's 50 us coalescing), so after each step the model is exact: a key whose wait ended
// is owed a run, and every hand-out must be owed (none early, none twice).

#ifndef KWQ_FUZZ_WAITS_H_
#define KWQ_FUZZ_WAITS_H_

#include <map>
#include <set>

#include "absl/time/time.h"
#include "fuzz_check.h"
#include "kwq/clock.h"

class Waits {
 public:
  explicit Waits(kwq::FakeClock* clock) : clock_(clock) {}

  // Add(k): k is owed a run now, and its wait (if any) ends.
  void AddNow(int k) {
    owed_.insert(k);
    waiting_.erase(k);
  }
  // AddAfter(k, d): with d <= 0, AddNow; else k waits until now + d, the earliest wins
  // (a key owed a run already does not wait as well).
  void AddAfter(int k, absl::Duration d) {
    if (d <= absl::ZeroDuration()) return AddNow(k);
    if (owed_.count(k) == 1) return;
    const absl::Time at = clock_->Now() + d;
    auto [it, inserted] = waiting_.emplace(k, at);
    if (!inserted && at < it->second) it->second = at;
  }
  // CancelAfter(k): ends k's wait; returns whether it waited.
  bool Cancel(int k) { return waiting_.erase(k) == 1; }
  // After the clock moved: every wait that ended is owed a run.
  void Advanced() {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->second <= clock_->Now()) {
        owed_.insert(it->first);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Ends every wait (time moved past every deadline).
  void EndAll() {
    for (const auto& [k, at] : waiting_) owed_.insert(k);
    waiting_.clear();
  }
  // A hand-out of k: it must be owed.
  void HandedOut(int k) {
    FUZZ_CHECK(owed_.count(k) == 1);
    owed_.erase(k);
  }

  size_t waiting() const { return waiting_.size(); }
  bool waits(int k) const { return waiting_.count(k) == 1; }
  bool owed(int k) const { return owed_.count(k) == 1; }
  bool nothing_owed() const { return owed_.empty(); }

 private:
  kwq::FakeClock* const clock_;
  std::set<int> owed_;                 // keys owed a run (ready, or to run after their Done)
  std::map<int, absl::Time> waiting_;  // keys waiting, until when
};

#endif  // KWQ_FUZZ_WAITS_H_
