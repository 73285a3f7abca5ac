// FragileKey: a queue or limiter key (an int) whose copy throws std::runtime_error for the
// value 7, for tests that a container is left whole when a key's copy throws part-way
// through storing it.

#ifndef KWQ_TESTS_TESTING_FRAGILE_KEY_H_
#define KWQ_TESTS_TESTING_FRAGILE_KEY_H_

#include <stdexcept>
#include <utility>

namespace kwq::testing {

struct FragileKey {
  int v;
  explicit FragileKey(int value) : v(value) {}
  FragileKey(const FragileKey& o) : v(o.v) {
    if (v == 7) throw std::runtime_error("copy");
  }
  bool operator==(const FragileKey& o) const { return v == o.v; }
  template <typename H>
  friend H AbslHashValue(H h, const FragileKey& k) {
    return H::combine(std::move(h), k.v);
  }
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_FRAGILE_KEY_H_
