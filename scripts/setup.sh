#!/usr/bin/env bash
# Installs the Debian packages kwq needs to build, test and benchmark.
# Idempotent: does nothing when every package is present; otherwise runs
# `apt-get update` once and installs only what is missing.
set -euo pipefail

required=(
  build-essential cmake ninja-build ccache pkg-config make
  clang libclang-rt-14-dev clang-format
  libabsl-dev libhwloc-dev liburing-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
# Peers and adapters: used when present (comparison benchmarks, Prometheus adapter).
optional=(prometheus-cpp-dev libtbb-dev libboost-dev libconcurrentqueue-dev)

missing=()
for p in "${required[@]}" "${optional[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${required[@]}"
# Optional packages must not fail the set-up when a mirror lacks one.
for p in "${optional[@]}"; do
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$p" ||
    echo "setup: optional package $p not installed; dependent benchmarks are skipped"
done
