// Workqueues: queueing, max_active accounting, flush colors, cancel, delayed work,
// freeze, drain, rescuer, and the public Workqueue/Work API.

#include <algorithm>
#include <cstdio>
#include <new>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "internal/cycle_clock.h"
#include "kwq/internal/check.h"
#include "kwq/internal/test_hooks.h"
#include "workqueue/internal.h"
#include "workqueue/post_blocks.h"

namespace kwq {
namespace internal {

namespace {
using A = WorkAccess;
constexpr int kDefaultMaxActive = 256;
constexpr int kMaxMaxActive = 2048;
constexpr int kDefaultMinActive = 8;
// Waits that depend on another workqueue's completions poll at this period.
constexpr absl::Duration kPollPeriod = absl::Milliseconds(1);

void SetWhere(Work* w, WorkWhere where) {
  A::where(w).store(static_cast<uint8_t>(where), std::memory_order_release);
}
WorkWhere WhereOf(Work* w) {
  return static_cast<WorkWhere>(A::where(w).load(std::memory_order_acquire));
}
bool Pending(Work* w) { return (A::state(w).load(std::memory_order_acquire) & kPendingBit) != 0; }
void ClearPending(Work* w) { A::state(w).fetch_and(~kPendingBit, std::memory_order_acq_rel); }
bool Running(Work* w) { return A::running_pool(w).load(std::memory_order_acquire) != nullptr; }

// Whether the instance numbered `target` (queued_seq) has finished and its worker is done
// with `w`: done_seq has reached it, and that worker's last touch of `w` (clearing
// running_pool, after done_seq) is over, or a later instance runs already (one starts only
// after that last touch: on another pool once running_pool is clear, on the same pool
// once the finishing worker let go of the pool's lock). So a caller may free `w` next.
bool FinishedAndReleased(Work* w, uint64_t target) {
  if (A::done_seq(w).load(std::memory_order_acquire) < target) return false;
  return A::running_pool(w).load(std::memory_order_acquire) == nullptr ||
         A::running_seq(w).load(std::memory_order_acquire) > target;
}

// A pending instance was taken back (cancelled, or moved back to a timer by ModDelayed)
// by the holder of the pending bit: it counts as finished for Flush, which would
// otherwise wait for a later instance to run. done_seq's other writer, a worker
// finishing an earlier instance, never lowers it. Returns true (GrabPending's result).
bool TakenBack(Work* w) {
  A::done_seq(w).store(A::queued_seq(w).load(std::memory_order_relaxed), std::memory_order_release);
  return true;
}

// Takes the pending bit unless it is set or the work is disabled.
bool TryClaimPending(Work* w) {
  uint64_t s = A::state(w).load(std::memory_order_relaxed);
  for (;;) {
    if ((s & kPendingBit) != 0 || s >= kCancelHoldUnit) return false;
    if (A::state(w).compare_exchange_weak(s, s | kPendingBit, std::memory_order_acq_rel)) {
      return true;
    }
  }
}
}  // namespace

WorkqueueCore::WorkqueueCore(RuntimeCore* rt, WorkqueueOptions opts, Workqueue* owner)
    : rt(rt), options(std::move(opts)), owner(owner) {}

absl::Status WorkqueueCore::Init() {
  const Topology& topo = *rt->topology;
  max_active_ = options.max_active;
  const bool highpri = (options.flags & kHighPri) != 0;
  int max_cpu = 0;
  for (const CpuInfo& c : topo.cpus()) max_cpu = std::max(max_cpu, c.cpu);
  pwq_by_cpu_.assign(max_cpu + 1, nullptr);

  if ((options.flags & kOrdered) != 0) {
    std::vector<int> all;
    for (const CpuInfo& c : topo.cpus()) all.push_back(c.cpu);
    WorkerPool* pool = rt->UnboundPool(all, highpri, /*strict=*/false);
    pwqs_.push_back(std::make_unique<PoolWorkqueue>(this, pool, 0));
    for (int c : all) pwq_by_cpu_[c] = pwqs_.back().get();
    node_limit_ = {1};
  } else if ((options.flags & kUnbound) == 0) {
    // Bound: one pwq per CPU, each with its own max_active.
    for (const CpuInfo& c : topo.cpus()) {
      const int node = static_cast<int>(pwqs_.size());
      pwqs_.push_back(std::make_unique<PoolWorkqueue>(this, rt->CpuPool(c.cpu, highpri), node));
      pwq_by_cpu_[c.cpu] = pwqs_.back().get();
      node_limit_.push_back(max_active_);
    }
  } else {
    // Unbound: one pwq per pod; max_active split over NUMA nodes by CPU count, rounded up
    // as Linux 6.9+ does (rounded down, three 1-CPU nodes shared max_active = 5 as 1+1+1),
    // with the min_active floor (one accounting node for the system scope or a one-node
    // machine). A pod whose CPUs span several nodes (the cache scope on a machine with
    // more nodes than L3s) is charged to one more accounting node, limited by max_active
    // alone, as the kernel charges such pods to NUMA_NO_NODE; it was charged to the node
    // of its first CPU, which capped it at that node's share.
    const bool one_node =
        options.affinity_scope == AffinityScope::kSystem || topo.num_numa_nodes() <= 1;
    const std::vector<int>& nodes = topo.numa_nodes();
    if (one_node) {
      node_limit_ = {max_active_};
    } else {
      for (int n : nodes) {
        const int64_t cpus = static_cast<int64_t>(topo.CpusOfNode(n).size());
        const int share =
            static_cast<int>((max_active_ * cpus + topo.num_cpus() - 1) / topo.num_cpus());
        node_limit_.push_back(std::clamp(std::max(share, options.min_active), 1, max_active_));
      }
    }
    int spanning_node = -1;  // the accounting node of pods that span nodes, once needed
    for (const std::vector<int>& pod : topo.Pods(options.affinity_scope)) {
      int node = 0;
      if (!one_node) {
        std::vector<int> pod_nodes;
        for (const CpuInfo& c : topo.cpus()) {
          if (std::find(pod.begin(), pod.end(), c.cpu) != pod.end() &&
              std::find(pod_nodes.begin(), pod_nodes.end(), c.numa_node) == pod_nodes.end()) {
            pod_nodes.push_back(c.numa_node);
          }
        }
        if (pod_nodes.size() > 1) {
          if (spanning_node < 0) {
            spanning_node = static_cast<int>(node_limit_.size());
            node_limit_.push_back(max_active_);
          }
          node = spanning_node;
        } else {
          const int pod_node = pod_nodes.empty() ? topo.cpus()[0].numa_node : pod_nodes[0];
          node = static_cast<int>(std::find(nodes.begin(), nodes.end(), pod_node) - nodes.begin());
          if (node >= static_cast<int>(nodes.size())) node = 0;
        }
      }
      WorkerPool* pool = rt->UnboundPool(pod, highpri, options.affinity_strict);
      pwqs_.push_back(std::make_unique<PoolWorkqueue>(this, pool, node));
      for (int c : pod) pwq_by_cpu_[c] = pwqs_.back().get();
    }
  }
  for (size_t i = 0; i < node_limit_.size(); ++i) nodes_.push_back(std::make_unique<Node>());
  if ((options.flags & kMemReclaim) != 0) {
    try {
      rescuer_ = std::thread([this] { RescuerMain(); });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Workqueue ", options.name, ": cannot start its rescuer: ", e.what()));
    }
  }
  rt->Register(this);
  return absl::OkStatus();
}

WorkqueueCore::~WorkqueueCore() {
  // destroy_workqueue: a frozen workqueue is thawed (its parked works would wait for ever),
  // delayed works still on timers are cancelled, the rest drained. A work run by the
  // drain may put a delayed work on a timer again (chained queueing), so this repeats
  // until, under timer_mu_, no timer is left and nothing is queued: a timer that fired
  // has then counted its work as queued (TimerFired holds timer_mu_ while it queues).
  Thaw();
  for (;;) {
    for (;;) {
      DelayedWork* d = nullptr;
      {
        MutexLock lock(&timer_mu_);
        d = timed_head_;
      }
      if (d == nullptr) break;
      CancelSync(A::work(d));
    }
    Drain();
    MutexLock lock(&timer_mu_);
    if (timed_head_ == nullptr && Queued() == 0) break;
  }
  // A worker counting the last instance gone with a waiter does so under mu_ and then
  // signals the waiters (InstanceGone): wait for it to let go before the memory goes.
  { MutexLock lock(&mu_); }
  rt->Unregister(this);
  if (rescuer_.joinable()) {
    {
      MutexLock lock(&rescuer_mu_);
      rescuer_stop_ = true;
    }
    rescuer_cv_.SignalAll();
    rescuer_.join();
  }
}

PoolWorkqueue* WorkqueueCore::PwqFor(int cpu, int node) const {
  if (pwqs_.size() == 1) return pwqs_[0].get();  // ordered, or one pod: no CPU lookup
  const Topology& topo = *rt->topology;
  if (cpu < 0 && node >= 0 && topo.HasNumaNode(node)) {
    // The calling CPU if it is on `node`, else the node's first. Read in place: this runs
    // after the work's pending bit was taken, where an allocation that throws (a copy of
    // the node's CPU list, once) left the work pending for ever.
    const int here = CurrentCpu();
    int first = -1;
    for (const CpuInfo& c : topo.cpus()) {
      if (c.numa_node != node) continue;
      if (c.cpu == here) {
        first = here;
        break;
      }
      if (first < 0) first = c.cpu;
    }
    cpu = first;
  }
  if (cpu < 0 || cpu >= static_cast<int>(pwq_by_cpu_.size()) || pwq_by_cpu_[cpu] == nullptr) {
    cpu = CurrentCpu();  // no preference, or an unknown CPU: the local one
  }
  if (cpu < 0 || cpu >= static_cast<int>(pwq_by_cpu_.size()) || pwq_by_cpu_[cpu] == nullptr) {
    cpu = topo.cpus()[0].cpu;  // not running on a CPU of this topology (synthetic)
  }
  return pwq_by_cpu_[cpu];
}

PoolWorkqueue* WorkqueueCore::PwqOfPool(WorkerPool* pool) const {
  for (const auto& pwq : pwqs_) {
    if (pwq->pool == pool) return pwq.get();
  }
  return nullptr;
}

bool WorkqueueCore::RefusedWhileDraining() const {
  if (draining_.load(std::memory_order_acquire) == 0) return false;
  // Only chained queueing while draining: from a work of this workqueue.
  const Worker* self = CurrentWorker();
  return self == nullptr || self->current_pwq == nullptr || self->current_pwq->wq != this;
}

bool WorkqueueCore::QueueOn(int cpu, int node, Work* w) {
  if (RefusedWhileDraining()) return false;
  if (!TryClaimPending(w)) return false;
  Enqueue(cpu, node, w);
  return true;
}

void WorkqueueCore::Enqueue(int cpu, int node, Work* w) {
  // Only the holder of the pending bit writes queued_seq: a plain increment (no RMW).
  A::queued_seq(w).store(A::queued_seq(w).load(std::memory_order_relaxed) + 1,
                         std::memory_order_release);
  PoolWorkqueue* pwq = PwqFor(cpu, node);
  // Non-reentrancy: while an instance runs, a new one goes to the pool running it.
  if (WorkerPool* running = A::running_pool(w).load(std::memory_order_acquire)) {
    if (PoolWorkqueue* there = PwqOfPool(running)) pwq = there;
  }
  // Counted in the bucket of the flush color current once counted: a Flush (FlushAll)
  // may bump the color between this read and the count, find the old bucket empty and
  // return (it ran concurrently with this Queue: fine), and a Flush called after this
  // Queue returned waits only for the newer color's bucket: it returned before this work
  // ran. So the color is read again after the count (both seq_cst, as FlushAll's bump and
  // its bucket reads: either that flush sees this count or this sees its bump), and a
  // count that went to a bucket already flushed moves to the current one.
  uint64_t color = color_.load(std::memory_order_seq_cst);
  TestHook(HookPoint::kEnqueueReadColor, this);
  color_queued_[color % kColorBuckets].fetch_add(1, std::memory_order_seq_cst);
  for (uint64_t now; (now = color_.load(std::memory_order_seq_cst)) != color; color = now) {
    // For Stats: one call, counted twice (first, so that a Stats between the two reads
    // one call too few, not too many: the count never goes down).
    rehomed_.fetch_add(1, std::memory_order_relaxed);
    color_queued_[now % kColorBuckets].fetch_add(1, std::memory_order_seq_cst);
    InstanceGone(color, nullptr);  // the old bucket's count, as if that instance had finished
  }
  A::color(w) = color;
  A::pwq(w).store(pwq, std::memory_order_release);
  Node& n = *nodes_[pwq->node];
  // Take a free slot only when no work waits: a parked work must not be overtaken (FIFO,
  // which kOrdered relies on).
  if (!frozen_.load(std::memory_order_acquire) && n.Waiting() == 0) {
    TestHook(HookPoint::kEnqueueWillReserve, this);
    if (TryReserve(n, node_limit_[pwq->node])) {
      // Freeze stores frozen_ and then reads the slot counts; this took a slot and now
      // reads frozen_ (both seq_cst): either Freeze waits for this slot or this sees it
      // frozen and parks the work instead, so nothing starts once Freeze has returned.
      if (!frozen_.load(std::memory_order_seq_cst)) {
        pwq->pool->Insert(w);
        return;
      }
      ReleaseRacingFreeze(n);
    }
  }
  {
    MutexLock lock(&n.in_mu);
    n.parked_works.PushIn(w);
    SetWhere(w, WorkWhere::kInactive);
  }
  n.parked.fetch_add(1, std::memory_order_seq_cst);
  ActivateWaiting(pwq->node);  // a slot may have freed since TryReserve failed
}

bool WorkqueueCore::TryReserve(Node& n, int limit) {
  int active = n.active.load(std::memory_order_seq_cst);
  while (active < limit) {
    if (n.active.compare_exchange_weak(active, active + 1, std::memory_order_seq_cst)) {
      return true;
    }
  }
  return false;
}

void WorkqueueCore::Release(Node& n) { n.active.fetch_sub(1, std::memory_order_seq_cst); }

void WorkqueueCore::ReleaseRacingFreeze(Node& n) {
  TestHook(HookPoint::kReleaseRacingFreeze, this);
  Release(n);
  // Dekker with Freeze's listing (its seq_cst fetch_or of kWaitedOn, which every bucket
  // gets for a waiter of any instance, then its seq_cst reads of the slot counts): either
  // it sees this slot given back or this sees it listed.
  if ((color_gone_[0].load(std::memory_order_seq_cst) & kWaitedOn) == 0) return;
  TestHook(HookPoint::kReleaseRacingFreezeWillSignal, this);
  MutexLock lock(&mu_);
  for (CompletionWaiter* x = completion_waiters_; x != nullptr; x = x->next_) {
    if (x->any_) x->cv_.Signal();
  }
}

Work* WorkqueueCore::PopWaiting(Node& n) {
  MutexLock out(&n.out_mu);
  if (n.parked_works.OutEmpty()) {
    MutexLock in(&n.in_mu);
    n.parked_works.MoveInToOut();
  }
  Work* w = n.parked_works.PopOut();
  n.out_nonempty.store(!n.parked_works.OutEmpty(), std::memory_order_relaxed);
  if (w != nullptr) {
    SetWhere(w, WorkWhere::kNone);
    n.unparked.fetch_add(1, std::memory_order_seq_cst);
  }
  return w;
}

void WorkqueueCore::ActivateWaiting(int node) {
  Node& n = *nodes_[node];
  // Reserve first: while the node is saturated that is one read of a line the workers do
  // not write (they hand their slots over), and Waiting() is not read at all.
  for (;;) {
    if (frozen_.load(std::memory_order_acquire)) return;
    TestHook(HookPoint::kActivateWillReserve, this);
    if (!TryReserve(n, node_limit_[node])) return;
    if (frozen_.load(std::memory_order_seq_cst)) {  // Freeze came in between (see Enqueue)
      ReleaseRacingFreeze(n);
      // Thaw stores frozen_ and then reserves: either it sees the released slot or this
      // sees the thaw and goes on.
      if (frozen_.load(std::memory_order_seq_cst)) return;
      continue;
    }
    Work* w = n.Waiting() > 0 ? PopWaiting(n) : nullptr;
    if (w == nullptr) {  // nothing waits (or another thread took it)
      TestHook(HookPoint::kActivateFoundNoneWaiting, this);
      Release(n);
      // A work parked after our check sees the released slot itself (Dekker).
      if (n.Waiting() > 0) continue;
      return;
    }
    A::pwq(w).load(std::memory_order_relaxed)->pool->Insert(w);
  }
}

void WorkqueueCore::InstanceGone(uint64_t color, const Work* w) {
  // The count is the last touch of this object: a drain waiting for nothing to be queued
  // may destroy it right after. Without a waiter, one compare-and-swap that fails if a
  // waiter sets kWaitedOn meanwhile (see color_gone_); with one, count and signal under
  // mu_ (the waiter re-checks under mu_, and ~Workqueue takes mu_ before the memory goes).
  const int bucket = static_cast<int>(color % kColorBuckets);
  std::atomic<uint64_t>& gone = color_gone_[bucket];
  uint64_t word = gone.load(std::memory_order_relaxed);
  while ((word & kWaitedOn) == 0) {
    TestHook(HookPoint::kInstanceGoneWillCount, this);
    // Release: a waiter whose setting of kWaitedOn reads this count (or a later one) sees
    // what the caller stored before (the work's running state, its active slot).
    if (gone.compare_exchange_weak(word, word + kGoneStep, std::memory_order_acq_rel,
                                   std::memory_order_relaxed)) {
      return;
    }
  }
  TestHook(HookPoint::kInstanceGoneWillLock, this);
  MutexLock lock(&mu_);
  gone.fetch_add(kGoneStep, std::memory_order_acq_rel);
  TestHook(HookPoint::kInstanceGoneCounted, this);
  for (CompletionWaiter* x = completion_waiters_; x != nullptr; x = x->next_) {
    if (x->any_ || x->bucket_ == bucket || (w != nullptr && x->work_ == w)) x->cv_.Signal();
  }
}

WorkqueueCore::CompletionWaiter::CompletionWaiter(WorkqueueCore* core, const Work* work, int bucket,
                                                  bool any)
    : core_(core), work_(work), bucket_(bucket), any_(any) {
  next_ = core->completion_waiters_;
  if (next_ != nullptr) next_->prev_ = this;
  core->completion_waiters_ = this;
  // A flush's own bucket; every bucket for the others (a work's instance may be of any
  // color, and Freeze waits for any). Set before the caller checks its condition: a
  // counter that finds the bit clear counted before it was set, and its release is then
  // seen by this read-modify-write (see color_gone_).
  for (int b = 0; b < kColorBuckets; ++b) {
    if (bucket_ >= 0 && b != bucket_) continue;
    ++core->waiters_on_[b];
    // seq_cst: also a Dekker pair with ReleaseRacingFreeze.
    core->color_gone_[b].fetch_or(kWaitedOn, std::memory_order_seq_cst);
  }
}

WorkqueueCore::CompletionWaiter::~CompletionWaiter() {
  core_->mu_.AssertHeld();  // the waits hold it across their whole scope
  for (int b = 0; b < kColorBuckets; ++b) {
    if (bucket_ >= 0 && b != bucket_) continue;
    if (--core_->waiters_on_[b] == 0) {
      core_->color_gone_[b].fetch_and(~kWaitedOn, std::memory_order_relaxed);
    }
  }
  if (prev_ != nullptr) {
    prev_->next_ = next_;
  } else {
    core_->completion_waiters_ = next_;
  }
  if (next_ != nullptr) next_->prev_ = prev_;
}

bool WorkqueueCore::CompletionWaiter::Wait(Mutex* mu) { return !cv_.WaitFor(mu, kPollPeriod); }

int64_t WorkqueueCore::Queued() const {
  int64_t n = 0;
  for (int b = 0; b < kColorBuckets; ++b) {
    // Gone first: an instance is counted queued before it can be counted gone.
    const uint64_t gone = GoneCount(color_gone_[b].load(std::memory_order_acquire));
    n += static_cast<int64_t>(color_queued_[b].load(std::memory_order_acquire) - gone);
  }
  return n;
}

Work* WorkqueueCore::Completed(PoolWorkqueue* pwq, WorkerPool* here) {
  Node& n = *nodes_[pwq->node];
  // Hand this work's active slot straight to the next waiting work of its node.
  Work* next = nullptr;
  // Works left in the taken-over list mean some wait: then the producers' counter (a
  // line they write on every park) is not read at all.
  if (!frozen_.load(std::memory_order_acquire) &&
      (n.out_nonempty.load(std::memory_order_relaxed) || n.Waiting() > 0)) {
    next = PopWaiting(n);
  }
  if (next == nullptr) {
    TestHook(HookPoint::kCompletedFoundNoneWaiting, this);
    Release(n);
    ActivateWaiting(pwq->node);  // a producer may have parked a work meanwhile
    return nullptr;
  }
  WorkerPool* pool = A::pwq(next).load(std::memory_order_relaxed)->pool;
  if (pool == here) return next;
  pool->Insert(next);
  return nullptr;
}

void WorkqueueCore::Finished(uint64_t color, const Work* w) { InstanceGone(color, w); }

WorkqueueCore::TimerGrab WorkqueueCore::GrabFromTimer(Work* w, PoolWorkqueue* pwq) {
  WorkqueueCore* owner_wq = pwq->wq;
  MutexLock lock(&owner_wq->timer_mu_);
  // pwq_ may be stale (the work moved on): re-check under the owner's lock.
  if (WhereOf(w) != WorkWhere::kTimer || A::pwq(w).load(std::memory_order_acquire) != pwq) {
    return TimerGrab::kGone;
  }
  auto* d = static_cast<DelayedWork*>(A::list(w));
  // The owner's timer service: the caller may be a workqueue of another runtime.
  if (!owner_wq->rt->timers->Cancel(A::timer(d))) {
    TestHook(HookPoint::kGrabFoundFiring, w);
    return TimerGrab::kFiring;
  }
  SetWhere(w, WorkWhere::kNone);
  A::list(w) = nullptr;
  owner_wq->UnlinkTimedLocked(d);
  return TimerGrab::kGrabbed;
}

bool WorkqueueCore::GrabPending(Work* w) {
  for (;;) {
    if (!Pending(w)) return false;
    // where_ first: a queuer stores pwq_ and then where_ (release), so a list read here
    // (acquire) comes with a pwq_ at least as new. Read the other way round, an old pwq_
    // (null before the first Queue, or of a destroyed workqueue) could meet a new list.
    const WorkWhere where = WhereOf(w);
    PoolWorkqueue* pwq = A::pwq(w).load(std::memory_order_acquire);
    switch (where) {
      case WorkWhere::kTimer: {
        const TimerGrab grab = GrabFromTimer(w, pwq);
        if (grab == TimerGrab::kGrabbed) return TakenBack(w);
        if (grab == TimerGrab::kFiring) std::this_thread::yield();  // it moves to a pool
        break;
      }
      case WorkWhere::kInactive: {
        WorkqueueCore* owner_wq = pwq->wq;
        Node& n = *owner_wq->nodes_[pwq->node];
        {
          MutexLock out(&n.out_mu);
          MutexLock in(&n.in_mu);
          if (WhereOf(w) != WorkWhere::kInactive ||
              A::pwq(w).load(std::memory_order_relaxed) != pwq) {
            break;
          }
          n.parked_works.Remove(w);
          n.out_nonempty.store(!n.parked_works.OutEmpty(), std::memory_order_relaxed);
          SetWhere(w, WorkWhere::kNone);
          n.unparked.fetch_add(1, std::memory_order_seq_cst);
        }
        // Taken back before the signal, so a Flush(w) it wakes finds the instance gone
        // (it slept on to its next poll); the color is read first (the count is the last
        // touch of the workqueue, and a Flush returning may let the work go).
        const uint64_t color = A::color(w);
        TakenBack(w);
        owner_wq->InstanceGone(color, w);
        return true;
      }
      case WorkWhere::kPool:
      case WorkWhere::kScheduled: {
        // TryRemove reports the pwq the work was queued with, read under the pool's lock
        // (the one read above may be stale).
        PoolWorkqueue* removed = pwq->pool->TryRemove(w);
        if (removed == nullptr) {
          std::this_thread::yield();
          break;
        }
        // It was active: it leaves without running, and its slot goes to a waiting work.
        // InstanceGone comes last: a drainer may destroy the workqueue right after it.
        WorkqueueCore* owner_wq = removed->wq;
        owner_wq->Release(*owner_wq->nodes_[removed->node]);
        owner_wq->ActivateWaiting(removed->node);
        // Taken back before the signal, so a Flush(w) it wakes finds the instance gone
        // (it slept on to its next poll); the color is read first (the count is the last
        // touch of the workqueue, and a Flush returning may let the work go).
        const uint64_t color = A::color(w);
        TakenBack(w);
        owner_wq->InstanceGone(color, w);
        return true;
      }
      case WorkWhere::kNone:
        std::this_thread::yield();  // between lists for a moment
        break;
    }
  }
}

bool WorkqueueCore::Cancel(Work* w) {
  if (!GrabPending(w)) return false;
  ClearPending(w);
  return true;
}

void WorkqueueCore::WaitIdle(Work* w) {
  BlockingScope blocking;  // waiting from a work must not hold up its pool
  MutexLock lock(&mu_);
  CompletionWaiter me(this, w, -1, false);
  while (Running(w)) {
    if (me.Wait(&mu_)) TestHook(HookPoint::kWaitSignalled, w);
  }
}

bool WorkqueueCore::CancelSync(Work* w) {
  A::state(w).fetch_add(kCancelHoldUnit, std::memory_order_acq_rel);  // refuse requeueing
  const bool was = GrabPending(w);
  if (was) ClearPending(w);
  WaitIdle(w);
  A::state(w).fetch_sub(kCancelHoldUnit, std::memory_order_acq_rel);
  return was;
}

bool WorkqueueCore::Flush(Work* w) {
  const uint64_t target = A::queued_seq(w).load(std::memory_order_acquire);
  if (!Pending(w) && !Running(w)) return false;
  // Pending only on its delay timer (not yet queued) and not running: nothing to wait for
  // (Flush(DelayedWork*) queues that one first), as flush_work.
  if (FinishedAndReleased(w, target)) return false;
  BlockingScope blocking;
  MutexLock lock(&mu_);
  CompletionWaiter me(this, w, -1, false);
  while (!FinishedAndReleased(w, target) && (Pending(w) || Running(w))) {
    TestHook(HookPoint::kFlushWorkWaits, w);
    if (me.Wait(&mu_)) TestHook(HookPoint::kWaitSignalled, w);
  }
  return true;
}

void WorkqueueCore::FlushAll() {
  BlockingScope blocking;
  // One flusher at a time, for its whole flush: the waits below release mu_, and a second
  // flusher bumping the color then would wait for its own bucket only, while works of
  // older colors still ran (it returned early).
  MutexLock flush_lock(&flush_mu_);
  MutexLock lock(&mu_);
  // Works queued from now on take the next color; wait for this one's bucket to empty.
  // seq_cst, as Enqueue's count and its re-read of the color (see there).
  const uint64_t mine = color_.fetch_add(1, std::memory_order_seq_cst);
  const int b = static_cast<int>(mine % kColorBuckets);
  CompletionWaiter me(this, nullptr, b, false);
  // Wait until the bucket is empty, re-reading both counts each time: a producer that
  // read the old color before the bump may still add to it, and a snapshot of `queued`
  // could then be matched by that newer work finishing before an older one.
  for (;;) {
    const uint64_t gone = GoneCount(color_gone_[b].load(std::memory_order_acquire));
    if (gone >= color_queued_[b].load(std::memory_order_seq_cst)) break;
    TestHook(HookPoint::kFlushAllWaits, this);
    if (me.Wait(&mu_)) TestHook(HookPoint::kWaitSignalled, this);
  }
}

void WorkqueueCore::Drain() {
  draining_.fetch_add(1, std::memory_order_acq_rel);
  do {
    FlushAll();
    TestHook(HookPoint::kDrainFlushed, this);
  } while (Queued() > 0);
  draining_.fetch_sub(1, std::memory_order_acq_rel);
}

bool WorkqueueCore::Disable(Work* w) {
  A::state(w).fetch_add(kDisableUnit, std::memory_order_acq_rel);
  const bool was = GrabPending(w);
  if (was) ClearPending(w);
  return was;
}

bool WorkqueueCore::Enable(Work* w) {
  uint64_t s = A::state(w).load(std::memory_order_acquire);
  do {
    // Not disabled: nothing to undo (a CancelSync's hold is not Enable's to take).
    if (s < kDisableUnit) return false;
  } while (!A::state(w).compare_exchange_weak(s, s - kDisableUnit, std::memory_order_acq_rel));
  return s - kDisableUnit < kDisableUnit;
}

void WorkqueueCore::Freeze() {
  if ((options.flags & kFreezable) == 0) return;
  frozen_.store(true, std::memory_order_seq_cst);
  auto busy = [this] {
    for (const auto& n : nodes_) {
      if (n->active.load(std::memory_order_seq_cst) > 0) return true;
    }
    return false;
  };
  BlockingScope blocking;
  MutexLock lock(&mu_);
  CompletionWaiter me(this, nullptr, -1, /*any=*/true);  // any may be the last active one
  while (busy()) {
    TestHook(HookPoint::kFreezeWaits, this);
    if (me.Wait(&mu_)) TestHook(HookPoint::kWaitSignalled, this);
  }
}

void WorkqueueCore::Thaw() {
  if ((options.flags & kFreezable) == 0) return;
  frozen_.store(false, std::memory_order_seq_cst);
  for (size_t n = 0; n < nodes_.size(); ++n) ActivateWaiting(static_cast<int>(n));
}

bool WorkqueueCore::QueueDelayed(DelayedWork* d, absl::Duration delay, int cpu, bool modify) {
  Work* w = A::work(d);
  // As for Queue (checked before taking the work: a refused ModDelayed leaves it as it was).
  if (RefusedWhileDraining()) return false;
  // Nothing may fail once the work is taken from where it was pending (ModDelayed): it
  // would be pending on no list, for ever. So the deadline is read first (a user's clock
  // may throw), and the timer is made first, parked (it never runs), and moved to the
  // deadline once the work is ours. A work that was not pending gets its timer after the
  // claim, which is undone if that throws.
  TimerService& timers = *rt->timers;
  const bool timed = delay > absl::ZeroDuration();
  const absl::Time deadline = timed ? timers.clock().Now() + delay : absl::InfinitePast();
  TimerId parked = 0;
  auto unpark = [&] {
    if (parked != 0) timers.Cancel(parked);
  };
  // The usual debounce, a work already on this workqueue's timer: its timer moves.
  if (modify && timed && MoveOwnTimer(d, deadline, cpu)) return true;
  bool was_pending = false;
  if (modify) {
    for (;;) {
      if (Pending(w)) {
        if (timed && parked == 0) {
          // May throw std::bad_alloc: nothing has changed.
          parked = timers.Schedule(absl::InfiniteFuture(), [this, d] { TimerFired(d); });
        }
        if (GrabPending(w)) {
          was_pending = true;  // we hold its pending bit now
          break;
        }
      }
      if (A::state(w).load(std::memory_order_acquire) >= kCancelHoldUnit) {
        unpark();
        return false;
      }
      if (TryClaimPending(w)) break;
    }
  } else if (!TryClaimPending(w)) {
    return false;
  }
  if (!timed) {
    Enqueue(cpu, -1, w);
    return modify ? was_pending : true;
  }
  MutexLock lock(&timer_mu_);
  if (parked != 0) {
    // Cannot fail: the timer is pending (only this call knows its id).
    timers.Reschedule(parked, deadline);
    A::timer(d) = parked;
  } else {
    try {
      A::timer(d) = timers.Schedule(deadline, [this, d] { TimerFired(d); });
    } catch (...) {
      ClearPending(w);  // it was not pending before this call: as it was
      throw;
    }
  }
  // The timer may be due already: it runs TimerFired once timer_mu_ is free, and finds
  // the work on its timer.
  A::target_cpu(d) = cpu;
  A::pwq(w).store(PwqFor(cpu, -1), std::memory_order_release);
  A::list(w) = d;
  LinkTimedLocked(d);
  timer_armed_.fetch_add(1, std::memory_order_relaxed);
  SetWhere(w, WorkWhere::kTimer);
  return modify ? was_pending : true;
}

bool WorkqueueCore::MoveOwnTimer(DelayedWork* d, absl::Time deadline, int cpu) {
  Work* w = A::work(d);
  if (WhereOf(w) != WorkWhere::kTimer) return false;
  MutexLock lock(&timer_mu_);
  // A work goes on a timer, and leaves it, only under its workqueue's timer lock: on a
  // timer, with this workqueue's pwq, it is on this workqueue's timer until we let go.
  // The pwq (atomic) is checked first, so that list_ is read only under the lock that
  // guards it (a work on another workqueue's timer has it written under that one's).
  // A CancelSync in progress takes the general path (as before this shortcut).
  PoolWorkqueue* pwq = A::pwq(w).load(std::memory_order_acquire);
  if (pwq == nullptr || pwq->wq != this) return false;
  if (WhereOf(w) != WorkWhere::kTimer || A::list(w) != d ||
      A::state(w).load(std::memory_order_acquire) >= kCancelHoldUnit) {
    return false;
  }
  TimerService& timers = *rt->timers;
  // False while the timer fires (its TimerFired waits for timer_mu_): the general path.
  if (!timers.Reschedule(A::timer(d), deadline)) return false;
  A::target_cpu(d) = cpu;
  A::pwq(w).store(PwqFor(cpu, -1), std::memory_order_release);
  timer_armed_.fetch_add(1, std::memory_order_relaxed);  // counted as a new arming, as before
  return true;
}

void WorkqueueCore::LinkTimedLocked(DelayedWork* d) {
  A::timed_prev(d) = nullptr;
  A::timed_next(d) = timed_head_;
  if (timed_head_ != nullptr) A::timed_prev(timed_head_) = d;
  timed_head_ = d;
}

void WorkqueueCore::UnlinkTimedLocked(DelayedWork* d) {
  DelayedWork* prev = std::exchange(A::timed_prev(d), nullptr);
  DelayedWork* next = std::exchange(A::timed_next(d), nullptr);
  if (prev != nullptr) {
    A::timed_next(prev) = next;
  } else {
    timed_head_ = next;
  }
  if (next != nullptr) A::timed_prev(next) = prev;
}

void WorkqueueCore::TimerFired(DelayedWork* d) {
  Work* w = A::work(d);
  TestHook(HookPoint::kTimerWillQueue, w);
  // Queued while timer_mu_ is held: the destructor, which looks at timed_head_ under it, sees
  // the work either still on its timer or already counted as queued (then it drains it).
  MutexLock lock(&timer_mu_);
  if (WhereOf(w) != WorkWhere::kTimer || A::list(w) != d) return;
  SetWhere(w, WorkWhere::kNone);
  A::list(w) = nullptr;
  UnlinkTimedLocked(d);
  timer_entered_.fetch_add(1, std::memory_order_relaxed);
  TestHook(HookPoint::kTimerTookWork, w);
  Enqueue(A::target_cpu(d), -1, w);
}

bool WorkqueueCore::FlushDelayed(DelayedWork* d) {
  Work* w = A::work(d);
  // Taken off its timer and queued now: it counts as flushed even if a worker finishes
  // it before Flush below looks (then Flush has nothing left to wait for).
  // Only off the timer: a work its timer moved into a pool meanwhile keeps its place
  // there (GrabPending would take it from any list and queue it again at the back).
  bool queued_now = false;
  for (;;) {
    const WorkWhere where = WhereOf(w);
    if (where == WorkWhere::kNone && Pending(w)) {
      // Between lists for a moment: say its timer took it off and has yet to queue it.
      // Flush below would read the instance number from before that queueing and return
      // at once: wait until it lands.
      std::this_thread::yield();
      continue;
    }
    if (where != WorkWhere::kTimer) break;
    TestHook(HookPoint::kFlushDelayedWillGrab, w);
    PoolWorkqueue* const pwq = A::pwq(w).load(std::memory_order_acquire);
    const TimerGrab grab = GrabFromTimer(w, pwq);
    if (grab == TimerGrab::kGrabbed) {
      // Queued on the workqueue whose timer it was on, as TimerFired would (this one may
      // be another: it ran on the caller's pools, beside an ordered owner's running work),
      // under that workqueue's timer_mu_, so that Stats never sees one count without the
      // other.
      WorkqueueCore* const owner_wq = pwq->wq;
      MutexLock lock(&owner_wq->timer_mu_);
      owner_wq->timer_entered_.fetch_add(1, std::memory_order_relaxed);
      owner_wq->Enqueue(A::target_cpu(d), -1, w);
      queued_now = true;
      break;
    }
    if (grab == TimerGrab::kFiring) std::this_thread::yield();
  }
  return Flush(w) || queued_now;
}

void WorkqueueCore::Mayday() {
  MutexLock lock(&rescuer_mu_);
  mayday_ = true;
  rescuer_cv_.Signal();
}

void WorkqueueCore::RescuerMain() {
  pthread_setname_np(pthread_self(), "kwq-rescuer");
  for (;;) {
    {
      MutexLock lock(&rescuer_mu_);
      while (!mayday_ && !rescuer_stop_) rescuer_cv_.Wait(&rescuer_mu_);
      if (rescuer_stop_) return;
      mayday_ = false;
    }
    for (const auto& pwq : pwqs_) {
      Worker rescuer(pwq->pool);
      rescuer.rescuer = true;
      const int ran = pwq->pool->Rescue(pwq.get(), &rescuer);
      rescued_.fetch_add(ran, std::memory_order_relaxed);
    }
  }
}

WorkqueueStats WorkqueueCore::Stats() const {
  WorkqueueStats s;
  // Successful calls: instances that entered a pool, plus delayed works put on a timer,
  // less those that went from a timer into a pool (counted once already). A cancelled
  // timer still counts: the call succeeded. Read under timer_mu_, under which a timer's
  // work moves into a pool (both counts at once).
  {
    MutexLock lock(&timer_mu_);
    s.queued = timer_armed_.load(std::memory_order_relaxed) -
               timer_entered_.load(std::memory_order_relaxed);
    for (int b = 0; b < kColorBuckets; ++b)
      s.queued += color_queued_[b].load(std::memory_order_relaxed);
    s.queued -= rehomed_.load(std::memory_order_relaxed);  // counts moved to a newer bucket
  }
  int64_t busy_ticks = 0;
  for (const auto& pwq : pwqs_) pwq->pool->AddStats(pwq.get(), &s, &busy_ticks);
  s.in_flight = static_cast<int64_t>(s.started) - static_cast<int64_t>(s.completed);
  s.run_time = CycleClock::ToDuration(busy_ticks);
  s.cpu_hogs = hogs_.load(std::memory_order_relaxed);
  s.concurrency_wakeups = wakeups_.load(std::memory_order_relaxed);
  s.rescued = rescued_.load(std::memory_order_relaxed);
  s.repatriations = repatriations_.load(std::memory_order_relaxed);
  return s;
}

std::string WorkqueueCore::DumpLine() const {
  std::string pools;
  for (const auto& pwq : pwqs_) absl::StrAppend(&pools, pools.empty() ? "" : ",", pwq->pool->id);
  int64_t waiting = 0;
  for (const auto& n : nodes_) waiting += n->Waiting();
  const uint32_t f = options.flags;
  return absl::StrCat(options.name, ": ",
                      (f & kOrdered)   ? "ordered"
                      : (f & kUnbound) ? "unbound"
                                       : "bound",
                      (f & kHighPri) ? " highpri" : "", (f & kCpuIntensive) ? " cpu-intensive" : "",
                      (f & kFreezable) ? " freezable" : "", (f & kMemReclaim) ? " mem-reclaim" : "",
                      " scope=", std::string(AffinityScopeName(options.affinity_scope)),
                      options.affinity_strict ? " strict" : "", " max_active=", max_active_,
                      " queued=", Queued(), " inactive=", waiting,
                      frozen_.load(std::memory_order_relaxed) ? " FROZEN" : "", " pools=[", pools,
                      "]");
}

}  // namespace internal

using internal::WorkAccess;

// ---- Work ----

Work::Work(absl::AnyInvocable<void()> fn) : fn_(std::move(fn)) {
  if (!fn_) fn_ = [] {};  // an empty function runs nothing (it was called, at address 0)
}

Work::~Work() {
  KWQ_CHECK((state_.load(std::memory_order_acquire) & internal::kPendingBit) == 0 &&
                running_pool_.load(std::memory_order_acquire) == nullptr,
            "kwq::Work destroyed while pending or running (CancelSync it first)");
}

bool Work::pending() const {
  return (state_.load(std::memory_order_acquire) & internal::kPendingBit) != 0;
}
bool Work::disabled() const {
  return state_.load(std::memory_order_acquire) >= internal::kDisableUnit;
}

// ---- Workqueue ----

absl::StatusOr<std::unique_ptr<Workqueue>> Workqueue::Create(WorkqueueOptions options) {
  if (options.name.empty()) return absl::InvalidArgumentError("Workqueue: a name is required");
  if (options.max_active < 0 || options.max_active > internal::kMaxMaxActive) {
    return absl::InvalidArgumentError(
        absl::StrCat("Workqueue ", options.name, ": max_active must be in [0, ",
                     internal::kMaxMaxActive, "], got ", options.max_active));
  }
  if (options.min_active < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Workqueue ", options.name, ": min_active must be >= 0, got ", options.min_active));
  }
  constexpr uint32_t kKnownFlags =
      kUnbound | kHighPri | kCpuIntensive | kOrdered | kFreezable | kMemReclaim;
  if ((options.flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Workqueue ", options.name, ": unknown flags 0x",
                                                   absl::Hex(options.flags & ~kKnownFlags)));
  }
  if (static_cast<int>(options.affinity_scope) < 0 ||
      static_cast<int>(options.affinity_scope) >= kNumAffinityScopes) {
    return absl::InvalidArgumentError(absl::StrCat("Workqueue ", options.name,
                                                   ": unknown affinity_scope ",
                                                   static_cast<int>(options.affinity_scope)));
  }
  if ((options.flags & kOrdered) != 0) {
    if (options.max_active > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Workqueue ", options.name, ": kOrdered needs max_active 1, got ", options.max_active));
    }
    options.flags |= kUnbound;
    options.max_active = 1;
  }
  if (options.max_active == 0) options.max_active = internal::kDefaultMaxActive;
  if (options.min_active == 0) options.min_active = internal::kDefaultMinActive;
  options.min_active = std::min(options.min_active, options.max_active);
  WorkqueueRuntime* runtime =
      options.runtime != nullptr ? options.runtime : &WorkqueueRuntime::Default();
  std::unique_ptr<Workqueue> wq(new Workqueue(nullptr));
  wq->core_ = std::make_unique<internal::WorkqueueCore>(WorkAccess::core(runtime),
                                                        std::move(options), wq.get());
  if (absl::Status s = wq->core_->Init(); !s.ok()) return s;
  return wq;
}

