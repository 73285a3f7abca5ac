// Test helpers for the queues' concurrency stress tests.
//
// HoldBriefly: a worker holding an item spins here (about a microsecond) between marking
// the item busy and unmarking it, so that a second hand-out of the same item, which the
// tests look for, has a window wide enough to land in.
//
// SettlesWithin: polls `done()` until it holds or `timeout` (real time) passes. A stress
// test calls it before it shuts the queue down: shutdown wakes every sleeping worker, so
// an item left ready beside sleeping workers (a lost wake-up) would otherwise be handed
// out at shutdown and go unnoticed. The timeout only bounds a failure; passing never
// depends on timing.
//
// KeyRunLedger and RunStressRounds: the one harness of the exclusivity stress tests of
// Queue, PriorityQueue and ShardedQueue (see RunStressRounds).

#ifndef KWQ_TESTS_TESTING_STRESS_CHECK_H_
#define KWQ_TESTS_TESTING_STRESS_CHECK_H_

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kwq::testing {

inline void HoldBriefly() {
  for (int i = 0; i < 40; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

template <typename Done>
bool SettlesWithin(Done done, absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Per-key bookkeeping of a stress test. Producers wrap each add in Add; workers call Run
// with the key of each lease they hold. Thread-safe.
class KeyRunLedger {
 public:
  explicit KeyRunLedger(int keys)
      : busy_(keys), last_add_gen_(keys), done_gen_(keys), runs_(keys), queued_(keys) {}

  // Records an add of key `k`, made by `add()` (true when it queued the key or marked it
  // to run again). The generation moves first: a run that starts after the add sees it.
  template <typename AddFn>
  void Add(int k, AddFn add) {
    last_add_gen_[k].fetch_add(1);
    if (add()) queued_[k].fetch_add(1);
  }

  // One run of key `k`: notes an overlap with another run of it, records that every add
  // made so far is seen, and holds the key briefly (HoldBriefly).
  void Run(int k) {
    if (busy_[k].fetch_add(1) != 0) overlap_ = true;
    done_gen_[k].store(last_add_gen_[k].load());
    runs_[k].fetch_add(1);
    HoldBriefly();
    busy_[k].fetch_sub(1);
  }

  // Every key's newest add was followed by a run that saw it.
  bool AllAddsSeen() const {
    for (size_t k = 0; k < busy_.size(); ++k) {
      if (done_gen_[k].load() != last_add_gen_[k].load()) return false;
    }
    return true;
  }

  // Once the queue is drained: no key ran on two workers at once, every key's last add was
  // followed by a run that saw it (level-triggered), and each run was owed to an add that
  // returned true.
  void ExpectConsistent() const {
    EXPECT_FALSE(overlap_.load()) << "a key was handed to two workers at once";
    for (size_t k = 0; k < busy_.size(); ++k) {
      EXPECT_EQ(done_gen_[k].load(), last_add_gen_[k].load()) << "key " << k;
      EXPECT_EQ(runs_[k].load(), queued_[k].load()) << "key " << k;
    }
  }

 private:
  std::vector<std::atomic<int>> busy_;
  std::vector<std::atomic<int>> last_add_gen_;   // generation of the newest add
  std::vector<std::atomic<int>> done_gen_;       // newest generation a run started after
  std::vector<std::atomic<int>> runs_, queued_;  // hand-outs; adds that returned true
  std::atomic<bool> overlap_{false};
};

// The exclusivity stress test of a queue, with its parts given as callables:
// - work(w): worker w's loop, Get and ledger.Run(key) until the queue shuts down;
// - produce(p, round): producer p's adds of `round`, each through ledger.Add;
// - quiet(): nothing ready, waiting or in flight in the queue;
// - asleep(): how many workers sleep in Get;
// - drain(): ShutDownWithDrain.
// The adds come in `rounds` rounds of `producers` threads. After each, the queue must
// settle (every add seen, quiet) and every worker fall asleep, so the next round's first
// adds must wake them: a lost item or wake-up shows as a queue that does not settle, and
// shutdown, which wakes everyone, comes only at the end. Then ledger.ExpectConsistent().
template <typename Work, typename Produce, typename Quiet, typename Asleep, typename Drain>
void RunStressRounds(KeyRunLedger& ledger, int workers, int producers, int rounds, Work work,
                     Produce produce, Quiet quiet, Asleep asleep, Drain drain) {
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back([&, w] { work(w); });
  bool lost = false;
  for (int round = 0; round < rounds && !lost; ++round) {
    std::vector<std::thread> adders;
    for (int p = 0; p < producers; ++p) adders.emplace_back([&, p, round] { produce(p, round); });
    for (auto& t : adders) t.join();
    lost = !SettlesWithin([&] { return ledger.AllAddsSeen() && quiet(); }, absl::Seconds(10));
    // Every worker asleep, so the next round's adds must wake them (else it is untested).
    EXPECT_TRUE(SettlesWithin([&] { return asleep() == workers; }, absl::Seconds(5)))
        << "round " << round << ": the workers did not all fall asleep";
  }
  EXPECT_FALSE(lost) << "work left with the workers idle: a lost item or wake-up";
  EXPECT_TRUE(drain());
  for (auto& t : threads) t.join();
  ledger.ExpectConsistent();
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_STRESS_CHECK_H_
