// fifo_1t's two phases apart: Add 1,000,000 distinct keys ("default/object-<i>", made
// before timing), then TryGet+Done until empty, three times in one process. The first
// pass runs on fresh memory (page faults included, as kwq-scenarios' fifo_1t does); the
// third reuses memory the earlier passes freed, which leaves the queue's own work. Prints
// one line per pass:
//
//   pass=<k> add_ns_per_item=<a> get_done_ns_per_item=<g> total_ns_per_item=<t>
//
// For A/B comparisons of the queue's hot path (docs/benchmarks.md):
//   for i in $(seq 9); do for b in A B; do $b/bench/fifo_phases | sed "s/^/$b /"; done; done

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kwq/queue.h"

int main() {
  constexpr int kItems = 1'000'000;
  using Clock = std::chrono::steady_clock;
  const auto per_item = [](Clock::duration d) {
    return std::chrono::duration<double, std::nano>(d).count() / kItems;
  };
  for (int pass = 1; pass <= 3; ++pass) {
    std::vector<std::string> keys;
    keys.reserve(kItems);
    for (int i = 0; i < kItems; ++i) keys.push_back(absl::StrCat("default/object-", i));
    kwq::Queue<std::string> q;
    const auto t0 = Clock::now();
    for (auto& key : keys) q.Add(std::move(key));
    const auto t1 = Clock::now();
    int handed_out = 0;
    while (auto lease = q.TryGet()) ++handed_out;
    const auto t2 = Clock::now();
    if (handed_out != kItems) {
      std::fprintf(stderr, "fifo_phases: handed out %d of %d\n", handed_out, kItems);
      return 1;
    }
    std::printf("pass=%d add_ns_per_item=%.1f get_done_ns_per_item=%.1f total_ns_per_item=%.1f\n",
                pass, per_item(t1 - t0), per_item(t2 - t1), per_item(t2 - t0));
  }
  return 0;
}
