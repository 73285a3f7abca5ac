#include <cstdio>
#include <cstdlib>

#include "kwq/internal/check.h"

namespace kwq::internal {

void CheckFailed(const char* condition, const char* message, const char* file, int line) {
  std::fprintf(stderr, "kwq: check failed at %s:%d: %s (%s)\n", file, line, message, condition);
  std::fflush(stderr);
  std::abort();
}

}  // namespace kwq::internal
