// Test helpers: ThreadState(tid), the scheduler state of thread `tid` of this process as
// /proc shows it ('R' running, 'S' sleeping, ...; '?' when /proc cannot be read), and
// CurrentTid(). A test waits until a thread sleeps in the kernel ('S') to stage "the
// wake-up comes while it sleeps" without a sleep of its own.

#ifndef KWQ_TESTS_TESTING_THREAD_STATE_H_
#define KWQ_TESTS_TESTING_THREAD_STATE_H_

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace kwq::testing {

inline pid_t CurrentTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

inline char ThreadState(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : '?';
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_THREAD_STATE_H_
