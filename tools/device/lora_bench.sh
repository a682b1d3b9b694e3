#!/usr/bin/env bash
# LoRA GRPO step against full fine-tuning (issue 19, item 6) on the GPU machine:
# bench_lora in each mode (separate processes, so each one's device memory is its
# own), then the comparison JSON with the ratios, bench/results/lora_vs_full-<preset>.json.
# Usage: PRESETS="qwen2.5-0.5b qwen2.5-1.5b" R=16 bash tools/device/lora_bench.sh
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p bench/results
for preset in ${PRESETS:-qwen2.5-0.5b}; do
  for mode in full lora; do
    echo "=== bench_lora $preset $mode"
    timeout 280 $B/bench_lora --preset "$preset" --device cuda --mode $mode --r "${R:-16}" ${LORA_FLAGS:-} 2>&1 | tail -6
  done
  python3 - "$preset" <<'PY'
import json, sys
p = sys.argv[1]
full = json.load(open(f"bench/results/lora_step-{p}-full.json"))
lora = json.load(open(f"bench/results/lora_step-{p}-lora.json"))
fm, lm = full["metrics"], lora["metrics"]
ratios = {k: lm[k] / fm[k] for k in ("rollout_s", "train_s", "step_s", "device_bytes_in_use",
                                     "param_optimizer_bytes_computed") if fm.get(k)}
out = {"bench": "lora_vs_full", "date": lora["date"], "device": lora["device"],
       "command": "tools/device/lora_bench.sh", "config": lora["config"], "metrics": lm,
       "peer": {"name": "full fine-tuning (same binary, --mode full)", "metrics": fm}, "ratios": ratios}
json.dump(out, open(f"bench/results/lora_vs_full-{p}.json", "w"), indent=2)
print(json.dumps(ratios, indent=2))
PY
done
[ -n "${OUT:-}" ] && tar czf "$OUT/results.tgz" bench/results 2>/dev/null
true
