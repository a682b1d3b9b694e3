#!/usr/bin/env bash
# Same-call A/B of environment switches on the rollout benchmark, rounds interleaved.
# Usage: VARIANTS="X=1;GRPO_FUSED_GATE_SWIGLU=0" ROUNDS=2 PRESETS="qwen2.5-0.5b qwen3-0.6b" WORKLOADS="grpo" \
#        bash tools/device/ab_run.sh          (X=1: the defaults)
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && [ ! -x $B/bench_rollout ] && tar xJf .carry/bin.tar.xz
IFS=';' read -r -a vs <<< "${VARIANTS:-X=1}"
for r in $(seq 1 ${ROUNDS:-2}); do
  for P in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b}; do
    for W in ${WORKLOADS:-grpo}; do
      for v in "${vs[@]}"; do
        printf '%-14s %-9s %-40s ' "$P" "$W" "$v"
        env $v $B/bench_rollout --preset $P --workload $W --device cuda --dtype bf16 --out-dir /tmp/ab ${ROLLOUT_FLAGS:-} 2>&1 |
          awk -F'|' '/^\| qwen/ {printf "%s s  %s tok/s\n", $7, $8}'
      done
    done
  done
done
