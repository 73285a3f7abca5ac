// Uses the installed headers and library: a context with a deadline on the default timer
// service. Exits 0 when the deadline fired as promised.
#include <cstdio>

#include "kwq/context.h"

int main() {
  auto [ctx, cancel] = kwq::WithTimeout(kwq::Background(), absl::Milliseconds(1));
  ctx.Done().Wait();
  std::printf("consumer: %s\n", ctx.Err().ToString().c_str());
  return ctx.Err().code() == absl::StatusCode::kDeadlineExceeded ? 0 : 1;
}
