// File: kwq/internal/key_table.h
//
// KeyTable: the one place a queue stores its keys. Each key lives once, in a chunked slab
// (stable addresses, so a lease can hand out a reference), and a hash index of slot
// numbers finds it by value; per-slot state bits (dirty, processing, ...) sit in a byte
// array beside it. This is how kwq keeps client-go's three sets (queue, dirty,
// processing) without three copies of every key. Not thread-safe: the owning queue's
// lock guards it, except that item() and state() of a slot may be read from a thread
// that was handed the slot number (see item()). Internal: used by Queue, PriorityQueue
// and DelayingQueue.
//
// Memory per stored key: sizeof(T) in the slab, one byte of state, the key's 32-bit hash
// (all three in fixed-size chunks), and a 4-byte slot number plus one control byte in the
// index (absl::flat_hash_set), at its load factor. The stored hash means a key is hashed once per
// insert: growing the index and erasing a key never read the key again (for std::string keys that
// read is a cache miss on the string's heap buffer; it was 36% of fifo_1t's time before).
// Once the index is more than 25/32 full, the block its next growth will take (about twice
// its size) is set aside (kwq/internal/safe_growth.h) and held until that growth, or the
// table's end if the table shrinks first; a big block is not resident until used.

#ifndef KWQ_INTERNAL_KEY_TABLE_H_
#define KWQ_INTERNAL_KEY_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_set.h"
#include "kwq/internal/check.h"
#include "kwq/internal/prefault.h"
#include "kwq/internal/safe_growth.h"
#include "kwq/internal/spread_hash.h"

namespace kwq::internal {

template <typename T, typename Hash, typename Eq>
class KeyTable {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  // Slot numbers stay below 2^31 (SlotFifo uses the top bit).
  static constexpr uint32_t kMaxSlots = 0x80000000u;

  KeyTable() : index_(0, SlotHash{this}, SlotEq{this}, ReservingAllocator<SlotRef>(&growth_)) {}
  ~KeyTable() {
    for (uint32_t slot = 0; slot < limit_; ++slot) {
      if (state(slot) & kLive) Ptr(slot)->~T();
    }
  }
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  // The slot holding `key`, or kNone.
  uint32_t Find(const T& key) const { return Find(key, HashOf(key)); }

  // Find with the key's hash already computed (HashOf). Always inlined: it is the heart of
  // every Add, and once the queues called it from a few more places g++ stopped inlining
  // it into Add (a call more per Add, +2 ns in queue_bench's AddGetDoneHot).
  ABSL_ATTRIBUTE_ALWAYS_INLINE uint32_t Find(const T& key, uint32_t hash) const {
    auto it = index_.find(Probe{&key, hash});
    return it == index_.end() ? kNone : it->slot;
  }

  // The hash the table uses for `key`: FoldHash of Hash{}(key), as the limiters' failure
  // tables hash (TableHash; RateLimiter::Prefetch relies on this).
  static uint32_t HashOf(const T& key) { return FoldHash(Hash{}(key)); }

  // Stores `key` (which must not be present) with state bits `bits`; returns its slot.
  template <typename K>
  uint32_t Insert(K&& key, uint8_t bits) {
    const uint32_t hash = HashOf(key);
    return Insert(std::forward<K>(key), hash, bits);
  }

  // Insert with the key's hash already computed (HashOf).
  template <typename K>
  //
  // The table's own allocations all come first, before anything changes, so one that
  // fails (std::bad_alloc) leaves the table as it was: the block the index's growth will
  // take is set aside (kwq/internal/safe_growth.h), the free list keeps room for every
  // slot (so neither the unwinding below nor Erase allocates), and a new chunk is added
  // whole.
  uint32_t Insert(K&& key, uint32_t hash, uint8_t bits) {
    ReserveGrowth(index_, growth_);
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = limit_;
      KWQ_CHECK(slot < kMaxSlots, "kwq queue: more than 2^31 distinct keys stored at once");
      if (free_.capacity() <= slot) free_.reserve(std::max<size_t>(64, 2 * (size_t{slot} + 1)));
      if ((slot & (kChunk - 1)) == 0) {
        AddChunk();
      }
      ++limit_;
    }
    // A key constructor that throws gives the slot back (it was taken for good, and each
    // such add grew the table by one slot).
    try {
      new (Ptr(slot)) T(std::forward<K>(key));
    } catch (...) {
      free_.push_back(slot);
      throw;
    }
    state(slot) = static_cast<uint8_t>(bits | kLive);
    hash_of(slot) = hash;
    index_.insert(SlotRef{slot});  // room was made: no allocation
    return slot;
  }

