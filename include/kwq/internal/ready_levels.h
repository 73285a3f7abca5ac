// File: kwq/internal/ready_levels.h
//
// ReadyLevels: the ready items of a PriorityQueue, as slot numbers, in the order they are
// served. Highest priority first; within a priority, items fall into groups (by a group
// key, controller-runtime's fairness extension) served round-robin; within a group, by
// ready sequence (FIFO). Link, Unlink and PopNext are amortised O(log levels + log
// group size), and O(1) for the usual in-order arrivals. Not thread-safe: the queue's
// lock guards it. Internal: used by kwq/priority_queue.h.
//
// Each group keeps a FIFO for items that arrive in sequence order (almost all: O(1) in
// and out, sequential memory) and a heap for those that do not (an item whose priority
// was raised keeps its older sequence). An item taken out of the FIFO's middle (a raise,
// an aged item) leaves a dead entry, skipped when it reaches the front and compacted
// away when dead entries outnumber live ones. Heap ids are group-local, so each heap's
// position index is as large as its own peak, not the whole table. Empty groups and
// levels are kept for reuse until more than half are empty (then swept, amortised O(1)).
//
// Out of memory: every Link is set aside first by a Pin, which may allocate (and throw
// std::bad_alloc with nothing observable changed): it creates the group if need be and
// makes room for the Link in the group's FIFO (and heap, for a Link out of sequence), in
// the level heap and in the lists Unlink and Sweep write to, and keeps the group from
// being swept until the Link uses the pin (or Unpin gives it back). Link, Unlink and
// PopNext then allocate nothing, so the queue can link an item where nothing may throw (a
// lease's Done, the timer's firing) and hand items out without allocating. The maps from
// priority and group key grow through a reserve (kwq/internal/safe_growth.h).

#ifndef KWQ_INTERNAL_READY_LEVELS_H_
#define KWQ_INTERNAL_READY_LEVELS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "kwq/internal/check.h"
#include "kwq/internal/indexed_heap.h"
#include "kwq/internal/pod_vector.h"
#include "kwq/internal/safe_growth.h"
#include "kwq/internal/ticket_ring.h"

namespace kwq::internal {

class ReadyLevels {
 public:
  static constexpr uint32_t kNoGroup = UINT32_MAX;

  ReadyLevels() = default;
  ReadyLevels(const ReadyLevels&) = delete;  // the maps' allocators point at the reserves
  ReadyLevels& operator=(const ReadyLevels&) = delete;

  // Makes room for the positions of every slot below `slots`. Throws std::bad_alloc with
  // nothing changed.
  void ReserveSlots(size_t slots) {
    if (pos_.size() < slots) pos_.resize(slots, Position{});
  }

  // Sets aside one Link into the group of (priority, group_key), creating the group if
  // need be; returns the group. `late`: the Link may carry an older ready sequence than
  // the group's newest (a raised item keeps its place), which goes to the group's heap.
  // Throws std::bad_alloc with nothing observable changed.
  uint32_t Pin(int priority, uint64_t group_key, bool late = false) {
    uint32_t g;
    if (auto it = group_ids_.find(std::pair<int, uint64_t>(priority, group_key));
        it != group_ids_.end()) {
      g = it->second;
    } else {
      g = NewGroup(priority, group_key);
    }
    Group& group = groups_[g];
    group.fifo.Reserve(group.fifo.size() + group.pins + 1);
    if (late) {
      // Room for every pin outstanding (any of them may be late): two late pins that each
      // reserved one more id than the group had reserved for one between them.
      const size_t ids = group.slot_of.size() + group.pins + 1;
      group.late.Reserve(ids);
      GrowFor(group.slot_of, ids);
      GrowFor(group.free_ids, ids);  // Unlink gives ids back
    }
    if (group.pins++ == 0 && group.count == 0) --empty_groups_;  // in use now
    return g;
  }

  // Gives back a pin of group `g` unused.
  void Unpin(uint32_t g) {
    Group& group = groups_[g];
    KWQ_DCHECK(group.pins > 0, "ReadyLevels: Unpin without a pin");
    if (--group.pins == 0 && group.count == 0) BecameEmpty(g);
  }

