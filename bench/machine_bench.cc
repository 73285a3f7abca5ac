// Floors: what this machine charges for the work a queue scenario cannot avoid, measured
// without any kwq code, so a scenario's figure can be read against them
// (docs/benchmarks.md, "Floors").
//
// - BM_FloorDedupFifo: fifo_1t's data movement alone, on one thread with no lock and no
//   atomic: hash each of 1,000,000 distinct std::string keys, move it into a slab, index
//   its slot in an absl::flat_hash_set (keyed by the stored hash, as kwq's KeyTable is),
//   then in FIFO order erase each from the index and destroy it. Any queue that
//   deduplicates by value does at least this. Arg 1 reserves the index first (a queue
//   cannot know to do that); arg 0 grows it as kwq's does.
// - BM_FloorFirstTouch: the first write to a fresh 4 KiB page (a page fault).
//   BM_FloorPopulate: the same pages mapped first in one madvise(MADV_POPULATE_WRITE) call,
//   as kwq's key tables map their bulk growth (kwq/internal/prefault.h), then written.
// - BM_FloorLineRoundTrip: one cache line passed from one thread to another and back
//   (two transfers), the least a hand-out between cores can cost when someone waits on it.

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kwq/internal/prefault.h"

namespace {

// The index holds slot numbers; their hashes sit beside the slab, so growing and erasing
// never read a key again (KeyTable does the same).
struct SlotHash {
  const std::vector<uint32_t>* hashes;
  size_t operator()(uint32_t slot) const { return (*hashes)[slot]; }
};

void BM_FloorDedupFifo(benchmark::State& state) {
  constexpr uint32_t kKeys = 1'000'000;
  const bool reserve = state.range(0) != 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<std::string> keys;
    keys.reserve(kKeys);
    for (uint32_t i = 0; i < kKeys; ++i) keys.push_back(absl::StrCat("default/object-", i));
    std::vector<std::string> slab;
    std::vector<uint32_t> hashes;
    slab.reserve(kKeys);
    hashes.reserve(kKeys);
    absl::flat_hash_set<uint32_t, SlotHash> index(0, SlotHash{&hashes});
    if (reserve) index.reserve(kKeys);
    state.ResumeTiming();

    for (uint32_t i = 0; i < kKeys; ++i) {
      hashes.push_back(static_cast<uint32_t>(absl::Hash<std::string>{}(keys[i])));
      slab.push_back(std::move(keys[i]));
      index.insert(i);
    }
    for (uint32_t i = 0; i < kKeys; ++i) {
      benchmark::DoNotOptimize(slab[i].data());
      index.erase(i);
      std::string().swap(slab[i]);
    }

    state.PauseTiming();
    benchmark::DoNotOptimize(index.size());
    slab = {};  // freed outside the timing
    state.ResumeTiming();
  }
  // Seconds per key (printed with an SI prefix: 120n is 120 ns).
  state.counters["s_per_key"] =
      benchmark::Counter(static_cast<double>(kKeys), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}
BENCHMARK(BM_FloorDedupFifo)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Writes one byte to every page of 64 MiB of fresh memory; with `populate`, maps the
// pages first in one call as kwq's key tables do for their bulk growth
// (kwq/internal/prefault.h), timed with the writes.
void FirstTouch(benchmark::State& state, bool populate) {
  constexpr size_t kPage = 4096;
  constexpr size_t kBytes = size_t{64} << 20;
  for (auto _ : state) {
    state.PauseTiming();
    void* map = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      break;
    }
    madvise(map, kBytes, MADV_NOHUGEPAGE);
    auto* bytes = static_cast<volatile char*>(map);
    state.ResumeTiming();
    if (populate) kwq::internal::Prefault(map, kBytes);
    for (size_t i = 0; i < kBytes; i += kPage) bytes[i] = 1;
    state.PauseTiming();
    munmap(map, kBytes);
    state.ResumeTiming();
  }
  // Seconds per page (printed with an SI prefix: 120n is 120 ns).
  state.counters["s_per_page"] = benchmark::Counter(
      static_cast<double>(kBytes / kPage),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
void BM_FloorFirstTouch(benchmark::State& state) { FirstTouch(state, /*populate=*/false); }
BENCHMARK(BM_FloorFirstTouch)->Unit(benchmark::kMillisecond)->UseRealTime();
void BM_FloorPopulate(benchmark::State& state) { FirstTouch(state, /*populate=*/true); }
BENCHMARK(BM_FloorPopulate)->Unit(benchmark::kMillisecond)->UseRealTime();

// The first two CPUs in `allowed`, or none when fewer are allowed.
std::vector<int> TwoCpus(const cpu_set_t& allowed) {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  if (cpus.size() < 2) cpus.clear();
  return cpus;
}

void PinTo(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
}

void BM_FloorLineRoundTrip(benchmark::State& state) {
  constexpr int64_t kTrips = 200'000;
  alignas(64) std::atomic<int64_t> word{0};
  cpu_set_t before;
  if (pthread_getaffinity_np(pthread_self(), sizeof(before), &before) != 0) {
    state.SkipWithError("pthread_getaffinity_np failed");
    return;
  }
  const std::vector<int> cpus = TwoCpus(before);
  if (cpus.empty()) {
    state.SkipWithError("needs two CPUs");
    return;
  }
  PinTo(cpus[0]);
  for (auto _ : state) {
    state.PauseTiming();
    word.store(0);
    std::thread echo([&] {
      PinTo(cpus[1]);
      for (int64_t i = 0; i < kTrips; ++i) {
        while (word.load(std::memory_order_acquire) != 2 * i + 1) {
        }
        word.store(2 * i + 2, std::memory_order_release);
      }
    });
    state.ResumeTiming();
    for (int64_t i = 0; i < kTrips; ++i) {
      word.store(2 * i + 1, std::memory_order_release);
      while (word.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    state.PauseTiming();
    echo.join();
    state.ResumeTiming();
  }
  pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
  // Seconds per round trip (printed with an SI prefix: 120n is 120 ns).
  state.counters["s_per_round_trip"] = benchmark::Counter(
      static_cast<double>(kTrips),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_FloorLineRoundTrip)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
