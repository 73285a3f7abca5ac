// RefuseIoUring(): makes io_uring_setup fail with EPERM in this process and the programs it
// runs, as a seccomp profile (Docker's default, for one) does, so tests can check what
// kwq does where io_uring is refused. Linux only.

#ifndef KWQ_TESTS_TESTING_REFUSE_IO_URING_H_
#define KWQ_TESTS_TESTING_REFUSE_IO_URING_H_

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>

namespace kwq::testing {

// Returns false if the filter cannot be installed.
inline bool RefuseIoUring() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_REFUSE_IO_URING_H_
