// A client-go style controller on kwq: a RateLimitingQueue fed by an "informer", two
// workers reconciling keys, failed reconciles retried with exponential backoff, and a
// drained shutdown within a grace period. Prints what happened; exits non-zero if a key
// was lost.
//
//   informer ──Add──► RateLimitingQueue ──Get──► worker 1, worker 2
//                         ▲                        │
//                         └──AddRateLimited────────┘ (reconcile failed: back off)

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kwq/context.h"
#include "kwq/rate_limiter.h"
#include "kwq/rate_limiting_queue.h"

namespace {

// The "cluster": how many times each object still fails to reconcile (a flaky API).
class FakeCluster {
 public:
  explicit FakeCluster(int objects) {
    for (int i = 0; i < objects; ++i) failures_left_[Key(i)] = i % 4;  // 0..3 failures
  }
  static std::string Key(int i) { return absl::StrCat("default/object-", i); }

  absl::Status Reconcile(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ++reconciles_;
    int& left = failures_left_[key];
    if (left > 0) {
      --left;
      return absl::UnavailableError("conflict, try again");
    }
    converged_[key] = true;
    return absl::OkStatus();
  }
  int reconciles() {
    std::lock_guard<std::mutex> lock(mu_);
    return reconciles_;
  }
  int converged() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(converged_.size());
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> failures_left_;
  std::map<std::string, bool> converged_;
  int reconciles_ = 0;
};

}  // namespace

int main() {
  constexpr int kObjects = 200;
  FakeCluster cluster(kObjects);

  // client-go's ItemExponentialFailureRateLimiter(1 ms, 50 ms): short, for a demo.
  auto limiter = *kwq::ExponentialFailureRateLimiter<std::string>::Create(
      {.base = absl::Milliseconds(1), .max = absl::Milliseconds(50)});
  kwq::RateLimitingQueue<std::string> queue(std::move(limiter), {.name = "example"});

  std::atomic<int> retries{0}, max_requeues{0};
  auto worker = [&] {
    while (auto lease = queue.Get()) {  // nullopt once shut down and drained
      const std::string& key = **lease;
      if (cluster.Reconcile(key).ok()) {
        queue.Forget(key);  // success: reset its backoff
      } else {
        ++retries;
        queue.AddRateLimited(key);  // runs again after 1, 2, 4... ms
        const int n = queue.NumRequeues(key);
        for (int m = max_requeues.load(); n > m && !max_requeues.compare_exchange_weak(m, n);) {
        }
      }
    }  // the lease ends here: Done (also on an early return or an exception)
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) workers.emplace_back(worker);

  // The informer: every object, some twice (an update while the first is queued merges).
  for (int i = 0; i < kObjects; ++i) queue.Add(FakeCluster::Key(i));
  for (int i = 0; i < kObjects; i += 3) queue.Add(FakeCluster::Key(i));

  // Wait until everything converged (retries are delayed; a lost key would never
  // converge, so the wait gives up after a minute), then drain and stop, giving the
  // workers a grace period of 30 s to finish (a drain past it returns false).
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (cluster.converged() < kObjects && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto [grace, cancel] = kwq::WithTimeout(kwq::Background(), absl::Seconds(30));
  const bool drained = queue.ShutDownWithDrain(grace);
  cancel();  // frees the grace period's timer now (Go's defer cancel())
  for (auto& t : workers) t.join();

  std::printf(
      "controller: %d objects converged with %d reconciles (%d retries, at most %d "
      "requeues of one key); drained: %s\n",
      cluster.converged(), cluster.reconciles(), retries.load(), max_requeues.load(),
      drained ? "yes" : "no");
  return cluster.converged() == kObjects && drained ? 0 : 1;
}
