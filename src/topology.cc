#include "kwq/topology.h"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace kwq {
namespace {

constexpr std::array<std::string_view, kNumAffinityScopes> kScopeNames = {"cpu", "smt", "cache",
                                                                          "numa", "system"};

std::string_view StripBlanks(std::string_view s) {
  constexpr std::string_view kBlanks = " \t\n\r\f\v";
  const size_t first = s.find_first_not_of(kBlanks);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kBlanks) - first + 1);
}

int ScopeIndex(AffinityScope scope) {
  const int i = static_cast<int>(scope);
  return i >= 0 && i < kNumAffinityScopes ? i : -1;
}

// The number of CPU ids this kernel can have: one more than the highest id in
// /sys/devices/system/cpu/possible ("0-3", "0-3,8-11", "0"). Falls back to
// sysconf(_SC_NPROCESSORS_CONF), then CPU_SETSIZE. Read once.
int PossibleCpuIds() {
  static const int count = [] {
    std::ifstream in("/sys/devices/system/cpu/possible");
    std::string line;
    if (in && std::getline(in, line)) {
      // Each comma-separated item is "N" or "N-M"; the highest id ends the last item.
      const size_t start = line.find_last_of(",-");
      const std::string_view last_id =
          StripBlanks(std::string_view(line).substr(start == std::string::npos ? 0 : start + 1));
      int highest = -1;
      const auto [end, error] =
          std::from_chars(last_id.data(), last_id.data() + last_id.size(), highest);
      if (error == std::errc() && end == last_id.data() + last_id.size() && highest >= 0 &&
          highest < (1 << 22)) {
        return highest + 1;
      }
    }
    const long conf = sysconf(_SC_NPROCESSORS_CONF);
    if (conf > 0 && conf < (1 << 22)) return static_cast<int>(conf);
    return CPU_SETSIZE;
  }();
  return count;
}

// A cpu_set_t of a run-time size (CPU_ALLOC), freed on destruction.
class DynamicCpuSet {
 public:
  explicit DynamicCpuSet(int num_cpus)
      : num_cpus_(std::max(num_cpus, 1)),
        set_(CPU_ALLOC(num_cpus_)),
        bytes_(CPU_ALLOC_SIZE(num_cpus_)) {
    if (set_ != nullptr) CPU_ZERO_S(bytes_, set_);
  }
  ~DynamicCpuSet() {
    if (set_ != nullptr) CPU_FREE(set_);
  }
  DynamicCpuSet(const DynamicCpuSet&) = delete;
  DynamicCpuSet& operator=(const DynamicCpuSet&) = delete;

  bool ok() const { return set_ != nullptr; }
  cpu_set_t* get() { return set_; }
  size_t bytes() const { return bytes_; }
  void Set(int cpu) { CPU_SET_S(static_cast<size_t>(cpu), bytes_, set_); }
  // False for ids beyond the set's size.
  bool IsSet(unsigned cpu) const { return CPU_ISSET_S(cpu, bytes_, set_); }

 private:
  int num_cpus_;
  cpu_set_t* set_;
  size_t bytes_;
};

// Owns an hwloc topology object (hwloc_topology_destroy on destruction).
class HwlocHandle {
 public:
  HwlocHandle() = default;
  ~HwlocHandle() {
    if (topology_ != nullptr) hwloc_topology_destroy(topology_);
  }
  HwlocHandle(const HwlocHandle&) = delete;
  HwlocHandle& operator=(const HwlocHandle&) = delete;

