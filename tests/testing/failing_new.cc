// The operator new replacement of testing/failing_new.h.

// g++ sees an array new freed by free() once the replacements below are inlined: it is
// this file's own malloc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "testing/failing_new.h"

#include "kwq/internal/pod_vector.h"

#include <pthread.h>

#include <cstdlib>
#include <new>

namespace kwq::testing {
namespace {
// When above 0, counts allocations of the thread that armed it (failing_thread) down; the
// one that takes it to 0 throws.
std::atomic<int> fail_countdown{0};
thread_local bool failing_thread = false;
}  // namespace

std::atomic<int> array_failures_left{0};
std::atomic<bool (*)(std::size_t)> extra_failure{nullptr};

void FailAllocation(int k) {
  failing_thread = true;
  fail_countdown = k;
}

bool FailureUsed() { return fail_countdown.exchange(0) == 0; }

int AllocationsOf(absl::FunctionRef<void()> f) {
  constexpr int kMany = 1 << 30;
  FailAllocation(kMany);
  f();
  return kMany - fail_countdown.exchange(0);
}

// PodVector's growth (kwq/internal/pod_vector.h) counts as an allocation too.
void* FailingRealloc(void* p, std::size_t n) {
  if (failing_thread && fail_countdown.load() > 0 && fail_countdown.fetch_sub(1) == 1) {
    return nullptr;
  }
  return ::realloc(p, n);
}
[[maybe_unused]] const bool realloc_installed =
    (kwq::internal::pod_vector_realloc = &FailingRealloc, true);

bool OnThreadNamed(std::string_view prefix) {
  char name[16] = {};
  return pthread_getname_np(pthread_self(), name, sizeof(name)) == 0 &&
         std::string_view(name).starts_with(prefix);
}

}  // namespace kwq::testing

void* operator new(std::size_t n) {
  using namespace kwq::testing;
  if (auto extra = extra_failure.load(); extra != nullptr && extra(n)) throw std::bad_alloc();
  if (failing_thread && fail_countdown.load() > 0 && fail_countdown.fetch_sub(1) == 1) {
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The array forms too: under AddressSanitizer they would not reach the operator new above.
void* operator new[](std::size_t n) {
  using kwq::testing::array_failures_left;
  if (array_failures_left.load() > 0 && array_failures_left.fetch_sub(1) > 0) {
    throw std::bad_alloc();
  }
  return ::operator new(n);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }
