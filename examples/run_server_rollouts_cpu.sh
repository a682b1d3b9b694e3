#!/usr/bin/env bash
# Rollouts from a separate server (TRL's server mode) on the CPU with the tiny model:
# `grpo serve` on :8001 follows the run's checkpoints (--watch, one per step) and
# `grpo train` sends every generation batch there (rollout.server_url) instead of
# sampling in-process. On GPUs the NCCL bridge replaces --watch (docs/serve.md,
# "Rollouts from a separate server").
#   bash examples/run_server_rollouts_cpu.sh [grpo binary] [run dir] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
GRPO="${1:-build/grpo}"
OUT="${2:-runs/server-rollouts}"
STEPS="${3:-20}"
PORT="${PORT:-8001}"
mkdir -p "$OUT"
"$GRPO" serve --model models/arith-tiny --port "$PORT" --watch "$OUT" --watch-interval 0.2 &
SERVE=$!
trap 'kill "$SERVE" 2>/dev/null || true; wait "$SERVE" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.1
done
# --watch lags the trainer by about a step: importance sampling corrects for it.
"$GRPO" train examples/default.toml --out "$OUT" --set train.steps="$STEPS" \
  --set rollout.server_url="http://127.0.0.1:$PORT" --set checkpoint.every=1 --set checkpoint.keep_last=2 \
  --set train.importance_sampling=token_truncate --set eval.every=10
echo "metrics: $OUT/metrics.jsonl (rollout/server_policy_version: the checkpoint the server sampled from)"
