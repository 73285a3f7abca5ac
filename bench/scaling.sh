#!/usr/bin/env bash
# How pools and queues scale with the CPU count: runs each scenario under
# `taskset -c LIST` with C CPUs for every C (distinct physical cores first, then their
# SMT siblings, as `lscpu -p` numbers them), ROUNDS times interleaved (round-major, so a change of
# machine regime hits every C alike), prints every raw line prefixed with "cpus=C", then
# the median of each scenario's first key per C.
#   bench/scaling.sh ROUNDS "2 4 8 16" "wq_tiny wq_tiny_tbb mpmc_sharded" [kwq-scenarios]
# The binary may be a command with arguments (e.g. a dynamic loader and --library-path).
set -euo pipefail
rounds=$1
cpu_counts=$2
scenarios=$3
bin=${4:-build/release/tools/kwq-scenarios}
# CPUs ordered so that the first C sit on C different cores where the machine has them.
order=$(lscpu -p=CPU,CORE 2>/dev/null | grep -v '^#' | sort -t, -k2,2n -k1,1n |
  awk -F, '{print (seen[$2]++) * 100000 + NR, $1}' | sort -n | cut -d' ' -f2 | paste -sd' ')
[ -n "$order" ] || order=$(seq 0 $(($(nproc) - 1)) | paste -sd' ')
first() { echo "$order" | tr ' ' '\n' | head -n "$1" | paste -sd,; }
for _ in $(seq "$rounds"); do
  for c in $cpu_counts; do
    for s in $scenarios; do
      # shellcheck disable=SC2086 # $bin may carry arguments
      echo "cpus=$c $(taskset -c "$(first "$c")" $bin --scenario="$s")"
    done
  done
done | tee /dev/stderr | python3 -c '
import sys, statistics
vals = {}
for line in sys.stdin:
    parts = line.split()
    c, s, key = parts[0].split("=")[1], parts[1], parts[2].split("=")
    vals.setdefault((s, key[0]), {}).setdefault(int(c), []).append(float(key[1]))
for (s, key), per in vals.items():
    cells = "  ".join(f"{c}:{statistics.median(v):.1f}" for c, v in sorted(per.items()))
    print(f"{s} {key} medians by cpus  {cells}")
'
