// ResidentBytes(): this process's resident memory in bytes (/proc/self/statm), for the
// tests and the kwq-scenarios memory figures that measure what a queue keeps mapped.
// Linux only; 0 when /proc is not mounted.

#ifndef KWQ_TESTS_TESTING_RESIDENT_BYTES_H_
#define KWQ_TESTS_TESTING_RESIDENT_BYTES_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace kwq::testing {

inline int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_RESIDENT_BYTES_H_
