// File: kwq/workqueue.h
//
// Kernel-style workqueues (Linux cmwq, Documentation/core-api/workqueue.rst) in user
// space: work items queued to workqueues, executed by shared pools of worker threads
// laid out on the machine's topology.
//
//   kwq::Work work([] { Flush(); });                 // like INIT_WORK
//   auto wq = *kwq::Workqueue::Create({.name = "writeback", .flags = kwq::kUnbound});
//   wq->Queue(&work);                                // queue_work: false if already pending
//   wq->Flush(&work);                                // flush_work
//   wq->CancelSync(&work);                           // cancel_work_sync
//
// Model (as in the kernel):
//   - A WorkqueueRuntime owns the worker pools: per CPU a normal and a high-priority
//     pool whose workers are bound to that CPU, and unbound pools, one per pod of the
//     workqueue's affinity scope (cpu, smt, cache, numa, system; see kwq/topology.h),
//     shared by every unbound workqueue with equal attributes. The process-wide
//     WorkqueueRuntime::Default() serves workqueues that name no runtime.
//   - Bound pools are concurrency-managed: one worker runs at a time per CPU pool; when it
//     blocks in a BlockingScope, or runs longer than the CPU-intensive threshold (the
//     watchdog marks it a CPU hog), another worker is woken or created. kCpuIntensive
//     work does not count. Unbound pools run, besides blocked and hogging workers, one
//     worker per CPU they may run on (the pod's when strict, every allowed CPU when not),
//     and max_active bounds the workqueue.
//   - max_active limits a workqueue's concurrently active works per CPU (bound) or per
//     NUMA node (unbound: max_active split over nodes by their CPU counts, rounded up,
//     never below min_active; a pod whose CPUs span nodes is limited by max_active alone).
//     Works beyond the limit wait, in order, on the workqueue.
//   - kOrdered: unbound, max_active 1, one pool: works run one at a time in queueing order.
//
// Work promises (pinned by tests/workqueue_test.cc):
//   - Queue returns false when the work is already pending; the pending bit is cleared
//     just before the function runs, so queueing during a run runs it again after.
//   - A work never runs on two workers at once (non-reentrancy), even when queued on
//     another CPU while it runs: it is routed to the pool running it. This holds within
//     one workqueue, as in the kernel: queueing a Work on a second workqueue while it is
//     pending or running on the first is a programming error (it may run on both at once).
//     Once it has finished there (Flush or CancelSync), it may move.
//   - Everything written before a successful Queue is visible to the function.
//   - A Work must not be destroyed while pending or running: CancelSync it first.
//
// User space cannot see a thread block or be preempted the way the scheduler tells the
// kernel; kwq substitutes explicit BlockingScope hints and the CPU-hog watchdog, and
// documents every other difference in docs/workqueues.md.
//
// Thread safety: every member may be called from any thread, including from work
// functions (queueing, cancelling and flushing other works). Flushing or draining a
// workqueue from one of its own works deadlocks, as in the kernel.

#ifndef KWQ_WORKQUEUE_H_
#define KWQ_WORKQUEUE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kwq/clock.h"
#include "kwq/timer.h"
#include "kwq/topology.h"

namespace kwq {

namespace internal {
class WorkerPool;
class Worker;
class PoolWorkqueue;
class WorkqueueCore;
class RuntimeCore;
struct WorkAccess;
}  // namespace internal

class Workqueue;

// A unit of deferred work, like the kernel's struct work_struct. Not copyable or movable
// (pools link it by address). Must outlive every period in which it is pending or
// running.
class Work {
 public:
  // `fn` runs at each execution; an empty one runs nothing. An exception `fn` throws is
  // caught on the worker, said on stderr and counted (WorkqueueStats::exceptions); the
  // work counts as finished.
  explicit Work(absl::AnyInvocable<void()> fn);
  // Fails a check if the work is pending or running (cancel it first).
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Queued and not yet started (or waiting on a delay timer). Lock-free.
  bool pending() const;
  // Disabled by Workqueue::Disable and not yet re-enabled (a CancelSync in progress
  // refuses queueing too, but does not count here). Lock-free.
  bool disabled() const;

