#!/usr/bin/env bash
# Interleaved A/B (or A/B/C...) comparison of kwq-scenarios binaries, for a noisy machine:
# each round runs every binary once per scenario, so a change of machine regime hits all
# of them alike. Prints the median and every value of each scenario's first key, or of
# the key KEY names (KEY=posted_ns_per_item bench/ab_scenarios.sh ...).
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
  done | KEY="${KEY:-}" python3 -c '
import os, sys, statistics
key = os.environ["KEY"]
vals = {}
for line in sys.stdin:
    parts = line.split()
    fields = [p.split("=", 1) for p in parts[2:] if "=" in p]
    value = next((v for k, v in fields if k == key), None) if key else fields[0][1]
    if value is None:
        sys.exit(f"no key {key} in: {line.strip()}")
    vals.setdefault(parts[0], []).append(float(value))
for b, v in vals.items():
    print(f"  {b}: median {statistics.median(v):.1f}  {v}")
'
done
