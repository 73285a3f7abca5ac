// AsyncGet: runs a queue's Get on a thread of its own and hands its outcome back, for
// tests of what wakes (or fails to wake) a sleeping Get. The outcome is a string: the
// item, or whatever the caller's function makes of nullopt, or "threw" when it threw a
// std::exception. Await waits a bounded time and, when the Get has not returned by then,
// runs a release (an add, a cancel or a ShutDown that lets it end) before it joins the
// thread, so that a test whose Get is never woken fails instead of hanging.
//
// With kScribbleAndStay the thread, once the Get returned, overwrites its stack below
// (ScribbleStack) and stays alive until Await: a wake-up the Get left registered (on a
// context, say) then points at garbage, and running it crashes instead of finding the
// dead frame intact.

#ifndef KWQ_TESTS_TESTING_ASYNC_GET_H_
#define KWQ_TESTS_TESTING_ASYNC_GET_H_

#include <exception>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <utility>

#include "absl/time/time.h"
#include "testing/stack_scribble.h"

namespace kwq::testing {

class AsyncGet {
 public:
  enum Mode { kReturn, kScribbleAndStay };

  // Starts `get` on a new thread.
  explicit AsyncGet(std::function<std::string()> get, Mode mode = kReturn)
      : result_(promise_.get_future()), thread_([this, mode, get = std::move(get)] {
          std::string outcome;
          try {
            outcome = get();
          } catch (const std::exception&) {
            outcome = "threw";
          }
          if (mode == kScribbleAndStay) ScribbleStack();
          promise_.set_value(std::move(outcome));
          if (mode == kScribbleAndStay) leave_.get_future().wait();
        }) {}
  AsyncGet(const AsyncGet&) = delete;
  AsyncGet& operator=(const AsyncGet&) = delete;
  ~AsyncGet() {
    if (thread_.joinable()) {
      leave_.set_value();
      thread_.join();
    }
  }

  // Whether the Get returns within `wait` (it goes on either way). A check that it has
  // not returned can only miss a wrong wake-up, never invent one.
  bool ReturnsWithin(absl::Duration wait) {
    return result_.wait_for(absl::ToChronoNanoseconds(wait)) == std::future_status::ready;
  }

  // Whether the Get returned within `limit`. When it has not, runs `release` (which must
  // make it return), then joins the thread either way. Call once.
  bool Await(const std::function<void()>& release, absl::Duration limit = absl::Seconds(5)) {
    const bool in_time =
        result_.wait_for(absl::ToChronoNanoseconds(limit)) == std::future_status::ready;
    if (!in_time) release();
    leave_.set_value();
    thread_.join();
    outcome_ = result_.get();
    return in_time;
  }
  // What the Get gave (after Await).
  const std::string& outcome() const { return outcome_; }

 private:
  std::promise<void> leave_;  // kScribbleAndStay: the thread may end
  std::promise<std::string> promise_;
  std::future<std::string> result_;
  std::string outcome_;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace kwq::testing

#endif  // KWQ_TESTS_TESTING_ASYNC_GET_H_