 private:
  friend struct internal::WorkAccess;
  absl::AnyInvocable<void()> fn_;
  // Bit 0: pending; bits 1..31: CancelSync calls in progress; bits 32..63: disable count
  // (src/workqueue/internal.h). Acq/rel: a successful pending CAS orders the queuer's
  // writes before the function's reads.
  std::atomic<uint64_t> state_{0};
  // The pool running this work, or null. Set (release) before pending is cleared, so a
  // queuer that wins the pending bit sees where the previous instance runs.
  std::atomic<internal::WorkerPool*> running_pool_{nullptr};
  // Which list holds the pending instance (internal::WorkWhere), and so which lock
  // guards the links below. Written under that lock (release), read by cancellers
  // (acquire) who then take the lock and re-check.
  std::atomic<uint8_t> where_{0};
  // Made by Workqueue::Post: the workqueue owns it and frees it after it runs. Set before
  // it is first queued, then only read.
  bool owned_ = false;
  std::atomic<internal::PoolWorkqueue*> pwq_{nullptr};  // the (workqueue, pool) queued to
  // Guarded by the lock of the list the work is on / the pool it is running in:
  internal::Worker* runner_ = nullptr;  // the worker executing it
  Work* prev_ = nullptr;                // links in one intrusive work list
  Work* next_ = nullptr;
  void* list_ = nullptr;  // that list, or the DelayedWork on a timer
  uint64_t color_ = 0;    // flush color of the pending instance
  // Flush(work): instances queued and instances finished (sequence numbers).
  std::atomic<uint64_t> queued_seq_{0};
  std::atomic<uint64_t> done_seq_{0};
  // The instance being run (written under the runner's pool lock; Flush reads it).
  std::atomic<uint64_t> running_seq_{0};
};

// A work queued after a delay (struct delayed_work). The delay runs on the workqueue's
// TimerService.
class DelayedWork {
 public:
  explicit DelayedWork(absl::AnyInvocable<void()> fn) : work_(std::move(fn)) {}
  // The Work inside, for the calls that take only a Work (Disable, Enable).
  Work& work() { return work_; }
  // On its timer or queued, and not yet started (Work::pending). Lock-free.
  bool pending() const { return work_.pending(); }

 private:
  friend struct internal::WorkAccess;
  Work work_;
  // Guarded by the owning workqueue's timer lock.
  TimerId timer_ = 0;
  int target_cpu_ = -1;
  // Its place in the owning workqueue's list of works on a timer (intrusive, so putting
  // a work on a timer allocates nothing once its timer exists).
  DelayedWork* timed_prev_ = nullptr;
  DelayedWork* timed_next_ = nullptr;
};

// Workqueue flags (WQ_*).
enum WorkqueueFlags : uint32_t {
  kUnbound = 1u << 0,       // WQ_UNBOUND: pools per affinity pod, not per CPU
  kHighPri = 1u << 1,       // WQ_HIGHPRI: the high-priority pools (raised priority)
  kCpuIntensive = 1u << 2,  // WQ_CPU_INTENSIVE: works do not count for concurrency
  kOrdered = 1u << 3,       // one at a time, in queueing order (implies kUnbound)
  kFreezable = 1u << 4,     // WQ_FREEZABLE: stops on Freeze until Thaw
  kMemReclaim = 1u << 5,    // WQ_MEM_RECLAIM: a rescuer thread guarantees progress
};

class WorkqueueRuntime;

struct WorkqueueOptions {
  std::string name = {};  // required, for dumps and stall reports
  uint32_t flags = 0;     // WorkqueueFlags, or-ed; another bit set is InvalidArgument
  // Concurrently active works: per CPU (bound), or split over NUMA nodes by their CPU
  // counts (unbound; each node's share rounded up and at least min_active, so the nodes
  // together may run a little more). 0 means the default (256); must be in [0, 2048].
  // kOrdered forces 1.
  int max_active = 0;
  // Unbound: each node's share of max_active is at least this (default 8, capped at
  // max_active).
  int min_active = 0;
  // Unbound pools are formed per pod of this scope.
  AffinityScope affinity_scope = AffinityScope::kCache;
  // Strict: workers stay inside their pod's CPUs. Not strict: they start there but may
  // run on any allowed CPU (the scheduler decides).
  bool affinity_strict = false;
  // nullptr: WorkqueueRuntime::Default().
  WorkqueueRuntime* runtime = nullptr;
};

// Counters like the kernel's wq_monitor.py, since the workqueue was created.
struct WorkqueueStats {
  // Successful Queue*/ModDelayed calls (work or delayed work; a delayed work counts once,
  // when queued, whether its timer fires or is cancelled). Exact when no call is in
  // progress.
  uint64_t queued = 0;
  uint64_t started = 0;              // function executions started
  uint64_t completed = 0;            // function executions finished
  int64_t in_flight = 0;             // started - completed
  absl::Duration run_time;           // summed wall-clock time of executions (TSC)
  uint64_t cpu_hogs = 0;             // executions the watchdog marked CPU-intensive
  uint64_t concurrency_wakeups = 0;  // extra workers woken for blocked/hogging ones
  uint64_t rescued = 0;              // works executed by the rescuer
  // Executions of a non-strict unbound workqueue that found their worker outside the
  // pod and moved it back in first (wq_monitor's repatriations).
  uint64_t repatriations = 0;
  uint64_t exceptions = 0;  // work functions that threw (caught, counted)
};

class Workqueue {
 public:
  // InvalidArgument for an empty name, max_active outside [0, 2048], negative
  // min_active, kOrdered with max_active > 1, or an affinity_scope outside the enum;
  // ResourceExhausted when a kMemReclaim workqueue's rescuer thread cannot start.
  static absl::StatusOr<std::unique_ptr<Workqueue>> Create(WorkqueueOptions options);

