// Worker pools, workers, the watchdog and the runtime that owns them.

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <new>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/cycle_clock.h"
#include "kwq/internal/test_hooks.h"
#include "workqueue/internal.h"
#include "workqueue/post_blocks.h"

namespace kwq {
namespace internal {

namespace {
thread_local Worker* tls_worker = nullptr;
using A = WorkAccess;

void SetWhere(Work* w, WorkWhere where) {
  A::where(w).store(static_cast<uint8_t>(where), std::memory_order_release);
}

// Whether `w`, queued to a pool (its pwq set, and fixed while it is queued), belongs to a
// kMemReclaim workqueue.
bool Reclaims(Work* w) {
  return (A::pwq(w).load(std::memory_order_relaxed)->wq->options.flags & kMemReclaim) != 0;
}

// Appends `w` to the intrusive list that runs from *head to *tail, tagging it as `owner`'s.
void AppendWork(Work* w, Work** head, Work** tail, void* owner) {
  A::prev(w) = *tail;
  A::next(w) = nullptr;
  A::list(w) = owner;
  if (*tail != nullptr) {
    A::next(*tail) = w;
  } else {
    *head = w;
  }
  *tail = w;
}
}  // namespace

Worker* CurrentWorker() { return tls_worker; }

// ---- WorkList ----

void WorkList::PushBack(Work* w) {
  AppendWork(w, &head_, &tail_, this);
  ++size_;
}

void WorkList::Remove(Work* w) {
  Work* prev = A::prev(w);
  Work* next = A::next(w);
  if (prev != nullptr) {
    A::next(prev) = next;
  } else {
    head_ = next;
  }
  if (next != nullptr) {
    A::prev(next) = prev;
  } else {
    tail_ = prev;
  }
  A::prev(w) = A::next(w) = nullptr;
  A::list(w) = nullptr;
  --size_;
}

Work* WorkList::PopFront() {
  Work* w = head_;
  if (w != nullptr) Remove(w);
  return w;
}

bool WorkList::Contains(const Work* w) const { return A::list(const_cast<Work*>(w)) == this; }

// ---- ParkedWorks ----

void ParkedWorks::PushIn(Work* w) { AppendWork(w, &in_head_, &in_tail_, this); }

void ParkedWorks::MoveInToOut() {
  out_head_ = in_head_;
  in_head_ = in_tail_ = nullptr;
}

Work* ParkedWorks::PopOut() {
  // Touches `out` only: the producers own `in` (and in_tail_) under in_mu, not held here.
  Work* w = out_head_;
  if (w == nullptr) return nullptr;
  out_head_ = A::next(w);
  if (out_head_ != nullptr) A::prev(out_head_) = nullptr;
  A::prev(w) = A::next(w) = nullptr;
  A::list(w) = nullptr;
  return w;
}

void ParkedWorks::Remove(Work* w) {
  Work* prev = A::prev(w);
  Work* next = A::next(w);
  // A work without a predecessor heads exactly one of the lists, one without a successor
  // ends exactly one (nothing is appended to `out`, so its end is not kept).
  if (prev != nullptr) {
    A::next(prev) = next;
  } else if (out_head_ == w) {
    out_head_ = next;
  } else {
    in_head_ = next;
  }
  if (next != nullptr) {
    A::prev(next) = prev;
  } else if (in_tail_ == w) {
    in_tail_ = prev;
  }
  A::prev(w) = A::next(w) = nullptr;
  A::list(w) = nullptr;
}

// ---- WorkerPool ----

WorkerPool::WorkerPool(RuntimeCore* rt, int id, int cpu, bool highpri, std::vector<int> cpus,
                       bool strict)
    : rt(rt), id(id), cpu(cpu), highpri(highpri), cpus(std::move(cpus)), strict(strict) {}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Stop() {
  std::vector<std::unique_ptr<Worker>> all;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  // Workers leave their loop once nothing is left for them; join them outside the lock.
  for (;;) {
    std::unique_ptr<Worker> w;
    {
      MutexLock lock(&mu_);
      if (!dead_.empty()) {
        w = std::move(dead_.back());
        dead_.pop_back();
      } else if (!workers_.empty()) {
        w = std::move(workers_.back());
        workers_.pop_back();
      } else if (nr_creating_ == 0) {
        break;
      }
    }
    if (w == nullptr) {
      std::this_thread::yield();
      continue;
    }
    if (w->thread.joinable()) w->thread.join();
  }
}

bool WorkerPool::NeedMoreWorkerLocked() const {
  return !worklist_.empty() && nr_running_ < concurrency();
}

void WorkerPool::WakeOrCreateLocked() {
  if (nr_idle_ > 0) {
    cv_.Signal();
    return;
  }
  if (nr_creating_ > 0 || stopping_) return;
  // Workers between two works (or running one that still counts) come back for the
  // worklist by themselves; only workers stuck in an uncounted work (blocked, a CPU hog,
  // kCpuIntensive) do not. Create one only when too few can come back.
  int stuck = 0;
  for (const auto& w : workers_) stuck += w->current != nullptr && !w->counted;
  if (static_cast<int>(workers_.size()) - stuck >= concurrency()) return;
  if (rt->ShouldFailSpawn()) {
    spawn_failed_ = true;
  } else {
    ++nr_creating_;
    // Out of threads (std::system_error) or of memory (std::bad_alloc, which once left
    // this call, with the work already inserted, through every Queue): a spawn failure
    // either way. Room is made in workers_ first, so that no thread starts unless it is
    // recorded.
    try {
      if (workers_.size() == workers_.capacity()) {
        workers_.reserve(std::max<size_t>(8, 2 * workers_.capacity()));
      }
      auto worker = std::make_unique<Worker>(this);
      Worker* raw = worker.get();
      raw->thread = std::thread([this, raw] { WorkerMain(raw); });
      workers_.push_back(std::move(worker));
      spawn_failed_ = false;
    } catch (...) {
      spawn_failed_ = true;
    }
    --nr_creating_;
  }
  // No worker could be made: ask the rescuer of each kMemReclaim workqueue with work here.
  if (!spawn_failed_) return;
  for (PoolWorkqueue* p = reclaim_pwqs_; p != nullptr; p = p->reclaim_next) p->wq->Mayday();
}

void WorkerPool::PushWorkLocked(Work* w) {
  worklist_.PushBack(w);
  if (Reclaims(w)) CountReclaimLocked(A::pwq(w).load(std::memory_order_relaxed), 1);
}

void WorkerPool::RemoveWorkLocked(Work* w) {
  worklist_.Remove(w);
  if (Reclaims(w)) CountReclaimLocked(A::pwq(w).load(std::memory_order_relaxed), -1);
}

Work* WorkerPool::PopWorkLocked() {
  Work* w = worklist_.PopFront();
  if (w != nullptr && Reclaims(w)) {
    CountReclaimLocked(A::pwq(w).load(std::memory_order_relaxed), -1);
  }
  return w;
}

void WorkerPool::CountReclaimLocked(PoolWorkqueue* pwq, int delta) {
  if (delta > 0 && pwq->reclaim_queued++ == 0) {  // listed first
    pwq->reclaim_prev = nullptr;
    pwq->reclaim_next = reclaim_pwqs_;
    if (reclaim_pwqs_ != nullptr) reclaim_pwqs_->reclaim_prev = pwq;
    reclaim_pwqs_ = pwq;
  } else if (delta < 0 && --pwq->reclaim_queued == 0) {
    (pwq->reclaim_prev != nullptr ? pwq->reclaim_prev->reclaim_next : reclaim_pwqs_) =
        pwq->reclaim_next;
    if (pwq->reclaim_next != nullptr) pwq->reclaim_next->reclaim_prev = pwq->reclaim_prev;
    pwq->reclaim_prev = pwq->reclaim_next = nullptr;
  }
}

void WorkerPool::Insert(Work* w) {
  {
    MutexLock lock(&mu_);
    PushWorkLocked(w);
    SetWhere(w, WorkWhere::kPool);
    if (NeedMoreWorkerLocked()) WakeOrCreateLocked();
  }
  rt->KickWatchdog();  // pending work is watched for stalls too
}

PoolWorkqueue* WorkerPool::TryRemove(Work* w) {
  MutexLock lock(&mu_);
  PoolWorkqueue* pwq = A::pwq(w).load(std::memory_order_acquire);
  // Only a work queued to this pool has its links guarded by this lock.
  if (pwq == nullptr || pwq->pool != this) return nullptr;
  const auto where = static_cast<WorkWhere>(A::where(w).load(std::memory_order_acquire));
  if (where == WorkWhere::kPool && worklist_.Contains(w)) {
    RemoveWorkLocked(w);
    SetWhere(w, WorkWhere::kNone);
    return pwq;
  }
  if (where == WorkWhere::kScheduled) {
    auto take = [&](Worker* worker) {
      if (!worker->scheduled.Contains(w)) return false;
      worker->scheduled.Remove(w);
      SetWhere(w, WorkWhere::kNone);
      return true;
    };
    for (auto& worker : workers_) {
      if (take(worker.get())) return pwq;
    }
    for (Worker* rescuer = rescuing_; rescuer != nullptr; rescuer = rescuer->rescuing_next) {
      if (take(rescuer)) return pwq;
    }
  }
  return nullptr;
}

Work* WorkerPool::NextLocked(Worker* self) {
  if (!self->scheduled.empty()) return self->scheduled.PopFront();
  while (!worklist_.empty()) {
    if (nr_running_ >= concurrency()) return nullptr;  // concurrency management
    Work* w = PopWorkLocked();
    // Non-reentrancy: an instance queued while the work runs here goes to the worker
    // running it, which runs it next.
    if (A::running_pool(w).load(std::memory_order_acquire) == this && A::runner(w) != nullptr &&
        A::runner(w) != self) {
      A::runner(w)->scheduled.PushBack(w);
      SetWhere(w, WorkWhere::kScheduled);
      continue;
    }
    return w;
  }
  return nullptr;
}

Work* WorkerPool::Execute(Worker* self, Work* w) {
  PoolWorkqueue* pwq = A::pwq(w).load(std::memory_order_relaxed);
  WorkqueueCore* wq = pwq->wq;
  const uint64_t color = A::color(w);
  self->current = w;
  self->current_pwq = pwq;
  ++self->execs;
  A::runner(w) = self;
  A::running_seq(w).store(A::queued_seq(w).load(std::memory_order_relaxed),
                          std::memory_order_release);
  A::running_pool(w).store(this, std::memory_order_release);
  SetWhere(w, WorkWhere::kNone);
  // Cleared just before the function runs: a Queue from now on runs it again after.
  A::state(w).fetch_and(~kPendingBit, std::memory_order_acq_rel);
  if (!wq->cpu_intensive() && !self->rescuer) {
    self->counted = true;
    ++nr_running_;
  }
  // More work and room to run it (unbound pools run one worker per CPU): wake or make
  // another worker, as the kernel's kick_pool does.
  if (NeedMoreWorkerLocked()) WakeOrCreateLocked();
  ++started_;
  ++pwq->started;
  mu_.Unlock();

  rt->KickWatchdog();
  if (repatriates && !self->rescuer && self->bound) Repatriate(wq);
  const int64_t start = CycleClock::Now();
  bool threw = false;
  try {
    A::fn(w)();
  } catch (const std::exception& e) {
    threw = true;
    std::fprintf(stderr, "kwq: work on workqueue %s threw: %s\n", wq->options.name.c_str(),
                 e.what());
  } catch (...) {
    threw = true;
    std::fprintf(stderr, "kwq: work on workqueue %s threw a non-std exception\n",
                 wq->options.name.c_str());
  }
  const int64_t busy = CycleClock::Now() - start;
  // A posted work's function goes now, outside the pool's lock (its captures' destructors
  // are user code); nobody else holds the work, so nothing else reads fn_.
  const bool owned = A::owned(w);
  if (owned) A::fn(w) = nullptr;
  Work* next = wq->Completed(pwq, this);

  mu_.Lock();
  ++pwq->completed;
  pwq->busy_ticks += busy;
  if (threw) ++pwq->exceptions;
  if (self->counted) {
    self->counted = false;
    --nr_running_;
  }
  self->hog = false;
  // Clearing running_pool is the last touch of `w` (a waiter may free it next): Flush
  // checks it, and running_seq, besides done_seq (FinishedAndReleased).
  // Never lowered: a later instance taken back meanwhile (TakenBack) counts as finished
  // already, and storing this instance's number over it made a Flush of the work wait for
  // its timer (ModDelayed) to fire and run it.
  {
    const uint64_t seq = A::running_seq(w).load(std::memory_order_relaxed);
    uint64_t done = A::done_seq(w).load(std::memory_order_relaxed);
    while (done < seq && !A::done_seq(w).compare_exchange_weak(done, seq, std::memory_order_release,
                                                               std::memory_order_relaxed)) {
    }
  }
  TestHook(HookPoint::kWorkerWillRelease, w);
  A::runner(w) = nullptr;
  A::running_pool(w).store(nullptr, std::memory_order_release);
  self->current = nullptr;
  self->current_pwq = nullptr;
  // A posted work is freed after its last touch above (its function is gone already, so
  // this runs no user code under the lock). Nobody can have queued it again: only the
  // workqueue holds it.
  if (owned) DestroyPosted(w);
  // Run the activated work at once unless others wait in the worklist (FIFO first) or it
  // collides with a running instance.
  if (next != nullptr && (!worklist_.empty() || !self->scheduled.empty() || stopping_ ||
                          A::running_pool(next).load(std::memory_order_acquire) == this ||
                          nr_running_ >= concurrency())) {
    PushWorkLocked(next);
    SetWhere(next, WorkWhere::kPool);
    if (NeedMoreWorkerLocked()) WakeOrCreateLocked();
    next = nullptr;
  }
  wq->Finished(color, w);  // last touch of `wq` (unless `next` keeps it busy)
  return next;
}

void WorkerPool::Repatriate(WorkqueueCore* wq) {
  // Non-strict: the worker may run anywhere, but starts each work inside its pod, as the
  // kernel's non-strict affinity scopes do. Pinning to the pod migrates it; widening the
  // mask again keeps it non-strict. Two system calls, only when it had wandered off.
  const int here = CurrentCpu();
  if (here < 0 || std::find(pod.begin(), pod.end(), here) != pod.end()) return;
  if (BindCurrentThread(pod).ok() && BindCurrentThread(cpus).ok()) {
    wq->CountRepatriation();
  } else {
    rt->CountBindFailure();
  }
}

void WorkerPool::WorkerMain(Worker* self) {
  tls_worker = self;
  pthread_setname_np(pthread_self(), highpri ? "kwq-worker-H" : "kwq-worker");
  // A new thread inherits its creator's CPU mask, scheduling policy and nice value, and
  // any thread may create a pool's worker (the first to queue there, the watchdog): a
  // pinned or high-priority creator must not pass that on. So every worker sets all three
  // itself.
  if (rt->options.bind_workers && !cpus.empty()) {
    self->bound = BindCurrentThread(cpus).ok();
    if (!self->bound) rt->CountBindFailure();
  }
  // Unpinned (by choice, or pinning failed): anywhere the runtime's topology allows. (A
  // synthetic topology's CPUs may not exist here; then the mask stays as it was.)
  if (!self->bound) (void)BindCurrentThread(rt->all_cpus);
  // The process's policy and nice value (its main thread's when the runtime was made),
  // whatever the creating thread's: a process started under `nice` or `chrt` keeps them.
  int policy = SCHED_OTHER;
  sched_param param{};
  if (pthread_getschedparam(pthread_self(), &policy, &param) == 0 &&
      (policy != rt->base_policy || param.sched_priority != rt->base_param.sched_priority)) {
    (void)pthread_setschedparam(pthread_self(), rt->base_policy, &rt->base_param);
  }
  const id_t tid = static_cast<id_t>(syscall(SYS_gettid));
  const int nice = highpri ? std::min(rt->base_nice, -20) : rt->base_nice;
  if (setpriority(PRIO_PROCESS, tid, nice) != 0 && highpri) {
    rt->highpri_raised_.store(false, std::memory_order_relaxed);
  }
  // Idle workers that exited before this one, joined by it on its way out (outside the
  // lock): the watchdog, the other joiner, is disarmed while the runtime is quiet, which
  // is when idle workers exit, so their stacks would otherwise stay mapped.
  std::vector<std::unique_ptr<Worker>> reaped;
  {
    MutexLock lock(&mu_);
    for (;;) {
      if (Work* w = NextLocked(self)) {
        while (w != nullptr) w = Execute(self, w);
        continue;
      }
      if (stopping_) break;
      ++nr_idle_;
      const bool timed_out = cv_.WaitFor(&mu_, rt->options.idle_timeout);
      --nr_idle_;
      // Too many idle workers: the kernel keeps two per pool.
      if (timed_out && nr_idle_ >= 2 && worklist_.empty() && self->scheduled.empty() &&
          !stopping_) {
        auto it = std::find_if(workers_.begin(), workers_.end(),
                               [self](const auto& p) { return p.get() == self; });
        if (it != workers_.end()) {
          // dead_ is about to be emptied, so handing this worker over allocates: first,
          // and without memory the worker stays, idle (a bad_alloc here ended the
          // process: it leaves the worker's thread function).
          std::vector<std::unique_ptr<Worker>> next_dead;
          try {
            next_dead.reserve(1);
          } catch (const std::bad_alloc&) {
            continue;
          }
          reaped.swap(dead_);  // only workers that entered dead_ before this one
          next_dead.push_back(std::move(*it));
          dead_.swap(next_dead);
          workers_.erase(it);
        }
        break;
      }
    }
  }
  for (auto& w : reaped) {
    if (w->thread.joinable()) w->thread.join();
  }
  tls_worker = nullptr;
}

void WorkerPool::JoinDead() {
  std::vector<std::unique_ptr<Worker>> dead;
  {
    MutexLock lock(&mu_);
    dead.swap(dead_);
  }
  for (auto& w : dead) {
    if (w->thread.joinable()) w->thread.join();
  }
}

void WorkerPool::EnterBlocking(Worker* w) {
  MutexLock lock(&mu_);
  if (w->blocking++ > 0) return;
  if (w->counted) {
    w->counted = false;
    --nr_running_;
    if (NeedMoreWorkerLocked()) {
      if (w->current_pwq != nullptr) w->current_pwq->wq->CountWakeup();
      WakeOrCreateLocked();
    }
  }
}

void WorkerPool::ExitBlocking(Worker* w) {
  MutexLock lock(&mu_);
  if (--w->blocking > 0) return;
  if (w->current != nullptr && !w->hog && w->current_pwq != nullptr &&
      !w->current_pwq->wq->cpu_intensive() && !w->rescuer) {
    w->counted = true;
    ++nr_running_;
  }
}

bool WorkerPool::Check(absl::Time now) {
  JoinDead();
  const uint64_t epoch = rt->watch_epoch_.load(std::memory_order_relaxed);
  std::string stall;  // reported after the lock is released (the reporter may Dump())
  bool busy;
  {
    MutexLock lock(&mu_);
    const bool fresh = watch_epoch_ != epoch;  // the watchdog was paused: look anew
    watch_epoch_ = epoch;
    busy = !worklist_.empty();
    // By index: WakeOrCreateLocked below may add a worker, and growing workers_ would
    // leave a range-for's iterator in freed memory.
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker* w = workers_[i].get();
      if (w->current == nullptr) continue;
      busy = true;
      if (fresh || w->watch_epoch != epoch || w->watch_execs != w->execs) {
        w->watch_epoch = epoch;  // a new execution: first seen now
        w->watch_execs = w->execs;
        w->watch_since = now;
        continue;
      }
      if (w->counted && !w->hog && now - w->watch_since >= rt->options.cpu_intensive_threshold) {
        // A CPU hog: stop counting it, so the pool's other works can run.
        w->hog = true;
        w->counted = false;
        --nr_running_;
        w->current_pwq->wq->CountHog();
        if (NeedMoreWorkerLocked()) {
          w->current_pwq->wq->CountWakeup();
          WakeOrCreateLocked();
        }
      }
    }
    if (fresh || worklist_.empty() || started_ != watch_started_) {
      watch_started_ = started_;
      watch_since_ = now;
      stall_reported_ = false;
    } else if (now - watch_since_ >= rt->options.stall_threshold && !stall_reported_) {
      stall_reported_ = true;
      stall = (absl::StrCat(
          "kwq: pool ", id, " (", cpu >= 0 ? absl::StrCat("cpu ", cpu) : std::string("unbound"),
          highpri ? ", highpri" : "", ") made no progress for ",
          absl::FormatDuration(now - watch_since_), ": ", worklist_.size(), " pending, ",
          workers_.size(), " workers", spawn_failed_ ? ", worker creation failing" : ""));
    }
    if (!worklist_.empty() && NeedMoreWorkerLocked() && spawn_failed_) WakeOrCreateLocked();
  }
  if (!stall.empty()) rt->ReportStall(stall);
  return busy;
}

int WorkerPool::Rescue(PoolWorkqueue* pwq, Worker* rescuer) {
  int ran = 0;
  // The works it runs see the rescuer as their worker: chained queueing during a drain,
  // and BlockingScope, work as on any worker.
  Worker* const outer = tls_worker;
  tls_worker = rescuer;
  MutexLock lock(&mu_);
  rescuer->rescuing_next = rescuing_;
  rescuing_ = rescuer;
  for (;;) {
    // Every work of `pwq` in the worklist moves to the rescuer's own list in one pass, as
    // the kernel's rescuer assigns them (one whose instance runs here goes to that
    // instance's runner, which runs it next); a Cancel finds them there (TryRemove looks
    // at the rescuers' lists). Looking for each from the worklist's front cost O(pending)
    // per rescued work: 32 -> 102 us per work with 4,096 -> 16,384 other works ahead.
    // (The pass ends at the last of them: the pool counts them.)
    for (Work* w = worklist_.front(); w != nullptr && pwq->reclaim_queued > 0;) {
      Work* const next = A::next(w);
      if (A::pwq(w).load(std::memory_order_relaxed) == pwq) {
        RemoveWorkLocked(w);
        Worker* runner =
            A::running_pool(w).load(std::memory_order_acquire) == this ? A::runner(w) : nullptr;
        (runner != nullptr ? runner : rescuer)->scheduled.PushBack(w);
        SetWhere(w, WorkWhere::kScheduled);
      }
      w = next;
    }
    if (rescuer->scheduled.empty()) break;
    // With the instances queued to the rescuer while it runs these (its Worker object dies
    // with this call); then a new pass, for works queued to the worklist meanwhile.
    while (Work* again = rescuer->scheduled.PopFront()) {
      for (Work* w = again; w != nullptr; w = Execute(rescuer, w)) ++ran;
    }
  }
  for (Worker** p = &rescuing_; *p != nullptr; p = &(*p)->rescuing_next) {
    if (*p == rescuer) {
      *p = rescuer->rescuing_next;
      break;
    }
  }
  rescuer->rescuing_next = nullptr;
  tls_worker = outer;
  return ran;
}

bool WorkerPool::Busy() const {
  MutexLock lock(&mu_);
  if (!worklist_.empty()) return true;
  for (const auto& w : workers_) {
    if (w->current != nullptr) return true;
  }
  return false;
}

void WorkerPool::AddStats(const PoolWorkqueue* pwq, WorkqueueStats* s, int64_t* busy_ticks) const {
  MutexLock lock(&mu_);
  s->started += pwq->started;
  s->completed += pwq->completed;
  s->exceptions += pwq->exceptions;
  *busy_ticks += pwq->busy_ticks;
}

std::string WorkerPool::DumpLine() const {
  MutexLock lock(&mu_);
  int busy = 0;
  for (const auto& w : workers_) busy += w->current != nullptr;
  return absl::StrCat(
      "pool ", id, ": ", cpu >= 0 ? absl::StrCat("cpu ", cpu) : std::string("unbound"),
      highpri ? " highpri" : "", " cpus [", absl::StrJoin(cpus, ","), "]", strict ? " strict" : "",
      " workers=", workers_.size(), " idle=", nr_idle_, " busy=", busy, " running=", nr_running_,
      " pending=", worklist_.size(), " started=", started_);
}

// ---- RuntimeCore ----

RuntimeCore::RuntimeCore(WorkqueueRuntime::Options opts)
    : options(std::move(opts)),
      topology(options.topology),
      clock(options.clock != nullptr ? options.clock : RealClock::Default()),
      timers(options.timers != nullptr ? options.timers : &TimerService::Default()) {
  errno = 0;
  base_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(getpid()));
  if (errno != 0) base_nice = 0;
  base_policy = sched_getscheduler(getpid());
  if (base_policy < 0 || sched_getparam(getpid(), &base_param) != 0) {
    base_policy = SCHED_OTHER;
    base_param = sched_param{};
  }
  MutexLock lock(&mu_);
  int max_cpu = 0;
  for (const CpuInfo& c : topology->cpus()) {
    max_cpu = std::max(max_cpu, c.cpu);
    all_cpus.push_back(c.cpu);
  }
  cpu_pools_[0].resize(max_cpu + 1);
  cpu_pools_[1].resize(max_cpu + 1);
}

