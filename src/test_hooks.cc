// Test hooks of kwq's implementation (see kwq/internal/test_hooks.h).

#include "kwq/internal/test_hooks.h"

#include <thread>

#include "kwq/internal/check.h"

namespace kwq::internal {

// On a line of its own: every Queue and every execution reads it, and nothing may write
// next to it.
alignas(64) std::atomic<TestHooks*> installed_test_hooks{nullptr};

namespace {
// Threads inside CallTestHooks (A, seq_cst: see below).
alignas(64) std::atomic<int> hook_calls{0};
}  // namespace

void CallTestHooks(HookPoint point, const void* subject) {
  // Dekker with ~ScopedTestHooks: this counts itself and then reads the hooks; the
  // destructor clears the hooks and then reads the count. Either this sees them cleared
  // or the destructor waits for this call to end.
  hook_calls.fetch_add(1, std::memory_order_seq_cst);
  if (TestHooks* hooks = installed_test_hooks.load(std::memory_order_seq_cst)) {
    hooks->At(point, subject);
  }
  hook_calls.fetch_sub(1, std::memory_order_release);
}

ScopedTestHooks::ScopedTestHooks(TestHooks* hooks) {
  TestHooks* none = nullptr;
  KWQ_CHECK(installed_test_hooks.compare_exchange_strong(none, hooks, std::memory_order_seq_cst),
            "ScopedTestHooks: hooks are installed already");
}

ScopedTestHooks::~ScopedTestHooks() {
  installed_test_hooks.store(nullptr, std::memory_order_seq_cst);
  while (hook_calls.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
}

}  // namespace kwq::internal
