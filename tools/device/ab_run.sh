#!/usr/bin/env bash
# Same-call A/B of environment switches on the rollout benchmark, rounds interleaved.
# Usage: VARIANTS="X=1;GRPO_FUSED_GATE_SWIGLU=0" ROUNDS=2 PRESETS="qwen2.5-0.5b qwen3-0.6b" WORKLOADS="grpo" \
#        bash tools/device/ab_run.sh          (X=1: the defaults)
# A variant's words that start with "-" are bench_rollout flags ("X=1 --kv-cache-dtype fp8"),
# the others environment assignments.
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && [ ! -x $B/bench_rollout ] && tar xJf .carry/bin.tar.xz
IFS=';' read -r -a vs <<< "${VARIANTS:-X=1}"
for r in $(seq 1 ${ROUNDS:-2}); do
  for P in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b}; do
    for W in ${WORKLOADS:-grpo}; do
      for v in "${vs[@]}"; do
        printf '%-14s %-9s %-40s ' "$P" "$W" "$v"
        envs=(); flags=()
        for w in $v; do if [[ "$w" == -* || ${#flags[@]} -gt 0 && "$w" != *=* ]]; then flags+=("$w"); else envs+=("$w"); fi; done
        env "${envs[@]}" $B/bench_rollout --preset $P --workload $W --device cuda --dtype bf16 --out-dir /tmp/ab ${ROLLOUT_FLAGS:-} "${flags[@]}" 2>&1 |
          awk -F'|' '/^\| qwen/ {printf "%s s  %s tok/s\n", $7, $8}'
      done
    done
  done
done
