#!/usr/bin/env bash
# Runs the GPU benchmarks and the peer in the same call on the GPU machine.
# Expects binaries in build-static/ (built on the dev machine with
# -DGRPO_STATIC_DEPS=ON -DGRPO_CUDA=ON) and the peer script at
# .carry/peers/hf_grpo_step.py. Results: bench/results/*.json (+ copies in $OUT).
set -uo pipefail
export PYTHONUNBUFFERED=1
B=${BUILD:-build-static}
mkdir -p bench/results
for preset in qwen2.5-0.5b qwen3-0.6b; do
  for wl in grpo nanovllm; do
    echo "=== rollout $preset $wl"
    timeout 240 $B/bench_rollout --preset $preset --workload $wl --device cuda --dtype bf16 ${ROLLOUT_FLAGS:-} || echo "bench_rollout $preset $wl FAILED rc=$?"
  done
done
for arch in qwen2.5-0.5b qwen3-0.6b; do
  if [ -f .carry/peers/hf_grpo_step.py ] && [ -z "${NO_PEER:-}" ]; then
    echo "=== peer $arch"
    OUT=${OUT:-/tmp} timeout 300 python3 .carry/peers/hf_grpo_step.py --arch $arch --steps 2 | tail -1 > bench/results/peer-$arch.json
    ls bench/results/*-$arch-*.json >/dev/null 2>&1 && python3 bench/merge_peer.py bench/results/peer-$arch.json bench/results/*-$arch-grpo.json
  fi
done
cp bench/results/*.json "${OUT:-/tmp}/" 2>/dev/null || true