RuntimeCore::~RuntimeCore() {
  TimerId timer;
  {
    MutexLock lock(&watchdog_mu_);
    timer = watchdog_timer_;
    watchdog_timer_ = 0;
  }
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (timer != 0) timers->CancelSync(timer);
  std::vector<std::unique_ptr<WorkerPool>> pools;
  {
    MutexLock lock(&mu_);
    for (auto& v : cpu_pools_) {
      for (auto& p : v) {
        if (p) pools.push_back(std::move(p));
      }
    }
    for (auto& p : unbound_pools_) pools.push_back(std::move(p));
  }
  for (auto& p : pools) p->Stop();
  // The watchdog may have been re-armed by a work that ran during Stop.
  {
    MutexLock lock(&watchdog_mu_);
    timer = watchdog_timer_;
    watchdog_timer_ = 0;
  }
  if (timer != 0) timers->CancelSync(timer);
}

WorkerPool* RuntimeCore::CpuPool(int cpu, bool highpri) {
  MutexLock lock(&mu_);
  auto& slot = cpu_pools_[highpri ? 1 : 0][cpu];
  if (!slot)
    slot = std::make_unique<WorkerPool>(this, next_pool_id_++, cpu, highpri, std::vector<int>{cpu},
                                        /*strict=*/true);
  return slot.get();
}

