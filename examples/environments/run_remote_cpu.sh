#!/usr/bin/env bash
# The whole bring-your-own-environment loop on the CPU with the tiny model:
# `grpo train` (trajectory API on :8000, live policy served on :8001) plus the
# Python environment process sampling, scoring and posting groups.
#   bash examples/environments/run_remote_cpu.sh [grpo binary] [run dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
GRPO="${1:-build/grpo}"
OUT="${2:-runs/remote-cpu}"
mkdir -p "$OUT"
"$GRPO" make-data arithmetic --out "$OUT/questions.jsonl" -n 2000 --prompt-suffix "" >/dev/null
"$GRPO" train examples/remote-gsm8k.toml --out "$OUT/run" &
TRAIN=$!
python3 examples/environments/gsm8k_env.py --api http://127.0.0.1:8000 --server http://127.0.0.1:8001 \
  --data "$OUT/questions.jsonl" --question-field prompt --answer-field answer \
  --prompt-template $'{question}\n' --group-size 8 --max-tokens 22 &
ENV=$!
wait "$TRAIN"
kill "$ENV" 2>/dev/null || true
wait "$ENV" 2>/dev/null || true
echo "metrics: $OUT/run/metrics.jsonl"