  // destroy_workqueue: thaws a frozen workqueue, cancels delayed works still on their
  // timers, drains the rest, and repeats until no timer is left (a work run by the drain
  // may put a delayed work on a timer again); then frees it. Blocks until then. Queueing
  // from outside meanwhile is the caller's bug, as in the kernel. Destroying it from one
  // of its own works deadlocks (it drains).
  ~Workqueue();
  Workqueue(const Workqueue&) = delete;
  Workqueue& operator=(const Workqueue&) = delete;

  // queue_work: on the calling thread's CPU pool (bound) or pod (unbound). Returns false,
  // changing nothing, when `work` is already pending or disabled, a CancelSync of it is in
  // progress, or a Drain refuses it (see Drain). Never waits for a work; it may wake or
  // start a worker thread (one that cannot be started is not an error here: the pool
  // retries, and a kMemReclaim workqueue's rescuer steps in).
  bool Queue(Work* work);
  // Runs `fn` once, as Queue would run a work of its own, in a Work that the workqueue
  // makes and frees once `fn` has returned (its captures are destroyed on the worker,
  // right after the run, outside the pool's locks). For fire-and-forget tasks, as an
  // executor's post: there is no Work to Cancel or Flush, but Flush() and Drain() of the
  // workqueue wait for it, and destroying the workqueue runs it first. Returns false, and
  // destroys `fn` without running it, when the workqueue refuses works (a Drain or the
  // destruction in progress). Thread-safe. The Work's memory is recycled: taken from a
  // cache per thread, refilled with batches of blocks that workers freed (operator new
  // only when none is cached). Kept for reuse: fewer than 128 blocks per thread that
  // posts or runs posted works, until it exits, plus up to 4,096 passed between threads
  // (docs/design.md). A block is about sizeof(Work), 128 bytes. An empty `fn` runs
  // nothing. Throws std::bad_alloc, with `fn` destroyed and nothing queued, when no block
  // is cached and none can be allocated.
  bool Post(absl::AnyInvocable<void()> fn);
  // queue_work_on: on `cpu`'s pool (bound) or the pod containing `cpu` (unbound). An
  // unknown CPU (any int) falls back to Queue's choice (as the kernel does for offline
  // CPUs). Returns, refuses and costs as Queue.
  bool QueueOn(int cpu, Work* work);
  // queue_work_node: a CPU of NUMA node `node`, the caller's when it is on that node
  // (unknown node, any int: Queue's choice). Returns, refuses and costs as Queue.
  bool QueueOnNode(int node, Work* work);
  // queue_delayed_work(_on): after `delay` (<= 0: now). `cpu` as QueueOn; -1 (or an
  // unknown CPU): Queue's choice on the thread that queues it when the delay ends (the
  // timer's). False, changing nothing, if already pending or refused as Queue is.
  // Throws std::bad_alloc when its timer cannot be made, with the work left as it was.
  bool QueueDelayed(DelayedWork* dwork, absl::Duration delay, int cpu = -1);
  // mod_delayed_work: (re)sets the delay whether or not it is pending. Returns true when
  // it was pending before the call. Throws std::bad_alloc when its timer cannot be made,
  // with the work left as it was (its timer is made before the work is taken from where
  // it was pending, so nothing fails after that). Returns false, changing nothing, when
  // a Drain refuses it (see Drain), the work is disabled, or a CancelSync of it is in
  // progress (queueing is refused while it cancels; the kernel's mod_delayed_work queues
  // nothing there either, but returns true).
  bool ModDelayed(DelayedWork* dwork, absl::Duration delay, int cpu = -1);

