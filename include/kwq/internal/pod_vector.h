// File: kwq/internal/pod_vector.h
//
// PodVector<T>: a growable array of trivially copyable T that grows with realloc.
// Internal: the storage of IndexedHeap (a delaying queue's waiting items, the priority
// queue's heaps, the timers).
//
// Why not std::vector: a vector grows by allocating a new block, copying, and freeing the
// old one, so a heap of 200,000 waiting items (16 bytes each) touches about twice its
// final size in fresh pages, each a page fault on first touch, and copies 3.2 MB on the
// way. glibc serves large blocks with mmap and grows them with mremap, which moves the
// pages already touched instead of copying them. docs/design.md ("Waiting items'
// heap grows with realloc") has the measurements.
//
// Not thread-safe. Elements past size() are unspecified until written.

#ifndef KWQ_INTERNAL_POD_VECTOR_H_
#define KWQ_INTERNAL_POD_VECTOR_H_

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/base/attributes.h"

namespace kwq::internal {

// How every PodVector grows: ::realloc. A test that runs out of memory on purpose points
// it at a realloc that fails when told to (tests/testing/failing_new.cc), before it starts
// any thread; nothing else may change it.
inline void* (*pod_vector_realloc)(void*, size_t) = &::realloc;

template <typename T>
class PodVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  PodVector() = default;
  ~PodVector() { std::free(data_); }
  PodVector(const PodVector& other) { *this = other; }
  PodVector& operator=(const PodVector& other) {
    if (this != &other) {
      size_ = 0;
      Reserve(other.size_);
      if (other.size_ != 0) std::memcpy(data_, other.data_, other.size_ * sizeof(T));
      size_ = other.size_;
    }
    return *this;
  }
  PodVector(PodVector&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)) {}
  PodVector& operator=(PodVector&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

  // `value` may be one of the vector's own elements (read before any growth frees it).
  void push_back(const T& value) {
    const T copy = value;
    if (size_ == capacity_) Reserve(size_ + 1);
    data_[size_++] = copy;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  // Grows to `n` elements, the new ones set to `fill` (which may be one of the vector's
  // own); shrinks by dropping the tail.
  void resize(size_t n, const T& fill) {
    const T copy = fill;
    if (n > capacity_) Reserve(n);
    for (size_t i = size_; i < n; ++i) data_[i] = copy;
    size_ = n;
  }
  // Makes room for at least `n` elements (doubling, at least 16). Throws std::bad_alloc.
  // Inline up to the check: callers reserve on hot paths (a heap push per delayed add),
  // where the growth is rare.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Reserve(size_t n) {
    if (n > capacity_) [[unlikely]]
      Grow(n);
  }

 private:
  // Reserve's growth, out of line: rare.
  ABSL_ATTRIBUTE_NOINLINE void Grow(size_t n) {
    const size_t capacity = std::max({n, capacity_ * 2, size_t{16}});
    void* grown = pod_vector_realloc(data_, capacity * sizeof(T));
    if (grown == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(grown);
    capacity_ = capacity;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_POD_VECTOR_H_
