// Series: one queue metric's use of one prometheus-cpp series, counted so that queues
// of one name share a series and the last of them removes it (kwq/prometheus.h).
// Internal to kwq::prometheus.

#ifndef KWQ_SRC_PROMETHEUS_SERIES_H_
#define KWQ_SRC_PROMETHEUS_SERIES_H_

#include <prometheus/family.h>
#include <prometheus/labels.h>
#include <prometheus/registry.h>

#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "kwq/internal/mutex.h"

namespace kwq::prometheus_internal {

// How many live queue metrics use each series. Family::Add hands out the existing series
// for labels it has already, so queues of one name (through one provider or through
// several sharing a registry) share a series, which must stay until the last of them
// goes. Keyed by the series object; process-wide because providers may share a registry.
class SeriesUsers {
 public:
  static SeriesUsers& Get() {
    static SeriesUsers* const users = new SeriesUsers;  // never destroyed: see ~Series
    return *users;
  }

  // `keep`: this user's provider keeps its series for the life of the registry; one such
  // user is enough for the series to stay, whichever user goes last.
  template <typename M, typename... Args>
  M* Acquire(prometheus::Family<M>& family, bool keep, const prometheus::Labels& labels,
             Args&&... args) {
    internal::MutexLock lock(&mu_);
    M* series = &family.Add(labels, std::forward<Args>(args)...);
    Users& users = users_[series];
    ++users.count;
    users.keep |= keep;
    return series;
  }

  // Counts one user less; the last one removes the series unless one of its users kept
  // it.
  template <typename M>
  void Release(prometheus::Family<M>& family, M* series) {
    internal::MutexLock lock(&mu_);
    auto it = users_.find(series);
    if (it == users_.end() || --it->second.count > 0) return;
    const bool keep = it->second.keep;
    users_.erase(it);
    if (!keep) family.Remove(series);  // takes the family's lock, never ours: no cycle
  }

 private:
  struct Users {
    int count = 0;
    bool keep = false;  // sticky: a keep_series provider used it
  };
  internal::Mutex mu_;
  absl::flat_hash_map<const void*, Users> users_ ABSL_GUARDED_BY(mu_);
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
        series_(SeriesUsers::Get().Acquire(*family, keep, labels, std::forward<Args>(args)...)) {}
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
