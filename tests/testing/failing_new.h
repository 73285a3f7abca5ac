// A replacement of the global operator new and new[] for the test binaries that run out
// of memory on purpose: link testing/failing_new.cc into the binary (it must be the only
// replacement there). Chosen allocations throw std::bad_alloc; the rest go to malloc.
//
// FailAllocation(k) fails the k-th allocation (operator new, new[], or a PodVector's
// realloc) of the calling thread from now; threads the
// code under test starts when it likes (workers, timers) are left alone, so a failure is
// never taken by another thread. A binary adds failures of its own (a size on a named
// thread, say) through extra_failure.

#ifndef KWQ_TESTS_TESTING_FAILING_NEW_H_
#define KWQ_TESTS_TESTING_FAILING_NEW_H_

#include <atomic>
#include <cstddef>
#include <string_view>

#include "absl/functional/function_ref.h"

namespace kwq::testing {

// Fails the `k`-th allocation (operator new, new[], or a PodVector growth) of this thread
// from now (1: the next one).
void FailAllocation(int k);
// Whether the failure FailAllocation armed was used; disarms it.
bool FailureUsed();
// The allocations `f` makes on this thread.
int AllocationsOf(absl::FunctionRef<void()> f);

// While above 0, every array allocation (new[]) of any thread throws and counts it down.
extern std::atomic<int> array_failures_left;
// Consulted first by every operator new with the size asked for: true makes it throw.
// Null (the default): no further failures.
extern std::atomic<bool (*)(std::size_t)> extra_failure;

// Whether the calling thread's name starts with `prefix` (kwq names its threads
// "kwq-worker...", "kwq-rescuer", "kwq-timer").
bool OnThreadNamed(std::string_view prefix);

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_FAILING_NEW_H_
