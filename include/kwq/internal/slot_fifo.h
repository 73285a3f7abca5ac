// File: kwq/internal/slot_fifo.h
//
// SlotFifo: a FIFO of slot numbers (kwq/internal/key_table.h) that stores a run of
// consecutive slots in two words. New keys take consecutive slots from the key table's
// slab, so a burst of new keys (the usual way a queue fills up) costs almost nothing here:
// one million fresh keys are one run, not four megabytes of slot numbers. Slots that do
// not continue a run cost one word each, as in a plain deque. Not thread-safe: the owning
// queue's lock guards it. Internal: used by Queue.
//
// Encoding: a word with the top bit clear is one slot. A word with the top bit set starts a
// run: its low 31 bits are the run's first slot and the next word is the run's length
// (at least 2). Slot numbers must be below 2^31 (KeyTable::kMaxSlots).
//
// The words sit in a circular buffer that doubles when full, so room can be set aside
// ahead of time: after Reserve(n), the next n push_backs allocate nothing and cannot
// throw (the queue reserves before it marks an item queued, so an allocation failure
// leaves nothing half done; see Queue::ReservePushLocked). Every operation that throws
// leaves the FIFO as it was. Popping never frees the buffer (that would drop reserved
// room); ReleaseIfEmpty does, for a buffer larger than kKeepWords.

#ifndef KWQ_INTERNAL_SLOT_FIFO_H_
#define KWQ_INTERNAL_SLOT_FIFO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "kwq/internal/check.h"

namespace kwq::internal {

class SlotFifo {
 public:
  static constexpr uint32_t kRunBit = 0x80000000u;
  // ReleaseIfEmpty keeps a buffer up to this many words for reuse.
  static constexpr size_t kKeepWords = 1024;

  SlotFifo() = default;
  SlotFifo(SlotFifo&& other) noexcept { swap(other); }
  SlotFifo& operator=(SlotFifo&& other) noexcept {
    swap(other);
    return *this;
  }
  void swap(SlotFifo& other) noexcept {
    std::swap(words_, other.words_);
    std::swap(capacity_, other.capacity_);
    std::swap(head_, other.head_);
    std::swap(count_, other.count_);
    std::swap(size_, other.size_);
    std::swap(tail_is_run_, other.tail_is_run_);
  }
  friend void swap(SlotFifo& a, SlotFifo& b) noexcept { a.swap(b); }

  bool empty() const { return size_ == 0; }
  // Slots in the FIFO (runs counted by their length).
  size_t size() const { return size_; }

  // Makes room for `n` more push_backs (each adds at most one word), so that they do
  // not allocate. Throws std::bad_alloc (the FIFO unchanged) when it cannot.
  void Reserve(size_t n) {
    if (capacity_ - count_ >= n) return;
    size_t capacity = capacity_ == 0 ? 16 : capacity_;
    while (capacity - count_ < n) capacity *= 2;
    auto words = std::make_unique_for_overwrite<uint32_t[]>(capacity);
    for (size_t i = 0; i < count_; ++i) words[i] = Word(i);
    words_ = std::move(words);
    capacity_ = capacity;
    head_ = 0;
  }

  // Makes room for `n` slots in all, so that the FIFO can hold any `n` distinct slots
  // without allocating: it never uses more words than it holds slots (a run of L >= 2
  // slots is two words). For a FIFO that holds each slot at most once (the priority
  // queue's idle keys). Throws std::bad_alloc (the FIFO unchanged) when it cannot.
  void ReserveFor(size_t n) {
    if (capacity_ < n) Reserve(n - count_);
  }

  // Appends `slot` (< 2^31) at the back. Allocates (and may throw std::bad_alloc, the
  // FIFO unchanged) only when no room was reserved.
  void push_back(uint32_t slot) {
    KWQ_DCHECK(slot < kRunBit, "SlotFifo: slot number out of range");
    if (tail_is_run_) {
      // [..., first|kRunBit, length]
      uint32_t& length = Word(count_ - 1);
      const uint32_t first = Word(count_ - 2) & ~kRunBit;
      if (first + length == slot) {
        ++length;
        ++size_;
        return;
      }
    } else if (count_ > 0 && Word(count_ - 1) + 1 == slot) {
      Reserve(1);
      Word(count_ - 1) |= kRunBit;  // a single slot becomes a run of two
      Word(count_++) = 2;
      tail_is_run_ = true;
      ++size_;
      return;
    }
    Reserve(1);
    Word(count_++) = slot;
    tail_is_run_ = false;
    ++size_;
  }

  // Frees the buffer if the FIFO is empty and the buffer is larger than kKeepWords (room
  // reserved is given up too).
  void ReleaseIfEmpty() {
    if (count_ == 0 && capacity_ > kKeepWords) {
      words_.reset();
      capacity_ = 0;
    }
  }

  // The slot at the front. The FIFO must not be empty.
  uint32_t front() const { return Word(0) & ~kRunBit; }

  // Copies the first min(n, size()) slots, front first, to `out`; returns how many.
  size_t CopyFront(uint32_t* out, size_t n) const {
    size_t copied = 0;
    for (size_t w = 0; w < count_ && copied < n;) {
      const uint32_t word = Word(w);
      if (!(word & kRunBit)) {
        out[copied++] = word;
        ++w;
        continue;
      }
      const uint32_t first = word & ~kRunBit;
      const uint32_t length = Word(w + 1);
      for (uint32_t i = 0; i < length && copied < n; ++i) out[copied++] = first + i;
      w += 2;
    }
    return copied;
  }

  // Removes the front slot. The FIFO must not be empty.
  void pop_front() {
    --size_;
    const uint32_t word = Word(0);
    if (!(word & kRunBit)) {
      PopWord();
      return;
    }
    // A run [first, first + length): drop its first slot.
    uint32_t& length = Word(1);
    const uint32_t next = (word & ~kRunBit) + 1;
    if (length > 2) {
      --length;
      Word(0) = next | kRunBit;
      return;
    }
    // The run shrinks to one slot: store it as a single word.
    PopWord();
    Word(0) = next;
    if (count_ == 1) tail_is_run_ = false;
  }

 private:
  // The i-th word from the front.
  uint32_t& Word(size_t i) { return words_[(head_ + i) & (capacity_ - 1)]; }
  uint32_t Word(size_t i) const { return words_[(head_ + i) & (capacity_ - 1)]; }
  void PopWord() {
    head_ = (head_ + 1) & (capacity_ - 1);
    if (--count_ == 0) {
      head_ = 0;
      tail_is_run_ = false;
    }
  }

  std::unique_ptr<uint32_t[]> words_;  // a power-of-two number of them (capacity_), or none
  size_t capacity_ = 0;
  size_t head_ = 0;           // index of the front word
  size_t count_ = 0;          // words in use
  size_t size_ = 0;           // slots
  bool tail_is_run_ = false;  // the last two words are a run
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SLOT_FIFO_H_