WorkerPool* RuntimeCore::UnboundPool(const std::vector<int>& cpus, bool highpri, bool strict) {
  MutexLock lock(&mu_);
  for (auto& p : unbound_pools_) {
    if (p->highpri == highpri && p->strict == strict && p->pod == cpus) return p.get();
  }
  // Not strict: workers may run on any allowed CPU (the scheduler places them).
  std::vector<int> bind = cpus;
  if (!strict) {
    bind.clear();
    for (const CpuInfo& c : topology->cpus()) bind.push_back(c.cpu);
  }
  unbound_pools_.push_back(
      std::make_unique<WorkerPool>(this, next_pool_id_++, -1, highpri, std::move(bind), strict));
  unbound_pools_.back()->pod = cpus;  // the lookup key, whatever the workers bind to
  unbound_pools_.back()->repatriates =
      !strict && options.bind_workers && cpus.size() < topology->cpus().size();
  return unbound_pools_.back().get();
}

void RuntimeCore::Register(WorkqueueCore* wq) {
  MutexLock lock(&mu_);
  workqueues_.push_back(wq);
}

void RuntimeCore::Unregister(WorkqueueCore* wq) {
  MutexLock lock(&mu_);
  workqueues_.erase(std::remove(workqueues_.begin(), workqueues_.end(), wq), workqueues_.end());
}

