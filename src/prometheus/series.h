// Series: one queue metric's use of one prometheus-cpp series, counted so that queues
// of one name share a series and the last of them removes it (kwq/prometheus.h).
// Internal to kwq::prometheus.

#ifndef KWQ_SRC_PROMETHEUS_SERIES_H_
#define KWQ_SRC_PROMETHEUS_SERIES_H_

#include <prometheus/family.h>
#include <prometheus/labels.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "kwq/internal/mutex.h"
#include "kwq/internal/safe_growth.h"

namespace kwq::prometheus_internal {

// How many live queue metrics use each series. Family::Add hands out the existing series
// for labels it has already, so queues of one name (through one provider or through
// several sharing a registry) share a series, which must stay until the last of them
// goes. Keyed by the series object; process-wide because providers may share a registry.
// A series that a keep_series provider used keeps its entry (with no users) for as long
// as its registry lives, so a later queue of the name through a provider that does not
// keep series does not remove it either ("for the life of the registry").
class SeriesUsers {
 public:
  static SeriesUsers& Get() {
    static SeriesUsers* const users = new SeriesUsers;  // never destroyed: see ~Series
    return *users;
  }

  // `keep`: this user's provider keeps its series for the life of the registry; one such
  // user is enough for the series to stay, whichever user goes last. `registry` owns
  // `family`.
  template <typename M, typename... Args>
  M* Acquire(const std::shared_ptr<prometheus::Registry>& registry, prometheus::Family<M>& family,
             bool keep, const prometheus::Labels& labels, Args&&... args) {
    internal::MutexLock lock(&mu_);
    // Room for the entry first: a series added and then not counted would never be
    // removed (and a failed growth would leave the map corrupt, kwq/internal/safe_growth.h).
    internal::ReserveGrowth(users_, growth_);
    M* series = &family.Add(labels, std::forward<Args>(args)...);
    auto [it, inserted] = users_.try_emplace(series);
    Users& users = it->second;
    // An unused entry of another registry is stale: its registry died and a series of
    // this one took its address (a weak_ptr keeps its registry's control block, so a
    // live registry never shares an owner with a dead one).
    if (!inserted && users.count == 0 && !SameOwner(users.registry, registry)) users = Users{};
    if (users.count == 0) users.registry = registry;
    ++users.count;
    users.keep |= keep;
    if (inserted && users_.size() >= sweep_at_) SweepLocked();
    return series;
  }

  // Counts one user less; the last one removes the series unless one of its users kept
  // it (then the entry stays, unused, for the registry's life).
  template <typename M>
  void Release(prometheus::Family<M>& family, M* series) {
    internal::MutexLock lock(&mu_);
    auto it = users_.find(series);
    if (it == users_.end() || --it->second.count > 0 || it->second.keep) return;
    users_.erase(it);
    family.Remove(series);  // takes the family's lock, never ours: no cycle
  }

 private:
  struct Users {
    int count = 0;
    bool keep = false;  // sticky: a keep_series provider used it
    std::weak_ptr<prometheus::Registry> registry;
  };

  static bool SameOwner(const std::weak_ptr<prometheus::Registry>& a,
                        const std::shared_ptr<prometheus::Registry>& b) {
    return !a.owner_before(b) && !b.owner_before(a);
  }

  // Drops the unused entries of dead registries; runs each time the map doubles, so the
  // kept entries of registries long gone do not pile up.
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::erase_if(users_, [](const auto& entry) {
      return entry.second.count == 0 && entry.second.registry.expired();
    });
    sweep_at_ = std::max<size_t>(64, 2 * users_.size());
  }

  using UsersMap =
      absl::flat_hash_map<const void*, Users, absl::Hash<const void*>, std::equal_to<const void*>,
                          internal::ReservingAllocator<std::pair<const void* const, Users>>>;
  internal::Mutex mu_;
  internal::GrowthReserve growth_ ABSL_GUARDED_BY(mu_);  // before users_: its allocator's
  UsersMap users_ ABSL_GUARDED_BY(mu_){0, UsersMap::hasher(), UsersMap::key_equal(),
                                       UsersMap::allocator_type(&growth_)};
  size_t sweep_at_ ABSL_GUARDED_BY(mu_) = 64;
};

// One queue's use of one series. Holds the registry, which owns the family, so a series
// is removed safely even if the provider is gone first.
template <typename M>
class Series {
 public:
  template <typename... Args>
  Series(std::shared_ptr<prometheus::Registry> registry, prometheus::Family<M>* family, bool keep,
         const prometheus::Labels& labels, Args&&... args)
      : registry_(std::move(registry)),
        family_(family),
        series_(SeriesUsers::Get().Acquire(registry_, *family, keep, labels,
                                           std::forward<Args>(args)...)) {}
  ~Series() { SeriesUsers::Get().Release(*family_, series_); }
  Series(const Series&) = delete;
  Series& operator=(const Series&) = delete;

  M& operator*() const { return *series_; }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<M>* const family_;
  M* const series_;
};

}  // namespace kwq::prometheus_internal

#endif  // KWQ_SRC_PROMETHEUS_SERIES_H_
