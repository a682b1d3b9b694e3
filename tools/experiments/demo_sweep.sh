#!/usr/bin/env bash
# Hyperparameter sweep of the embedded default (examples/default.toml) on the GPU, where
# one 60-step run takes ~2 s in f32 with the same curve as the CPU. Prints the eval curve
# of each variant. Usage: bash tools/experiments/demo_sweep.sh [VARIANTS_FILE]  (binary: build-static/grpo)
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
variants=(
  ""
  "--set train.lr=5e-4"
  "--set train.lr=8e-4"
  "--set train.steps=80"
  "--set train.steps=80 --set train.lr=5e-4"
  "--set train.steps=80 --set train.lr=8e-4"
  "--set train.scale_rewards=none"
  "--set train.scale_rewards=none --set train.lr=5e-4"
  "--set train.steps=80 --set train.scale_rewards=none --set train.lr=5e-4"
  "--set rollout.temperature=1.2 --set train.lr=5e-4"
  "--set train.epsilon_high=0.4 --set train.lr=5e-4"
  "--set train.steps=80 --set train.lr=5e-4 --set train.lr_schedule=cosine --set train.warmup_steps=5"
  "--set train.steps=80 --set train.lr=1e-3 --set train.lr_schedule=cosine --set train.warmup_steps=5"
  "--set rollout.num_generations=32 --set rollout.prompts_per_step=16 --set train.lr=5e-4"
)
# A file argument replaces the list above: one variant (the --set flags) per line.
if [ $# -ge 1 ]; then mapfile -t variants < "$1"; fi
i=0
mkdir -p /tmp/sweep
for v in "${variants[@]}"; do
  out=/tmp/sweep/$i
  rm -rf "$out"
  t0=$(date +%s%N)
  $B/grpo train examples/default.toml --set model.device=cuda $v --set log.progress=off --out "$out" > "$out.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  acc=$(python3 -c "
import json,sys
a=[json.loads(l) for l in open('$out/metrics.jsonl') if 'eval/accuracy' in l]
print(' '.join('%.3f'%x['eval/accuracy'] for x in a))" 2>/dev/null)
  printf "%2d rc=%d %5dms [%s] %s\n" $i $rc $(( (t1 - t0) / 1000000 )) "$v" "$acc"
  i=$((i+1))
done