void RuntimeCore::KickWatchdog() {
  if (watchdog_armed_.load(std::memory_order_relaxed) ||
      watchdog_armed_.exchange(true, std::memory_order_acq_rel)) {
    return;
  }
  watch_epoch_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&watchdog_mu_);
  ArmWatchdogLocked();
}

void RuntimeCore::ArmWatchdogLocked() {
  const absl::Duration period =
      std::min(options.cpu_intensive_threshold, options.stall_threshold / 4);
  // Scheduling may throw (an allocation of the timer heap, a user's clock). A kick's
  // caller has queued its work already (Queue, Post) and the watchdog's own re-arm runs
  // on the timer thread: the throw must reach neither, and the watchdog must not stay
  // marked armed with no timer (it would never run again). So it is disarmed, for the
  // next kick to retry, and said once on stderr.
  try {
    watchdog_timer_ = timers->ScheduleAfter(period, [this] { Watchdog(); });
  } catch (...) {
    watchdog_timer_ = 0;
    watchdog_armed_.store(false, std::memory_order_release);
    static std::atomic<bool> said{false};
    if (!said.exchange(true, std::memory_order_relaxed)) {
      std::fprintf(stderr, "kwq: the workqueue watchdog could not be armed; retrying later\n");
    }
  }
}

bool RuntimeCore::CheckPools(std::vector<WorkerPool*>* pools) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return false;
    for (auto& v : cpu_pools_) {
      for (auto& p : v) {
        if (p) pools->push_back(p.get());
      }
    }
    for (auto& p : unbound_pools_) pools->push_back(p.get());
  }
  const absl::Time now = clock->Now();
  bool busy = false;
  for (WorkerPool* p : *pools) busy |= p->Check(now);
  return busy;
}

