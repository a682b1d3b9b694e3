# Sourced by the two-GPU scripts (dp_run.sh, nccl_bridge_run.sh, remote_rollout_bench.sh):
# the carried binaries, the Qwen2 tokenizer, NCCL's multicast kept off (KINDS.md), and the
# GRPO benchmark config (examples/bench-qwen2.5-0.5b.toml) on a random-init preset.
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && [ ! -x "$B/grpo" ] && tar xJf .carry/bin.tar.xz
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p bench/results runs/models

# bench_model PRESET LOG: makes runs/models/bench-PRESET once (bf16, seed 1); exits on failure.
bench_model() {
  local m=runs/models/bench-$1
  [ -f $m/config.json ] || $B/grpo init-model --preset $1 --out $m --dtype bf16 --seed 1 --tokenizer-dir $TOK \
    > "$2" 2>&1 || { cat "$2"; exit 1; }
}

# bench_config PRESET CFG RUN_DIR: the benchmark config with the preset's model, written to CFG.
bench_config() {
  sed "s#runs/models/bench-qwen2.5-0.5b#runs/models/bench-$1#; s#runs/bench-qwen2.5-0.5b#$3#" \
    examples/bench-qwen2.5-0.5b.toml > "$2"
}
