#!/usr/bin/env bash
# The main job: sets up and builds grpo.cpp, then runs the embedded default.
# Until `grpo train` lands this converts the real pretrained stories260K Llama
# (shipped in ../shared/data/models) and generates from it on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
if [ -f examples/default.toml ] && ./build/grpo train --help >/dev/null 2>&1; then
  exec ./build/grpo train examples/default.toml --out runs/default "$@"
fi
SHARED="${GRPO_SHARED:-../shared}"
mkdir -p runs
./build/grpo convert llama2c --model "$SHARED/data/models/stories260K/stories260K.bin" \
  --tokenizer "$SHARED/data/models/stories260K/tok512.bin" --out runs/stories260K
exec ./build/grpo generate --model runs/stories260K --prompt "Once upon a time" --max-tokens 200 --temperature 0 "$@"
