#include "kwq/internal/mutex.h"

#include <algorithm>
#include <chrono>

namespace kwq::internal {

void Mutex::SpinThenLock(absl::Duration spin) {
  // The clock is read once per 32 pauses (a pause costs about 25 ns on the development
  // VM, a clock read about as much), so the bound holds within a microsecond.
  constexpr int kPausesPerCheck = 32;
  // At most a second (an infinite Duration would overflow the chrono deadline).
  spin = std::clamp(spin, absl::ZeroDuration(), absl::Seconds(1));
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
  do {
    for (int i = 0; i < kPausesPerCheck; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      // Read before trying: a failed try would still take the line from the holder.
      if (!LockedHint() && TryLockUnannotated()) return;
    }
  } while (std::chrono::steady_clock::now() < deadline);
  pthread_mutex_lock(&mu_);
}

}  // namespace kwq::internal
