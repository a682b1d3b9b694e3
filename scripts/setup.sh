#!/usr/bin/env bash
# Installs the Debian packages grpo.cpp builds with (idempotent) and builds it.
# Usage: scripts/setup.sh [build-dir] [target]   (default: build, all targets)
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="cmake g++ make libopenblas-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libcpp-httplib-dev libgtest-dev libopenmpi-dev openmpi-bin"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
BUILD="${1:-build}"
CUDA_FLAG=""
if [ -z "${GRPO_CUDA:-}" ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_FLAG="-DGRPO_CUDA=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"; else CUDA_FLAG="-DGRPO_CUDA=OFF"; fi
else
  CUDA_FLAG="-DGRPO_CUDA=$GRPO_CUDA"
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release $CUDA_FLAG >/dev/null
if [ -n "${2:-}" ]; then
  cmake --build "$BUILD" --target "$2" -j"$(nproc)"
else
  cmake --build "$BUILD" -j"$(nproc)"
fi
