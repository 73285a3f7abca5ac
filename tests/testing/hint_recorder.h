// HintRecorder<T>: a rate limiter for tests that limits nothing (every delay is zero, no
// failures are kept) and records the RateLimiter::Prefetch hints it is given, so a test
// can check which items a queue names as next in line. StoredHash(key) is the hint a
// queue gives for `key`: the 32 bits its key table keeps of its absl::Hash (FoldHash).
// Thread-safe.

#ifndef KWQ_TESTS_TESTING_HINT_RECORDER_H_
#define KWQ_TESTS_TESTING_HINT_RECORDER_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "kwq/internal/spread_hash.h"
#include "kwq/rate_limiter.h"

namespace kwq::testing {

template <typename T>
class HintRecorder final : public RateLimiter<T> {
 public:
  absl::Duration When(const T&) override { return absl::ZeroDuration(); }
  void Forget(const T&) override {}
  int NumRequeues(const T&) override { return 0; }
  void Prefetch(uint32_t hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    hints_.push_back(hash);
  }

  // The hints so far, in order.
  std::vector<uint32_t> Hints() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hints_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<uint32_t> hints_;
};

inline uint32_t StoredHash(const std::string& key) {
  return internal::FoldHash(absl::Hash<std::string>{}(key));
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_HINT_RECORDER_H_
