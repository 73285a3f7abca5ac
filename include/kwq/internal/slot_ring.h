// File: kwq/internal/slot_ring.h
//
// SlotRing: a fixed-size single-producer single-consumer ring of slot numbers, the
// lock-free hand-over between a Queue's producers and its workers. "Single" means one at a
// time: the producer side is whoever holds the queue's table lock and the consumer side
// whoever holds its outbox lock, so each side's successive holders are ordered by their
// lock, and the two sides never wait for each other. Internal: used by Queue.
//
// Why hand-written: the only Debian packages with such a ring are Boost.Lockfree (Boost is
// an optional, benchmark-only dependency of kwq) and moodycamel's ConcurrentQueue, which is
// multi-producer and does not keep one FIFO order across producers. The ring is a textbook
// Lamport queue: the producer publishes with a release store of tail_, the consumer frees
// a cell with a release store of head_, and each side caches the other's index so a push
// or pop reads the other side's cache line only when its cached view says full or empty.

#ifndef KWQ_INTERNAL_SLOT_RING_H_
#define KWQ_INTERNAL_SLOT_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kwq::internal {

class SlotRing {
 public:
  static constexpr uint32_t kCapacity = 1024;  // a power of two

  SlotRing() = default;
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  // Producer side. Appends `slot`; false when the ring is full.
  bool TryPush(uint32_t slot) {
    const uint32_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_cache_ == kCapacity) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (tail - head_cache_ == kCapacity) return false;
    }
    cells_[Cell(tail)] = slot;
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer side. Removes the oldest slot into `*slot`; false when the ring is empty.
  bool TryPop(uint32_t* slot) {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    if (head == tail_cache_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (head == tail_cache_) return false;
    }
    *slot = cells_[Cell(head)];
    head_.store(head + 1, std::memory_order_release);
    return true;
  }

  // Consumer side. The oldest slot, without removing it; false when the ring is empty as
  // far as the consumer's cached view of the producer's end says (it does not read the
  // producer's cache line, so a slot pushed since the last TryPop may go unseen).
  bool TryPeekCached(uint32_t* slot) const {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    if (head == tail_cache_) return false;
    *slot = cells_[Cell(head)];
    return true;
  }

  // Slots in the ring. Exact on either side when the other side is idle; otherwise a
  // snapshot that may be stale by the other side's recent operations.
  // `order`: acquire (default) or seq_cst (for a caller that relies on a store-load
  // pair with the pusher's fence).
  size_t SizeHint(std::memory_order order = std::memory_order_acquire) const {
    // head_ first: tail_ read after it is never behind it.
    const uint32_t head = head_.load(order);
    const uint32_t tail = tail_.load(order);
    return tail - head;
  }

 private:
  // Where position `i` lives: consecutive positions go to different cache lines (64
  // apart), so while the ring is nearly empty the producer writing one cell and the
  // consumer reading the one before do not share a line. A bijection of [0, kCapacity):
  // 64 lines of 16 cells.
  static uint32_t Cell(uint32_t i) {
    static_assert(kCapacity == 64 * 16, "Cell spreads the ring over 64 lines of 16 cells");
    return ((i & 63) << 4) | ((i >> 6) & 15);
  }

  alignas(64) uint32_t cells_[kCapacity] = {};
  // Consumer side: head_ (read by the producer when it thinks the ring is full) and its
  // cached copy of tail_.
  alignas(64) std::atomic<uint32_t> head_{0};
  uint32_t tail_cache_ = 0;
  // Producer side: tail_ and its cached copy of head_.
  alignas(64) std::atomic<uint32_t> tail_{0};
  uint32_t head_cache_ = 0;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_SLOT_RING_H_
