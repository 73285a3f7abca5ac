// Internals of kwq's kernel-style workqueues: runtime, pools, workers, pool workqueues.
//
// Locking rules (one letter per field, as in the kernel's workqueue.c):
//   I: set at creation, read-only after.
//   P: the pool's mu.
//   Q: the workqueue's mu.
//   T: the workqueue's timer_mu (delayed works waiting on a timer).
//   R: the runtime's mu.
//   A: atomic; the comment says which order.
// Lock order: T (timer_mu) before P; R before P; P before Q (a worker signals flushers
// under its pool's lock); node locks (out_mu before in_mu) are leaves. A work moves
// between a node's parking lists and a pool's worklist with one lock at a time, and its
// `where_` field tells which lock guards it now.

#ifndef KWQ_SRC_WORKQUEUE_INTERNAL_H_
#define KWQ_SRC_WORKQUEUE_INTERNAL_H_

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kwq/internal/mutex.h"
#include "kwq/workqueue.h"

namespace kwq::internal {

// Where a pending work is, i.e. which lock guards its list links (Work::list_).
enum class WorkWhere : uint8_t { kNone, kTimer, kInactive, kPool, kScheduled };

// An intrusive FIFO of works (links in Work::prev_/next_/list_).
class WorkList {
 public:
  bool empty() const { return head_ == nullptr; }
  size_t size() const { return size_; }
  Work* front() const { return head_; }
  void PushBack(Work* w);
  void Remove(Work* w);
  Work* PopFront();
  bool Contains(const Work* w) const;

 private:
  Work* head_ = nullptr;
  Work* tail_ = nullptr;
  size_t size_ = 0;
};

// The two parking lists of a max_active node (see WorkqueueCore::Node): producers append
// to `in` under the node's in_mu; consumers pop from `out` under its out_mu and, when `out`
// is empty, move all of `in` over (both locks held). The move is O(1): a parked work's
// list_ points at this object, not at one of the two lists, so no work is touched (a
// million parked works used to be walked one by one while producers waited for in_mu).
// Remove tells the lists apart by their ends. The caller holds the locks named.
class ParkedWorks {
 public:
  bool OutEmpty() const { return out_head_ == nullptr; }  // out_mu
  void PushIn(Work* w);                                   // in_mu
  void MoveInToOut();                                     // out_mu and in_mu; out empty
  Work* PopOut();                                         // out_mu; null when out is empty
  void Remove(Work* w);                                   // out_mu and in_mu; w parked here

