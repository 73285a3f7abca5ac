// Model-based fuzzer for the context tree: random WithCancel / WithTimeout (on a
// FakeClock) / WithValue / WithoutCancel / cancel / drop / Advance sequences, checked
// against a reference tree after every step: who is cancelled, with which error and
// cause. Handles are dropped in random order to exercise unlinking; LSan checks leaks.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "fuzz_check.h"
#include "kwq/clock.h"
#include "kwq/context.h"
#include "kwq/timer.h"

namespace {

struct Node {
  int parent = -1;  // index in the model, -1 for the root
  bool cancellable = false;
  bool detached = false;  // WithoutCancel: inherits nothing
  absl::Time deadline = absl::InfiniteFuture();
  bool cancelled = false;
  absl::StatusCode err = absl::StatusCode::kOk;
  int cause_tag = -1;  // which cancel call's cause (or -1: the error itself)
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kwq::FakeClock clock;
  auto timers = *kwq::TimerService::Create({.clock = &clock});
  std::vector<Node> model{Node{}};
  std::vector<std::optional<kwq::Context>> ctxs;
  std::vector<kwq::CancelFunc> cancels;
  ctxs.emplace_back(kwq::BackgroundWithTimers(timers.get()));
  cancels.emplace_back();

  // Marks node n and its live descendants cancelled (model), as the tree must.
  auto cancel_model = [&](int n, absl::StatusCode err, int tag) {
    std::vector<int> stack{n};
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (model[x].cancelled) continue;
      // A node whose own cancellation comes from an ancestor is reached via it.
      model[x].cancelled = true;
      model[x].err = err;
      model[x].cause_tag = tag;
      for (size_t c = 0; c < model.size(); ++c) {
        if (model[c].parent == x && !model[c].detached) stack.push_back(static_cast<int>(c));
      }
    }
  };

  for (size_t i = 0; i + 2 < size && model.size() < 64; i += 3) {
    const uint8_t op = data[i] % 7;
    const int target = data[i + 1] % model.size();
    const int arg = data[i + 2];
    if (!ctxs[target].has_value()) continue;  // dropped
    const kwq::Context& parent = *ctxs[target];
    switch (op) {
      case 0: {  // WithCancel
        auto [c, cancel] = kwq::WithCancel(parent);
        Node n{.parent = target, .cancellable = true};
        n.deadline = model[target].deadline;
        model.push_back(n);
        if (model[target].cancelled) {
          model.back().cancelled = true;
          model.back().err = model[target].err;
          model.back().cause_tag = model[target].cause_tag;
        }
        ctxs.emplace_back(std::move(c));
        cancels.push_back(std::move(cancel));
        break;
      }
      case 1: {  // WithTimeout(arg ms)
        const absl::Duration d = absl::Milliseconds(arg % 50);
        auto [c, cancel] = kwq::WithTimeout(parent, d);
        Node n{.parent = target, .cancellable = true};
        n.deadline = std::min(model[target].deadline, clock.Now() + d);
        model.push_back(n);
        const int self = static_cast<int>(model.size() - 1);
        if (model[target].cancelled) {
          model[self].cancelled = true;
          model[self].err = model[target].err;
          model[self].cause_tag = model[target].cause_tag;
        } else if (model[self].deadline <= clock.Now()) {
          cancel_model(self, absl::StatusCode::kDeadlineExceeded, -1);
        }
        ctxs.emplace_back(std::move(c));
        cancels.push_back(std::move(cancel));
        break;
      }
      case 2: {  // WithoutCancel
        model.push_back(Node{.parent = target, .detached = true});
        ctxs.emplace_back(kwq::WithoutCancel(parent));
        cancels.emplace_back();
        break;
      }
      case 3: {  // cancel with a cause
        if (!model[target].cancellable) break;
        cancels[target](absl::AbortedError(std::to_string(arg)));
        if (!model[target].cancelled) cancel_model(target, absl::StatusCode::kCancelled, arg);
        break;
      }
      case 4: {  // drop the handles of a node (children keep it alive in the real tree)
        if (target == 0) break;
        ctxs[target].reset();
        cancels[target] = kwq::CancelFunc();
        break;
      }
      case 5: {  // advance time: deadlines fire in order
        const absl::Time now = clock.Now() + absl::Milliseconds(arg % 20);
        clock.SetTime(now);
        for (bool changed = true; changed;) {
          changed = false;
          for (size_t n = 0; n < model.size(); ++n) {
            // Dropped nodes fire too: live descendants keep them alive.
            if (!model[n].cancelled && model[n].cancellable && model[n].deadline <= now) {
              // Only nodes whose own deadline (not inherited) fires get DeadlineExceeded
              // directly; inherited ones are reached through the ancestor.
              const int p = model[n].parent;
              if (p >= 0 && !model[n].detached && model[p].deadline == model[n].deadline &&
                  model[p].cancellable)
                continue;
              cancel_model(static_cast<int>(n), absl::StatusCode::kDeadlineExceeded, -1);
              changed = true;
            }
          }
        }
        break;
      }
      case 6:
        break;
    }
    // Compare every live handle with the model.
    for (size_t n = 0; n < model.size(); ++n) {
      if (!ctxs[n].has_value()) continue;
      const kwq::Context& c = *ctxs[n];
      FUZZ_CHECK(c.IsCancelled() == model[n].cancelled);
      FUZZ_CHECK(c.Err().code() == model[n].err);
      if (model[n].cancelled && model[n].cause_tag >= 0) {
        FUZZ_CHECK(c.Cause() == absl::AbortedError(std::to_string(model[n].cause_tag)));
      }
    }
  }
  return 0;
}
