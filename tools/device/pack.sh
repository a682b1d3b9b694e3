#!/usr/bin/env bash
# Packs the device binaries of build-static (stripped) into .carry/bin.tar.xz for `run` with carry [".carry"].
# Usage: bash tools/device/pack.sh [binary ...]   (default: grpo, bench_rollout, bench_kernels, grpo_tests_kernels, grpo_tests_engine)
set -euo pipefail
B=${BUILD:-build-static}
rm -rf /tmp/binpack && mkdir -p /tmp/binpack/$B
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(grpo bench_rollout bench_kernels grpo_tests_kernels grpo_tests_engine)
for n in "${names[@]}"; do strip -o /tmp/binpack/$B/$n $B/$n; done
mkdir -p .carry && XZ_OPT="-T2 -3" tar cJf .carry/bin.tar.xz -C /tmp/binpack $B
ls -la .carry/bin.tar.xz