  // hwloc_topology_init plus the flags and filters kwq wants: CPUs outside the allowed
  // cpuset (cgroup) kept in the topology, so the "N of M" total counts them (ExtractCpus
  // leaves them out of cpus()); no I/O objects (faster, and nothing here uses them);
  // every L3 cache kept even where it adds no structure.
  absl::Status Init() {
    hwloc_topology_t topology;
    if (hwloc_topology_init(&topology) != 0) {
      return absl::InternalError(
          absl::StrCat("hwloc_topology_init failed: ", std::strerror(errno)));
    }
    topology_ = topology;
    hwloc_topology_set_flags(topology_, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
    hwloc_topology_set_io_types_filter(topology_, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_type_filter(topology_, HWLOC_OBJ_L3CACHE, HWLOC_TYPE_FILTER_KEEP_ALL);
    return absl::OkStatus();
  }

  hwloc_topology_t get() const { return topology_; }

 private:
  hwloc_topology_t topology_ = nullptr;
};

int LogicalIndexOfAncestor(hwloc_topology_t topology, hwloc_obj_type_t type, hwloc_obj_t pu) {
  const hwloc_obj_t ancestor = hwloc_get_ancestor_obj_by_type(topology, type, pu);
  if (ancestor == nullptr || ancestor->logical_index > static_cast<unsigned>(INT_MAX)) return -1;
  return static_cast<int>(ancestor->logical_index);
}

// The id of each of `nodes`: its OS index, or -1 where that does not tell it apart from
// the others (unknown, past INT_MAX, or another node's too). A CPU of such a node could
// not be given its own node's id (it once fell to node 0, merging two nodes).
std::vector<int> NodeIds(const std::vector<hwloc_obj_t>& nodes) {
  std::map<unsigned, int> uses;
  for (const hwloc_obj_t node : nodes) ++uses[node->os_index];
  std::vector<int> ids;
  ids.reserve(nodes.size());
  for (const hwloc_obj_t node : nodes) {
    const unsigned os = node->os_index;
    const bool distinct =
        os != HWLOC_UNKNOWN_INDEX && os <= static_cast<unsigned>(INT_MAX) && uses[os] == 1;
    ids.push_back(distinct ? static_cast<int>(os) : -1);
  }
  return ids;
}

// The NUMA node local to `pu`: among the nodes whose cpuset holds it, the one with the
// smallest cpuset (so a node of the PU's own package wins over a machine-wide memory
// node), ties broken by the lower OS index. 0 when no node holds it; -1 when one that
// holds it has no id of its own (NodeIds).
int NumaNodeOf(const std::vector<hwloc_obj_t>& nodes, const std::vector<int>& ids,
               unsigned pu_os_index) {
  std::pair<int, int> best{INT_MAX, INT_MAX};  // (cpuset weight, node id)
  for (size_t i = 0; i < nodes.size(); ++i) {
    const hwloc_obj_t node = nodes[i];
    if (node->cpuset == nullptr || !hwloc_bitmap_isset(node->cpuset, pu_os_index)) continue;
    if (ids[i] < 0) return -1;
    int weight = hwloc_bitmap_weight(node->cpuset);
    if (weight < 0) weight = INT_MAX;  // an infinite set
    best = std::min(best, std::pair{weight, ids[i]});
  }
  return best.second == INT_MAX ? 0 : best.second;
}

struct Extracted {
  int total_cpus = 0;
  std::vector<CpuInfo> cpus;
  // Set when the topology cannot be used as it is (then `cpus` is incomplete).
  std::string error;
};

// Copies the allowed PUs of a loaded topology (those `affinity` also holds, when given).
Extracted ExtractCpus(hwloc_topology_t topology, const DynamicCpuSet* affinity) {
  Extracted out;
  std::vector<hwloc_obj_t> nodes;
  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr);
       node != nullptr; node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) {
    nodes.push_back(node);
  }
  const std::vector<int> node_ids = NodeIds(nodes);
  const hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topology);
  std::set<int> seen;
  for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_PU, nullptr); pu != nullptr;
       pu = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_PU, pu)) {
    ++out.total_cpus;
    const unsigned os_index = pu->os_index;
    if (os_index == HWLOC_UNKNOWN_INDEX || os_index > static_cast<unsigned>(INT_MAX)) continue;
    if (allowed != nullptr && !hwloc_bitmap_isset(allowed, os_index)) continue;
    if (affinity != nullptr && !affinity->IsSet(os_index)) continue;
    if (!seen.insert(static_cast<int>(os_index)).second) continue;
    const int numa_node = NumaNodeOf(nodes, node_ids, os_index);
    if (numa_node < 0) {
      out.error =
          absl::StrCat("the NUMA node of CPU ", os_index,
                       " has no OS index of its own (none, one past INT_MAX, or another node's)");
      return out;
    }
    out.cpus.push_back(CpuInfo{
        .cpu = static_cast<int>(os_index),
        .core = LogicalIndexOfAncestor(topology, HWLOC_OBJ_CORE, pu),
        .package = LogicalIndexOfAncestor(topology, HWLOC_OBJ_PACKAGE, pu),
        .numa_node = numa_node,
        .l3 = LogicalIndexOfAncestor(topology, HWLOC_OBJ_L3CACHE, pu),
    });
  }
  return out;
}

