#!/usr/bin/env bash
# Issue 22, item 3: the GRPO step with train.on_policy = "bitwise" against the default mode in
# the same call, through `grpo train`'s own setup (bench_grpo --config, examples/bench-<preset>.toml:
# random-weight model, B = 8 prompts x G = 8 samples, 512 forced new tokens). Prints each mode's
# step / rollout / train seconds and logprob mismatch, the ratio bitwise / default, and writes
# bench/results/bitwise_step-<preset>.json (the default mode as the peer; DESIGN.md section 6).
# Binaries from build-static/ (tools/device/pack.sh grpo bench_grpo; .carry/bin.tar.xz); the
# Qwen2 tokenizer from .carry/shared or ../shared.
# Usage: bash tools/device/bitwise_bench.sh          (PRESETS="qwen2.5-0.5b qwen3-0.6b llama-3.2-1b" STEPS=4)
# (the Llama preset with the Qwen2 tokenizer and its vocabulary of 151,936: the Llama 3 tokenizer
# under shared/data has no tokenizer.json for init-model to ship; the architecture is Llama's)
set -uo pipefail
B=${BUILD:-build-static}
STEPS=${STEPS:-4}
[ -f .carry/bin.tar.xz ] && [ ! -x $B/bench_grpo ] && tar xJf .carry/bin.tar.xz
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
OUT=${OUT:-/tmp/bitwise_bench}
mkdir -p bench/results "$OUT" runs/models
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for preset in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b llama-3.2-1b}; do
  cfg=examples/bench-$preset.toml
  model=runs/models/bench-$preset
  echo "=== $preset"
  vocab=""
  case $preset in llama*) vocab="--vocab-size 151936" ;; esac
  [ -f $model/config.json ] || $B/grpo init-model --preset $preset --out $model --tokenizer-dir $TOK $vocab || exit 1
  for mode in default bitwise; do
    timeout -k 5 ${BENCH_TIMEOUT:-200} $B/bench_grpo --config $cfg --steps $STEPS --set train.on_policy=$mode --out-dir "$OUT" \
      > "$OUT/$preset-$mode.log" 2>&1
    echo "$mode rc=$?"; grep -E "^step|^mean|error|Error" "$OUT/$preset-$mode.log" | tail -$((STEPS + 2))
  done
  python3 - "$preset" "$cfg" "$STEPS" "$OUT" <<'PY'
import json, sys, datetime, subprocess
preset, cfg, steps, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
stem = cfg.rsplit('/', 1)[-1].rsplit('.', 1)[0]
try:
    d = json.load(open(f"{out}/loop_step-{stem}.json"))["metrics"]
    b = json.load(open(f"{out}/loop_step-{stem}-bitwise.json"))["metrics"]
except Exception as e:
    print("no result:", e); sys.exit(0)
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
ratio = b["seconds"] / d["seconds"]
print(f"{preset}: bitwise step {b['seconds']:.3f} s (rollout {b['rollout_s']:.3f}, train {b['train_s']:.3f}) vs default "
      f"{d['seconds']:.3f} s (rollout {d['rollout_s']:.3f}, train {d['train_s']:.3f}): {ratio:.3f}x; mismatch max "
      f"{b['logprob_mismatch_max']:.3g} (default {d['logprob_mismatch_max']:.3g}, mean {d['logprob_mismatch_mean']:.3g})")
j = {"bench": "bitwise_step", "date": datetime.date.today().isoformat(), "device": gpu,
     "command": f"bash tools/device/bitwise_bench.sh (bench_grpo --config {cfg} --steps {steps} --set train.on_policy=bitwise|default)",
     "preset": preset, "bitwise": b, "peer": {"name": "default mode (on_policy = default), same call", **d},
     "ratio_bitwise_over_default": ratio}
json.dump(j, open(f"bench/results/bitwise_step-{preset}.json", "w"), indent=2)
PY
done
