// without-io-uring COMMAND [ARGS...]: runs COMMAND with io_uring refused (io_uring_setup
// fails with EPERM, as under Docker's default seccomp profile). ctest runs timer_test
// under it (timer_test_io_uring_refused), so the suite's handling of a refused io_uring
// is checked on machines that allow it. Exits 77 (ctest: skipped) if the filter cannot be
// installed.

#include <unistd.h>

#include <cstdio>

#include "testing/refuse_io_uring.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s COMMAND [ARGS...]\n", argv[0]);
    return 2;
  }
  if (!kwq::testing::RefuseIoUring()) {
    std::perror("without-io-uring: cannot install the seccomp filter");
    return 77;
  }
  execv(argv[1], argv + 1);
  std::perror("without-io-uring: execv");
  return 127;
}