Workqueue::Workqueue(std::unique_ptr<internal::WorkqueueCore> core) : core_(std::move(core)) {}
Workqueue::~Workqueue() = default;

bool Workqueue::Queue(Work* work) { return core_->QueueOn(-1, -1, work); }
bool Workqueue::Post(absl::AnyInvocable<void()> fn) {
  // The block is recycled (post_blocks.h); Work's constructor does not throw (it moves the
  // function in).
  Work* work = new (internal::PostBlocks::Allocate()) Work(std::move(fn));
  internal::WorkAccess::owned(work) = true;
  // QueueOn refuses (false) before it takes the pending bit, and can throw only after:
  // from then on the work is its pool's, which frees it after the run (WorkerPool::Execute;
  // it may have run already), so it is not touched here again.
  if (core_->QueueOn(-1, -1, work)) return true;
  internal::DestroyPosted(work);  // refused: freed here, not run
  return false;
}
bool Workqueue::QueueOn(int cpu, Work* work) { return core_->QueueOn(cpu, -1, work); }
bool Workqueue::QueueOnNode(int node, Work* work) { return core_->QueueOn(-1, node, work); }
bool Workqueue::QueueDelayed(DelayedWork* dwork, absl::Duration delay, int cpu) {
  return core_->QueueDelayed(dwork, delay, cpu, /*modify=*/false);
}
bool Workqueue::ModDelayed(DelayedWork* dwork, absl::Duration delay, int cpu) {
  return core_->QueueDelayed(dwork, delay, cpu, /*modify=*/true);
}
bool Workqueue::Cancel(Work* work) { return core_->Cancel(work); }
bool Workqueue::Cancel(DelayedWork* dwork) { return core_->Cancel(&dwork->work()); }
bool Workqueue::CancelSync(Work* work) { return core_->CancelSync(work); }
bool Workqueue::CancelSync(DelayedWork* dwork) { return core_->CancelSync(&dwork->work()); }
bool Workqueue::Flush(Work* work) { return core_->Flush(work); }
bool Workqueue::Flush(DelayedWork* dwork) { return core_->FlushDelayed(dwork); }
void Workqueue::Flush() { core_->FlushAll(); }
void Workqueue::Drain() { core_->Drain(); }
bool Workqueue::Disable(Work* work) { return core_->Disable(work); }
bool Workqueue::Enable(Work* work) { return core_->Enable(work); }
void Workqueue::Freeze() { core_->Freeze(); }
void Workqueue::Thaw() { core_->Thaw(); }
WorkqueueStats Workqueue::stats() const { return core_->Stats(); }
const std::string& Workqueue::name() const { return core_->options.name; }
uint32_t Workqueue::flags() const { return core_->options.flags; }
int Workqueue::max_active() const { return core_->options.max_active; }
const Topology& Workqueue::topology() const { return *core_->rt->topology; }

// ---- system workqueues ----

namespace {
Workqueue& MakeSystemWq(const char* name, uint32_t flags) {
  absl::StatusOr<std::unique_ptr<Workqueue>> wq = Workqueue::Create({.name = name, .flags = flags});
  KWQ_CHECK(wq.ok(), "cannot create a system workqueue");
  return *wq->release();
}
}  // namespace

Workqueue& SystemWq() {
  static Workqueue& wq = MakeSystemWq("events", 0);
  return wq;
}
Workqueue& SystemHighPriWq() {
  static Workqueue& wq = MakeSystemWq("events_highpri", kHighPri);
  return wq;
}
Workqueue& SystemLongWq() {
  static Workqueue& wq = MakeSystemWq("events_long", 0);
  return wq;
}
Workqueue& SystemUnboundWq() {
  static Workqueue& wq = MakeSystemWq("events_unbound", kUnbound);
  return wq;
}

}  // namespace kwq
