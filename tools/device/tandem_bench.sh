#!/usr/bin/env bash
# Tandem training on the GPU machine (issue 17): the CUDA tandem tests, then the
# tandem GRPO step against the vanilla step in the same process (bench_tandem),
# for Qwen2.5-0.5B with a same-size frozen partner and with a partner of about a
# quarter of its size (qwen3-0.6b shape at hidden 512, 8 layers: ~141M params,
# the same 151936-token vocabulary). Random weights, B = 8 x G = 8, P = 128, N = 512.
# Targets: tandem step <= 1.3x vanilla (same-size partner), <= 1.1x (small partner).
# Binaries from build-static (carried as .carry/bin.tar.xz, see tools/device/pack.sh):
#   bash tools/device/pack.sh grpo_tests_engine bench_tandem bench_grpo
#   run: bash tools/device/tandem_bench.sh          (carry [".carry"])
# Results: bench/results/tandem_step-*.json and logs under $OUT.
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
# Tests find fixtures through the absolute paths baked in at build time.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
if [ ! -e /work/shared/data ]; then mkdir -p /work/shared && ln -s "$PWD/.carry/shared" /work/shared/data; fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
mkdir -p bench/results "${OUT:-/tmp}/logs"
if [ -x $B/grpo_tests_engine ]; then
  echo "=== grpo_tests_engine --gtest_filter=Tandem*"
  timeout 200 $B/grpo_tests_engine --gtest_filter='Tandem*' --gtest_brief=1 > "${OUT:-/tmp}/logs/tests_tandem.log" 2>&1
  echo "rc=$?"; grep -E "FAILED|PASSED|SKIPPED|tests ran" "${OUT:-/tmp}/logs/tests_tandem.log" | head -20
fi
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
for strat in ${STRATEGIES:-token chunk word}; do
  wf=""; [ "$strat" = word ] && wf="--tokenizer $TOK"  # word starts from the tokenizer's token texts
  echo "=== bench_tandem qwen2.5-0.5b, same-size partner, $strat"
  timeout 240 $B/bench_tandem --preset qwen2.5-0.5b --partner same --strategy $strat $wf ${TANDEM_FLAGS:-} 2>&1 | tail -9
  echo "=== bench_tandem qwen2.5-0.5b, quarter-size partner, $strat"
  timeout 240 $B/bench_tandem --preset qwen2.5-0.5b --partner qwen3-0.6b --partner-layers 8 --partner-hidden 512 \
    --strategy $strat $wf ${TANDEM_FLAGS:-} 2>&1 | tail -9
  echo "=== bench_tandem qwen2.5-0.5b, quarter-size partner of its own family (8 layers, hidden 512, 8 heads, 2 KV heads), $strat"
  timeout 240 $B/bench_tandem --preset qwen2.5-0.5b --partner qwen2.5-0.5b --partner-layers 8 --partner-hidden 512 \
    --partner-heads 8 --partner-kv-heads 2 --strategy $strat $wf ${TANDEM_FLAGS:-} 2>&1 | tail -9
done
tar czf "${OUT:-/tmp}/results.tgz" bench/results "${OUT:-/tmp}/logs" 2>/dev/null
