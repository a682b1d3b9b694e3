#!/usr/bin/env bash
# Per-kernel time breakdown with Nsight Compute (one metric, gpu__time_duration):
#   train  : one GRPO training step (bench_grpo, GRPO_PROFILE=train)
#   decode : three eager decode steps of the GRPO-shape rollout (bench_rollout --no-graphs)
# Usage: bash tools/device/profile_run.sh [train] [decode]   (PRESET=qwen2.5-0.5b by default)
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
P=${PRESET:-qwen2.5-0.5b}
mkdir -p "$OUT"
NCU="ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --page raw"
what=" $* "
if [[ "$what" == *" train "* ]]; then
  GRPO_PROFILE=train timeout 400 $NCU $B/bench_grpo --preset $P --device cuda --steps 1 --out-dir /tmp/pr \
    > "$OUT/train.csv" 2> "$OUT/train.err"; echo "train rc=$?"
  python3 tools/device/ncu_summary.py "$OUT/train.csv" | tee "$OUT/train.txt"
fi
if [[ "$what" == *" decode "* ]]; then
  GRPO_PROFILE=decode timeout 300 $NCU $B/bench_rollout --preset $P --workload grpo --device cuda --dtype bf16 \
    --no-graphs --out-dir /tmp/pr > "$OUT/decode.csv" 2> "$OUT/decode.err"; echo "decode rc=$?"
  python3 tools/device/ncu_summary.py "$OUT/decode.csv" | tee "$OUT/decode.txt"
fi