void RuntimeCore::Watchdog() {
  // A timer callback must not throw (it would end the process): a pass that cannot
  // allocate (its list of pools, a stall report) or whose stall reporter throws is cut
  // short, and the watchdog looks again a period later.
  std::vector<WorkerPool*> pools;
  bool busy;
  try {
    busy = CheckPools(&pools);
  } catch (...) {
    busy = true;
  }
  MutexLock lock(&watchdog_mu_);
  if (!busy) {  // (also when the runtime is stopping: no pools listed)
    // Disarm, then look again: work that arrived after the pass above either is seen
    // now, or its KickWatchdog comes after the disarm and arms the watchdog itself. All
    // under watchdog_mu_ through the re-arm: the runtime's destructor reads
    // watchdog_timer_ under it, so it either sees this timer (and waits for this
    // callback) or the one re-armed here.
    watchdog_timer_ = 0;
    watchdog_armed_.store(false, std::memory_order_seq_cst);
    for (WorkerPool* p : pools) busy |= p->Busy();
    if (!busy || watchdog_armed_.exchange(true, std::memory_order_seq_cst)) return;
  }
  ArmWatchdogLocked();
}

void RuntimeCore::ReportStall(const std::string& report) {
  stalls_.fetch_add(1, std::memory_order_relaxed);
  if (options.stall_reporter) {
    options.stall_reporter(report);
  } else {
    std::fprintf(stderr, "%s\n", report.c_str());
  }
}

