// File: kwq/internal/range_items.h
//
// MovesItems<Range>(): whether a queue's AddAll may move the items out of a range passed
// to it as `Range&& items` (Range deduced). It may when the range yields rvalues (a view
// that makes values, such as a transform, or move iterators), or when it is an rvalue
// that provably owns its items: a container with an allocator (std::vector, std::deque,
// absl::InlinedVector, ...), a std::array or a built-in array. Anything else is copied
// from: an lvalue, any view (std::span, filter, take_while), and every other range type,
// since a range passed as an rvalue may still refer to the caller's items without saying
// so (absl::Span is neither a std::ranges::view nor borrowed in Debian's Abseil, and was
// moved out of). Copying is always correct; moving is only the fast path. Internal: used
// by Queue, ShardedQueue and PriorityQueue.

#ifndef KWQ_INTERNAL_RANGE_ITEMS_H_
#define KWQ_INTERNAL_RANGE_ITEMS_H_

#include <array>
#include <cstddef>
#include <ranges>
#include <type_traits>

namespace kwq::internal {

template <typename R>
struct IsStdArray : std::false_type {};
template <typename T, size_t N>
struct IsStdArray<std::array<T, N>> : std::true_type {};

// Whether a range of type R (no reference, no cv) owns its items: copying it copies them.
template <typename R>
concept OwnsItems = std::is_array_v<R> || IsStdArray<R>::value ||
    (requires { typename R::allocator_type; } && !std::ranges::view<R>);

template <typename Range>
constexpr bool MovesItems() {
  if constexpr (std::is_lvalue_reference_v<Range>) {
    if constexpr (std::ranges::range<Range>) {
      // A range that yields rvalues (a transform's values, move iterators): nobody else
      // has them.
      return !std::is_lvalue_reference_v<std::ranges::range_reference_t<Range>>;
    } else {
      return false;
    }
  } else if constexpr (std::ranges::range<Range> &&
                       !std::is_lvalue_reference_v<std::ranges::range_reference_t<Range>>) {
    return true;
  } else {
    return OwnsItems<std::remove_cv_t<Range>>;
  }
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_RANGE_ITEMS_H_
