#!/usr/bin/env bash
# Runs every kwq-scenarios scenario RUNS times (default 3) and appends the raw lines to
# docs/data/scenarios.txt, each block headed by the date, machine and commit. The medians
# in docs/benchmarks.md and the plot come from that file (docs/plot.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/release/tools/kwq-scenarios
runs=${RUNS:-3}
out=docs/data/scenarios.txt
mkdir -p docs/data
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD)"
  for s in $($bin --list | cut -d' ' -f1); do
    for _ in $(seq "$runs"); do $bin --scenario="$s"; done
  done
} | tee -a "$out"