  // Prefetches the index lines a Find of `key` (hash `hash`) reads, and an Insert writes.
  void Prefetch(const T& key, uint32_t hash) const { index_.prefetch(Probe{&key, hash}); }

  // Prefetches what Erase(slot) will read in the index (for a group of erases whose cache
  // misses should overlap).
  void Prefetch(uint32_t slot) const { index_.prefetch(SlotRef{slot}); }

  // Prefetches the lines a hand-out of `slot` and its Done touch: its state byte and its
  // key. `slot` must be below slot_limit(); a free one is harmless (only a hint).
  void PrefetchSlot(uint32_t slot) const {
    const Chunk& chunk = ChunkOf(slot);
    __builtin_prefetch(&chunk.state[StateIndex(slot)], 1);
    __builtin_prefetch(chunk.items[slot & (kChunk - 1)].bytes);
  }

  // Prefetches what an eviction of `slot` reads first: its state byte and its stored
  // hash (which locates its index entry). Same conditions as PrefetchSlot.
  void PrefetchStateAndHash(uint32_t slot) const {
    const Chunk& chunk = ChunkOf(slot);
    __builtin_prefetch(&chunk.state[StateIndex(slot)], 1);
    __builtin_prefetch(&chunk.hashes[slot & (kChunk - 1)]);
  }

  // Removes the key in `slot` and frees the slot.
  void Erase(uint32_t slot) {
    index_.erase(SlotRef{slot});
    Ptr(slot)->~T();
    state(slot) = 0;
    free_.push_back(slot);
  }

  // The key in a live slot. Besides the owner (under its lock), a thread that was handed
  // the slot number under a lock the owner took after inserting the key may call item()
  // and state() without the owner's lock: neither moves when the table grows.
  T& item(uint32_t slot) { return *Ptr(slot); }
  const T& item(uint32_t slot) const { return *Ptr(slot); }
  // The stored hash (HashOf) of a live slot's key; readable like item().
  uint32_t hash(uint32_t slot) const { return hash_of(slot); }
  // State bits of a live slot; bit 7 (kLive) is reserved.
  uint8_t& state(uint32_t slot) { return ChunkOf(slot).state[StateIndex(slot)]; }
  uint8_t state(uint32_t slot) const { return ChunkOf(slot).state[StateIndex(slot)]; }
  size_t size() const { return index_.size(); }
  // One past the highest slot number ever used (for per-slot side arrays).
  uint32_t slot_limit() const { return limit_; }
  // slot_limit() once the next Insert has taken its slot (a free one, or a new one).
  uint32_t slot_limit_after_insert() const { return free_.empty() ? limit_ + 1 : limit_; }

  static constexpr uint8_t kLive = 0x80;

 private:
  static constexpr uint32_t kChunk = 4096;  // slots per slab chunk (a power of two)
  struct alignas(T) Storage {
    std::byte bytes[sizeof(T)];
  };
  // kChunk slots: the keys, their hashes and their state bytes. Growing by whole chunks
  // never copies (a vector per field would copy and leave freed buffers behind on growth).
  // Only the state bytes are cleared when a chunk is made (zero: not live), so the pages
  // of unused slots are not touched (in the first chunk; later ones are prefaulted).
  struct Chunk {
    Storage items[kChunk];
    uint32_t hashes[kChunk];
    uint8_t state[kChunk];
  };
  struct SlotRef {
    uint32_t slot;
  };
  // A key being looked up, with its hash.
  struct Probe {
    const T* key;
    uint32_t hash;
  };
  // The stored 32 bits spread over 64 (kwq/internal/spread_hash.h), so that the index
  // serves any number of keys.
  struct SlotHash {
    using is_transparent = void;
    const KeyTable* table;
    size_t operator()(SlotRef s) const { return SpreadHash(table->hash_of(s.slot)); }
    size_t operator()(const Probe& p) const { return SpreadHash(p.hash); }
  };
  struct SlotEq {
    using is_transparent = void;
    const KeyTable* table;
    bool operator()(SlotRef a, SlotRef b) const { return a.slot == b.slot; }
    bool operator()(SlotRef a, const Probe& p) const {
      return table->hash_of(a.slot) == p.hash && Eq{}(table->item(a.slot), *p.key);
    }
    bool operator()(const Probe& p, SlotRef a) const { return (*this)(a, p); }
  };

