#!/usr/bin/env bash
# Packs the device binaries of build-static (stripped) into .carry/bin.tar.xz for `run` with carry [".carry"].
# Usage: bash tools/device/pack.sh [binary ...]   (default: grpo, bench_rollout, bench_kernels, grpo_tests_kernels, grpo_tests_engine)
set -euo pipefail
B=${BUILD:-build-static}
rm -rf /tmp/binpack && mkdir -p /tmp/binpack/$B
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(grpo bench_rollout bench_kernels grpo_tests_kernels grpo_tests_engine)
for n in "${names[@]}"; do strip -o /tmp/binpack/$B/$n $B/$n; done
# One thread and the 64 MiB dictionary of -9: the binaries share their CUDA code, which xz then
# stores once (5 binaries: 11 MB instead of 43 MB at -T2 -3), so that more fit in the carry limit.
mkdir -p .carry && XZ_OPT="-T1 -9" tar cJf .carry/bin.tar.xz -C /tmp/binpack $B
ls -la .carry/bin.tar.xz
