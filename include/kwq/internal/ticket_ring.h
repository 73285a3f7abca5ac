// File: kwq/internal/ticket_ring.h
//
// TicketRing: a FIFO of slot numbers in a circular buffer, each entry with a ticket: the
// front's ticket plus its place in the ring (modulo 2^32). A push gets the ticket after
// the last entry's, a pop moves the front's on by one, and a Filter numbers the entries it
// keeps anew from the front's; so the entries in the ring have distinct consecutive
// tickets, and an owner can record where an item's entry is and tell it from an older
// entry of the same slot (the priority queue's groups, kwq/internal/ready_levels.h, which
// leave an item taken out of the middle in place, dead, and recognise it by its ticket).
// Four bytes an entry.
//
// Room can be set aside ahead of time: after Reserve(n) the FIFO can hold n entries
// without allocating, so that an item owed a place in a group (an add made while it was in
// flight, a delayed item coming due) gets it without an allocation that could fail where
// nothing may throw (a lease's Done, the timer's firing). std::deque, used before, could
// not set room aside.
// Not thread-safe: the owning queue's lock guards it.

#ifndef KWQ_INTERNAL_TICKET_RING_H_
#define KWQ_INTERNAL_TICKET_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace kwq::internal {

// The first ticket of a new ring. Tests only (tickets that wrap around 2^32 and 2^31 soon):
// set it before making the rings, on one thread, before any other thread runs.
inline uint32_t ticket_ring_first_ticket = 0;

class TicketRing {
 public:
  // ReleaseIfEmpty keeps a buffer up to this many entries for reuse.
  static constexpr size_t kKeepEntries = 64;

  TicketRing() = default;
  TicketRing(TicketRing&& other) noexcept { swap(other); }
  TicketRing& operator=(TicketRing&& other) noexcept {
    swap(other);
    return *this;
  }
  void swap(TicketRing& other) noexcept {
    std::swap(entries_, other.entries_);
    std::swap(capacity_, other.capacity_);
    std::swap(head_, other.head_);
    std::swap(size_, other.size_);
    std::swap(front_ticket_, other.front_ticket_);
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

  // Makes room for `n` entries in all (not `n` more), so that push_backs up to that size
  // do not allocate. Throws std::bad_alloc with the ring unchanged. Tickets stay.
  void Reserve(size_t n) {
    if (capacity_ >= n) return;
    size_t capacity = capacity_ == 0 ? 8 : capacity_;
    while (capacity < n) capacity *= 2;
    auto entries = std::make_unique_for_overwrite<uint32_t[]>(capacity);
    for (size_t i = 0; i < size_; ++i) entries[i] = At(i);
    entries_ = std::move(entries);
    capacity_ = capacity;
    head_ = 0;
  }

  // Appends `slot` and returns its ticket. Allocates (and may throw std::bad_alloc, the
  // ring unchanged) only when the ring is full.
  uint32_t push_back(uint32_t slot) {
    if (size_ == capacity_) Reserve(size_ + 1);
    const uint32_t ticket = front_ticket_ + static_cast<uint32_t>(size_);
    At(size_++) = slot;
    return ticket;
  }
  // The ring must not be empty.
  uint32_t front() const { return At(0); }
  uint32_t front_ticket() const { return front_ticket_; }
  uint32_t back() const { return At(size_ - 1); }
  // The entry `i` places behind the front; `i` < size().
  uint32_t at(size_t i) const { return At(i); }
  void pop_front() {
    head_ = (head_ + 1) & (capacity_ - 1);
    --size_;
    ++front_ticket_;
  }
  // Empties the ring; tickets go on from the next one.
  void clear() {
    front_ticket_ += static_cast<uint32_t>(size_);
    head_ = 0;
    size_ = 0;
  }
  // Keeps only the entries for which `keep(slot, ticket)` is true, in order, in place.
  // The kept entries are numbered anew from the front's ticket: `renumbered(slot,
  // ticket)` is called for each kept entry whose ticket changed (one that moved), with
  // its new ticket.
  template <typename Keep, typename Renumbered>
  void Filter(Keep keep, Renumbered renumbered) {
    size_t kept = 0;
    for (size_t i = 0; i < size_; ++i) {
      const uint32_t slot = At(i);
      if (!keep(slot, front_ticket_ + static_cast<uint32_t>(i))) continue;
      if (kept != i) renumbered(slot, front_ticket_ + static_cast<uint32_t>(kept));
      At(kept++) = slot;
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
  uint32_t& At(size_t i) { return entries_[(head_ + i) & (capacity_ - 1)]; }
  const uint32_t& At(size_t i) const { return entries_[(head_ + i) & (capacity_ - 1)]; }

  std::unique_ptr<uint32_t[]> entries_;  // a power-of-two number of them (capacity_), or none
  size_t capacity_ = 0;
  size_t head_ = 0;  // index of the front entry
  size_t size_ = 0;
  uint32_t front_ticket_ = ticket_ring_first_ticket;  // the front's; the others' follow it
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_TICKET_RING_H_
