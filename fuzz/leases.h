// Leases<Lease>: the leases a queue fuzzer holds, by key (int). Take keeps a hand-out,
// checking that no key is leased twice (a queue's exclusivity promise); DoneOne ends a
// lease chosen by a fuzz byte; Pick names one. Shared by the delaying and rate-limiting
// queue fuzzers.

#ifndef KWQ_FUZZ_LEASES_H_
#define KWQ_FUZZ_LEASES_H_

#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "fuzz_check.h"

template <typename Lease>
class Leases {
 public:
  // Checks that `key` is not leased (call it for every hand-out, kept or not).
  void CheckNotLeased(int key) const { FUZZ_CHECK(!leases_.count(key)); }

  // Keeps the lease of a hand-out (after CheckNotLeased).
  void Keep(Lease lease) {
    const int key = *lease;
    leases_.emplace(key, std::move(lease));
  }

  // A hand-out (TryGet's result): if there is one, checks its key is not leased, calls
  // `handed_out(key)` and keeps the lease.
  template <typename F>
  void Take(std::optional<Lease> lease, F handed_out) {
    if (!lease) return;
    CheckNotLeased(**lease);
    handed_out(**lease);
    Keep(std::move(*lease));
  }

  // Ends the lease chosen by `arg`, if any (its Done runs); returns its key, or -1.
  int DoneOne(int arg) {
    if (leases_.empty()) return -1;
    auto it = std::next(leases_.begin(), arg % leases_.size());
    const int key = it->first;
    leases_.erase(it);
    return key;
  }

  bool leased(int key) const { return leases_.count(key) == 1; }

  // The lease chosen by `arg`, or nullptr when none is held.
  const Lease* Pick(int arg) const {
    if (leases_.empty()) return nullptr;
    return &std::next(leases_.begin(), arg % leases_.size())->second;
  }

  // Ends every lease.
  void Clear() { leases_.clear(); }

 private:
  std::map<int, Lease> leases_;
};

#endif  // KWQ_FUZZ_LEASES_H_
