// File: kwq/internal/spin.h
//
// PollUntil: how a queue's Get waits a little before it sleeps. It polls a condition
// (a relaxed hint of ready items, read without the queue's lock) for about half a
// millisecond, yielding the CPU every few polls, and returns as soon as it holds; only
// QueueOptions::polling_workers Gets at a time poll that long (EnterLongPoll). The polls
// are counted, and their time is capped too (kGetPollLimit): on a busy machine each yield
// can hand the CPU to another thread for a whole time slice, and 1,000 of them kept an
// idle Get awake for seconds.
// A producer usually adds the next item within that time, and catching it saves the
// worker's sleep and the producer's futex wake-up. Measured on 2 cores (dedup_hot):
// with 2,000 polls and no yield, futex calls were half the cost of an add (180 ns/add);
// with these values about 100 ns/add. Internal: used by Queue and PriorityQueue.

#ifndef KWQ_INTERNAL_SPIN_H_
#define KWQ_INTERNAL_SPIN_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>

namespace kwq::internal {

inline constexpr int kGetPolls = 8000;
inline constexpr int kGetYieldEvery = 8;
// The longest a poll goes on, from its first yield (on an idle machine kGetPolls end it
// first, after about half a millisecond). Read at each yield from steady_clock (20-30 ns
// through the vDSO, next to a yield's system call).
inline constexpr std::chrono::microseconds kGetPollLimit{2000};
// Polls of a Get that finds enough others polling at length, before it sleeps (a short
// poll still catches the next item of a busy producer, which saves it a wake-up call).
inline constexpr int kBriefPolls = 32;

// How many Gets may poll at length at once for QueueOptions::polling_workers: 0 or less
// means 1, and at most 1024.
inline int MaxPollers(int polling_workers) {
  return polling_workers > 0 ? (polling_workers < 1024 ? polling_workers : 1024) : 1;
}

// Counts the caller in `pollers` if fewer than `max` Gets poll at length; returns whether
// it did (the caller then takes itself out when it stops). The increment is relaxed; a
// queue whose wake-ups read the count orders what it needs around it (Queue: see
// NeedWakeLocked).
inline bool EnterLongPoll(std::atomic<int>& pollers, int max) {
  int polling = pollers.load(std::memory_order_relaxed);
  do {
    if (polling >= max) return false;
  } while (!pollers.compare_exchange_weak(polling, polling + 1, std::memory_order_relaxed));
  return true;
}

// Polls until `ready()` returns true, `polls` polls have been made, or `limit` has
// passed since the first yield (looked at when yielding, every kGetYieldEvery polls, so
// a slow yield can take it past `limit`).
template <typename Ready>
void PollUntil(Ready ready, int polls = kGetPolls,
               std::chrono::steady_clock::duration limit = kGetPollLimit) {
  std::chrono::steady_clock::time_point give_up;
  for (int i = 1; i <= polls && !ready(); ++i) {
    if (i % kGetYieldEvery == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (i == kGetYieldEvery) {
        give_up = now + limit;
      } else if (now >= give_up) {
        return;
      }
      std::this_thread::yield();  // the producer may need the CPU
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SPIN_H_
