// File: kwq/internal/safe_growth.h
//
// Growth of an absl::flat_hash_set that cannot fail part-way. Debian's Abseil (20220623)
// grows a table in place and sets the new capacity before it allocates: a growth that
// threw std::bad_alloc left the set corrupt (its capacity over its old arrays; a later
// lookup read past them, and the destructor freed Abseil's static empty group).
//
// So a set that must stay whole takes a ReservingAllocator, and its owner calls
// ReserveGrowth(set, reserve) before each insert. When that insert could make Abseil grow
// the set (Abseil allocates on an insert only at capacity 0, at a capacity of one group
// (16) or less, or above 25/32 full), ReserveGrowth allocates the block the growth will
// ask for, sized with Abseil's own AllocSize, and may throw there, with nothing changed.
// The growth then takes that block from the allocator and cannot fail. A request of any
// other size (a reserve() call) is an ordinary allocation.
//
// AllocSize is Abseil's internal API: an Abseil whose layout differs would not take the
// block (the growth would allocate, as before). QueueAllocTest.EveryAllocationOfAn*
// (tests/alloc_failure_test.cc) fails every allocation but the reserve's and would then
// crash.
//
// Why not grow out of place (a bigger set built, then swapped in): inserting every
// element through the public interface measured 8-12 ns per key more on fifo_1t's adds
// than Abseil's own growth. Internal: used by the key table, the limiters' failure table
// and the metrics recorder's depth by priority.

#ifndef KWQ_INTERNAL_SAFE_GROWTH_H_
#define KWQ_INTERNAL_SAFE_GROWTH_H_

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "absl/container/internal/raw_hash_set.h"
#include "kwq/internal/prefault.h"

namespace kwq::internal {

// The block set aside for a set's next growth. Not thread-safe: the set's owner's lock.
class GrowthReserve {
 public:
  static constexpr size_t kPrefaultBytes = size_t{256} << 10;

  GrowthReserve() = default;
  ~GrowthReserve() { ::operator delete(block_); }
  GrowthReserve(const GrowthReserve&) = delete;
  GrowthReserve& operator=(const GrowthReserve&) = delete;

  // Makes sure a block of `bytes` is set aside. Throws std::bad_alloc (nothing changed).
  void Ensure(size_t bytes) {
    if (block_ != nullptr && bytes_ == bytes) return;
    void* block = ::operator new(bytes);
    ::operator delete(block_);
    block_ = block;
    bytes_ = bytes;
  }
  // The block, if one of `bytes` is set aside; else nullptr.
  void* Take(size_t bytes) {
    if (block_ == nullptr || bytes_ != bytes) return nullptr;
    // The growth taking it writes all of it now (the rehash): map it in one call rather
    // than a page fault per page (kwq/internal/prefault.h). Not in Ensure: the block is
    // set aside at 25/32 full and taken at 7/8, and a set that stays between kept the
    // whole next array resident unwritten (+20 MiB at 1.7 million keys). Small blocks are
    // left alone (the call would cost more than their faults).
    if (bytes >= kPrefaultBytes) Prefault(block_, bytes);
    return std::exchange(block_, nullptr);
  }
  bool holds_block() const { return block_ != nullptr; }

 private:
  void* block_ = nullptr;
  size_t bytes_ = 0;
};

// std::allocator, except that an allocation of the size set aside in its GrowthReserve
// takes that block. Blocks come from the plain operator new either way.
template <typename T>
class ReservingAllocator {
 public:
  using value_type = T;
  explicit ReservingAllocator(GrowthReserve* reserve) noexcept : reserve_(reserve) {}
  template <typename U>
  ReservingAllocator(const ReservingAllocator<U>& other) noexcept : reserve_(other.reserve()) {}

  T* allocate(size_t n) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    if (void* block = reserve_->Take(n * sizeof(T))) return static_cast<T*>(block);
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p); }

  GrowthReserve* reserve() const noexcept { return reserve_; }
  friend bool operator==(const ReservingAllocator& a, const ReservingAllocator& b) noexcept {
    return a.reserve_ == b.reserve_;
  }

 private:
  GrowthReserve* reserve_;
};

// Call before inserting one element into `set` (a flat set or map whose allocator is a
// ReservingAllocator on `reserve`). Throws std::bad_alloc with nothing changed.
template <typename Set>
void ReserveGrowth(const Set& set, GrowthReserve& reserve) {
  using Slot = typename Set::slot_type;
  const size_t capacity = set.capacity();
  if (capacity > 16 && (set.size() + 1) * 32 <= capacity * 25) return;  // in place at most
  const size_t next = capacity == 0 ? 1 : 2 * capacity + 1;
  // Abseil allocates its arrays in units of the slot's alignment.
  const size_t bytes = absl::container_internal::AllocSize(next, sizeof(Slot), alignof(Slot));
  reserve.Ensure((bytes + alignof(Slot) - 1) / alignof(Slot) * alignof(Slot));
}

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SAFE_GROWTH_H_