 private:
  // The two ends on separate cache lines: workers pop at out_head_ while producers
  // append at in_tail_.
  alignas(64) Work* out_head_ = nullptr;
  alignas(64) Work* in_head_ = nullptr;
  Work* in_tail_ = nullptr;
};

// Friend of Work, DelayedWork, Workqueue and WorkqueueRuntime: the one door to their
// private state for the implementation.
struct WorkAccess {
  static absl::AnyInvocable<void()>& fn(Work* w) { return w->fn_; }
  static std::atomic<uint64_t>& state(Work* w) { return w->state_; }
  static std::atomic<WorkerPool*>& running_pool(Work* w) { return w->running_pool_; }
  static std::atomic<PoolWorkqueue*>& pwq(Work* w) { return w->pwq_; }
  static std::atomic<uint8_t>& where(Work* w) { return w->where_; }
  static bool& owned(Work* w) { return w->owned_; }
  static Worker*& runner(Work* w) { return w->runner_; }
  static Work*& prev(Work* w) { return w->prev_; }
  static Work*& next(Work* w) { return w->next_; }
  static void*& list(Work* w) { return w->list_; }
  static uint64_t& color(Work* w) { return w->color_; }
  static std::atomic<uint64_t>& queued_seq(Work* w) { return w->queued_seq_; }
  static std::atomic<uint64_t>& done_seq(Work* w) { return w->done_seq_; }
  static std::atomic<uint64_t>& running_seq(Work* w) { return w->running_seq_; }
  static TimerId& timer(DelayedWork* d) { return d->timer_; }
  static int& target_cpu(DelayedWork* d) { return d->target_cpu_; }
  static DelayedWork*& timed_prev(DelayedWork* d) { return d->timed_prev_; }
  static DelayedWork*& timed_next(DelayedWork* d) { return d->timed_next_; }
  static Work* work(DelayedWork* d) { return &d->work_; }
  static WorkqueueCore* core(Workqueue* wq) { return wq->core_.get(); }
  static RuntimeCore* core(WorkqueueRuntime* rt) { return rt->core_.get(); }
};

// Work::state_: bit 0 pending; bits 1..31 the CancelSync calls in progress (each refuses
// requeueing while it waits); bits 32..63 the Disable count. Kept apart so that an
// Enable cannot undo a CancelSync's hold, and disabled() reports Disable alone. Queueing
// is refused while either count is non-zero (s >= kCancelHoldUnit).
inline constexpr uint64_t kPendingBit = 1;
inline constexpr uint64_t kCancelHoldUnit = 2;
inline constexpr uint64_t kDisableUnit = uint64_t{1} << 32;

// One worker thread of a pool.
class Worker {
 public:
  explicit Worker(WorkerPool* pool) : pool(pool) {}
  WorkerPool* const pool;  // I
  std::thread thread;      // I (started by the pool, joined by the pool)
  // P:
  Work* current = nullptr;  // the work being executed
  PoolWorkqueue* current_pwq = nullptr;
  WorkList scheduled;  // colliding instances of `current` to run next
  uint64_t execs = 0;  // executions started (the watchdog samples it)
  // Watchdog only: the execution it saw last, since when, in which watch epoch.
  uint64_t watch_execs = 0;
  absl::Time watch_since;
  uint64_t watch_epoch = 0;
  bool counted = false;  // counts in pool->nr_running
  // Owner thread only: pinned to its pool's CPUs at start. One that is not (by choice, or
  // pinning failed) is not repatriated either: that would fail (and count) once per work.
  bool bound = false;
  bool hog = false;      // marked CPU-intensive by the watchdog
  int blocking = 0;      // nesting of BlockingScope
  bool rescuer = false;  // I: a kMemReclaim rescuer borrowed by the pool
  // P: the next rescuer at work in the pool (WorkerPool::rescuing_; a list through the
  // rescuers, so that joining it allocates nothing on the rescuer's thread).
  Worker* rescuing_next = nullptr;
};

// A pool of workers: per CPU (bound, normal or high priority) or per pod (unbound).
class WorkerPool {
 public:
  WorkerPool(RuntimeCore* rt, int id, int cpu, bool highpri, std::vector<int> cpus, bool strict);
  ~WorkerPool();  // joins every worker (Stop first)

  // Appends a work (its pwq_ set) and wakes or creates a worker if needed.
  void Insert(Work* w);
  // Removes `w` if it is queued here (worklist or a worker's scheduled list) and returns
  // the pool workqueue it was queued with (read under this pool's lock); null if not here.
  PoolWorkqueue* TryRemove(Work* w);
  // Stops the workers (they exit once the worklist is empty) and joins them.
  void Stop();
  // Watchdog: marks CPU hogs, reports stalls. Returns true while the pool is busy.
  bool Check(absl::Time now);
  // Pending work or a worker running one.
  bool Busy() const;
  // Moves the calling worker back into the pod if it wandered off (non-strict pools).
  void Repatriate(WorkqueueCore* wq);
  std::string DumpLine() const;
  // Adds `pwq`'s execution counters (guarded by this pool's lock) to `s`.
  void AddStats(const PoolWorkqueue* pwq, WorkqueueStats* s, int64_t* busy_ticks) const;
  // For BlockingScope.
  void EnterBlocking(Worker* w);
  void ExitBlocking(Worker* w);
  // Runs the works of `pwq` found in this pool's worklist on the calling (rescuer)
  // thread. Returns how many ran.
  int Rescue(PoolWorkqueue* pwq, Worker* rescuer);

