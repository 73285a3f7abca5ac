// File: kwq/internal/seq_ring.h
//
// SeqRing: a FIFO of (ready sequence, slot) entries in a circular buffer, for the
// priority queue's groups (kwq/internal/ready_levels.h). Room can be set aside ahead of
// time: after Reserve(n) the FIFO can hold n entries without allocating, so that an item
// owed a place in a group (an add made while it was in flight, a delayed item coming due)
// gets it without an allocation that could fail where nothing may throw (a lease's
// Done, the timer's firing). std::deque, used before, could not set room aside.
// Not thread-safe: the owning queue's lock guards it.

#ifndef KWQ_INTERNAL_SEQ_RING_H_
#define KWQ_INTERNAL_SEQ_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace kwq::internal {

class SeqRing {
 public:
  struct Entry {
    int64_t seq;
    uint32_t slot;
  };
  // ReleaseIfEmpty keeps a buffer up to this many entries for reuse.
  static constexpr size_t kKeepEntries = 64;

  SeqRing() = default;
  SeqRing(SeqRing&& other) noexcept { swap(other); }
  SeqRing& operator=(SeqRing&& other) noexcept {
    swap(other);
    return *this;
  }
  void swap(SeqRing& other) noexcept {
    std::swap(entries_, other.entries_);
    std::swap(capacity_, other.capacity_);
    std::swap(head_, other.head_);
    std::swap(size_, other.size_);
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  // Makes room for `n` entries in all (not `n` more), so that push_backs up to that size
  // do not allocate. Throws std::bad_alloc with the ring unchanged.
  void Reserve(size_t n) {
    if (capacity_ >= n) return;
    size_t capacity = capacity_ == 0 ? 8 : capacity_;
    while (capacity < n) capacity *= 2;
    auto entries = std::make_unique_for_overwrite<Entry[]>(capacity);
    for (size_t i = 0; i < size_; ++i) entries[i] = At(i);
    entries_ = std::move(entries);
    capacity_ = capacity;
    head_ = 0;
  }

  // Appends an entry. Allocates (and may throw std::bad_alloc, the ring unchanged) only
  // when the ring is full.
  void push_back(Entry e) {
    if (size_ == capacity_) Reserve(size_ + 1);
    At(size_++) = e;
  }
  const Entry& front() const { return At(0); }
  const Entry& back() const { return At(size_ - 1); }
  // The ring must not be empty.
  void pop_front() {
    head_ = (head_ + 1) & (capacity_ - 1);
    --size_;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  // Keeps only the entries for which `keep(entry)` is true, in order, in place.
  template <typename Keep>
  void Filter(Keep keep) {
    size_t kept = 0;
    for (size_t i = 0; i < size_; ++i) {
      if (keep(At(i))) At(kept++) = At(i);
    }
    size_ = kept;
  }
  // Frees the buffer if the ring is empty and the buffer holds more than kKeepEntries.
  void ReleaseIfEmpty() {
    if (size_ == 0 && capacity_ > kKeepEntries) {
      entries_.reset();
      capacity_ = 0;
      head_ = 0;
    }
  }

 private:
  Entry& At(size_t i) { return entries_[(head_ + i) & (capacity_ - 1)]; }
  const Entry& At(size_t i) const { return entries_[(head_ + i) & (capacity_ - 1)]; }

  std::unique_ptr<Entry[]> entries_;  // a power-of-two number of them (capacity_), or none
  size_t capacity_ = 0;
  size_t head_ = 0;  // index of the front entry
  size_t size_ = 0;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SEQ_RING_H_
