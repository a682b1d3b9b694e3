#!/usr/bin/env bash
# Speculative decoding on the GPU machine (issue 18, item 5): bench_spec runs plain decoding
# and speculative decoding in one process with the engine of `grpo generate` (same flags),
# for a random-init Qwen2.5-0.5B target and four proposers: the target itself (acceptance
# upper bound), prompt lookup on GSM8K prompts, the target's first 6 layers with its own
# final norm and LM head (layer-skip self-draft) and a random-weights draft (lower bound).
#   1. greedy (T = 0) at 1, 8 and 64 sequences, 128 new tokens: with random weights only
#      greedy makes the bounds meaningful (at T = 1 a random model's near-uniform p and q
#      overlap almost fully, so any draft is "accepted");
#   2. the GRPO shape at T = 1: 64 prompts x G = 8 (512 sequences), 128 new tokens.
# Each line: plain tok/s, speculative tok/s, ratio, acceptance, drafting steps / steps of the speculative run
# (the median of REPEAT = 3 alternating runs of each). Runtime about 6-10 minutes.
# Binaries from build-static (tools/device/pack.sh grpo bench_spec grpo_tests_kernels; carry [".carry"]);
# the CUDA parity tests of spec_verify and the sampler run first when grpo_tests_kernels is there.
# Results: bench/results/spec-*.json, logs under $OUT.
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
GSM=.carry/shared/gsm8k/test.jsonl
[ -f "$GSM" ] || GSM=../shared/data/gsm8k/test.jsonl
OUT=${OUT:-/tmp/spec_bench}
mkdir -p bench/results "$OUT/logs" runs/models
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
# Tests find fixtures through the absolute paths baked in at build time.
if [ ! -e /work/shared/data ]; then mkdir -p /work/shared && ln -s "$PWD/.carry/shared" /work/shared/data; fi
if [ -x $B/grpo_tests_kernels ]; then
  echo "=== grpo_tests_kernels --gtest_filter='CudaSpecVerify.*:CudaSampling.*'"
  timeout 120 $B/grpo_tests_kernels --gtest_filter='CudaSpecVerify.*:CudaSampling.*' --gtest_brief=1 > "$OUT/logs/tests_cuda.log" 2>&1
  echo "rc=$?"; grep -E "FAILED|PASSED|SKIPPED|tests ran" "$OUT/logs/tests_cuda.log" | head -20
fi
model=runs/models/bench-qwen2.5-0.5b
[ -f $model/config.json ] || $B/grpo init-model --preset qwen2.5-0.5b --out $model --tokenizer-dir $TOK || exit 1
common="--model $model --device cuda --gsm8k $GSM --new ${NEW:-128} --layers 6 --draft-k ${K:-4} --repeat ${REPEAT:-3}"
echo "=== greedy, 1 / 8 / 64 sequences"
timeout 400 $B/bench_spec $common --sizes 1,8,64 --grpo "" --temperature 0 \
  --json bench/results/spec-qwen2.5-0.5b-greedy.json 2>&1 | tee "$OUT/logs/spec-greedy.log" | tail -14
echo "=== GRPO shape 64 x 8, T = 1"
timeout 400 $B/bench_spec $common --sizes "" --grpo ${GRPO:-64x8} --temperature 1 \
  --json bench/results/spec-qwen2.5-0.5b-grpo.json 2>&1 | tee "$OUT/logs/spec-grpo.log" | tail -6
cp bench/results/spec-*.json "$OUT/" 2>/dev/null
