#!/usr/bin/env bash
# Issue 24 item 2 on two GPUs: the whole GRPO step with rollouts from a separate
# `grpo serve` (TRL's server mode: `rollout.server_url`, weights sent back over the
# NCCL bridge after every optimizer step), synchronous and with
# `[async] max_staleness = 1`, against the one-process colocated step, in one call.
# The GRPO benchmark config (examples/bench-qwen2.5-0.5b.toml, random-init PRESET,
# 8 prompts x 8 samples, 512 forced new tokens). Trainer on GPU 0, server on GPU 1.
# Step time = mean of the steps after the first. Writes
# bench/results/remote_rollouts-<preset>.json.
set -uo pipefail
source tools/device/lib.sh
PRESET=${PRESET:-qwen2.5-0.5b}
STEPS=${STEPS:-6}
OUT=${OUT:-/tmp/remote_rollouts}
W=runs/remote_rollouts
mkdir -p "$OUT/logs" $W
MODEL=runs/models/bench-$PRESET
bench_model $PRESET "$OUT/logs/init.log"
CFG=$W/bench.toml
bench_config $PRESET $CFG $W/default
COMMON=(--set train.steps=$STEPS --set engine.kv_cache_mib=8192 --set log.progress=plain)

echo "colocated (one process, GPU 0)"
CUDA_VISIBLE_DEVICES=0 timeout 200 $B/grpo train $CFG --out $W/colocated "${COMMON[@]}" > "$OUT/logs/colocated.log" 2>&1
echo "colocated rc=$?"

BPORT=29700
for mode in sync async; do
  BPORT=$((BPORT + 1)); HPORT=$((BPORT + 100))
  extra=()
  [ $mode = async ] && extra=(--set async.max_staleness=1)
  CUDA_VISIBLE_DEVICES=1 $B/grpo serve --model $MODEL --device cuda --port $HPORT --kv-cache-mib 8192 \
    --receive 127.0.0.1:$BPORT > "$OUT/logs/server-$mode-serve.log" 2>&1 &
  SERVE=$!
  CUDA_VISIBLE_DEVICES=0 timeout 200 $B/grpo train $CFG --out $W/server-$mode "${COMMON[@]}" --set server.bridge=nccl \
    --set server.bridge_addr=127.0.0.1:$BPORT --set rollout.server_url=http://127.0.0.1:$HPORT "${extra[@]}" \
    > "$OUT/logs/server-$mode-train.log" 2>&1
  echo "server-$mode rc=$?"; tail -3 "$OUT/logs/server-$mode-train.log" | cut -c1-300
  kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
done

python3 - "$PRESET" "$W" <<'PY'
import datetime, json, os, subprocess, sys
preset, w = sys.argv[1], sys.argv[2]
def rows(run):
    p = f"{w}/{run}/metrics.jsonl"
    return [json.loads(l) for l in open(p) if '"time/step"' in l] if os.path.exists(p) else []
def mean(rs, k):
    v = [r[k] for r in rs[1:] if k in r]
    return sum(v) / len(v) if v else None
m = {}
for run in ("colocated", "server-sync", "server-async"):
    rs = rows(run)
    if len(rs) > 1:
        m[run] = {k.split("/")[-1] + "_s": mean(rs, k) for k in ("time/step", "time/rollout", "time/train", "time/bridge",
                                                                  "time/trainer_wait") if mean(rs, k) is not None}
        m[run]["steps"] = len(rs)
        m[run]["server_policy_version_last"] = rs[-1].get("rollout/server_policy_version")
for run, v in m.items():
    print(f"{run}: " + ", ".join(f"{k} {x:.4f}" if isinstance(x, float) else f"{k} {x}" for k, x in v.items()))
ratios = {}
if "colocated" in m:
    base = m["colocated"]["step_s"]
    for run in ("server-sync", "server-async"):
        if run in m:
            ratios[f"{run}_over_colocated_step"] = m[run]["step_s"] / base
            print(f"{run} step / colocated step = {m[run]['step_s'] / base:.3f}")
dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
if m:
    json.dump({"bench": "remote_rollouts", "date": datetime.date.today().isoformat(), "device": dev.replace("\n", " + "),
               "command": "bash tools/device/remote_rollout_bench.sh", "config": {"preset": preset, "steps": len(rows("colocated"))},
               "metrics": {k: v for k, v in m.items() if k != "colocated"},
               "peer": {"name": "colocated (one process, one GPU)", "metrics": m.get("colocated", {})}, "ratios": ratios},
              open(f"bench/results/remote_rollouts-{preset}.json", "w"), indent=2)
PY
