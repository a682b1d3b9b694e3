#!/usr/bin/env bash
# The main job: sets up and builds grpo.cpp, then runs the embedded default.
# The embedded default is GRPO on the synthetic arithmetic environment with the
# tiny model shipped in models/arith-tiny (examples/default.toml). Without that
# model it converts the real pretrained stories260K Llama (../shared/data/models)
# and generates from it on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# The demo runs on the CPU: build without CUDA (faster) in its own folder.
GRPO_CUDA=OFF bash scripts/setup.sh build-demo grpo
if [ -f examples/default.toml ] && [ -f models/arith-tiny/model.safetensors ]; then
  rm -rf runs/default
  exec ./build-demo/grpo train examples/default.toml --out runs/default "$@"
fi
SHARED="${GRPO_SHARED:-../shared}"
mkdir -p runs
./build-demo/grpo convert llama2c --model "$SHARED/data/models/stories260K/stories260K.bin" \
  --tokenizer "$SHARED/data/models/stories260K/tok512.bin" --out runs/stories260K
exec ./build-demo/grpo generate --model runs/stories260K --prompt "Once upon a time" --max-tokens 200 --temperature 0 "$@"
