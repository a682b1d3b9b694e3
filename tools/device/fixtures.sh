#!/usr/bin/env bash
# Runs every reference-fixture script (tools/ref/*.py) on the GPU machine,
# which has PyTorch/transformers/tokenizers, and packs tests/fixtures into
# $OUT/fixtures.tgz. Usage (from the repo root): bash tools/device/fixtures.sh [script ...]
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, tokenizers, safetensors; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
scripts=("$@")
[ ${#scripts[@]} -eq 0 ] && scripts=(tools/ref/*.py)
status=0
for s in "${scripts[@]}"; do
  name=$(basename "$s" .py)
  case "$name" in
    make_tokenizer_fixtures) out=tests/fixtures/tokenizer ;;
    make_model_fixtures) out=tests/fixtures/models ;;
    make_grpo_fixtures) out=tests/fixtures/grpo ;;
    make_model_file_fixtures) out=tests/fixtures/model_files ;;
    *) out=tests/fixtures/${name#make_}; out=${out%_fixtures} ;;
  esac
  mkdir -p "$out"
  echo "=== $s -> $out"
  t0=$(date +%s)
  extra=""; [ "$name" = make_tokenizer_fixtures ] && extra="--shared .carry/shared"
  if python3 "$s" $extra --out "$out" > "$OUT/$name.log" 2>&1; then
    echo "ok ($(( $(date +%s) - t0 )) s)"; tail -3 "$OUT/$name.log"
  else
    echo "FAILED"; tail -25 "$OUT/$name.log"; status=1
  fi
done
tar czf "$OUT/fixtures.tgz" tests/fixtures
ls -la "$OUT"
exit $status
