// One of the examples `make run` runs (until the simulator exists): a small tour of the context
// tree and the timer service, printing what happens.
//
//   request (5 ms timeout)
//   ├── db lookup      (cancelled by hand)
//   └── fan-out        (inherits the deadline; 3 workers watch it)

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "kwq/context.h"
#include "kwq/stop_token.h"
#include "kwq/timer.h"

namespace {
inline constexpr kwq::ContextKey<std::string> kRequestId{"request-id"};
}

int main() {
  kwq::TimerService& timers = kwq::TimerService::Default();
  std::printf("timer service backend: %s\n", std::string(timers.backend_name()).c_str());

  // A one-off timer.
  std::atomic<bool> fired{false};
  const absl::Time start = timers.clock().Now();
  timers.ScheduleAfter(absl::Milliseconds(2), [&] { fired = true; });
  while (!fired.load()) std::this_thread::yield();
  std::printf("timer: fired after %.3f ms\n",
              absl::ToDoubleMilliseconds(timers.clock().Now() - start));

  // A request tree.
  kwq::Context base = kwq::WithValue(kwq::Background(), kRequestId, std::string("req-42"));
  auto [request, cancel_request] = kwq::WithTimeout(base, absl::Milliseconds(5));
  auto [db, cancel_db] = kwq::WithCancel(request);
  kwq::AfterFunc(db, [] { std::printf("db lookup: AfterFunc ran on cancel\n"); });
  cancel_db(absl::AbortedError("cache hit, lookup not needed"));
  std::printf("db lookup: err=%s cause=%s; request still live: %s\n", db.Err().ToString().c_str(),
              db.Cause().ToString().c_str(), request.IsCancelled() ? "no" : "yes");

  auto [fanout, cancel_fanout] = kwq::WithCancel(request);
  std::vector<std::jthread> workers;
  std::atomic<int> stopped{0};
  for (int i = 0; i < 3; ++i) {
    workers.emplace_back([&, ctx = fanout] {
      ctx.Done().Wait();
      stopped.fetch_add(1);
    });
  }
  for (auto& w : workers) w.join();
  std::printf("fan-out: %d workers saw %s after %.3f ms (request-id %s)\n", stopped.load(),
              fanout.Err().ToString().c_str(),
              absl::ToDoubleMilliseconds(timers.clock().Now() - start),
              fanout.Value(kRequestId)->c_str());

  // std::jthread interop: request_stop cancels the worker's context.
  absl::Status seen;
  {
    std::jthread worker([&seen](std::stop_token st) {
      auto [ctx, cancel] = kwq::WithStopToken(kwq::Background(), st);
      ctx.Done().Wait();
      seen = ctx.Cause();
    });
  }
  std::printf("jthread: worker context ended with cause %s\n", seen.ToString().c_str());
  return request.Err().code() == absl::StatusCode::kDeadlineExceeded ? 0 : 1;
}
