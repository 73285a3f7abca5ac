// Ranges for AddAll tests, written by hand because clang 14 cannot compile most of
// libstdc++ 12's std::views:
// - RefView: a view over the caller's container that is not a borrowed range (as
//   std::views::filter or take_while over a vector are): its items stay the caller's.
// - PlainRef: a range over the caller's container that says nothing of what it is: not a
//   view, not borrowed, no allocator (as absl::Span in Debian's Abseil): its items stay
//   the caller's too.
// - KeyValues(n): a range that yields the strings "key-0" .. "key-<n-1>" by value (as a
//   std::views::transform does).

#ifndef KWQ_TESTS_TESTING_RANGES_H_
#define KWQ_TESTS_TESTING_RANGES_H_

#include <cstddef>
#include <iterator>
#include <ranges>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kwq::testing {

template <typename C>
class RefView : public std::ranges::view_base {
 public:
  RefView() = default;
  explicit RefView(C& c) : c_(&c) {}
  auto begin() const { return c_->begin(); }
  auto end() const { return c_->end(); }

 private:
  C* c_ = nullptr;
};

template <typename C>
class PlainRef {
 public:
  explicit PlainRef(C& c) : c_(&c) {}
  auto begin() const { return c_->begin(); }
  auto end() const { return c_->end(); }

 private:
  C* c_;
};

class KeyValues {
 public:
  class Iterator {
   public:
    using value_type = std::string;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    explicit Iterator(int i) : i_(i) {}
    std::string operator*() const { return absl::StrCat("key-", i_); }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator old = *this;
      ++i_;
      return old;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }

   private:
    int i_ = 0;
  };
  explicit KeyValues(int n) : n_(n) {}
  Iterator begin() const { return Iterator(0); }
  Iterator end() const { return Iterator(n_); }

 private:
  int n_;
};

static_assert(std::ranges::view<RefView<std::vector<int>>>);
static_assert(std::ranges::forward_range<KeyValues>);
static_assert(!std::ranges::view<PlainRef<std::vector<int>>>);
static_assert(!std::ranges::borrowed_range<PlainRef<std::vector<int>>>);

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_RANGES_H_
