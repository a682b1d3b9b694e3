#!/usr/bin/env bash
# Issue 19, item 4: asynchronous rollouts against the synchronous loop in one GPU call.
# On a random-weight Qwen2.5-0.5B (examples/bench-qwen2.5-0.5b.toml: B = 8 prompts x
# G = 8 samples, 512 forced new tokens) bench_grpo --config ... --async K times STEPS
# loop steps with async.max_staleness = 0 and then with K, one setup after the other in
# the same process, and prints seconds per step, trainer wait, engine idle and the
# throughput ratio. Writes bench/results/loop_async-bench-qwen2.5-0.5b.json (the
# synchronous loop is its peer). Runtime about 2 minutes on an H100.
# Binaries come from build-static/ (tools/device/pack.sh grpo bench_grpo; carried in
# .carry/bin.tar.xz); the Qwen2 tokenizer from .carry/shared or ../shared.
# Usage: bash tools/device/async_bench.sh            (K=1 STEPS=6)
set -uo pipefail
B=${BUILD:-build-static}
K=${K:-1}
STEPS=${STEPS:-6}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
OUT=${OUT:-/tmp/async_bench}
mkdir -p bench/results "$OUT" runs/models
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cfg=examples/bench-qwen2.5-0.5b.toml
model=runs/models/bench-qwen2.5-0.5b
[ -f $model/config.json ] || $B/grpo init-model --preset qwen2.5-0.5b --out $model --tokenizer-dir $TOK || exit 1
timeout 220 $B/bench_grpo --config $cfg --steps "$STEPS" --async "$K" 2>&1 | tee "$OUT/async_bench.log"
rc=${PIPESTATUS[0]}
echo "bench_grpo rc=$rc"
cp bench/results/loop_async-bench-qwen2.5-0.5b.json "$OUT/" 2>/dev/null
exit $rc
