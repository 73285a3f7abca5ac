// ScribbleStack: overwrites the calling thread's stack below the caller with a pattern, so
// that whatever a returned frame left there (an object someone still points at) reads as
// garbage: a later use of it then crashes instead of finding the old values intact. For
// tests of "nothing keeps a pointer into this frame once it is gone".

#ifndef KWQ_TESTS_TESTING_STACK_SCRIBBLE_H_
#define KWQ_TESTS_TESTING_STACK_SCRIBBLE_H_

#include <cstring>

namespace kwq::testing {

[[gnu::noinline]] inline void ScribbleStack() {
  volatile char bytes[16384];
  std::memset(const_cast<char*>(bytes), 0x5a, sizeof bytes);
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_STACK_SCRIBBLE_H_
