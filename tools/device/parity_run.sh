#!/usr/bin/env bash
# Checks against transformers on the GPU machine: bf16 greedy agreement of the
# CUDA engine (random Qwen2.5-0.5B preset and the real stories260K model), and
# that transformers loads/reproduces our converted llama2.c checkpoint.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && [ ! -x $B/grpo ] && tar xJf .carry/bin.tar.xz
mkdir -p bench/results
$B/grpo convert llama2c --model .carry/shared/models/stories260K/stories260K.bin \
  --tokenizer .carry/shared/models/stories260K/tok512.bin --out /tmp/stories260K
echo "=== transformers vs converted stories260K"
timeout 120 python3 tools/ref/make_model_file_fixtures.py --check-hf /tmp/stories260K 2>&1 | tail -5
echo "=== bf16 greedy parity: stories260K"
timeout 200 python3 tools/ref/bf16_greedy_parity.py --grpo $B/grpo --model /tmp/stories260K --prompts 8 --prompt-len 8 --new 64 \
  --out bench/results/bf16_parity-stories260K.json 2>&1 | tail -2
echo "=== bf16 greedy parity: qwen2.5-0.5b (random weights)"
timeout 300 python3 tools/ref/bf16_greedy_parity.py --grpo $B/grpo --preset qwen2.5-0.5b --prompts 8 --new 64 \
  --out bench/results/bf16_parity-qwen2.5-0.5b.json 2>&1 | tail -2