// The affinity mask of thread `tid` (0: the calling thread), grown until the kernel's mask
// fits.
absl::StatusOr<std::unique_ptr<DynamicCpuSet>> ThreadAffinity(pid_t tid) {
  for (int size = std::max(PossibleCpuIds(), CPU_SETSIZE); size <= (1 << 22); size *= 2) {
    auto set = std::make_unique<DynamicCpuSet>(size);
    if (!set->ok()) return absl::ResourceExhaustedError("cannot allocate a CPU set");
    if (sched_getaffinity(tid, set->bytes(), set->get()) == 0) return set;
    if (errno != EINVAL) break;
  }
  return absl::InternalError(absl::StrCat("sched_getaffinity failed: ", std::strerror(errno)));
}

void AppendCpuList(const std::vector<int>& cpus, std::string* out) {
  // Ranges of consecutive ids, as in /sys cpulists: "0-3,8,10-11".
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (i != 0) out->push_back(',');
    absl::StrAppend(out, cpus[i]);
    if (j > i) absl::StrAppend(out, "-", cpus[j]);
    i = j + 1;
  }
}

std::string Padded(std::string_view text, size_t width) {
  std::string s(text);
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string IdOrDash(int id) { return id < 0 ? std::string("-") : absl::StrCat(id); }

size_t CountDistinct(const std::vector<CpuInfo>& cpus, int CpuInfo::*field) {
  std::set<int> ids;
  for (const CpuInfo& c : cpus) {
    if (c.*field >= 0) ids.insert(c.*field);
  }
  return ids.size();
}

}  // namespace

std::string_view AffinityScopeName(AffinityScope scope) {
  const int i = ScopeIndex(scope);
  return i < 0 ? std::string_view("unknown") : kScopeNames[i];
}

absl::StatusOr<AffinityScope> ParseAffinityScope(std::string_view name) {
  for (int i = 0; i < kNumAffinityScopes; ++i) {
    if (name == kScopeNames[i]) return static_cast<AffinityScope>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown affinity scope \"",
                                                 absl::CEscape(std::string(name)),
                                                 "\" (want cpu, smt, cache, numa or system)"));
}

Topology::Topology(std::string source, int total_cpus, std::vector<CpuInfo> cpus)
    : source_(std::move(source)), total_cpus_(total_cpus), cpus_(std::move(cpus)) {
  std::sort(cpus_.begin(), cpus_.end(),
            [](const CpuInfo& a, const CpuInfo& b) { return a.cpu < b.cpu; });
  std::set<int> nodes;
  for (const CpuInfo& c : cpus_) nodes.insert(c.numa_node);
  numa_nodes_.assign(nodes.begin(), nodes.end());

  // The grouping key of a CPU in each scope; the first member of the pair keeps keys of
  // different kinds (an L3 index, a package index, a node) apart in the cache fallback.
  auto key_of = [](AffinityScope scope, const CpuInfo& c) -> std::pair<int, int> {
    switch (scope) {
      case AffinityScope::kCpu:
        return {0, c.cpu};
      case AffinityScope::kSmt:
        return c.core >= 0 ? std::pair{0, c.core} : std::pair{1, c.cpu};
      case AffinityScope::kCache:
        if (c.l3 >= 0) return {0, c.l3};
        if (c.package >= 0) return {1, c.package};
        return {2, c.numa_node};
      case AffinityScope::kNuma:
        return {0, c.numa_node};
      case AffinityScope::kSystem:
        return {0, 0};
    }
    return {0, 0};
  };
  for (int s = 0; s < kNumAffinityScopes; ++s) {
    const auto scope = static_cast<AffinityScope>(s);
    std::map<std::pair<int, int>, int> pod_of_key;
    std::vector<std::vector<int>>& pods = pods_[s];
    std::vector<int>& index = pod_index_[s];
    index.reserve(cpus_.size());
    // cpus_ is ascending, so pods come out ordered by first CPU and each pod ascending.
    for (const CpuInfo& c : cpus_) {
      auto [it, inserted] = pod_of_key.try_emplace(key_of(scope, c), static_cast<int>(pods.size()));
      if (inserted) pods.emplace_back();
      pods[it->second].push_back(c.cpu);
      index.push_back(it->second);
    }
  }
}

