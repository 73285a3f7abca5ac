#!/usr/bin/env bash
# Installs the Debian packages kwq needs to build, test and benchmark.
# Idempotent: does nothing when every required package is present; otherwise runs
# `apt-get update` once and installs only what is missing. Optional packages (benchmark
# peers) are installed in that same run when the mirror has them; a missing optional
# package alone never triggers apt (so a machine without network works once the required
# ones are there). Extra package names given as arguments count as required (make plots).
# Usage: bash scripts/setup.sh [extra-package...]
set -euo pipefail

required=(
  build-essential cmake ninja-build ccache pkg-config make
  clang libclang-rt-14-dev clang-format
  libabsl-dev libhwloc-dev liburing-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev
  "$@"
)
# Peers: used when present (comparison benchmarks).
optional=(libtbb-dev libboost-dev libconcurrentqueue-dev)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for p in "${required[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
# env: sudo's env_reset would drop a DEBIAN_FRONTEND set in front of it.
apt_get() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "$@"; }
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}"
# Optional packages must not fail the set-up when a mirror lacks one.
for p in "${optional[@]}"; do
  installed "$p" && continue
  apt_get install -y -qq --no-install-recommends "$p" ||
    echo "setup: optional package $p not installed; dependent benchmarks are skipped"
done
