// Gate: a flag a work item spins on until the test opens it (with a yield, and without a
// BlockingScope, so to a workqueue the waiting work looks like CPU work). Open may be
// called from any thread; everything written before Open is visible after Wait returns.

#ifndef KWQ_TESTS_TESTING_GATE_H_
#define KWQ_TESTS_TESTING_GATE_H_

#include <atomic>
#include <thread>

namespace kwq::testing {

class Gate {
 public:
  void Open() { open_.store(true, std::memory_order_release); }
  void Wait() const {
    while (!open_.load(std::memory_order_acquire)) std::this_thread::yield();
  }

 private:
  std::atomic<bool> open_{false};
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_GATE_H_
