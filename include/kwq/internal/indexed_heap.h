// File: kwq/internal/indexed_heap.h
//
// IndexedHeap: a 4-ary min-heap of small integer ids ordered by (int64 key, sequence),
// with each id's position remembered so it can be removed or re-keyed in O(log n). Ties
// on key pop in insertion (sequence) order. Not thread-safe. Internal: used by the
// delaying queue (ids are KeyTable slots, keys are ready times), the priority queue and
// the timer service.
//
// An entry is 16 bytes: the key, the id and a 32-bit sequence number. The sequence only
// orders entries with equal keys, so when the counter runs out (after 2^32 pushes and
// re-keys) the entries present are renumbered 0..n-1 in their current order, which keeps
// every comparison, and so the heap, as it was. That costs O(n log n) once per 2^32 - n
// operations, and keeps an item that waits through billions of pushes in its FIFO place
// (a wrapping 32-bit comparison would not). A 64-bit sequence made entries 24 bytes.
//
// Why hand-written: std::priority_queue cannot remove or re-key an entry, and Debian's
// Abseil and Boost offer no indexed heap with integer handles.

#ifndef KWQ_INTERNAL_INDEXED_HEAP_H_
#define KWQ_INTERNAL_INDEXED_HEAP_H_

#include <algorithm>
#include <cstdint>

#include "absl/base/attributes.h"
#include "kwq/internal/check.h"
#include "kwq/internal/pod_vector.h"

namespace kwq::internal {

struct IndexedHeapPeer;  // tests: the sequence counter

class IndexedHeap {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;

  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  bool Contains(uint32_t id) const { return id < pos_.size() && pos_[id] != kAbsent; }

  // Makes room for every id below `ids`, so that pushing them allocates nothing and cannot
  // throw. Throws std::bad_alloc (the heap unchanged).
  void Reserve(size_t ids) {
    heap_.Reserve(ids);
    if (pos_.size() < ids) pos_.resize(ids, kAbsent);
  }
  // Makes room for one more entry, of any id below `ids`, so that its Push allocates
  // nothing. Throws std::bad_alloc (the heap unchanged).
  ABSL_ATTRIBUTE_ALWAYS_INLINE void ReserveOneMore(size_t ids) {  // per delayed add
    heap_.Reserve(heap_.size() + 1);
    if (pos_.size() < ids) [[unlikely]]
      pos_.resize(ids, kAbsent);
  }
  // Adds `id` (which must be absent) with `key`. Allocates (and may throw std::bad_alloc,
  // the heap unchanged) only when no room was reserved for it.
  void Push(uint32_t id, int64_t key) {
    if (id >= pos_.size()) pos_.resize(id + 1, kAbsent);
    heap_.push_back(Entry{key, id, NextSeq()});
    pos_[id] = static_cast<uint32_t>(heap_.size() - 1);
    SiftUp(pos_[id]);
  }

  // Changes the key of a present `id`; it goes behind entries with the same key.
  void Update(uint32_t id, int64_t key) {
    const uint32_t seq = NextSeq();  // may renumber: before the entry changes
    const uint32_t p = pos_[id];
    heap_[p].key = key;
    heap_[p].seq = seq;
    SiftUp(p);
    SiftDown(pos_[id]);
  }

  // Removes a present `id`.
  void Remove(uint32_t id) {
    const uint32_t p = pos_[id];
    const uint32_t last = static_cast<uint32_t>(heap_.size() - 1);
    pos_[id] = kAbsent;
    if (p != last) {
      const uint32_t moved = heap_[last].id;
      Place(p, heap_[last]);
      heap_.pop_back();
      SiftUp(p);
      SiftDown(pos_[moved]);
    } else {
      heap_.pop_back();
    }
  }

  // Removes every entry, calling `f(id)` for each (in no particular order).
  template <typename F>
  void Clear(F f) {
    for (const Entry& e : heap_) {
      pos_[e.id] = kAbsent;
      f(e.id);
    }
    heap_.clear();
  }

