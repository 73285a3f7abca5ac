// HeapInUse(): bytes the process's malloc has handed out and not taken back (glibc's
// count). Tests that a loop takes no memory compare it before and after. A sanitizer's
// allocator keeps its own count, and under one this reads a constant: such tests can
// fail only in a build without a sanitizer (the clang build).

#ifndef KWQ_TESTS_TESTING_HEAP_IN_USE_H_
#define KWQ_TESTS_TESTING_HEAP_IN_USE_H_

#include <malloc.h>

#include <cstddef>

namespace kwq::testing {

inline size_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_HEAP_IN_USE_H_