bool RuntimeCore::ShouldFailSpawn() {
  if (!options.fail_thread_creation) return false;
  // A hook that throws refuses: the exception would otherwise leave Queue (or the
  // watchdog's pass) with the work already inserted.
  try {
    return options.fail_thread_creation();
  } catch (...) {
    return true;
  }
}

std::string RuntimeCore::Dump() const {
  std::string out = topology->Describe();
  std::vector<const WorkerPool*> pools;  // live as long as the runtime
  std::vector<std::string> wq_lines;
  {
    MutexLock lock(&mu_);
    for (const auto& v : cpu_pools_) {
      for (const auto& p : v) {
        if (p) pools.push_back(p.get());
      }
    }
    for (const auto& p : unbound_pools_) pools.push_back(p.get());
    // Under mu_: a workqueue unregisters (under mu_) before it is freed, so one listed here
    // is alive until the lock is released. DumpLine takes no lock.
    for (WorkqueueCore* wq : workqueues_) wq_lines.push_back(wq->DumpLine());
  }
  absl::StrAppend(&out, "\nPools (", pools.size(), "):\n");
  for (const WorkerPool* p : pools) absl::StrAppend(&out, "  ", p->DumpLine(), "\n");
  absl::StrAppend(&out, "Workqueues (", wq_lines.size(), "):\n");
  for (const std::string& line : wq_lines) absl::StrAppend(&out, "  ", line, "\n");
  return out;
}

}  // namespace internal

