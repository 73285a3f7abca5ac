// File: kwq/internal/lease.h
//
// Lease<Q, T>: the move-only right to process one item of a kwq queue (Queue,
// PriorityQueue), shared by them so both behave the same. Done (explicit or by the
// destructor) ends it by calling Q::Finish(slot); Q befriends this class and is the only
// one that can make a lease. Internal: users name it as Queue<T>::Lease.

#ifndef KWQ_INTERNAL_LEASE_H_
#define KWQ_INTERNAL_LEASE_H_

#include <cstdint>

#include "kwq/internal/check.h"

namespace kwq::internal {

template <typename Q, typename T>
class Lease {
 public:
  Lease(Lease&& other) noexcept
      : queue_(other.queue_), slot_(other.slot_), priority_(other.priority_), item_(other.item_) {
    other.queue_ = nullptr;
  }
  Lease& operator=(Lease&& other) noexcept {
    if (this != &other) {
      Done();
      queue_ = other.queue_;
      slot_ = other.slot_;
      priority_ = other.priority_;
      item_ = other.item_;
      other.queue_ = nullptr;
    }
    return *this;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { Done(); }

  // The item. Valid until Done. Calling it on an ended lease fails a debug assertion.
  const T& item() const {
    KWQ_DCHECK(queue_ != nullptr, "kwq queue lease used after Done or move");
    return *item_;
  }
  const T& operator*() const { return item(); }
  const T* operator->() const { return &item(); }

  // The priority the item was handed out with (PriorityQueue; 0 for FIFO queues).
  int priority() const { return priority_; }

  // Marks the item done: an add that came while it was processed queues it again.
  // Idempotent: later calls do nothing.
  void Done() {
    if (queue_ != nullptr) {
      Q* q = queue_;
      queue_ = nullptr;
      q->Finish(slot_);
    }
  }
  // False once Done has been called or the lease was moved from.
  bool active() const { return queue_ != nullptr; }

 private:
  friend Q;
  Lease(Q* queue, uint32_t slot, const T* item, int priority = 0)
      : queue_(queue), slot_(slot), priority_(priority), item_(item) {}

  Q* queue_;
  uint32_t slot_;
  int priority_;
  // Read under the queue's lock when the lease is made; the queue's slab never moves an
  // item and nothing changes or frees it while the lease is active, so it is read
  // without the lock.
  const T* item_;
};

}  // namespace kwq::internal

#endif  // KWQ_INTERNAL_LEASE_H_
