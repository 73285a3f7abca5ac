// FUZZ_CHECK(cond): abort with the condition and line when a fuzzer's model disagrees.
#ifndef KWQ_FUZZ_FUZZ_CHECK_H_
#define KWQ_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

#endif  // KWQ_FUZZ_FUZZ_CHECK_H_