  // Puts `slot` (not ready, below ReserveSlots' bound) into group `g`, ordered by `seq`,
  // using one of the group's pins. Allocates nothing.
  void Link(uint32_t slot, uint32_t g, int64_t seq) {
    Group& group = groups_[g];
    KWQ_DCHECK(group.pins > 0 && slot < pos_.size(), "ReadyLevels: Link without a Pin");
    --group.pins;
    Position& pos = pos_[slot];
    pos.group = g;
    pos.seq = seq;
    if (group.fifo.empty() || seq > group.fifo_last) {
      pos.local = FifoLocal(group.fifo.push_back(slot));
      group.fifo_last = seq;
    } else {
      uint32_t local;
      if (!group.free_ids.empty()) {
        local = group.free_ids.back();
        group.free_ids.pop_back();
        group.slot_of[local] = slot;
      } else {
        local = static_cast<uint32_t>(group.slot_of.size());
        group.slot_of.push_back(slot);
      }
      KWQ_DCHECK(local < kFifoBit, "ReadyLevels: heap id out of range");
      group.late.Push(local, seq);
      pos.local = local;
    }
    Level& level = levels_[group.level];
    if (group.count++ == 0) {  // pinned until now: not counted empty
      RingAppend(level, g);
      if (level.count == 0) level_heap_.Push(group.level, -static_cast<int64_t>(level.priority));
    }
    ++level.count;
    ++size_;
  }

  // Takes a ready `slot` out; returns its ready sequence.
  int64_t Unlink(uint32_t slot) {
    Position& pos = pos_[slot];
    const uint32_t g = pos.group;
    Group& group = groups_[g];
    if (!InFifo(pos.local)) {
      group.late.Remove(pos.local);
      group.free_ids.push_back(pos.local);
    } else if (group.fifo.front() == slot) {  // the front is live: this slot's own entry
      group.fifo.pop_front();
    } else {
      ++group.dead;  // left in place, dead once pos.group changes
    }
    pos.group = kNone;
    Level& level = levels_[group.level];
    --level.count;
    --size_;
    if (--group.count == 0) {
      group.fifo.clear();
      group.dead = 0;
      if (group.pins == 0) {
        group.fifo.ReleaseIfEmpty();
        BecameEmpty(g);
      }
      RingRemove(level, g);
      if (level.count == 0) level_heap_.Remove(group.level);
    } else if (group.dead > 0) {
      while (!group.fifo.empty() && !Live(g, group.fifo.front(), group.fifo.front_ticket())) {
        group.fifo.pop_front();  // keep the front live
        --group.dead;
      }
      if (group.dead > kMinDead && group.dead > group.count) {  // amortised O(1)
        group.fifo.Filter(  // in place; the live entries that move get new tickets
            [&](uint32_t s, uint32_t ticket) { return Live(g, s, ticket); },
            [&](uint32_t s, uint32_t ticket) { pos_[s].local = FifoLocal(ticket); });
        group.dead = 0;
        if (!group.fifo.empty()) group.fifo_last = pos_[group.fifo.back()].seq;
      }
    }
    return pos.seq;
  }

  // The slot served next: the earliest of the group whose turn it is at the highest
  // priority. Must not be empty.
  uint32_t Next() const { return First(levels_[level_heap_.TopId()].head); }

