// Test helper: RunOnSmallStack(fn) runs `fn` on a new thread with a 512 KiB stack and
// waits for it. For tests of "bounded stack" promises: recursion that grows with the
// input (hundreds of bytes a level, more under the sanitizers) overflows it within a few
// thousand levels, so a test needs only tens of thousands of links to catch it.

#ifndef KWQ_TESTS_TESTING_SMALL_STACK_H_
#define KWQ_TESTS_TESTING_SMALL_STACK_H_

#include <pthread.h>

#include <functional>

#include "gtest/gtest.h"

namespace kwq::testing {

inline void RunOnSmallStack(std::function<void()> fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 512 * 1024), 0);
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    (*static_cast<std::function<void()>*>(arg))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, body, &fn), 0);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_SMALL_STACK_H_
