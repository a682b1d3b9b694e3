#!/usr/bin/env bash
# peft reads the adapters grpo.cpp writes (issue 19): trains a LoRA adapter on the CPU
# tiny model with the carried `grpo` binary, merges it with `grpo merge-lora`, and runs
# tools/ref/check_peft_load.py (peft's PeftModel.from_pretrained + merge_and_unload
# against our merge). Usage: bash tools/device/lora_peft_check.sh
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
run=$(mktemp -d)
$B/grpo train examples/lora.toml --out "$run/lora" --set train.steps=10 --set eval.every=0 --threads 8 | tail -2 || exit 1
$B/grpo merge-lora --model models/arith-tiny --lora "$run/lora/checkpoint-10" --out "$run/merged" --dtype f32 || exit 1
python3 tools/ref/check_peft_load.py --base models/arith-tiny --adapter "$run/lora/checkpoint-10" --merged "$run/merged"
