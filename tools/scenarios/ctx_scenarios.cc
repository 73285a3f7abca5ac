// The ctx_* scenarios of SCENARIOS.md, written as the Go peer wrote them against Go's
// context package.

#include <vector>

#include "absl/strings/str_format.h"
#include "kwq/context.h"
#include "scenario.h"

namespace kwq::scenarios {
namespace {

std::string NsPerOp(absl::Duration d, int64_t n) {
  return absl::StrFormat("ns_per_op=%.2f n=%d", absl::ToDoubleNanoseconds(d) / n, n);
}

// WithCancel(live parent) then cancel, n times.
std::string ChildCreateCancel(int64_t n) {
  auto [root, cancel_root] = WithCancel(Background());
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) {
    auto [ctx, cancel] = WithCancel(root);
    cancel();
  }
  return NsPerOp(sw.Elapsed(), n);
}

// WithTimeout(live parent, 1 h) then cancel, n times.
std::string TimeoutCreateCancel(int64_t n) {
  auto [root, cancel_root] = WithCancel(Background());
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) {
    auto [ctx, cancel] = WithTimeout(root, absl::Hours(1));
    cancel();
  }
  return NsPerOp(sw.Elapsed(), n);
}

// n children of one root; cancel the root; wait until every child reports Done.
std::string WideCancel(int64_t n) {
  auto [root, cancel_root] = WithCancel(Background());
  std::vector<Context> children;
  children.reserve(n);
  for (int64_t i = 0; i < n; ++i) children.push_back(WithCancel(root).context);
  Stopwatch sw;
  cancel_root();
  // Every child's Done() waited on, as Go's `<-c.Done()` on each (no IsCancelled() check
  // first: SCENARIOS.md says wait until all report Done).
  for (const Context& c : children) c.Done().Wait();
  const absl::Duration d = sw.Elapsed();
  return absl::StrFormat("ms=%.2f n=%d", absl::ToDoubleMilliseconds(d), n);
}

// A chain of n nested WithCancel; cancel the root; wait for the deepest.
std::string DeepCancel(int64_t n) {
  auto [root, cancel_root] = WithCancel(Background());
  std::vector<Context> chain{root};
  chain.reserve(n + 1);
  for (int64_t i = 0; i < n; ++i) chain.push_back(WithCancel(chain.back()).context);
  Stopwatch sw;
  cancel_root();
  chain.back().Done().Wait();
  const absl::Duration d = sw.Elapsed();
  return absl::StrFormat("ms=%.2f n=%d", absl::ToDoubleMilliseconds(d), n);
}

// IsCancelled() on a live context n times, then Err() n times (reported separately: Go's
// figure is Err()'s; Go has no IsCancelled).
std::string ErrCheck(int64_t n) {
  auto [ctx, cancel] = WithCancel(Background());
  int64_t hits = 0;
  Stopwatch sw;
  for (int64_t i = 0; i < n; ++i) {
    KeepAlive(ctx);
    hits += ctx.IsCancelled();
  }
  const absl::Duration d = sw.Elapsed();
  const int64_t m = n;
  Stopwatch sw_err;
  for (int64_t i = 0; i < m; ++i) {
    KeepAlive(ctx);
    hits += !ctx.Err().ok();
  }
  const absl::Duration d_err = sw_err.Elapsed();
  KeepAlive(hits);
  Check(hits == 0, "a live context reported cancelled");
  return absl::StrFormat("ns_per_op=%.3f err_ns_per_op=%.3f n=%d", absl::ToDoubleNanoseconds(d) / n,
                         absl::ToDoubleNanoseconds(d_err) / m, n);
}

}  // namespace

std::vector<Scenario> ContextScenarios() {
  return {
      {"ctx_child_create_cancel", 1'000'000, ChildCreateCancel},
      {"ctx_timeout_create_cancel", 1'000'000, TimeoutCreateCancel},
      {"ctx_wide_cancel_1M", 1'000'000, WideCancel},
      {"ctx_deep_cancel_100k", 100'000, DeepCancel},
      {"ctx_err_check", 100'000'000, ErrCheck},
  };
}

}  // namespace kwq::scenarios