// ---- public: WorkqueueRuntime, BlockingScope ----

absl::StatusOr<std::unique_ptr<WorkqueueRuntime>> WorkqueueRuntime::Create(Options options) {
  if (options.topology == nullptr) {
    absl::StatusOr<std::shared_ptr<const Topology>> topo = Topology::Detect();
    if (!topo.ok()) return topo.status();
    options.topology = *topo;
  }
  if (options.topology->num_cpus() == 0) {
    return absl::InvalidArgumentError("WorkqueueRuntime: the topology has no CPUs");
  }
  // Per-CPU tables are indexed by CPU id (in the runtime and in every workqueue): an id
  // near INT_MAX overflowed their size and aborted the process.
  for (const CpuInfo& c : options.topology->cpus()) {
    if (c.cpu >= kMaxCpuId) {
      return absl::InvalidArgumentError(
          absl::StrCat("WorkqueueRuntime: CPU id ", c.cpu, " is not below ", kMaxCpuId));
    }
  }
  if (options.idle_timeout <= absl::ZeroDuration() ||
      options.cpu_intensive_threshold <= absl::ZeroDuration() ||
      options.stall_threshold <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "WorkqueueRuntime: idle_timeout, cpu_intensive_threshold and stall_threshold must "
        "be positive");
  }
  return std::unique_ptr<WorkqueueRuntime>(
      new WorkqueueRuntime(std::make_unique<internal::RuntimeCore>(std::move(options))));
}