  // Takes out the slot Next() names and moves its group's turn on (to the back of its
  // priority's ring). Must not be empty.
  uint32_t PopNext() {
    const uint32_t served = levels_[level_heap_.TopId()].head;
    const uint32_t slot = First(served);
    Unlink(slot);
    Group& group = groups_[served];
    if (group.count != 0) {
      Level& level = levels_[group.level];
      if (level.tail != served) {  // its turn is over: to the back of the ring
        RingRemove(level, served);
        RingAppend(level, served);
      }
    }
    return slot;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // A slot served soon: `k` entries behind the front of the FIFO of the group served
  // next, or kNoSlot when it holds fewer. Only a hint, for prefetching (it may be an
  // entry left dead in place, whose slot is then no longer ready here).
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  uint32_t Upcoming(size_t k) const {
    if (size_ == 0) return kNoSlot;
    const Group& group = groups_[levels_[level_heap_.TopId()].head];
    return k < group.fifo.size() ? group.fifo.at(k) : kNoSlot;
  }
  // Prefetches what serving `slot` reads here (its position). `slot` below ReserveSlots'
  // bound.
  void PrefetchPosition(uint32_t slot) const { __builtin_prefetch(&pos_[slot], 1); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // Position::local of a FIFO item: this bit and the low 31 bits of its entry's ticket
  // (kwq/internal/ticket_ring.h). A dead entry of the same slot in the same FIFO has
  // another ticket, and would need 2^31 entries between them to share its low bits.
  static constexpr uint32_t kFifoBit = 0x8000'0000;
  static constexpr uint32_t kTicketMask = kFifoBit - 1;
  static uint32_t FifoLocal(uint32_t ticket) { return kFifoBit | (ticket & kTicketMask); }
  static bool InFifo(uint32_t local) { return (local & kFifoBit) != 0; }
  // Empty groups are kept for reuse until there are this many and more than non-empty
  // ones; then all are forgotten (Sweep).
  static constexpr size_t kMinEmptyGroups = 64;
  // A group's FIFO is compacted when it holds more dead entries than this and than live
  // items.
  static constexpr size_t kMinDead = 64;

  // Where a ready slot is.
  struct Position {
    uint32_t group = kNone;  // kNone when not ready
    uint32_t local = kNone;  // FifoLocal(its FIFO entry's ticket), or its id in the heap
    int64_t seq = -1;        // its ready sequence
  };

  // The ready items of one (priority, group key), by ready sequence.
  struct Group {
    TicketRing fifo;                // slots by increasing seq; the front is always live
    int64_t fifo_last = 0;          // the seq of the FIFO's newest entry (live or dead)
    IndexedHeap late;               // local ids by ready sequence
    std::vector<uint32_t> slot_of;  // local id -> slot
    std::vector<uint32_t> free_ids;
    size_t count = 0;  // live items (fifo and late)
    size_t dead = 0;   // dead entries in fifo
    size_t pins = 0;   // Links set aside (Pin): the group stays, with room for them
    int priority = 0;
    uint64_t key = 0;
    uint32_t level = kNone;
    uint32_t prev = kNone, next = kNone;  // the level's ring of non-empty groups
    bool live = false;                    // in group_ids_
    bool listed = false;  // in emptied_ (every live group with no items and no pins is)
  };

  // One priority: its ring of non-empty groups (front is served next).
  struct Level {
    int priority = 0;
    uint32_t head = kNone, tail = kNone;
    size_t count = 0;   // ready items
    size_t groups = 0;  // live groups
    bool live = false;  // in level_ids_
  };

  // Creates the group of (priority, key), empty (and so listed in emptied_). Every allocation
  // comes first, so one that throws changes nothing observable (a sweep may have run).
  uint32_t NewGroup(int priority, uint64_t key) {
    if (empty_groups_ >= kMinEmptyGroups && empty_groups_ * 2 > group_ids_.size()) Sweep();
    auto lit = level_ids_.find(priority);
    if (lit == level_ids_.end()) {
      ReserveGrowth(level_ids_, level_growth_);
      if (free_levels_.empty()) GrowFor(levels_, levels_.size() + 1);
      const size_t levels = levels_.capacity();
      GrowFor(free_levels_, levels);  // Sweep gives levels back
      level_heap_.Reserve(levels);
    }
    ReserveGrowth(group_ids_, group_growth_);
    if (free_groups_.empty()) GrowFor(groups_, groups_.size() + 1);
    const size_t groups = groups_.capacity();
    GrowFor(free_groups_, groups);  // Sweep gives groups back
    GrowFor(emptied_, groups);      // each group is listed at most once
    // Nothing below allocates.
    uint32_t level;
    if (lit != level_ids_.end()) {
      level = lit->second;
    } else {
      level = Take(free_levels_, levels_);
      levels_[level] = Level{.priority = priority, .live = true};
      level_ids_.emplace(priority, level);
    }
    const uint32_t g = Take(free_groups_, groups_);
    Group& group = groups_[g];
    group.fifo.clear();
    group.slot_of.clear();
    group.free_ids.clear();
    group.count = 0;
    group.dead = 0;
    group.pins = 0;
    group.priority = priority;
    group.key = key;
    group.level = level;
    group.prev = group.next = kNone;
    group.live = true;
    group.listed = false;
    ++levels_[level].groups;
    group_ids_.emplace(std::pair<int, uint64_t>(priority, key), g);
    BecameEmpty(g);  // until its first pin
    return g;
  }

  // A live group that now holds neither items nor pins: counted, and listed for Sweep.
  // Allocates nothing (emptied_ has room for every group).
  void BecameEmpty(uint32_t g) {
    Group& group = groups_[g];
    ++empty_groups_;
    if (!group.listed) {
      group.listed = true;
      emptied_.push_back(g);
    }
  }

  // Makes room for at least `n` elements, growing geometrically (std::vector::reserve
  // takes exactly what it is asked for: reserving one more each time copied everything
  // each time).
  template <typename V>
  static void GrowFor(V& v, size_t n) {
    if (v.capacity() < n) v.reserve(std::max({n, 2 * v.capacity(), size_t{8}}));
  }

  // An index taken from `free` if it has one, else a new element at the end of `items`
  // (whose room the caller reserved).
  template <typename Item>
  static uint32_t Take(std::vector<uint32_t>& free, std::vector<Item>& items) {
    if (!free.empty()) {
      const uint32_t index = free.back();
      free.pop_back();
      return index;
    }
    items.emplace_back();
    return static_cast<uint32_t>(items.size() - 1);
  }

  // Forgets every empty group (no items, no pins), and every level left without groups.
  // Amortised O(1): it runs when more than half the groups are empty, and visits only
  // the groups listed in emptied_ (each at most once; one in use again is unlisted, and
  // listed again when it empties). Allocates nothing.
  void Sweep() {
    for (const uint32_t g : emptied_) {
      Group& group = groups_[g];
      group.listed = false;
      if (!group.live || group.count != 0 || group.pins != 0) continue;
      group_ids_.erase(std::pair<int, uint64_t>(group.priority, group.key));
      group.live = false;
      free_groups_.push_back(g);
      Level& level = levels_[group.level];
      if (--level.groups == 0) {
        level_ids_.erase(level.priority);
        level.live = false;
        free_levels_.push_back(group.level);
      }
    }
    emptied_.clear();
    empty_groups_ = 0;  // every empty group was listed
  }

  void RingAppend(Level& level, uint32_t g) {
    Group& group = groups_[g];
    group.prev = level.tail;
    group.next = kNone;
    if (level.tail != kNone) {
      groups_[level.tail].next = g;
    } else {
      level.head = g;
    }
    level.tail = g;
  }

  void RingRemove(Level& level, uint32_t g) {
    Group& group = groups_[g];
    if (group.prev != kNone) {
      groups_[group.prev].next = group.next;
    } else {
      level.head = group.next;
    }
    if (group.next != kNone) {
      groups_[group.next].prev = group.prev;
    } else {
      level.tail = group.prev;
    }
    group.prev = group.next = kNone;
  }

  // Whether a FIFO entry of group `g` is a live item (not one taken out of the middle).
  bool Live(uint32_t g, uint32_t slot, uint32_t ticket) const {
    const Position& pos = pos_[slot];
    return pos.group == g && pos.local == FifoLocal(ticket);
  }

  // The slot of group `g`'s earliest-ready item. The group must not be empty.
  uint32_t First(uint32_t g) const {
    const Group& group = groups_[g];
    if (group.late.empty() ||
        (!group.fifo.empty() && pos_[group.fifo.front()].seq < group.late.TopKey())) {
      return group.fifo.front();
    }
    return group.slot_of[group.late.TopId()];
  }

  using LevelIds = absl::flat_hash_map<int, uint32_t, absl::Hash<int>, std::equal_to<int>,
                                       ReservingAllocator<std::pair<const int, uint32_t>>>;
  using GroupKey = std::pair<int, uint64_t>;
  using GroupIds =
      absl::flat_hash_map<GroupKey, uint32_t, absl::Hash<GroupKey>, std::equal_to<GroupKey>,
                          ReservingAllocator<std::pair<const GroupKey, uint32_t>>>;

  PodVector<Position> pos_;  // by slot; grows with realloc, as PriorityQueue's info_ does
  std::vector<Level> levels_;
  std::vector<Group> groups_;
  GrowthReserve level_growth_;  // before the maps, whose allocators point at them
  GrowthReserve group_growth_;
  LevelIds level_ids_{0, LevelIds::hasher(), LevelIds::key_equal(),
                      LevelIds::allocator_type(&level_growth_)};
  GroupIds group_ids_{0, GroupIds::hasher(), GroupIds::key_equal(),
                      GroupIds::allocator_type(&group_growth_)};
  std::vector<uint32_t> free_levels_;
  std::vector<uint32_t> free_groups_;
  size_t empty_groups_ = 0;        // live groups with no items and no pins (all listed)
  std::vector<uint32_t> emptied_;  // groups that emptied or were made since a sweep
  IndexedHeap level_heap_;         // non-empty levels by -priority
  size_t size_ = 0;                // ready slots
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_READY_LEVELS_H_
