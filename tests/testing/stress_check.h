// Test helpers for the queues' concurrency stress tests.
//
// HoldBriefly: a worker holding an item spins here (about a microsecond) between marking
// the item busy and unmarking it, so that a second hand-out of the same item, which the
// tests look for, has a window wide enough to land in.
//
// SettlesWithin: polls `done()` until it holds or `timeout` (real time) passes. A stress
// test calls it before it shuts the queue down: shutdown wakes every sleeping worker, so
// an item left ready beside sleeping workers (a lost wake-up) would otherwise be handed
// out at shutdown and go unnoticed. The timeout only bounds a failure; passing never
// depends on timing.

#ifndef KWQ_TESTS_TESTING_STRESS_CHECK_H_
#define KWQ_TESTS_TESTING_STRESS_CHECK_H_

#include <chrono>
#include <thread>

#include "absl/time/time.h"

namespace kwq::testing {

inline void HoldBriefly() {
  for (int i = 0; i < 40; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

template <typename Done>
bool SettlesWithin(Done done, absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_STRESS_CHECK_H_