  // cancel_work: removes a pending instance. True when one was pending. Does not wait for
  // a running instance.
  bool Cancel(Work* work);
  bool Cancel(DelayedWork* dwork);
  // cancel_work_sync: cancels and waits until the work is not running; correct even for
  // works that requeue themselves (queueing is refused while it cancels). True when an
  // instance was pending. Must not be called from the work itself (it would wait for
  // itself). The wait is a BlockingScope.
  bool CancelSync(Work* work);
  bool CancelSync(DelayedWork* dwork);

  // flush_work: waits until the instance pending or running at the call has finished,
  // or was taken back (cancelled, or moved back to a timer by ModDelayed), and its worker
  // is done with `work` (unless queued again, it may be destroyed once Flush returns).
  // True when it waited; false when nothing was queued or running (a work waiting on its
  // delay timer counts as neither). Flush(DelayedWork*) queues a delayed work at once first
  // (flush_delayed_work), and is then true also when it finished before the wait began.
  // Must not be called from `work` itself (it would wait for itself). The wait is a
  // BlockingScope; a work held back by Freeze is waited for until Thaw.
  bool Flush(Work* work);
  bool Flush(DelayedWork* dwork);
  // flush_workqueue: waits for every work queued before the call to finish. Works queued
  // meanwhile (even by the flushed works) are not waited for, so it cannot livelock.
  // Concurrent flushes of one workqueue run one after another (each still waits for
  // every work queued before its own call). The wait is a BlockingScope; on a frozen
  // workqueue it waits for Thaw.
  void Flush();
  // drain_workqueue: flushes until the workqueue is empty; meanwhile only works of this
  // workqueue (chained queueing) may queue to it — Queue, QueueDelayed and ModDelayed
  // from anywhere else return false and change nothing (the kernel WARNs). Delayed works
  // still on their timers are not waited for. On a frozen workqueue it waits for Thaw.
  void Drain();

  // disable_work: cancels like Cancel and makes Queue refuse the work until Enable.
  // Nestable (a count). Returns true when an instance was pending. Like Cancel, does not
  // wait for a running instance (CancelSync after it does).
  bool Disable(Work* work);
  // enable_work: undoes one Disable (a work never disabled is left alone, also while a
  // CancelSync holds it). Returns true when the Disable count reached zero; queueing is
  // still refused until a CancelSync in progress returns.
  bool Enable(Work* work);

  // For kFreezable workqueues: stop activating queued works / resume. Works already
  // activated into a pool's worklist still start (as in the kernel), and Freeze waits
  // until those and the running ones have finished; once it returns, none starts until
  // Thaw. No-op without kFreezable. Must not be called from one of this workqueue's works
  // (it would wait for itself).
  void Freeze();
  void Thaw();

  // A snapshot: takes the timer lock and each of its pools' locks in turn (O(pools)), so
  // the pools' counts are read at slightly different moments.
  WorkqueueStats stats() const;
  const std::string& name() const;
  // The flags in force: kOrdered adds kUnbound.
  uint32_t flags() const;
  // The max_active in force (after defaults).
  int max_active() const;
  // The topology of the runtime this workqueue runs on: the CPUs QueueOn knows. Lives as
  // long as the workqueue.
  const Topology& topology() const;

 private:
  friend struct internal::WorkAccess;
  explicit Workqueue(std::unique_ptr<internal::WorkqueueCore> core);
  std::unique_ptr<internal::WorkqueueCore> core_;
};

// The worker pools of a topology (the kernel's per-CPU and unbound pools). Most programs
// use Default(); tests make their own with a synthetic topology and short timeouts.
class WorkqueueRuntime {
 public:
  // CPU ids must be below this (per-CPU tables are indexed by id); Create returns
  // InvalidArgument for a topology with a larger one. Linux's NR_CPUS is at most 8192.
  static constexpr int kMaxCpuId = 1 << 16;