  // Calls `f(id)` for every entry whose key is TopKey() (the heap must not be empty), in
  // no particular order; the first is TopId(). They form a subtree at the root (a parent's
  // key is at most its children's), so only they and their children are visited.
  template <typename F>
  void ForEachWithTopKey(F f) const {
    const int64_t key = heap_[0].key;
    uint32_t stack[64];  // a 4-ary heap of 2^32 entries is 16 levels: 3 * 16 + 1 suffice
    int depth = 0;
    stack[depth++] = 0;
    while (depth > 0) {
      const uint32_t p = stack[--depth];
      f(heap_[p].id);
      const size_t first = size_t{4} * p + 1;
      for (size_t c = first; c < first + 4 && c < heap_.size(); ++c) {
        if (heap_[c].key == key) stack[depth++] = static_cast<uint32_t>(c);
      }
    }
  }
  // Whether present `a` goes before present `b` (key, then sequence).
  bool Before(uint32_t a, uint32_t b) const { return Less(heap_[pos_[a]], heap_[pos_[b]]); }

  int64_t KeyOf(uint32_t id) const { return heap_[pos_[id]].key; }
  uint32_t TopId() const { return heap_[0].id; }
  int64_t TopKey() const { return heap_[0].key; }
  void Pop() { Remove(heap_[0].id); }

 private:
  friend struct IndexedHeapPeer;
  struct Entry {
    int64_t key;
    uint32_t id;
    uint32_t seq;
  };
  static_assert(sizeof(Entry) == 16);

  // A sequence number above every present entry's.
  uint32_t NextSeq() {
    if (seq_ == UINT32_MAX) [[unlikely]]
      Renumber();
    return seq_++;
  }
  // Gives the present entries sequence numbers 0..n-1 in (key, sequence) order. In place,
  // allocating nothing (a push must not throw here): a sorted array is a valid heap.
  void Renumber() {
    const size_t n = heap_.size();
    KWQ_CHECK(n < UINT32_MAX / 2, "IndexedHeap: too many entries");
    std::sort(heap_.begin(), heap_.end(), Less);
    for (uint32_t i = 0; i < n; ++i) {
      heap_[i].seq = i;
      pos_[heap_[i].id] = i;
    }
    seq_ = static_cast<uint32_t>(n);
  }
  static bool Less(const Entry& a, const Entry& b) {
    return a.key < b.key || (a.key == b.key && a.seq < b.seq);
  }
  void Place(uint32_t p, const Entry& e) {
    heap_[p] = e;
    pos_[e.id] = p;
  }
  void SiftUp(uint32_t p) {
    const Entry e = heap_[p];
    while (p > 0) {
      const uint32_t parent = (p - 1) / 4;
      if (!Less(e, heap_[parent])) break;
      Place(p, heap_[parent]);
      p = parent;
    }
    Place(p, e);
  }
  void SiftDown(uint32_t p) {
    const Entry e = heap_[p];
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    for (;;) {
      // In 64 bits: p * 4 + 1 wraps in 32 past 2^30 entries.
      const uint64_t first64 = uint64_t{p} * 4 + 1;
      if (first64 >= n) break;
      const uint32_t first = static_cast<uint32_t>(first64);
      uint32_t best = first;
      const uint32_t end = static_cast<uint32_t>(std::min<uint64_t>(first64 + 4, n));
      for (uint32_t c = first + 1; c < end; ++c) {
        if (Less(heap_[c], heap_[best])) best = c;
      }
      if (!Less(heap_[best], e)) break;
      Place(p, heap_[best]);
      p = best;
    }
    Place(p, e);
  }

  PodVector<Entry> heap_;
  PodVector<uint32_t> pos_;  // id -> index in heap_, or kAbsent
  uint32_t seq_ = 0;         // the next sequence number
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_INDEXED_HEAP_H_
