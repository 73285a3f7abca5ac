#!/usr/bin/env bash
# Interleaved A/B (or A/B/C...) comparison of kwq-scenarios binaries, for a noisy machine:
# each round runs every binary once per scenario, so a change of machine regime hits all
# of them alike. Prints the median and every value of each scenario's first key.
#   bench/ab_scenarios.sh ROUNDS "scenario1 scenario2" path/to/kwq-scenarios-A path/to/B ...
# Build each commit in its own worktree (git worktree add) to get the binaries.
set -euo pipefail
rounds=$1
scenarios=$2
shift 2
for s in $scenarios; do
  echo "$s"
  for _ in $(seq "$rounds"); do
    for b in "$@"; do
      # A failed check (kwq-scenarios exits 1) or a skipped peer stops the comparison
      # rather than entering it as a figure.
      out=$("$b" --scenario="$s")
      case "$out" in *skipped=1*) echo "$b: $out" >&2; exit 1 ;; esac
      echo "$b $out"
    done
  done | python3 -c '
import sys, statistics
vals = {}
for line in sys.stdin:
    parts = line.split()
    vals.setdefault(parts[0], []).append(float(parts[2].split("=")[1]))
for b, v in vals.items():
    print(f"  {b}: median {statistics.median(v):.1f}  {v}")
'
done