absl::StatusOr<std::shared_ptr<const Topology>> Topology::Detect() { return DetectWithMaskOf(0); }

absl::StatusOr<std::shared_ptr<const Topology>> Topology::DetectForProcess() {
  return DetectWithMaskOf(getpid());  // the main thread's id is the process id
}

absl::StatusOr<std::shared_ptr<const Topology>> Topology::DetectWithMaskOf(int tid) {
  absl::StatusOr<std::unique_ptr<DynamicCpuSet>> affinity = ThreadAffinity(tid);
  if (!affinity.ok()) return affinity.status();
  HwlocHandle hwloc;
  if (absl::Status s = hwloc.Init(); !s.ok()) return s;
  if (hwloc_topology_load(hwloc.get()) != 0) {
    return absl::InternalError(absl::StrCat("hwloc_topology_load failed: ", std::strerror(errno)));
  }
  Extracted e = ExtractCpus(hwloc.get(), affinity->get());
  if (!e.error.empty()) return absl::InternalError(absl::StrCat("this system: ", e.error));
  if (e.cpus.empty()) {
    return absl::FailedPreconditionError(
        "no CPU is both allowed by hwloc and in the thread's affinity mask");
  }
  return std::shared_ptr<const Topology>(
      new Topology("this system", e.total_cpus, std::move(e.cpus)));
}

