// File: include/kwq/internal/test_hooks.h
//
// Named points inside kwq's implementation (the kernel-style workqueue, and the queues'
// sleep paths) where a test can stop a thread, so that races whose windows are a few
// instructions wide can be tested deterministically (the test pauses one side inside the
// window and runs the other side through it). Internal: only kwq's own tests use it.
//
// The implementation calls TestHook(point, subject) at each point. With no hooks
// installed (always, outside tests) that is one relaxed load of a global that is never
// written and a branch predicted not taken; the call itself is out of line
// (src/test_hooks.cc). A test installs a TestHooks object with ScopedTestHooks; its At()
// runs on the thread that reached the point, may block it (while it holds whatever locks
// the point's comment names), and must filter on `subject`: the hooks are process-wide
// and other objects' threads reach the same points.

#ifndef KWQ_INTERNAL_TEST_HOOKS_H_
#define KWQ_INTERNAL_TEST_HOOKS_H_

#include <atomic>
#include <cstdint>

namespace kwq::internal {

// Where a hook runs, and what its `subject` is. "Per item" marks the points on the path
// every work takes (one relaxed load each without hooks).
enum class HookPoint : uint8_t {
  // Enqueue found the workqueue not frozen and nothing waiting, and is about to reserve
  // an active slot (then it re-checks frozen_). Subject: the WorkqueueCore. Per item.
  kEnqueueWillReserve,
  // ActivateWaiting found the workqueue not frozen and is about to reserve an active slot
  // for a waiting work (then it re-checks frozen_). Subject: the WorkqueueCore. Per item
  // (a completing worker calls ActivateWaiting when no work waited).
  kActivateWillReserve,
  // A worker's Completed found no work waiting for the finished work's active slot and is
  // about to release it (then it calls ActivateWaiting, for a work parked meanwhile by a
  // producer that found the slot taken). Subject: the WorkqueueCore. Per item (with no
  // work waiting).
  kCompletedFoundNoneWaiting,
  // ActivateWaiting reserved an active slot, found no work waiting, and is about to
  // release the slot (then it looks again, for a work parked meanwhile by a producer that
  // found the slot taken). Subject: the WorkqueueCore. Per item (a completing worker with
  // no work waiting).
  kActivateFoundNoneWaiting,
  // A worker finished a work and stored its done_seq, and is about to clear its runner
  // and running_pool (its last touch of the Work). The worker holds its pool's lock.
  // Subject: the Work. Per item.
  kWorkerWillRelease,
  // Flush(delayed work) found the work on its timer and is about to take it off (to
  // queue it now). Subject: the Work.
  kFlushDelayedWillGrab,
  // Flush(work) found the instance it waits for not finished and released, and is about
  // to wait (again). Holds the workqueue's mu_. Subject: the Work.
  kFlushWorkWaits,
  // A wait for instances to leave the workqueue ended by a signal, not by its poll period
  // (an instance gone that concerns it, or a spurious wake-up). Holds the workqueue's mu_.
  // Subject: the Work for Flush(work) and CancelSync, the WorkqueueCore for Flush() and
  // Freeze.
  kWaitSignalled,
  // Flush() (FlushAll) found its color's bucket not empty and is about to wait (again).
  // Holds the workqueue's flush_mu_ and mu_. Subject: the WorkqueueCore.
  kFlushAllWaits,
  // Freeze found a slot still taken and is about to wait (again). Holds the workqueue's
  // mu_. Subject: the WorkqueueCore.
  kFreezeWaits,
  // Drain finished a flush and is about to check whether anything is still queued (and
  // leave, ending its count in draining_, when nothing is). Subject: the WorkqueueCore.
  kDrainFlushed,
  // An instance left the workqueue and its counter found no waiter listed for its flush
  // color's bucket (kWaitedOn clear): it is about to count the instance gone with a
  // compare-and-swap, which fails if a waiter was listed meanwhile (then it reads the
  // word again). Subject: the WorkqueueCore. Per item.
  kInstanceGoneWillCount,
  // An instance left the workqueue while a waiter was listed for its bucket (kWaitedOn
  // set): its counter is about to take the workqueue's mu_. Subject: the WorkqueueCore.
  kInstanceGoneWillLock,
  // The same counter counted the instance gone under the workqueue's mu_ and is about to
  // signal the waiters it concerns and unlock mu_. Holds mu_ (and, from a worker, its pool's lock).
  // Subject:
  // the WorkqueueCore.
  kInstanceGoneCounted,
  // A delayed work's timer fired: TimerFired is about to take timer_mu_ and queue the
  // work. The timer service has let go of the timer (cancelling it fails from here on).
  // Subject: the Work. Per delayed item.
  kTimerWillQueue,
  // TimerFired took the work off its timer (where_ is kNone) and is about to queue it (a
  // new instance: queued_seq moves then). Holds the workqueue's timer_mu_. Subject: the
  // Work. Per delayed item.
  kTimerTookWork,
  // GrabFromTimer (Cancel, ModDelayed or Flush of a delayed work) found the work's timer
  // firing (the service could not cancel it) and is about to release timer_mu_ and let
  // its caller retry. Holds the owner workqueue's timer_mu_. Subject: the Work.
  kGrabFoundFiring,
  // Enqueue read the flush color for a new instance and is about to count it in that
  // color's bucket (then it re-reads the color). Subject: the WorkqueueCore. Per item.
  kEnqueueReadColor,
  // Enqueue or ActivateWaiting took an active slot and then found the workqueue frozen
  // (a Freeze came in between): it is about to give the slot back (ReleaseRacingFreeze).
  // Subject: the WorkqueueCore. Rare (only while a Freeze races).
  kReleaseRacingFreeze,
  // The same, after giving the slot back, found a waiter listed (a Freeze may wait for
  // that slot) and is about to take the workqueue's mu_ and signal the waiters for any
  // instance. Subject: the WorkqueueCore.
  kReleaseRacingFreezeWillSignal,
  // Queue (GetPromoting: a DelayingQueue's or a ShardedQueue's Get) found nothing ready,
  // ran its promote step for a Get about to sleep (which moves due items and makes sure
  // a timer wakes it by the next ready time), and is about to take the queue's lock to
  // sleep. It holds no lock and is not yet counted among the Gets asleep. Subject: the
  // Queue (a DelayingQueue's own). Per Get that sleeps.
  kGetWillWait,
};

// What a test installs. At() is called at every point reached while installed.
class TestHooks {
 public:
  virtual ~TestHooks() = default;
  virtual void At(HookPoint point, const void* subject) = 0;
};

// The installed hooks, or null (A: relaxed on the fast path; CallTestHooks re-reads it
// seq_cst before use).
extern std::atomic<TestHooks*> installed_test_hooks;

// The slow path of TestHook.
void CallTestHooks(HookPoint point, const void* subject);

inline void TestHook(HookPoint point, const void* subject) {
  if (installed_test_hooks.load(std::memory_order_relaxed) != nullptr) [[unlikely]] {
    CallTestHooks(point, subject);
  }
}

// Installs `hooks` for its lifetime (one at a time). The destructor uninstalls them and
// then waits until no thread is inside hooks->At(), so `hooks` may be destroyed next;
// the test must have let every paused thread go first.
class ScopedTestHooks {
 public:
  explicit ScopedTestHooks(TestHooks* hooks);
  ~ScopedTestHooks();
  ScopedTestHooks(const ScopedTestHooks&) = delete;
  ScopedTestHooks& operator=(const ScopedTestHooks&) = delete;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_TEST_HOOKS_H_