WorkqueueRuntime& WorkqueueRuntime::Default() {
  static WorkqueueRuntime* const runtime = [] {
    // The process's CPUs, not those of whichever thread happens to call first.
    absl::StatusOr<std::shared_ptr<const Topology>> topo = Topology::DetectForProcess();
    absl::StatusOr<std::unique_ptr<WorkqueueRuntime>> rt =
        topo.ok() ? Create({.topology = *topo}) : topo.status();
    if (!rt.ok()) {
      std::fprintf(stderr, "kwq: cannot create the default workqueue runtime: %s\n",
                   rt.status().ToString().c_str());
      std::abort();
    }
    return rt->release();
  }();
  return *runtime;
}

WorkqueueRuntime::WorkqueueRuntime(std::unique_ptr<internal::RuntimeCore> core)
    : core_(std::move(core)) {}
WorkqueueRuntime::~WorkqueueRuntime() = default;
const Topology& WorkqueueRuntime::topology() const { return *core_->topology; }
std::string WorkqueueRuntime::Dump() const { return core_->Dump(); }
uint64_t WorkqueueRuntime::bind_failures() const {
  return core_->bind_failures_.load(std::memory_order_relaxed);
}
uint64_t WorkqueueRuntime::stalls() const { return core_->stalls_.load(std::memory_order_relaxed); }
bool WorkqueueRuntime::highpri_raised() const {
  return core_->highpri_raised_.load(std::memory_order_relaxed);
}

BlockingScope::BlockingScope() : worker_(internal::CurrentWorker()) {
  if (worker_ != nullptr) worker_->pool->EnterBlocking(worker_);
}

BlockingScope::~BlockingScope() {
  if (worker_ != nullptr) worker_->pool->ExitBlocking(worker_);
}

}  // namespace kwq
