#!/usr/bin/env bash
# Runs the Google Benchmark binaries and writes their raw JSON to docs/data/, from which
# docs/plot.py draws the plots in docs/img/. Usage: bench/run_benchmarks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/data
for b in timer_bench context_bench queue_bench rate_limiter_bench priority_queue_bench metrics_bench \
  workqueue_bench; do
  ./build/release/bench/$b --benchmark_min_time=0.3 \
    --benchmark_out=docs/data/$b.json --benchmark_out_format=json
done
# The floors: medians of 5 (docs/benchmarks.md, "Floors").
./build/release/bench/machine_bench --benchmark_min_time=0.3 --benchmark_repetitions=5 \
  --benchmark_out=docs/data/machine_bench.json --benchmark_out_format=json
