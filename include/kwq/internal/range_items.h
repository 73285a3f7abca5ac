// File: kwq/internal/range_items.h
//
// MovesItems<Range>(): whether a queue's AddAll may move the items out of a range passed
// to it as `Range&& items` (Range deduced). It may when the range yields rvalues (a view
// that makes values, such as a transform, or move iterators), or when it is an rvalue
// container that owns its items. It may not for an lvalue, or for any view (std::span,
// filter, take_while, a view of the caller's own): a view passed as an rvalue still refers
// to the caller's items. An iterable that is not a std::ranges::range is moved from only
// as an rvalue. Internal: used by Queue, ShardedQueue and PriorityQueue.

#ifndef KWQ_INTERNAL_RANGE_ITEMS_H_
#define KWQ_INTERNAL_RANGE_ITEMS_H_

#include <ranges>
#include <type_traits>

namespace kwq::internal {

template <typename Range>
constexpr bool MovesItems() {
  if constexpr (std::ranges::range<Range>) {
    if constexpr (!std::is_lvalue_reference_v<std::ranges::range_reference_t<Range>>) {
      return true;  // the range yields rvalues: nobody else has them
    } else {
      return !std::is_lvalue_reference_v<Range> && !std::ranges::view<std::remove_cvref_t<Range>> &&
             !std::ranges::borrowed_range<Range>;
    }
  } else {
    return !std::is_lvalue_reference_v<Range>;
  }
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_RANGE_ITEMS_H_
