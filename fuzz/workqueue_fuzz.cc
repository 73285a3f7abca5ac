// Fuzzer for a Workqueue (real worker threads): random Queue / QueueOn / Cancel /
// Disable / Enable / Flush on a few works, checked at every Flush() against an exact
// count: every successful Queue runs the function once, except the instances that a
// successful Cancel (or Disable) removed. Works never run concurrently with themselves.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "kwq/workqueue.h"

namespace {

struct Counted {
  std::atomic<int> runs{0};
  std::atomic<int> busy{0};
  std::unique_ptr<kwq::Work> work;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kwq::WorkqueueRuntime* const runtime =
      kwq::WorkqueueRuntime::Create({.idle_timeout = absl::Seconds(1)})->release();
  auto wq = *kwq::Workqueue::Create({.name = "fuzz",
                                     .flags = size > 0 && (data[0] & 1) ? 0u : kwq::kUnbound,
                                     .runtime = runtime});
  constexpr int kWorks = 4;
  std::vector<Counted> works(kWorks);
  for (auto& c : works) {
    Counted* self = &c;
    c.work = std::make_unique<kwq::Work>([self] {
      FUZZ_CHECK(self->busy.fetch_add(1) == 0);  // non-reentrant
      self->runs.fetch_add(1);
      self->busy.fetch_sub(1);
    });
  }
  std::vector<int> expected(kWorks, 0);
  std::vector<int> disabled(kWorks, 0);
  const int ncpu = runtime->topology().num_cpus();
  for (size_t i = 1; i + 1 < size; i += 2) {
    const int k = data[i + 1] % kWorks;
    kwq::Work* w = works[k].work.get();
    switch (data[i] % 7) {
      case 0:
      case 1:
        expected[k] += wq->Queue(w);
        break;
      case 2:
        expected[k] += wq->QueueOn(runtime->topology().cpus()[data[i + 1] % ncpu].cpu, w);
        break;
      case 3:
        expected[k] -= wq->Cancel(w);
        break;
      case 4:
        if (disabled[k] < 3) {
          expected[k] -= wq->Disable(w);
          ++disabled[k];
        }
        break;
      case 5:
        if (disabled[k] > 0) {
          wq->Enable(w);
          --disabled[k];
        }
        break;
      case 6:
        wq->Flush();
        for (int j = 0; j < kWorks; ++j) FUZZ_CHECK(works[j].runs.load() == expected[j]);
        break;
    }
  }
  wq->Flush();
  for (int j = 0; j < kWorks; ++j) {
    FUZZ_CHECK(works[j].runs.load() == expected[j]);
    FUZZ_CHECK(!works[j].work->pending());
  }
  return 0;
}
