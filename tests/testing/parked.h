// Parked(w): whether a workqueue Work waits on its workqueue's inactive list (beyond
// max_active, or frozen), read through the implementation's WorkAccess. Lock-free: a
// snapshot, for tests that stage the state before they read it.

#ifndef KWQ_TESTS_TESTING_PARKED_H_
#define KWQ_TESTS_TESTING_PARKED_H_

#include "kwq/workqueue.h"
#include "workqueue/internal.h"

namespace kwq::testing {

inline bool Parked(Work* w) {
  return static_cast<internal::WorkWhere>(internal::WorkAccess::where(w).load()) ==
         internal::WorkWhere::kInactive;
}

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_PARKED_H_
