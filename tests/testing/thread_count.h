// ThreadCount(): how many threads this process has now (entries of /proc/self/task), for
// tests and the soak that check every thread a component starts is joined again.
// Linux only; 0 when /proc is not mounted.

#ifndef KWQ_TESTS_TESTING_THREAD_COUNT_H_
#define KWQ_TESTS_TESTING_THREAD_COUNT_H_

#include <dirent.h>

namespace kwq::testing {

inline int ThreadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_THREAD_COUNT_H_
