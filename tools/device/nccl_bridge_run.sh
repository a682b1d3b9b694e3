#!/usr/bin/env bash
# Issue 24 on two GPUs: the NCCL weight bridge from `grpo train` (GPU 0) to a
# separate `grpo serve --receive` (GPU 1), on a random-init PRESET (default
# qwen2.5-0.5b, bf16), the GRPO benchmark config (examples/bench-qwen2.5-0.5b.toml).
# Parts (PARTS, default all):
#   sync    : full bf16 weights broadcast after every optimizer step with the server
#             idle (no requests, so the trainer's time/bridge is the transfer itself, not
#             a wait for the server to drain); target <= 20 ms. The server's log gives
#             its receive times and versions.
#   lora    : the same with [lora] (r = 16, all seven targets): only the adapters'
#             arena moves; target <= 1 ms. The server starts from an adapter of the
#             same shape made by a one-step LoRA run.
#   lost    : the server is killed (SIGKILL) mid-run: with server.bridge_on_failure =
#             "error" the trainer must stop with an error naming the server within
#             seconds; with "continue" it must log the loss once and train on, and the
#             same server command started again must rejoin and serve the trainer's
#             current version (GET /health) until the run ends.
#   trainerlost: the trainer is killed mid-run: the server must notice within seconds
#             (its log), keep serving the last version it received (GET /health), and
#             take the trainer restarted with --resume at the same bridge address.
# Writes bench/results/bridge_nccl_sync-<preset>.json.
set -uo pipefail
source tools/device/lib.sh
PRESET=${PRESET:-qwen2.5-0.5b}
PARTS=${PARTS:-"sync lora lost trainerlost"}
STEPS=${STEPS:-12}
OUT=${OUT:-/tmp/nccl_bridge}
W=runs/nccl_bridge
mkdir -p "$OUT/logs" $W
MODEL=runs/models/bench-$PRESET
bench_model $PRESET "$OUT/logs/init.log"
CFG=$W/bench.toml
bench_config $PRESET $CFG $W/default
has() { [[ " $PARTS " == *" $1 "* ]]; }
PORT=29660
# start_pair NAME SERVER_EXTRA TRAIN_EXTRA...: trainer on GPU 0, server on GPU 1.
start_pair() {
  local name=$1 sx=$2; shift 2
  PORT=$((PORT + 1))
  rm -rf "$W/$name"
  CUDA_VISIBLE_DEVICES=0 $B/grpo train $CFG --out "$W/$name" --set engine.kv_cache_mib=8192 --set server.bridge=nccl \
    --set server.bridge_addr=127.0.0.1:$PORT --set log.progress=plain "$@" > "$OUT/logs/$name-train.log" 2>&1 &
  TRAIN=$!
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=1 $B/grpo serve --model $MODEL --device cuda --port 0 --kv-cache-mib 4096 --receive 127.0.0.1:$PORT \
    $sx > "$OUT/logs/$name-serve.log" 2>&1 &
  SERVE=$!
}
metric_med() {  # metric_med RUN KEY: median of KEY over the run's metrics.jsonl, in ms
  python3 - "$1" "$2" <<'PY'
import json, sys
v = sorted(json.loads(l)[sys.argv[2]] for l in open(sys.argv[1] + "/metrics.jsonl") if sys.argv[2] in l)
print("n=%d median %.3f ms min %.3f ms max %.3f ms" % (len(v), 1e3 * v[len(v) // 2], 1e3 * v[0], 1e3 * v[-1]) if v else "none")
PY
}
RES="{}"
if has sync; then
  start_pair sync "" --set train.steps=$STEPS --set checkpoint.save_final=true
  wait $TRAIN; echo "sync: trainer rc=$?"; sleep 1
  echo "sync: trainer time/bridge (full bf16 weights) $(metric_med $W/sync time/bridge)"
  grep -m3 -i "bridge\|receiv" "$OUT/logs/sync-train.log" | cut -c1-300
  grep -i "version\|receiv" "$OUT/logs/sync-serve.log" | tail -3 | cut -c1-300
  # Exactness after the last sync: the server's greedy tokens and logprobs against the
  # trainer's final checkpoint served by `grpo generate` on GPU 0 (batch of one on both).
  SP=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$OUT/logs/sync-serve.log" | grep -o '[0-9]*$')
  CK=$(ls -d $W/sync/checkpoint-* | sort -t- -k2 -n | tail -1)
  PROMPT="Problem: Tom has 3 apples and buys 4 more. How many apples does he have?"
  curl -s --max-time 30 http://127.0.0.1:$SP/v1/completions -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$PROMPT\", \"max_tokens\": 32, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 0, \"return_token_ids\": true}" \
    > "$OUT/logs/sync-server-answer.json"
  CUDA_VISIBLE_DEVICES=0 $B/grpo generate --model $CK --device cuda --prompt "$PROMPT" --temperature 0 --max-tokens 32 \
    --ignore-eos --logprobs --kv-cache-mib 1024 > "$OUT/logs/sync-generate.txt" 2>&1
  python3 - "$OUT/logs/sync-server-answer.json" "$OUT/logs/sync-generate.txt" "$CK" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
c = j["choices"][0]
ids_s, lp_s = c.get("token_ids"), c["logprobs"]["token_logprobs"]
rows = re.findall(r"\[(\d+)\] id (-?\d+) logprob (-?[\d.]+)", open(sys.argv[2]).read())
ids_g, lp_g = [int(r[1]) for r in rows], [float(r[2]) for r in rows]
same_ids = ids_s == ids_g
max_d = max((abs(a - b) for a, b in zip(lp_s, lp_g)), default=None)
print(f"sync: server at policy version {j.get('policy_version')} vs grpo generate on {sys.argv[3]}: "
      f"token ids {'identical' if same_ids else 'DIFFER'} ({len(ids_s or [])} / {len(ids_g)}), "
      f"max |logprob difference| {max_d} (generate prints 6 decimals)")
PY
  kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
  cp $W/sync/metrics.jsonl "$OUT/sync.metrics.jsonl"
fi
if has lora; then
  # An adapter of the run's shape for the server to start from: one LoRA step, saved.
  CUDA_VISIBLE_DEVICES=0 $B/grpo train $CFG --out $W/lora-init --set train.steps=1 --set lora.enabled=true --set lora.r=16 \
    --set checkpoint.save_final=true --set engine.kv_cache_mib=8192 > "$OUT/logs/lora-init.log" 2>&1
  AD=$(dirname "$(find $W/lora-init -name adapter_config.json | head -1)")
  echo "lora: initial adapter $AD"
  start_pair lora "--lora $AD" --set train.steps=$STEPS --set lora.enabled=true --set lora.r=16
  wait $TRAIN; echo "lora: trainer rc=$?"; sleep 1
  echo "lora: trainer time/bridge (adapters) $(metric_med $W/lora time/bridge)"
  grep -i "version\|receiv" "$OUT/logs/lora-serve.log" | tail -2 | cut -c1-300
  kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
  cp $W/lora/metrics.jsonl "$OUT/lora.metrics.jsonl"
fi
if has lost; then
  for mode in error continue; do
    start_pair lost-$mode "" --set train.steps=24 --set server.bridge_on_failure=$mode --set server.bridge_timeout_s=120
    for _ in $(seq 1 600); do grep -qE '"step": ?3,' $W/lost-$mode/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
    t0=$(date +%s.%N); kill -9 $SERVE; wait $SERVE 2>/dev/null
    if [ $mode = error ]; then
      for _ in $(seq 1 600); do kill -0 $TRAIN 2>/dev/null || break; sleep 0.1; done
      echo "lost-error: trainer ended $(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{printf "%.2f", b-a}') s after the server was killed"
      kill -9 $TRAIN 2>/dev/null; wait $TRAIN; echo "lost-error: trainer rc=$?"
    else
      # The same server command again: it must rejoin and get the trainer's current version.
      sleep 2
      CUDA_VISIBLE_DEVICES=1 $B/grpo serve --model $MODEL --device cuda --port 0 --kv-cache-mib 4096 \
        --receive 127.0.0.1:$PORT > "$OUT/logs/lost-continue-serve2.log" 2>&1 &
      SERVE=$!
      for _ in $(seq 1 300); do grep -q "rejoined" "$OUT/logs/lost-continue-train.log" && break; sleep 0.1; done
      grep -m1 "rejoined" "$OUT/logs/lost-continue-train.log" | cut -c1-300
      SP=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$OUT/logs/lost-continue-serve2.log" | grep -o '[0-9]*$')
      echo "lost-continue: restarted server /health: $(curl -s --max-time 5 http://127.0.0.1:$SP/health)"
      wait $TRAIN; echo "lost-continue: trainer rc=$? after $(grep -c time/step $W/lost-$mode/metrics.jsonl) steps"
      sleep 1; echo "lost-continue: restarted server after the run: $(curl -s --max-time 5 http://127.0.0.1:$SP/health)"
      grep "receive" "$OUT/logs/lost-continue-serve2.log" | tail -2 | cut -c1-300
      kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
    fi
    grep -i "error\|bridge" "$OUT/logs/lost-$mode-train.log" | tail -3 | cut -c1-400
  done
fi
if has trainerlost; then
  # The trainer is SIGKILLed after step 3 (checkpoints every 2 steps); the server must keep
  # serving its last version and take the restarted trainer (--resume, same bridge address).
  start_pair trainerlost "" --set train.steps=10 --set checkpoint.every=2
  for _ in $(seq 1 600); do grep -qE '"step": ?4,' $W/trainerlost/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
  t0=$(date +%s.%N); kill -9 $TRAIN; wait $TRAIN 2>/dev/null
  for _ in $(seq 1 100); do grep -qi "waiting at" "$OUT/logs/trainerlost-serve.log" && break; sleep 0.1; done
  echo "trainerlost: the server's log $(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{printf "%.2f", b-a}') s after the kill:"
  tail -3 "$OUT/logs/trainerlost-serve.log" | cut -c1-400
  SP=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$OUT/logs/trainerlost-serve.log" | grep -o '[0-9]*$')
  kill -0 $SERVE 2>/dev/null && echo "trainerlost: server alive; /health: $(curl -s --max-time 5 http://127.0.0.1:$SP/health)" || echo "trainerlost: server exited"
  echo "trainerlost: a greedy answer meanwhile: $(curl -s --max-time 30 http://127.0.0.1:$SP/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "Hello", "max_tokens": 4, "temperature": 0}' | cut -c1-200)"
  CUDA_VISIBLE_DEVICES=0 timeout 200 $B/grpo train $CFG --out "$W/trainerlost" --resume --set engine.kv_cache_mib=8192 \
    --set server.bridge=nccl --set server.bridge_addr=127.0.0.1:$PORT --set log.progress=plain --set train.steps=10 \
    --set checkpoint.every=2 > "$OUT/logs/trainerlost-resume.log" 2>&1
  echo "trainerlost: resumed trainer rc=$? ($(grep -m1 -o 'resumed from [^ ,)]*' "$OUT/logs/trainerlost-resume.log"))"
  sleep 1
  grep -i "joined\|finished" "$OUT/logs/trainerlost-serve.log" | tail -3 | cut -c1-300
  echo "trainerlost: server after the resumed run: $(curl -s --max-time 5 http://127.0.0.1:$SP/health)"
  kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
fi
python3 - "$PRESET" "$W" <<'PY'
import datetime, json, os, subprocess, sys
preset, w = sys.argv[1], sys.argv[2]
def vals(run):
    p = f"{w}/{run}/metrics.jsonl"
    return sorted(json.loads(l)["time/bridge"] for l in open(p) if "time/bridge" in l) if os.path.exists(p) else []
m = {}
for run, target in (("sync", 0.020), ("lora", 0.001)):
    v = vals(run)
    if v:
        m[run] = {"n": len(v), "median_s": v[len(v) // 2], "min_s": v[0], "max_s": v[-1], "target_s": target,
                  "median_within_target": v[len(v) // 2] <= target}
dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
if m:
    json.dump({"bench": "bridge_nccl_sync", "date": datetime.date.today().isoformat(), "device": dev.replace("\n", " + "),
               "command": "bash tools/device/nccl_bridge_run.sh", "config": {"preset": preset, "server": "idle"},
               "metrics": m}, open(f"bench/results/bridge_nccl_sync-{preset}.json", "w"), indent=2)
    print(json.dumps(m, indent=2))
PY
tar czf "$OUT/bridge_logs.tgz" -C "$OUT" logs
