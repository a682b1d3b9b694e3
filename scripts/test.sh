#!/usr/bin/env bash
# Sets up and builds if needed, then runs the CPU test suite (GPU tests skip
# themselves without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900