  RuntimeCore* const rt;        // I
  const int id;                 // I
  const int cpu;                // I: the CPU of a bound pool, -1 for unbound
  const bool highpri;           // I
  const std::vector<int> cpus;  // I: CPUs workers are bound to (empty: any)
  std::vector<int> pod;         // I: unbound pools: the pod they serve (their lookup key)
  // I: a non-strict pool whose pod is not every CPU: its workers may wander outside the
  // pod and are moved back at the start of an execution (repatriation).
  bool repatriates = false;
  const bool strict;  // I

 private:
  friend class WorkqueueCore;
  bool bound() const { return cpu >= 0; }
  bool NeedMoreWorkerLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeOrCreateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerMain(Worker* self);
  // Runs `w` (claimed from a list) on `self`; called and returns with mu_ held. Returns
  // a work the workqueue activated for this pool and handed straight back (to run next
  // without a trip through the worklist), or null.
  Work* Execute(Worker* self, Work* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Workers that may run at once without blocking: 1 per CPU pool (the kernel's
  // concurrency management); for unbound pools, one per CPU they may run on: the pod's
  // CPUs when strict, every allowed CPU when not (their workers start in the pod but the
  // scheduler may place them anywhere, as the kernel's non-strict scopes do).
  int concurrency() const { return bound() || cpus.empty() ? 1 : static_cast<int>(cpus.size()); }
  // Claims the next work for `self`, or null.
  Work* NextLocked(Worker* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JoinDead();

  mutable Mutex mu_;
  CondVar cv_;  // idle workers wait here
  WorkList worklist_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Worker>> dead_ ABSL_GUARDED_BY(mu_);
  // The rescuers running this pool's works (Rescue), so that instances scheduled to them
  // can be found and cancelled like those scheduled to a worker in workers_. Several: the
  // kMemReclaim workqueues of one pool each have a rescuer, and Rescue drops the lock
  // while a work runs, so another may enter meanwhile.
  Worker* rescuing_ ABSL_GUARDED_BY(mu_) = nullptr;  // first of the list (rescuing_next)
  int nr_idle_ ABSL_GUARDED_BY(mu_) = 0;
  int nr_running_ ABSL_GUARDED_BY(mu_) = 0;  // counted running workers (bound pools)
  int nr_creating_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool spawn_failed_ ABSL_GUARDED_BY(mu_) = false;
  // The pool workqueues of kMemReclaim workqueues with works in worklist_ (a list through
  // PoolWorkqueue::reclaim_prev/next, kept by the three calls below with each one's
  // reclaim_queued): the rescuers a failed spawn asks. It walked the worklist to find
  // them, on every Queue while spawning failed: 24 us per Queue with 16,384 works
  // pending and none a rescuer's, and up to the last rescuer's work when there was one.
  PoolWorkqueue* reclaim_pwqs_ ABSL_GUARDED_BY(mu_) = nullptr;
  // worklist_'s PushBack, Remove and PopFront, keeping reclaim_pwqs_.
  void PushWorkLocked(Work* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWorkLocked(Work* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Work* PopWorkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A kMemReclaim work of `pwq` entered (+1) or left (-1) worklist_.
  void CountReclaimLocked(PoolWorkqueue* pwq, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  // Watchdog only: started_ when it last looked, since when it has not moved with work
  // pending, in which watch epoch; whether this stall was reported.
  uint64_t watch_started_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time watch_since_ ABSL_GUARDED_BY(mu_);
  uint64_t watch_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool stall_reported_ ABSL_GUARDED_BY(mu_) = false;
};

// The link between a workqueue and one pool it uses (the kernel's pool_workqueue).
class PoolWorkqueue {
 public:
  PoolWorkqueue(WorkqueueCore* wq, WorkerPool* pool, int node) : wq(wq), pool(pool), node(node) {}
  WorkqueueCore* const wq;  // I
  WorkerPool* const pool;   // I
  const int node;           // I: max_active accounting node (index into WorkqueueCore)
  // Counters of executions in `pool` (P: the pool's lock, which the worker holds anyway,
  // so the hot path bumps no shared atomics; WorkqueueCore::Stats sums them).
  uint64_t started = 0;
  uint64_t completed = 0;
  uint64_t exceptions = 0;
  int64_t busy_ticks = 0;
  // P, for a kMemReclaim workqueue only: its works in `pool`'s worklist, and while there
  // are some, the links of the pool's list of such pool workqueues (reclaim_pwqs_).
  size_t reclaim_queued = 0;
  PoolWorkqueue* reclaim_prev = nullptr;
  PoolWorkqueue* reclaim_next = nullptr;
};

// The runtime: topology, pools, watchdog.
class RuntimeCore {
 public:
  explicit RuntimeCore(WorkqueueRuntime::Options options);
  ~RuntimeCore();

  // The topology's CPU ids: where an unpinned worker may run.
  std::vector<int> all_cpus;
  // The process's scheduling policy and nice value (its main thread's) when the runtime
  // was made: what every worker takes, whichever thread created it (high-priority ones
  // nice -20, or lower).
  int base_policy = SCHED_OTHER;
  sched_param base_param{};
  int base_nice = 0;

  // The per-CPU pool of `cpu` (a CPU of the topology).
  WorkerPool* CpuPool(int cpu, bool highpri);
  // The shared unbound pool for these attributes.
  WorkerPool* UnboundPool(const std::vector<int>& cpus, bool highpri, bool strict);
  void Register(WorkqueueCore* wq);
  void Unregister(WorkqueueCore* wq);
  // Makes sure the watchdog timer runs (cheap when it does).
  void KickWatchdog();
  void CountBindFailure() { bind_failures_.fetch_add(1, std::memory_order_relaxed); }
  void ReportStall(const std::string& report);
  // Fault injection: true when the next worker creation must fail.
  bool ShouldFailSpawn();
  std::string Dump() const;

  const WorkqueueRuntime::Options options;   // I
  std::shared_ptr<const Topology> topology;  // I
  Clock* const clock;                        // I
  TimerService* const timers;                // I
  std::atomic<uint64_t> bind_failures_{0};
  std::atomic<uint64_t> stalls_{0};
  std::atomic<bool> highpri_raised_{true};  // cleared when raising a priority fails

 private:
  void Watchdog();
  // One watchdog pass over the pools, which it lists in *pools: returns whether one is
  // busy (false when the runtime is stopping). May throw (allocations, a stall reporter).
  bool CheckPools(std::vector<WorkerPool*>* pools);
  // Schedules the next watchdog pass; a failure disarms it instead (never throws).
  void ArmWatchdogLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watchdog_mu_);

  mutable Mutex mu_;
  // Per CPU (indexed by OS CPU number): normal and high-priority pools, created lazily.
  std::vector<std::unique_ptr<WorkerPool>> cpu_pools_[2] ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<WorkerPool>> unbound_pools_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkqueueCore*> workqueues_ ABSL_GUARDED_BY(mu_);
  int next_pool_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> watchdog_armed_{false};

 public:
  // Bumped each time the watchdog is armed after a pause: pools and workers restart
  // their observations (A, relaxed: read by the watchdog only).
  std::atomic<uint64_t> watch_epoch_{0};

 private:
  Mutex watchdog_mu_;
  TimerId watchdog_timer_ ABSL_GUARDED_BY(watchdog_mu_) = 0;
};

// The state behind a Workqueue.
class WorkqueueCore {
 public:
  WorkqueueCore(RuntimeCore* rt, WorkqueueOptions options, Workqueue* owner);
  ~WorkqueueCore();
  absl::Status Init();

  bool QueueOn(int cpu, int node, Work* w);
  // While draining, queueing is refused except from a work of this workqueue.
  bool RefusedWhileDraining() const;
  // Inserts a work whose pending bit the caller holds.
  void Enqueue(int cpu, int node, Work* w);
  bool Cancel(Work* w);
  bool CancelSync(Work* w);
  bool Flush(Work* w);
  void FlushAll();
  void Drain();
  bool Disable(Work* w);
  bool Enable(Work* w);
  void Freeze();
  void Thaw();
  bool QueueDelayed(DelayedWork* d, absl::Duration delay, int cpu, bool modify);
  bool CancelDelayed(DelayedWork* d, bool sync);
  bool FlushDelayed(DelayedWork* d);
  void TimerFired(DelayedWork* d);

  // Called by a worker of `here` after a work of `pwq` ran, before it clears the work's
  // running state. Frees the work's active slot or hands it to the next waiting work:
  // returns that work when it belongs to `here` (the caller runs or queues it), else
  // inserts it into its pool. Must be followed by Finished.
  Work* Completed(PoolWorkqueue* pwq, WorkerPool* here);
  // Called once the finished work's running state is cleared (the caller may hold its
  // pool's lock): the instance of `w` (compared, never read: it may be freed already) of
  // flush color `color` has left the workqueue, which may be destroyed as soon as this
  // returns (its color_gone_ increment is the last touch).
  void Finished(uint64_t color, const Work* w);
  void CountHog() { hogs_.fetch_add(1, std::memory_order_relaxed); }
  void CountWakeup() { wakeups_.fetch_add(1, std::memory_order_relaxed); }
  void CountRescued() { rescued_.fetch_add(1, std::memory_order_relaxed); }
  void CountRepatriation() { repatriations_.fetch_add(1, std::memory_order_relaxed); }
  // Wakes the rescuer (kMemReclaim) because `pool` cannot create workers.
  void Mayday();
  WorkqueueStats Stats() const;
  std::string DumpLine() const;
  bool cpu_intensive() const { return (options.flags & kCpuIntensive) != 0; }

  RuntimeCore* const rt;           // I
  const WorkqueueOptions options;  // I (after defaults)
  Workqueue* const owner;          // I

 private:
  PoolWorkqueue* PwqFor(int cpu, int node) const;
  PoolWorkqueue* PwqOfPool(WorkerPool* pool) const;
  // Grabs a pending instance off whatever list holds it. Returns true when it was
  // pending (the caller then owns the pending bit and must clear or reuse it).
  bool GrabPending(Work* w);
  // GrabPending for a work on a timer (its pwq read as `pwq`): kGrabbed when taken off
  // the timer (pending bit now the caller's); kGone when it is no longer on that timer;
  // kFiring when the timer is running and about to move it into a pool.
  enum class TimerGrab { kGrabbed, kGone, kFiring };
  TimerGrab GrabFromTimer(Work* w, PoolWorkqueue* pwq);
  void Activate(Work* w, PoolWorkqueue* pwq);
  void WaitIdle(Work* w);
  void RescuerMain();

  std::vector<std::unique_ptr<PoolWorkqueue>> pwqs_;  // I (after Init)
  std::vector<PoolWorkqueue*> pwq_by_cpu_;            // I: indexed by OS CPU
  int max_active_ = 0;                                // I
  std::vector<int> node_limit_;                       // I: per accounting node

  // Active-work accounting of one max_active node (a CPU for bound workqueues, a NUMA
  // node or the whole machine for unbound ones). Works over the limit wait here: a
  // producer appends under in_mu, a consumer pops under out_mu and, when its list is
  // empty, moves the producers' list over, so queueing and completing rarely contend.
  // `active` and `waiting` are seq_cst: a producer publishes a waiting work and then
  // checks `active`; a completion releases its slot and then checks `waiting`; one of
  // them always sees the other, so no work is stranded below the limit.
  //
  // `waiting` is parked - unparked: producers bump `parked` and consumers `unparked`,
  // each on its own cache line, so a producer and the workers do not bounce one counter.
  struct Node {
    int64_t Waiting() const {
      return parked.load(std::memory_order_seq_cst) - unparked.load(std::memory_order_seq_cst);
    }
    std::atomic<int> active{0};
    alignas(64) std::atomic<int64_t> parked{0};
    alignas(64) std::atomic<int64_t> unparked{0};
    // Workers take out_mu, producers in_mu: separate cache lines (one shared line cost the
    // producer about 30 ns per Queue in wq_tiny).
    alignas(64) Mutex out_mu ABSL_ACQUIRED_BEFORE(in_mu);
    // Whether the taken-over list holds works (written under out_mu, read as a hint by a
    // completing worker without it).
    std::atomic<bool> out_nonempty{false};
    alignas(64) Mutex in_mu;
    // Each end guarded as ParkedWorks says (the analysis cannot name two locks per field).
    ParkedWorks parked_works;
  };
  bool TryReserve(Node& n, int limit);
  void Release(Node& n);
  // Release for a slot taken and given back because a Freeze came in between: a Freeze
  // waiting may have counted that slot, and no instance leaves to signal it (InstanceGone),
  // so this signals the waiters for any instance when one is listed.
  void ReleaseRacingFreeze(Node& n);
  Work* PopWaiting(Node& n);
  // Activates waiting works of `n` while its limit allows.
  void ActivateWaiting(int node);
  // An instance of color `color` left the workqueue (ran or was cancelled): of `w`
  // (compared only), or of no work in particular when null (a count moved between
  // buckets). Wakes the waiters it concerns.
  void InstanceGone(uint64_t color, const Work* w);

  // A thread waiting on mu_ for instances to leave the workqueue (Flush, CancelSync,
  // FlushAll, Freeze), on a condition variable of its own: InstanceGone wakes only the
  // waiters an instance concerns. (With one condition variable for all, every completion
  // woke every waiter, and each took mu_ again to find it was not its own: 32 threads
  // flushing their own works on one workqueue made each work cost 250 us instead of 20.)
  // The waits still poll every kPollPeriod (workqueue.cc): a wait may depend on another
  // workqueue's completions, which signal only their own waiters.
  // Listed on `core` from construction to destruction, both under core->mu_ (the
  // destructor also runs when a wait throws, so no freed waiter stays listed).
  class CompletionWaiter {
   public:
    // Woken by the instances of `work` (if not null), of flush color bucket `bucket` (if
    // not -1), or by every instance (`any`).
    CompletionWaiter(WorkqueueCore* core, const Work* work, int bucket, bool any)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(core->mu_);
    ~CompletionWaiter();
    CompletionWaiter(const CompletionWaiter&) = delete;
    CompletionWaiter& operator=(const CompletionWaiter&) = delete;

    // Waits on `mu` (core's mu_) for a signal or kPollPeriod; true when signalled (or
    // woken spuriously).
    bool Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

   private:
    friend class WorkqueueCore;
    WorkqueueCore* const core_;
    const Work* const work_;
    const int bucket_;
    const bool any_;
    CondVar cv_;
    CompletionWaiter* prev_ = nullptr;  // the list: core_->mu_
    CompletionWaiter* next_ = nullptr;
  };

  std::vector<std::unique_ptr<Node>> nodes_;  // I: one per max_active node
  std::atomic<bool> frozen_{false};
  // Flush colors: each queued instance takes color_ and counts in its bucket; Flush()
  // bumps color_ and waits for its bucket to empty. Flushers take flush_mu_ for the whole
  // flush, one at a time, so when one bumps the color every older color is already empty
  // and it waits for exactly one.
  // Per bucket, instances queued (bumped by producers) and gone (ran or cancelled, bumped
  // by workers) are separate counters on separate cache lines; a bucket is empty when
  // they are equal. pending = sum(queued) - sum(gone): the works pending (not on a
  // timer) or running.
  // A gone word counts in steps of kGoneStep; its low bit, kWaitedOn, says that a waiter
  // listed under mu_ may wait for this bucket. InstanceGone counts with one
  // compare-and-swap that fails when the bit is set (then it counts under mu_ and
  // signals), so checking for waiters and counting are one atomic step: a waiter listed
  // after the check would otherwise miss the count and sleep to its next poll. The same
  // read-modify-write orders the worker's earlier stores (running_pool, done_seq, the
  // active slot) before a waiter's setting of the bit, which a plain load could not do.
  static constexpr int kColorBuckets = 4;
  static constexpr uint64_t kWaitedOn = 1;
  static constexpr uint64_t kGoneStep = 2;
  static uint64_t GoneCount(uint64_t word) { return word / kGoneStep; }
  std::atomic<uint64_t> color_{0};
  alignas(64) std::atomic<uint64_t> color_queued_[kColorBuckets] = {};
  alignas(64) std::atomic<uint64_t> color_gone_[kColorBuckets] = {};
  int64_t Queued() const;

  // Held by a flusher for its whole flush (FlushAll), across its waits.
  Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;  // guards the waits for completions (flushers, drainers, freezers, CancelSync)
  CompletionWaiter* completion_waiters_ ABSL_GUARDED_BY(mu_) = nullptr;  // a list
  // Per bucket, the listed waiters it concerns; the bucket's kWaitedOn bit is set while
  // this is above zero.
  int waiters_on_[kColorBuckets] ABSL_GUARDED_BY(mu_) = {};
  // Drains in progress (a count: when one of two concurrent drains ends, the other still
  // refuses outside queueing, as the kernel's nr_drainers does).
  std::atomic<int> draining_{0};

  mutable Mutex timer_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Delayed works on a timer of this workqueue, linked through the works themselves.
  DelayedWork* timed_head_ ABSL_GUARDED_BY(timer_mu_) = nullptr;
  void LinkTimedLocked(DelayedWork* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(timer_mu_);
  // ModDelayed of a work on this workqueue's own timer: moves that timer (the kernel's
  // mod_timer), allocating nothing. False (nothing changed) when the work is elsewhere,
  // its timer is firing, or a CancelSync holds it: the caller takes the general path.
  bool MoveOwnTimer(DelayedWork* d, absl::Time deadline, int cpu) ABSL_LOCKS_EXCLUDED(timer_mu_);
  void UnlinkTimedLocked(DelayedWork* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(timer_mu_);
  // For stats().queued, which counts calls: delayed works put on a timer, and those that
  // left it into a pool (already counted once, as they went on the timer).
  std::atomic<uint64_t> timer_armed_{0}, timer_entered_{0};
  // Enqueue counts moved to a newer flush color's bucket (a Flush bumped the color while
  // the call counted): each is in two buckets, for one call.
  std::atomic<uint64_t> rehomed_{0};

  // Rescuer (kMemReclaim).
  std::thread rescuer_;
  Mutex rescuer_mu_;
  CondVar rescuer_cv_;
  bool mayday_ ABSL_GUARDED_BY(rescuer_mu_) = false;
  bool rescuer_stop_ ABSL_GUARDED_BY(rescuer_mu_) = false;

  // Rare events; the per-execution counters live in each PoolWorkqueue.
  std::atomic<uint64_t> hogs_{0}, wakeups_{0}, rescued_{0}, repatriations_{0};
};

// The worker running on this thread, or null.
Worker* CurrentWorker();

}  // namespace kwq::internal

#endif  // KWQ_SRC_WORKQUEUE_INTERNAL_H_