namespace {

// The OS index lists of a synthetic description ("pack:2 pu:2(indexes=0,2,1,3)"), checked
// before hwloc sees them: hwloc quietly drops objects whose indexes repeat (a description
// of 4 PUs loaded as 2), and an index in the billions had it build bitmaps of 512 MiB for
// over a minute. Only the entries hwloc reads are checked: one per object of the level
// (the product of the arities down to it); it ignores the rest of a longer list. Levels
// or lists in hwloc's other forms (memory children in brackets, interleavings such as
// "indexes=core:pu", anything not parsed here) are left to hwloc.
absl::Status CheckSyntheticIndexes(absl::string_view text) {
  constexpr uint32_t kMaxIndex = (uint32_t{1} << 24) - 1;  // bitmaps of 2 MiB at most
  constexpr uint64_t kManyObjects = uint64_t{1} << 32;     // past any list's length
  constexpr absl::string_view kKey = "indexes=";
  uint64_t objects = 1;  // of the level being read
  size_t at = 0;
  while (at < text.size()) {
    // The next level: up to a blank outside parentheses.
    at = text.find_first_not_of(" \t\n", at);
    if (at == absl::string_view::npos) break;
    size_t end = at;
    for (int depth = 0; end < text.size(); ++end) {
      const char c = text[end];
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (depth <= 0 && (c == ' ' || c == '\t' || c == '\n')) break;
    }
    const absl::string_view level = text.substr(at, end - at);
    at = end;
    if (level[0] == '(' || level[0] == '[') continue;  // the root's attributes, memory
    const size_t colon = level.find(':');
    const size_t paren = level.find('(');
    uint64_t arity = 0;
    if (colon == absl::string_view::npos || paren < colon ||
        !absl::SimpleAtoi(
            level.substr(colon + 1, paren == absl::string_view::npos ? absl::string_view::npos
                                                                     : paren - colon - 1),
            &arity)) {
      break;  // not a form read here: hwloc judges the rest
    }
    // Saturating: 2^32 objects times an arity of 2^32 wrapped to 0, which skipped the
    // check of every later list.
    objects = arity != 0 && objects > kManyObjects / arity ? kManyObjects : objects * arity;
    if (paren == absl::string_view::npos) continue;
    const size_t key = level.find(kKey, paren);
    if (key == absl::string_view::npos) continue;
    absl::string_view list = level.substr(key + kKey.size());
    list = list.substr(0, list.find_first_of(") \t\n"));
    if (list.empty() || list.find_first_not_of("0123456789,") != absl::string_view::npos) continue;
    std::set<uint32_t> seen;
    uint64_t read = 0;
    for (absl::string_view item : absl::StrSplit(list, ',')) {
      if (read++ == objects) break;  // hwloc reads no further
      uint32_t index = 0;
      if (!absl::SimpleAtoi(item, &index) || index > kMaxIndex) {
        return absl::InvalidArgumentError(
            absl::StrCat("hwloc synthetic description: index \"", absl::CEscape(item),
                         "\" in \"indexes=\" is not a number from 0 to ", kMaxIndex));
      }
      if (!seen.insert(index).second) {
        return absl::InvalidArgumentError(absl::StrCat("hwloc synthetic description: index ", index,
                                                       " repeats in \"indexes=", list, "\""));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Topology>> Topology::FromSynthetic(
    std::string_view description) {
  if (StripBlanks(description).empty()) {
    return absl::InvalidArgumentError("empty hwloc synthetic description");
  }
  if (description.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError("hwloc synthetic description contains a NUL byte");
  }
  const std::string text(description);
  if (absl::Status s = CheckSyntheticIndexes(text); !s.ok()) return s;
  HwlocHandle hwloc;
  if (absl::Status s = hwloc.Init(); !s.ok()) return s;
  if (hwloc_topology_set_synthetic(hwloc.get(), text.c_str()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid hwloc synthetic description \"", absl::CEscape(text), "\""));
  }
  if (hwloc_topology_load(hwloc.get()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load hwloc synthetic description \"",
                                                   absl::CEscape(text),
                                                   "\": ", std::strerror(errno)));
  }
  Extracted e = ExtractCpus(hwloc.get(), nullptr);
  if (!e.error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("hwloc synthetic description: ", e.error));
  }
  if (e.cpus.empty()) {
    return absl::InvalidArgumentError("hwloc synthetic description has no CPU");
  }
  return std::shared_ptr<const Topology>(
      new Topology(absl::StrCat("synthetic \"", text, "\""), e.total_cpus, std::move(e.cpus)));
}

absl::StatusOr<std::shared_ptr<const Topology>> Topology::FromXml(std::string_view xml_buffer) {
  if (StripBlanks(xml_buffer).empty()) {
    return absl::InvalidArgumentError("empty hwloc XML document");
  }
  if (xml_buffer.size() >= static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError("hwloc XML document too large");
  }
  // hwloc wants the size including a terminating NUL, as hwloc_topology_export_xmlbuffer
  // reports it.
  const std::string text(xml_buffer);
  HwlocHandle hwloc;
  if (absl::Status s = hwloc.Init(); !s.ok()) return s;
  if (hwloc_topology_set_xmlbuffer(hwloc.get(), text.c_str(), static_cast<int>(text.size()) + 1) !=
      0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use hwloc XML document: ", std::strerror(errno)));
  }
  if (hwloc_topology_load(hwloc.get()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load hwloc XML document: ", std::strerror(errno)));
  }
  Extracted e = ExtractCpus(hwloc.get(), nullptr);
  if (!e.error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("hwloc XML document: ", e.error));
  }
  if (e.cpus.empty()) return absl::InvalidArgumentError("hwloc XML document has no allowed CPU");
  return std::shared_ptr<const Topology>(new Topology(
      absl::StrCat("XML document (", text.size(), " bytes)"), e.total_cpus, std::move(e.cpus)));
}

absl::StatusOr<std::shared_ptr<const Topology>> Topology::FromXmlFile(std::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("empty hwloc XML file name");
  if (path.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError("hwloc XML file name contains a NUL byte");
  }
  const std::string name(path);
  HwlocHandle hwloc;
  if (absl::Status s = hwloc.Init(); !s.ok()) return s;
  if (hwloc_topology_set_xml(hwloc.get(), name.c_str()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use hwloc XML file ", name, ": ", std::strerror(errno)));
  }
  if (hwloc_topology_load(hwloc.get()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load hwloc XML file ", name, ": ", std::strerror(errno)));
  }
  Extracted e = ExtractCpus(hwloc.get(), nullptr);
  if (!e.error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("hwloc XML file ", name, ": ", e.error));
  }
  if (e.cpus.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("hwloc XML file ", name, " has no allowed CPU"));
  }
  return std::shared_ptr<const Topology>(
      new Topology(absl::StrCat("XML file ", name), e.total_cpus, std::move(e.cpus)));
}

bool Topology::HasCpu(int cpu) const {
  const auto it = std::lower_bound(cpus_.begin(), cpus_.end(), cpu,
                                   [](const CpuInfo& c, int id) { return c.cpu < id; });
  return it != cpus_.end() && it->cpu == cpu;
}

bool Topology::HasNumaNode(int node) const {
  return std::binary_search(numa_nodes_.begin(), numa_nodes_.end(), node);
}

std::vector<int> Topology::CpusOfNode(int node) const {
  std::vector<int> out;
  for (const CpuInfo& c : cpus_) {
    if (c.numa_node == node) out.push_back(c.cpu);
  }
  return out;
}

const std::vector<std::vector<int>>& Topology::Pods(AffinityScope scope) const {
  static const std::vector<std::vector<int>> kNoPods;
  const int s = ScopeIndex(scope);
  return s < 0 ? kNoPods : pods_[s];
}

int Topology::PodOf(AffinityScope scope, int cpu) const {
  const int s = ScopeIndex(scope);
  if (s < 0) return -1;
  const auto it = std::lower_bound(cpus_.begin(), cpus_.end(), cpu,
                                   [](const CpuInfo& c, int id) { return c.cpu < id; });
  if (it == cpus_.end() || it->cpu != cpu) return -1;
  return pod_index_[s][it - cpus_.begin()];
}

std::string Topology::Describe() const {
  std::string out = absl::StrCat("kwq topology of ", source_, "\n");
  absl::StrAppend(&out, "  cpus: ", cpus_.size(), " of ", total_cpus_, " (");
  std::vector<int> ids;
  ids.reserve(cpus_.size());
  for (const CpuInfo& c : cpus_) ids.push_back(c.cpu);
  AppendCpuList(ids, &out);
  absl::StrAppend(&out, ")\n  numa nodes: ", numa_nodes_.size(),
                  ", packages: ", CountDistinct(cpus_, &CpuInfo::package),
                  ", cores: ", CountDistinct(cpus_, &CpuInfo::core),
                  ", L3 caches: ", CountDistinct(cpus_, &CpuInfo::l3), "\n");
  for (int node : numa_nodes_) {
    absl::StrAppend(&out, "  node ", node, ": cpus ");
    AppendCpuList(CpusOfNode(node), &out);
    out.push_back('\n');
  }
  const size_t without_l3 =
      std::count_if(cpus_.begin(), cpus_.end(), [](const CpuInfo& c) { return c.l3 < 0; });
  if (without_l3 > 0) {
    absl::StrAppend(&out, "  note: ", without_l3,
                    " cpus are below no L3 cache; their cache pods are per package (or per "
                    "NUMA node without packages)\n");
  }
  absl::StrAppend(&out, "  ", Padded("cpu", 7), Padded("core", 7), Padded("package", 9),
                  Padded("node", 6), "l3\n");
  for (const CpuInfo& c : cpus_) {
    absl::StrAppend(&out, "  ", Padded(absl::StrCat(c.cpu), 7), Padded(IdOrDash(c.core), 7),
                    Padded(IdOrDash(c.package), 9), Padded(absl::StrCat(c.numa_node), 6),
                    IdOrDash(c.l3), "\n");
  }
  for (int s = 0; s < kNumAffinityScopes; ++s) {
    const auto scope = static_cast<AffinityScope>(s);
    absl::StrAppend(&out, "  pods ", Padded(AffinityScopeName(scope), 7), "(", pods_[s].size(),
                    "):");
    for (size_t p = 0; p < pods_[s].size(); ++p) {
      out.append(p == 0 ? " " : " | ");
      AppendCpuList(pods_[s][p], &out);
    }
    if (scope == kDefaultAffinityScope) out.append("  [default]");
    out.push_back('\n');
  }
  return out;
}

absl::Status BindCurrentThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("BindCurrentThread: empty CPU set");
  const int possible = PossibleCpuIds();
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= possible) {
      return absl::InvalidArgumentError(absl::StrCat("BindCurrentThread: unknown CPU ", cpu,
                                                     " (this system's CPU ids are 0..",
                                                     possible - 1, ")"));
    }
  }
  DynamicCpuSet set(possible);
  if (!set.ok())
    return absl::ResourceExhaustedError("BindCurrentThread: cannot allocate a CPU set");
  for (int cpu : cpus) set.Set(cpu);
  if (sched_setaffinity(0, set.bytes(), set.get()) != 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, "BindCurrentThread: sched_setaffinity");
  }
  return absl::OkStatus();
}

int CurrentCpu() {
  const int cpu = sched_getcpu();
  return cpu < 0 ? -1 : cpu;
}

}  // namespace kwq
