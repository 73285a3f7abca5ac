// File: kwq/internal/hand_out_record.h
//
// HandOutRecord: lets a queue recognise its leased item when a worker passes it back by
// reference (q.AddRateLimited(lease->item()), q.NumRequeues(...), q.Forget(...)), without
// hashing it or looking it up. Each hand-out records (queue id, slot) in one thread-local
// record per thread; LastSlot() returns the slot when the calling thread's last hand-out
// came from this queue. The queue then compares the argument's address with that slot's
// key: equal means it is that key (a key never moves while it is stored). Queues are told
// apart by a process-unique id rather than their address, since a later queue at the
// same address would misread an earlier one's slot number. Internal: used by Queue and
// PriorityQueue.
//
// Thread safety: Record and LastSlot touch only the calling thread's record.

#ifndef KWQ_INTERNAL_HAND_OUT_RECORD_H_
#define KWQ_INTERNAL_HAND_OUT_RECORD_H_

#include <atomic>
#include <cstdint>

namespace kwq::internal {

// The calling thread's last hand-out: which queue, which slot.
struct LastHandOut {
  uint64_t queue_id = 0;
  uint32_t slot = 0;
};

class HandOutRecord {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  HandOutRecord() : id_(next_id_.fetch_add(1, std::memory_order_relaxed)) {}
  HandOutRecord(const HandOutRecord&) = delete;
  HandOutRecord& operator=(const HandOutRecord&) = delete;

  // Records that this queue just handed `slot` to the calling thread.
  void Record(uint32_t slot) const { last_ = LastHandOut{id_, slot}; }

  // The slot of this queue's last hand-out to the calling thread, if the thread's last
  // hand-out (by any queue) was this queue's; else kNone.
  uint32_t LastSlot() const { return last_.queue_id == id_ ? last_.slot : kNone; }

 private:
  static inline thread_local LastHandOut last_;
  static inline std::atomic<uint64_t> next_id_{1};
  const uint64_t id_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_HAND_OUT_RECORD_H_
