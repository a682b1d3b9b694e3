#!/usr/bin/env bash
# Builds the embedded demo model models/arith-tiny from scratch with the
# project's own tools, deterministically (fixed seeds, fixed data slices):
#
#   1. byte-level tokenizer (258 ids: 256 bytes + <|endoftext|> + <|pad|>)
#   2. grpo init-model --preset tiny-llama --hidden 128 --layers 2 (f32, ~264K params, ~1 MB)
#   3. SFT data: grpo make-data arithmetic --difficulty 0 (prompt "{question}\n",
#      completion "<answer>N</answer>" + EOS)
#   4. grpo sft from scratch, in stages, stopped early on purpose (undertrained:
#      held-out greedy accuracy ~40% at difficulty 0) so that GRPO has room.
#      Stage 0: 6000 examples, lr 3e-3 cosine (warmup 20); stages 1..4: 2000
#      new examples each, lr 3e-3 constant (warmup 5). A full 20000-example
#      epoch instead reaches ~98%.
#   5. copies the result to models/arith-tiny (config.json, model.safetensors,
#      tokenizer.json, tokenizer_config.json).
#
# Usage: tools/demo/make_demo_model.sh [GRPO_BINARY] [WORK_DIR]
#   GRPO_BINARY defaults to build-demo/grpo, WORK_DIR to /tmp/arith-tiny-build.
# Takes about 3 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
GRPO="${1:-build-demo/grpo}"
WORK="${2:-/tmp/arith-tiny-build}"
DIFF=0
STAGES=4
THREADS="${THREADS:-2}"
rm -rf "$WORK"
mkdir -p "$WORK"

python3 tools/demo/make_byte_tokenizer.py "$WORK/tok"
"$GRPO" init-model --preset tiny-llama --out "$WORK/init" --seed 1 --dtype f32 --tokenizer-dir "$WORK/tok" \
  --hidden 128 --layers 2
"$GRPO" make-data arithmetic --out "$WORK/train.jsonl" --split train -n 20000 --difficulty $DIFF --seed 1

sft() {  # sft IN_MODEL DATA OUT LR_SCHEDULE WARMUP
  "$GRPO" sft --model "$1" --data "$2" --out "$3" --epochs 1 --batch-size 32 --lr 3e-3 --lr-scheduler "$4" \
    --warmup-steps "$5" --seed 1 --device cpu --dtype f32 --threads "$THREADS" --log-every 1000 --max-len 96
}

head -n 6000 "$WORK/train.jsonl" > "$WORK/stage0.jsonl"
sft "$WORK/init" "$WORK/stage0.jsonl" "$WORK/stage0" cosine 20
prev="$WORK/stage0"
for k in $(seq 1 $STAGES); do
  s=$((6000 + 2000 * (k - 1)))
  sed -n "$((s + 1)),$((s + 2000))p" "$WORK/train.jsonl" > "$WORK/stage$k.jsonl"
  sft "$prev" "$WORK/stage$k.jsonl" "$WORK/stage$k" constant 5
  prev="$WORK/stage$k"
done

mkdir -p models/arith-tiny
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  cp "$prev/$f" models/arith-tiny/$f
done
echo "models/arith-tiny written from $prev"
ls -la models/arith-tiny
