#!/usr/bin/env bash
# A rollout server lost mid-run, on the CPU with the tiny model: `grpo train` takes its
# rollouts from `grpo serve` on :8002 (rollout.server_url) with
# rollout.server_on_failure = "local". The server is killed after step 3: the trainer
# samples on its own engine (rollout/server_down = 1) and trains on; the server is started
# again after step 6 and the rollouts go back to it. Prints server_down per step.
#   bash examples/run_server_failover_cpu.sh [grpo binary] [run dir] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
GRPO="${1:-build/grpo}"
OUT="${2:-runs/server-failover}"
STEPS="${3:-10}"
PORT="${PORT:-8002}"
mkdir -p "$OUT"
SERVE=""
start_server() {
  "$GRPO" serve --model models/arith-tiny --port "$PORT" --watch "$OUT" --watch-interval 0.2 > "$OUT/serve.log" 2>&1 &
  SERVE=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "grpo serve did not answer on :$PORT; see $OUT/serve.log" >&2
  return 1
}
wait_step() {  # wait_step N: until metrics.jsonl has step N
  for _ in $(seq 3000); do
    grep -qE "\"step\": ?$1," "$OUT/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
start_server
trap 'kill "$SERVE" "$TRAIN" 2>/dev/null || true' EXIT
"$GRPO" train examples/default.toml --out "$OUT" --set train.steps="$STEPS" \
  --set rollout.server_url="http://127.0.0.1:$PORT" --set rollout.server_on_failure=local \
  --set checkpoint.every=1 --set checkpoint.keep_last=2 --set train.importance_sampling=token_truncate \
  --set eval.every=0 --set log.progress=off &
TRAIN=$!
wait_step 3 && kill -9 "$SERVE" && wait "$SERVE" 2>/dev/null || true
echo "killed the server after step 3"
wait_step 6 && start_server && echo "started the server again after step 6"
wait "$TRAIN"
python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "rollout/server_down" in j:
        print(f"step {j['step']:3d}: rollout/server_down {j['rollout/server_down']:.0f}")
PY