  // The directory only grows: a full one is copied into one twice its size, and the old one
  // is kept until the table dies. So a thread that holds a slot number handed to it under
  // a lock (see item()) may read the directory while the owner adds chunks.
  // Where a slot's state byte sits in its chunk: consecutive slots go to different cache
  // lines (64 apart), so a producer marking key k and a worker finishing key k-1 do not
  // pass one line back and forth (slots of keys added one after another are consecutive).
  // A bijection of [0, kChunk): 64 lines of 64 bytes.
  static uint32_t StateIndex(uint32_t slot) {
    static_assert(kChunk == 64 * 64, "StateIndex spreads a chunk over 64 lines of 64 bytes");
    const uint32_t i = slot & (kChunk - 1);
    return ((i & 63) << 6) | (i >> 6);
  }

  Chunk& ChunkOf(uint32_t slot) const {
    return *dir_.load(std::memory_order_acquire)[slot / kChunk];
  }

  // Strongly exception-safe: every allocation comes before the first change, so a
  // std::bad_alloc leaves the table as it was (a directory enlarged before its allocation
  // failed was once written past its end).
  void AddChunk() {
    const size_t n = chunks_.size();
    auto chunk = std::make_unique_for_overwrite<Chunk>();
    // A table past its first chunk grows in bulk and fills this one soon: map its pages
    // in one call rather than a fault per page (kwq/internal/prefault.h). The first chunk
    // is left to faults, so a small queue maps only the pages it uses.
    if (n > 0) Prefault(chunk.get(), sizeof(Chunk));
    std::fill_n(chunk->state, kChunk, uint8_t{0});
    GrowIfFull(chunks_);
    if (n == dir_capacity_) {
      const size_t capacity = dir_capacity_ == 0 ? 4 : dir_capacity_ * 2;
      auto dir = std::make_unique<Chunk*[]>(capacity);
      GrowIfFull(dirs_);
      for (size_t i = 0; i < n; ++i) dir[i] = chunks_[i].get();
      dir[n] = chunk.get();
      dir_.store(dir.get(), std::memory_order_release);
      dirs_.push_back(std::move(dir));  // no allocation: room was made
      dir_capacity_ = capacity;
    } else {
      dirs_.back()[n] = chunk.get();
    }
    chunks_.push_back(std::move(chunk));  // no allocation: room was made
  }
  // Makes room for one more element (doubling), so that the next push_back cannot throw.
  template <typename V>
  static void GrowIfFull(V& v) {
    if (v.size() == v.capacity()) v.reserve(std::max<size_t>(4, 2 * v.capacity()));
  }
  T* Ptr(uint32_t slot) const {
    return std::launder(reinterpret_cast<T*>(ChunkOf(slot).items[slot & (kChunk - 1)].bytes));
  }
  uint32_t& hash_of(uint32_t slot) const { return ChunkOf(slot).hashes[slot & (kChunk - 1)]; }

  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<std::unique_ptr<Chunk*[]>> dirs_;  // every directory made; the last is current
  std::atomic<Chunk* const*> dir_{nullptr};
  size_t dir_capacity_ = 0;
  uint32_t limit_ = 0;  // slots ever used
  std::vector<uint32_t> free_;
  GrowthReserve growth_;  // before index_, whose allocator points at it
  absl::flat_hash_set<SlotRef, SlotHash, SlotEq, ReservingAllocator<SlotRef>> index_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_KEY_TABLE_H_
