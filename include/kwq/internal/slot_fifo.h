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

#ifndef KWQ_INTERNAL_SLOT_FIFO_H_
#define KWQ_INTERNAL_SLOT_FIFO_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "kwq/internal/check.h"

namespace kwq::internal {

class SlotFifo {
 public:
  static constexpr uint32_t kRunBit = 0x80000000u;

  bool empty() const { return size_ == 0; }
  // Slots in the FIFO (runs counted by their length).
  size_t size() const { return size_; }

  // Appends `slot` (< 2^31) at the back.
  void push_back(uint32_t slot) {
    KWQ_DCHECK(slot < kRunBit, "SlotFifo: slot number out of range");
    ++size_;
    if (tail_is_run_) {
      // words_: [..., first|kRunBit, length]
      uint32_t& length = words_.back();
      const uint32_t first = words_[words_.size() - 2] & ~kRunBit;
      if (first + length == slot) {
        ++length;
        return;
      }
    } else if (!words_.empty() && words_.back() + 1 == slot) {
      words_.back() |= kRunBit;  // a single slot becomes a run of two
      words_.push_back(2);
      tail_is_run_ = true;
      return;
    }
    words_.push_back(slot);
    tail_is_run_ = false;
  }

  // The slot at the front. The FIFO must not be empty.
  uint32_t front() const { return words_.front() & ~kRunBit; }

  // Removes the front slot. The FIFO must not be empty.
  void pop_front() {
    --size_;
    const uint32_t word = words_.front();
    if (!(word & kRunBit)) {
      words_.pop_front();
      return;
    }
    // A run [first, first + length): drop its first slot.
    uint32_t& length = words_[1];
    const uint32_t next = (word & ~kRunBit) + 1;
    if (length > 2) {
      --length;
      words_.front() = next | kRunBit;
      return;
    }
    // The run shrinks to one slot: store it as a single word.
    words_.pop_front();
    words_.front() = next;
    if (words_.size() == 1) tail_is_run_ = false;
  }

 private:
  std::deque<uint32_t> words_;
  size_t size_ = 0;
  bool tail_is_run_ = false;  // the last two words are a run
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SLOT_FIFO_H_
