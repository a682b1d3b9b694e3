#!/usr/bin/env bash
# One GPU-machine session: CUDA tests, kernel micro-benchmarks, engine and
# GRPO-step benchmarks and the PyTorch peer, all in one call. Binaries come
# from build-static/ (carried; built here with -DGRPO_STATIC_DEPS=ON).
# Usage: bash tools/device/gpu_run.sh [tests] [kernels] [rollout] [grpo] [peer]
set -uo pipefail
export PYTHONUNBUFFERED=1
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
# Tests find fixtures through the absolute paths baked in at build time.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
if [ ! -e /work/shared/data ]; then mkdir -p /work/shared && ln -s "$PWD/.carry/shared" /work/shared/data; fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
mkdir -p bench/results "$OUT/logs"
what=" $* "
if [[ "$what" == *" tests "* ]]; then
  for t in kernels engine train model; do
    [ -x $B/grpo_tests_$t ] || continue
    echo "=== grpo_tests_$t"
    timeout 200 $B/grpo_tests_$t --gtest_brief=1 > "$OUT/logs/tests_$t.log" 2>&1
    echo "rc=$?"; grep -E "FAILED|PASSED|SKIPPED \[|tests ran" "$OUT/logs/tests_$t.log" | head -30
  done
fi
if [[ "$what" == *" kernels "* ]]; then
  echo "=== bench_kernels"; timeout 200 $B/bench_kernels 2>&1 | tail -30
fi
if [[ "$what" == *" rollout "* ]]; then
  for preset in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b}; do
    for wl in ${WORKLOADS:-grpo nanovllm}; do
      echo "=== bench_rollout $preset $wl"
      timeout 120 $B/bench_rollout --preset $preset --workload $wl --device cuda --dtype bf16 ${ROLLOUT_FLAGS:-} 2>&1 | tail -6
    done
  done
fi
if [[ "$what" == *" grpo "* ]]; then
  for preset in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b}; do
    echo "=== bench_grpo $preset"
    timeout 150 $B/bench_grpo --preset $preset --device cuda ${GRPO_FLAGS:-} 2>&1 | tail -6
  done
fi
if [[ "$what" == *" peer "* ]]; then
  for preset in ${PRESETS:-qwen2.5-0.5b qwen3-0.6b}; do
    echo "=== peer $preset"
    timeout 300 python3 .carry/peers/hf_grpo_step.py --arch $preset --steps 2 2>&1 | tail -1 > bench/results/peer-$preset.json
    cat bench/results/peer-$preset.json
    files=$(ls bench/results/rollout-$preset-grpo.json bench/results/train_step-$preset.json bench/results/grpo_step-$preset.json 2>/dev/null)
    [ -n "$files" ] && python3 bench/merge_peer.py bench/results/peer-$preset.json $files
  done
fi
tar czf "$OUT/results.tgz" bench/results "$OUT/logs" 2>/dev/null
