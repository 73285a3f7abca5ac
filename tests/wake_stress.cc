// kwq-wake-stress: hunts lost wake-ups in Queue's wake-up protocol (NeedWakeLocked, Spin,
// TryGet's post-take check), the race a review found in the worker-side wake. Each round
// waits until one worker sleeps and the other polls, then adds A and, after a random
// pause, B. The worker that takes A holds it until the other has taken B; if that takes
// over 20 ms, B sat ready while a worker slept: a stall, reported and counted. Exits 1 on
// any stall.
//
//   make wake-stress ROUNDS=200000            (or build/release-tests/tests/kwq-wake-stress)
//
// Not a ctest: the race it targets needed about 21,000 rounds per hit on the machine it
// was found on, and none in 150,000 on another, so a bounded unit test could not fail
// reliably. Run it after changing the wake-up protocol, on as many machines as you can.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kwq/queue.h"
#include "testing/queue_peer.h"

ABSL_FLAG(int, rounds, 100000, "rounds to run");
ABSL_FLAG(int, polling_workers, 0, "QueueOptions::polling_workers (0: default)");
ABSL_FLAG(int, max_pause, 4000, "upper bound of the pause (in pause instructions) between A and B");

namespace {

using Peer = kwq::internal::QueuePeer;
using Clock = std::chrono::steady_clock;

void Pause(int n) {
  for (int i = 0; i < n; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  kwq::Queue<int> q({.polling_workers = absl::GetFlag(FLAGS_polling_workers)});
  // Round k adds 2k (A) and 2k + 1 (B).
  std::vector<std::atomic<bool>> b_taken(rounds);
  std::atomic<int> rounds_done{0};
  std::atomic<int> stalls{0};
  auto worker = [&] {
    while (auto lease = q.Get()) {
      const int v = **lease;
      const int k = v / 2;
      if (v % 2 == 1) {
        b_taken[k].store(true);
        rounds_done.fetch_add(1);
        continue;
      }
      const auto start = Clock::now();
      while (!b_taken[k].load()) {
        if (Clock::now() - start > std::chrono::milliseconds(20)) {
          std::fprintf(stderr, "round %d: B still not taken after 20 ms (Len=%zu, sleepers=%d)\n",
                       k, q.Len(), Peer::Sleepers(q));
          stalls.fetch_add(1);
          break;  // let go of A; a worker will take B when it comes back
        }
        std::this_thread::yield();
      }
    }
  };
  std::thread w1(worker);
  std::thread w2(worker);
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> pause(0, absl::GetFlag(FLAGS_max_pause));
  for (int k = 0; k < rounds; ++k) {
    while (rounds_done.load() < k) std::this_thread::yield();
    // One worker asleep and one polling (give up waiting for it after a second).
    const auto start = Clock::now();
    while (!(Peer::Sleepers(q) == 1 && Peer::Polling(q) == 1) &&
           Clock::now() - start < std::chrono::seconds(1)) {
      std::this_thread::yield();
    }
    q.Add(2 * k);
    Pause(pause(rng));
    q.Add(2 * k + 1);
  }
  while (rounds_done.load() < rounds) std::this_thread::yield();
  q.ShutDown();
  w1.join();
  w2.join();
  std::printf("wake-stress rounds=%d stalls=%d\n", rounds, stalls.load());
  return stalls.load() == 0 ? 0 : 1;
}
