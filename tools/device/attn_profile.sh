#!/usr/bin/env bash
# Decode attention deep-dive with Nsight Compute:
#   1. per-kernel time summary of three eager decode steps of the nano-vllm workload (PRESET, default qwen3-0.6b)
#   2. full sections (SOL, memory, warp stalls, occupancy) of three attn_paged_kernel launches
#      at the GRPO shape and at the nano-vllm workload.
# Usage: bash tools/device/attn_profile.sh   (results under $OUT)
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
P=${PRESET:-qwen3-0.6b}
K=${KERNEL:-attn_paged_kernel}
mkdir -p "$OUT"
NCU="ncu --profile-from-start off --clock-control none"
GRPO_PROFILE=decode timeout 200 $NCU --metrics gpu__time_duration.sum --csv --page raw \
  $B/bench_rollout --preset $P --workload nanovllm --device cuda --dtype bf16 --no-graphs --out-dir /tmp/pr \
  > "$OUT/nano.csv" 2> "$OUT/nano.err"; echo "nano summary rc=$?"
python3 tools/device/ncu_summary.py "$OUT/nano.csv" | tee "$OUT/nano.txt"
for W in grpo nanovllm; do
  GRPO_PROFILE=decode timeout 200 $NCU -k "regex:$K" -c 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    $B/bench_rollout --preset $P --workload $W --device cuda --dtype bf16 --no-graphs --out-dir /tmp/pr \
    > "$OUT/attn-$W.txt" 2> "$OUT/attn-$W.err"; echo "attn $W rc=$?"
  grep -E "attn_paged|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Warp Cycles Per Issued|Issued Ipc|No Eligible|Grid Size|Waves Per SM|Compute \(SM\)" "$OUT/attn-$W.txt" | head -80
done
