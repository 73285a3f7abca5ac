// File: kwq/topology.h
//
// The machine topology kernel-style workqueues place their unbound worker pools on, and
// the affinity scopes that group CPUs into "pods" (the model is the Linux kernel's
// workqueue affinity scopes, Documentation/core-api/workqueue.rst):
//
//   kCpu     one pod per CPU.
//   kSmt     one pod per physical core: the core's SMT siblings (hyper-threads).
//   kCache   one pod per last-level (L3) cache domain. The default, as in the kernel.
//   kNuma    one pod per NUMA node.
//   kSystem  one pod holding every CPU.
//
//   absl::StatusOr<std::shared_ptr<const kwq::Topology>> topo = kwq::Topology::Detect();
//   if (!topo.ok()) return topo.status();
//   for (const std::vector<int>& pod : (*topo)->Pods(kwq::AffinityScope::kCache)) {
//     // start a worker pool bound to `pod` with kwq::BindCurrentThread(pod)
//   }
//
// A Topology is read from hwloc (the detection library behind lstopo) once, copied into
// plain vectors and the hwloc object freed: it is immutable after construction, holds no
// hwloc state, and every const member may be called concurrently from any thread. Detect()
// describes this machine; FromSynthetic() and FromXml() describe machines we do not have
// (for tests and for planning), from an hwloc synthetic description or an XML export
// (`lstopo machine.xml`).
//
// Identifiers: `cpu` is the OS index of a CPU (the number sched_setaffinity, taskset and
// /proc/cpuinfo use); `numa_node` is the OS index of a NUMA node (the number numactl and
// mbind use). `core`, `package` and `l3` are hwloc logical indexes (0, 1, 2, ... in
// topology order, unique machine-wide), meaningful only for comparison within one Topology.
//
// Cache pods fall back when the topology has no L3 caches (some ARM and virtual machines,
// synthetic descriptions without "l3"): a CPU that is below no L3 cache is grouped with the
// other such CPUs of its package, or, when it is below no package either, of its NUMA node.
// Likewise a CPU below no core object (no SMT information) is a kSmt pod of its own.
//
// Only NUMA nodes holding at least one of the CPUs described count as nodes here: memory-
// only nodes (CXL, HBM without CPUs) and nodes whose CPUs are all disallowed are left out.
// A topology with no NUMA information puts every CPU on node 0.

