#!/usr/bin/env bash
# Issue 14, item 5: `grpo train` step time against `bench_grpo` on the same config
# (both through train/loop_setup, examples/bench-<preset>.toml) and against the
# PyTorch + transformers peer (../shared/peers/hf_grpo_step.py), all in one GPU call.
# For each preset: makes the random-weight model (grpo init-model), runs
# `grpo train` for STEPS steps, `bench_grpo --config` for STEPS steps and the peer,
# prints the step times and ratios, and writes
# bench/results/step_compare-<preset>.json (DESIGN.md section 6).
# Binaries come from build-static/ (tools/device/pack.sh grpo bench_grpo; carried in
# .carry/bin.tar.xz); the Qwen2 tokenizer and the peer from .carry/shared and
# .carry/peers (as tools/device/gpu_run.sh), or from ../shared when present.
# Usage: bash tools/device/step_compare.sh            (PRESETS="qwen2.5-0.5b qwen3-0.6b" STEPS=5)
set -uo pipefail
export PYTHONUNBUFFERED=1
B=${BUILD:-build-static}
STEPS=${STEPS:-5}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
PEER=.carry/peers/hf_grpo_step.py
[ -f "$PEER" ] || PEER=../shared/peers/hf_grpo_step.py
OUT=${OUT:-/tmp/step_compare}
mkdir -p bench/results "$OUT/logs" runs/models
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
for preset in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b}; do
  cfg=examples/bench-$preset.toml
  model=runs/models/bench-$preset
  echo "=== $preset"
  [ -f $model/config.json ] || $B/grpo init-model --preset $preset --out $model --tokenizer-dir $TOK || exit 1
  rm -rf runs/step-compare-$preset
  timeout 300 $B/grpo train $cfg --out runs/step-compare-$preset --set train.steps=$STEPS \
    > "$OUT/logs/train-$preset.log" 2>&1
  echo "grpo train rc=$?"; tail -3 "$OUT/logs/train-$preset.log"
  cp runs/step-compare-$preset/run_info.json "$OUT/logs/run_info-$preset.json" 2>/dev/null
  timeout 300 $B/bench_grpo --config $cfg --steps $STEPS > "$OUT/logs/bench_grpo-$preset.log" 2>&1
  echo "bench_grpo rc=$?"; tail -$((STEPS + 2)) "$OUT/logs/bench_grpo-$preset.log"
  timeout 300 python3 $PEER --arch $preset --steps 2 > "$OUT/logs/peer-$preset.log" 2>&1
  echo "peer rc=$?"; tail -1 "$OUT/logs/peer-$preset.log" > bench/results/peer-$preset.json
  python3 - "$preset" "$cfg" "$STEPS" <<'PY'
import datetime, json, sys
preset, cfg, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def mean_after_first(v):
    return sum(v[1:]) / len(v[1:]) if len(v) > 1 else (v[0] if v else float("nan"))
recs = [json.loads(l) for l in open(f"runs/step-compare-{preset}/metrics.jsonl") if l.strip()]
recs = [r for r in recs if "loss" in r]
train = {k: mean_after_first([r[m] for r in recs]) for k, m in
         (("seconds", "time/step"), ("rollout_s", "time/rollout"), ("train_s", "time/train"))}
train["prefix_hit_tokens"] = recs[-1].get("rollout/prefix_hit_tokens") if recs else None
train["steps"] = len(recs)
bench = json.load(open(f"bench/results/loop_step-bench-{preset}.json"))["metrics"]
peer = json.load(open(f"bench/results/peer-{preset}.json"))
info = json.load(open(f"runs/step-compare-{preset}/run_info.json"))
ratios = {"grpo_train_over_bench_grpo": train["seconds"] / bench["seconds"],
          "speedup_vs_peer_step": peer["step_s"] / train["seconds"],
          "bench_grpo_speedup_vs_peer_step": peer["step_s"] / bench["seconds"]}
print(f"{preset}: grpo train {train['seconds']:.3f} s/step (rollout {train['rollout_s']:.3f}, train {train['train_s']:.3f})"
      f" | bench_grpo {bench['seconds']:.3f} s (rollout {bench['rollout_s']:.3f}, train {bench['train_s']:.3f})"
      f" | peer {peer['step_s']:.3f} s | train/bench {ratios['grpo_train_over_bench_grpo']:.3f}"
      f" | speed-up vs peer {ratios['speedup_vs_peer_step']:.2f}x")
out = {"bench": "step_compare", "date": datetime.date.today().isoformat(), "device": peer.get("gpu", "cuda"),
       "command": f"bash tools/device/step_compare.sh (PRESETS={preset} STEPS={steps})",
       "config": {"config_file": cfg, "steps": steps, "engine": info.get("engine"),
                  "example_prompt_tokens": info.get("example_prompt", {}).get("n_tokens")},
       "metrics": {"grpo_train": train, "bench_grpo": bench},
       "peer": {"name": "pytorch+transformers (shared/peers/hf_grpo_step.py)", "metrics": peer},
       "ratios": ratios}
json.dump(out, open(f"bench/results/step_compare-{preset}.json", "w"), indent=2)
PY
done
tar czf "$OUT/results.tgz" bench/results "$OUT/logs" 2>/dev/null
