#!/usr/bin/env bash
# Installs the Debian packages grpo.cpp builds with (idempotent) and builds it.
# Usage: scripts/setup.sh [build-dir] [target]   (default: build, all targets)
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="cmake g++ make libopenblas-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libcpp-httplib-dev libgtest-dev zlib1g-dev python3-requests libopenmpi-dev openmpi-bin"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# The server's client tests run the npm `openai` package. A node from another
# source (NodeSource bundles npm) is kept: Debian's npm would conflict with it.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# npm packages of the client tests, pinned by their package-lock.json;
# reinstalled only when the lock file changes.
CLIENTS=tests/server/clients
LOCK_SUM="$(sha256sum "$CLIENTS/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$CLIENTS/node_modules/.grpo-lock-sha256" 2>/dev/null)" != "$LOCK_SUM" ]; then
  (cd "$CLIENTS" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$LOCK_SUM" > "$CLIENTS/node_modules/.grpo-lock-sha256"
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