#ifndef KWQ_TOPOLOGY_H_
#define KWQ_TOPOLOGY_H_

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kwq {

// How unbound workers are grouped onto CPUs. See the file comment.
enum class AffinityScope { kCpu, kSmt, kCache, kNuma, kSystem };

// The number of AffinityScope values, and the default scope (the kernel's default too).
inline constexpr int kNumAffinityScopes = 5;
inline constexpr AffinityScope kDefaultAffinityScope = AffinityScope::kCache;

// "cpu", "smt", "cache", "numa" or "system" (the kernel's sysfs names); "unknown" for a
// value outside the enum. Thread-safe; the view points to static storage.
std::string_view AffinityScopeName(AffinityScope scope);

// The inverse of AffinityScopeName: exactly one of the five lowercase names.
// Errors: InvalidArgument for anything else (including "" and "unknown").
absl::StatusOr<AffinityScope> ParseAffinityScope(std::string_view name);

// One CPU of a Topology.
struct CpuInfo {
  int cpu = -1;       // OS index of the CPU
  int core = -1;      // hwloc logical index of its core; -1 if the topology has no cores
  int package = -1;   // hwloc logical index of its package (socket); -1 if none
  int numa_node = 0;  // OS index of its NUMA node; 0 if no NUMA node holds it
  int l3 = -1;        // hwloc logical index of its L3 cache (its cache domain); -1 if none

  friend bool operator==(const CpuInfo&, const CpuInfo&) = default;
};

// An immutable description of the CPUs a process may use and how they are grouped.
// Thread safety: every const member may be called concurrently. Nothing here blocks
// except the factories, which read /sys (Detect) or parse their input.
class Topology {
 public:
  // This machine, as the calling thread may use it: the CPUs in hwloc's allowed cpuset
  // (offline CPUs and CPUs outside the process's cgroup cpuset are excluded) that are
  // also in the calling thread's affinity mask (sched_getaffinity(0)), so taskset,
  // numactl --physcpubind and an earlier BindCurrentThread are honoured. Note that it reads
  // the mask of the *calling thread*: call it from a thread that is not pinned narrower
  // than the process (typically main, early). hwloc's environment variables
  // (HWLOC_XMLFILE, HWLOC_SYNTHETIC, HWLOC_COMPONENTS, ...) apply, as for any hwloc
  // program. Takes a few milliseconds.
  // Errors: Internal when hwloc cannot be initialised or fails to load the topology, or
  // sched_getaffinity fails; FailedPrecondition when no CPU is left after the intersection.
  static absl::StatusOr<std::shared_ptr<const Topology>> Detect();
  // Detect with the affinity mask of the process's main thread (sched_getaffinity(getpid()))
  // instead of the caller's, so the result does not depend on which thread calls it first
  // (WorkqueueRuntime::Default uses it). Same errors.
  static absl::StatusOr<std::shared_ptr<const Topology>> DetectForProcess();

  // A machine from an hwloc synthetic description, e.g. "pack:2 numa:2 l3:2 core:4 pu:2"
  // (64 CPUs numbered 0..63; see hwloc's "Synthetic topologies" documentation for the
  // syntax). Every CPU of the description is used: no affinity mask is applied.
  // Errors: InvalidArgument for an empty or malformed description, including an
  // "indexes=" list whose numbers repeat or exceed 2^24 - 1 (hwloc itself dropped repeated
  // objects, and spent minutes on indexes in the billions); Internal when hwloc fails
  // otherwise. A description of an absurd size (millions of objects) is refused by hwloc
  // or costs the memory it asks for.
  static absl::StatusOr<std::shared_ptr<const Topology>> FromSynthetic(
      std::string_view description);

  // A machine from an hwloc XML document held in memory (as written by
  // `lstopo file.xml` or hwloc_topology_export_xmlbuffer; hwloc 1.x and 2.x formats).
  // The CPUs used are those the document marks allowed; no affinity mask is applied.
  // Errors: InvalidArgument for an empty, malformed or unusable document (one whose
  // NUMA nodes are not told apart by their OS indexes among them), as far as hwloc
  // reports it: its parser itself can crash on some malformed documents (hwloc 2.9:
  // a segfault inside hwloc_topology_load, found by an audit), so do not pass it
  // untrusted XML.
  static absl::StatusOr<std::shared_ptr<const Topology>> FromXml(std::string_view xml_buffer);

  // FromXml with the document read from the file at `path`.
  // Errors: InvalidArgument for an empty path or a file hwloc cannot read or parse.
  static absl::StatusOr<std::shared_ptr<const Topology>> FromXmlFile(std::string_view path);

  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  // The CPUs described, in ascending order of `cpu`. Never empty.
  const std::vector<CpuInfo>& cpus() const { return cpus_; }
  int num_cpus() const { return static_cast<int>(cpus_.size()); }

  // The NUMA nodes holding at least one CPU of cpus(), ascending OS indexes. Never empty.
  const std::vector<int>& numa_nodes() const { return numa_nodes_; }
  int num_numa_nodes() const { return static_cast<int>(numa_nodes_.size()); }

  // Whether `cpu` (OS index) is one of cpus(). Any int may be passed.
  bool HasCpu(int cpu) const;
  // Whether `node` (OS index) is one of numa_nodes(). Any int may be passed.
  bool HasNumaNode(int node) const;

  // The CPUs of cpus() on NUMA node `node`, ascending; empty when the node is unknown.
  std::vector<int> CpusOfNode(int node) const;

  // The pods of `scope`: a partition of cpus() into non-empty groups of CPU numbers, each
  // group ascending, the groups ordered by their first CPU. kCpu has num_cpus() pods,
  // kSystem exactly one. An out-of-range `scope` gives an empty list. The reference
  // stays valid for the life of this Topology.
  const std::vector<std::vector<int>>& Pods(AffinityScope scope) const;

  // The index into Pods(scope) of the pod holding `cpu`; -1 when `cpu` is not one of
  // cpus() or `scope` is out of range.
  int PodOf(AffinityScope scope, int cpu) const;

  // Where this topology came from, e.g. "this system" or "synthetic \"pack:2 pu:2\"".
  const std::string& source() const { return source_; }

  // A human-readable multi-line summary for diagnostics (like the kernel's wq_dump.py):
  // counts, the CPUs of each NUMA node, one line per CPU and the pods of every scope.
  // The format is not stable; do not parse it.
  std::string Describe() const;

 private:
  // Detect with the affinity mask of thread `tid` (0: the calling thread).
  static absl::StatusOr<std::shared_ptr<const Topology>> DetectWithMaskOf(int tid);
  // Sorts `cpus` and derives everything else from it. `cpus` must be non-empty with
  // distinct `cpu` values.
  Topology(std::string source, int total_cpus, std::vector<CpuInfo> cpus);

  std::string source_;
  int total_cpus_;  // CPUs in the loaded topology before the allowed/affinity restriction
  std::vector<CpuInfo> cpus_;
  std::vector<int> numa_nodes_;
  std::array<std::vector<std::vector<int>>, kNumAffinityScopes> pods_;
  // pod_index_[scope][i] is the pod of cpus_[i].
  std::array<std::vector<int>, kNumAffinityScopes> pod_index_;
};

// Binds the calling thread to `cpus` (OS indexes; duplicates are harmless) with
// sched_setaffinity. Does not block. On failure the thread's affinity is unchanged.
// Errors: InvalidArgument for an empty set, a negative CPU or one beyond the CPUs this
// kernel can have (/sys/devices/system/cpu/possible); otherwise the errno of
// sched_setaffinity as a status (absl::ErrnoToStatus), e.g. InvalidArgument (EINVAL) when
// none of `cpus` is online and allowed by the cgroup cpuset, PermissionDenied (EPERM).
// When some but not all of `cpus` are allowed, the kernel binds to the allowed ones.
absl::Status BindCurrentThread(const std::vector<int>& cpus);

// The CPU the calling thread is running on now (sched_getcpu), or -1 when unknown. The
// answer may be stale as soon as it is returned unless the thread is bound to one CPU.
int CurrentCpu();

}  // namespace kwq

#endif  // KWQ_TOPOLOGY_H_