  struct Options {
    // nullptr: Topology::Detect().
    std::shared_ptr<const Topology> topology = nullptr;
    // Clock and timers for delays and the watchdog (idle workers time out on real time,
    // see idle_timeout). nullptr: real ones. Both must outlive the runtime. `timers`
    // should run on `clock` (not checked): delays are read on timers->clock(), the
    // watchdog's thresholds on `clock`.
    Clock* clock = nullptr;
    TimerService* timers = nullptr;
    // Idle workers beyond two per pool exit after this long (the kernel's 5 minutes).
    absl::Duration idle_timeout = absl::Minutes(5);
    // A work running longer than this on a counted worker (of any pool) is marked a CPU
    // hog and stops counting for concurrency (wq_cpu_intensive_thresh_us, 10 ms).
    absl::Duration cpu_intensive_threshold = absl::Milliseconds(10);
    // A pool with pending work that starts nothing for this long is reported stalled.
    absl::Duration stall_threshold = absl::Seconds(30);
    // Receives stall reports (default: stderr). Called by the watchdog, a timer callback
    // on `timers` (so a slow reporter delays that service's other timers), with no pool
    // lock held: it may call Dump(). An exception it throws is caught; the report still
    // counts in stalls().
    std::function<void(const std::string&)> stall_reporter = nullptr;
    // Pin workers to their pool's CPUs. When pinning fails (a synthetic topology, a
    // cpuset that forbids it) workers run unpinned and the failure is counted: on any CPU
    // of the topology, whatever the mask of the thread that created them, when those
    // CPUs exist here (a synthetic topology's may not: the worker then keeps the mask it
    // started with, its creator's).
    bool bind_workers = true;
    // Fault injection for tests: when set and it returns true, creating a worker thread
    // fails as if the system were out of threads (kMemReclaim rescuers then step in).
    // Called with a pool's lock held, on whichever thread needs a worker (a Queue, a
    // worker, the watchdog): it must not call into the workqueues. A throw counts as
    // true (the exception goes no further).
    std::function<bool()> fail_thread_creation = nullptr;
  };

  // Errors: InvalidArgument for a non-positive idle_timeout, cpu_intensive_threshold or
  // stall_threshold, or a topology with no CPU; without a topology, Topology::Detect's
  // errors.
  static absl::StatusOr<std::unique_ptr<WorkqueueRuntime>> Create(Options options);
  // The process-wide runtime on the detected topology (Topology::DetectForProcess: the
  // main thread's affinity mask, whichever thread calls first); never destroyed. If
  // detection or creation fails it says so on stderr and aborts, as
  // TimerService::Default() does.
  static WorkqueueRuntime& Default();

  // All workqueues of this runtime must have been destroyed. Joins every worker.
  ~WorkqueueRuntime();

  const Topology& topology() const;
  // A state dump like the kernel's wq_dump.py: pods per scope, pools (CPU, priority,
  // workers, idle, running, pending), and which workqueue uses which pool. Takes the
  // runtime's lock and each pool's lock in turn: O(pools + workqueues).
  std::string Dump() const;
  // Workers whose pinning failed and that run unpinned (one each), plus pinned workers of
  // non-strict pools that could not be moved back into their pod before a work.
  uint64_t bind_failures() const;
  // Stall reports made so far.
  uint64_t stalls() const;
  // Whether high-priority pools could raise their priority (nice -20 needs
  // CAP_SYS_NICE); when not, they run at normal priority.
  bool highpri_raised() const;

 private:
  friend class Workqueue;
  friend struct internal::WorkAccess;
  explicit WorkqueueRuntime(std::unique_ptr<internal::RuntimeCore> core);
  std::unique_ptr<internal::RuntimeCore> core_;
};

// Tells the pool that the calling worker is about to block (sleep, I/O, a lock), so a
// bound pool wakes another worker for its pending works — the hint the kernel gets from
// the scheduler. Harmless outside a worker. Not movable: made and destroyed on one
// thread. Nestable: only the outermost scope of a worker counts. Entering and leaving
// each take the worker's pool lock once (nothing outside a worker).
class BlockingScope {
 public:
  BlockingScope();
  ~BlockingScope();
  BlockingScope(const BlockingScope&) = delete;
  BlockingScope& operator=(const BlockingScope&) = delete;

 private:
  internal::Worker* worker_;
};

// The system workqueues (system_wq, system_highpri_wq, system_long_wq,
// system_unbound_wq) on WorkqueueRuntime::Default(); created on first use, never freed.
Workqueue& SystemWq();
Workqueue& SystemHighPriWq();
Workqueue& SystemLongWq();
Workqueue& SystemUnboundWq();

}  // namespace kwq

#endif  // KWQ_WORKQUEUE_H_
