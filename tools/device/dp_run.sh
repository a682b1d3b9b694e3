#!/usr/bin/env bash
# Issue 23: data-parallel GRPO on two GPUs of one host (nvidia-h100-x2 / nvidia-h200-x2).
# Every run is `grpo train` on examples/bench-<...>.toml (the GRPO benchmark shape per GPU:
# 8 prompts x 8 samples, ~128-token prompts, 512 forced new tokens, DAPO) with one extra
# reward, -chars/2000 of the completion text (length_linear, unit = chars), so that
# random weights give non-zero advantages and gradients. The KV pool is fixed
# (engine.kv_cache_mib = KV_MIB) in every run so that the peak device memory read by
# nvidia-smi shows the trainer's state (ZeRO-1 on/off) rather than the pool.
# Parts (PARTS, default all):
#   equal : one GPU vs `mpirun -np 2` on the same global batch (B = 16) with the engine
#           fed 64 sequences at a time (engine.max_num_seqs = 64, no prefix cache), so the
#           one-GPU engine runs the same two batches that the two ranks run: the first
#           step's rollouts, rewards, loss and grad norm must agree to the f32 rounding of
#           a regrouped gradient sum; later steps within the stated tolerance.
#   env   : the same two-rank run through the torchrun-style variables (RANK, WORLD_SIZE,
#           LOCAL_RANK, MASTER_ADDR, MASTER_PORT), compared with the mpirun run.
#   scale : step time of one GPU at B = 8 against two GPUs at B = 16 (twice the global
#           batch), ZeRO-1 off and on: step, all-reduce and exposed all-reduce time, peak
#           memory per GPU. Target: two-GPU step <= 1.1x the one-GPU step.
#   kill  : `mpirun -np 2` run with checkpoints every 2 steps; rank 1 is killed (SIGKILL)
#           mid-step; how long rank 0 lives on and what the job prints; then a resume from
#           the last checkpoint on two ranks and on one rank (2 more steps each).
#   killenv: the same kill with the torchrun-style launch (no launcher to reap rank 0).
# PRESETS (default "qwen2.5-0.5b qwen2.5-1.5b"), STEPS (default 4), KV_MIB (default 8192).
# Writes bench/results/dp2-<preset>.json and bench/results/dp2_fault-qwen2.5-0.5b.json.
set -uo pipefail
source tools/device/lib.sh
PRESETS=${PRESETS:-"qwen2.5-0.5b qwen2.5-1.5b"}
PARTS=${PARTS:-"equal env scale kill killenv"}
STEPS=${STEPS:-4}
KV_MIB=${KV_MIB:-8192}
OUT=${OUT:-/tmp/dp_run}
W=runs/dp2
mkdir -p "$OUT/logs" "$W"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
command -v mpirun >/dev/null || { echo "no mpirun on this machine"; exit 1; }
ldd $B/grpo | grep "not found" && { echo "libraries missing for $B/grpo"; exit 1; }
MPI="mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS"
has() { [[ " $PARTS " == *" $1 "* ]]; }

# mem_watch NAME: samples memory.used of both GPUs every 100 ms until mem_stop.
mem_watch() { nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/mem-$1.csv" 2>/dev/null & MEMPID=$!; }
mem_stop() { kill $MEMPID 2>/dev/null; wait $MEMPID 2>/dev/null; }

# train NAME LAUNCH [--set ...]: one `grpo train` run (LAUNCH: "" = one GPU, "mpi", "env").
train() {
  local name=$1 launch=$2; shift 2
  rm -rf "$W/$name"
  mem_watch "$name"
  local t0=$(date +%s.%N)
  case $launch in
    mpi) timeout 300 $MPI $B/grpo train "$CFG" --out "$W/$name" --set train.steps=$STEPS "$@" > "$OUT/logs/$name.log" 2>&1 ;;
    env) local pids=()
         for r in 0 1; do
           RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 timeout 300 \
             $B/grpo train "$CFG" --out "$W/$name" --set train.steps=$STEPS "$@" > "$OUT/logs/$name.r$r.log" 2>&1 &
           pids+=($!)
         done
         wait "${pids[1]}"; wait "${pids[0]}"; cp "$OUT/logs/$name.r0.log" "$OUT/logs/$name.log" ;;
    *) CUDA_VISIBLE_DEVICES=0 timeout 300 $B/grpo train "$CFG" --out "$W/$name" --set train.steps=$STEPS "$@" \
         > "$OUT/logs/$name.log" 2>&1 ;;
  esac
  local rc=$?
  mem_stop
  echo "$name rc=$rc wall $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
  [ $rc = 0 ] || tail -5 "$OUT/logs/$name.log"
  cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}

for PRESET in $PRESETS; do
  bench_model $PRESET "$OUT/logs/init-$PRESET.log"
  CFG=$W/bench-$PRESET.toml
  bench_config $PRESET $CFG $W/default-$PRESET
  cat >> $CFG <<EOF

[[reward]]
name = "length_linear"
weight = 1.0
target = 0
scale = 2000
max_penalty = 100.0
unit = "chars"
EOF
  KV="--set engine.kv_cache_mib=$KV_MIB"
  EQ="$KV --set rollout.prompts_per_step=16 --set engine.max_num_seqs=64 --set engine.enable_prefix_caching=false"
  # shellcheck disable=SC2086
  if has equal; then
    train "$PRESET-eq-1gpu" "" $EQ
    train "$PRESET-eq-mpi2" mpi $EQ
  fi
  # shellcheck disable=SC2086
  has env && train "$PRESET-eq-env2" env $EQ
  # shellcheck disable=SC2086
  if has scale; then
    train "$PRESET-1gpu-b8" "" $KV
    train "$PRESET-2gpu-b16" mpi $KV --set rollout.prompts_per_step=16
    train "$PRESET-2gpu-b16-zero1" mpi $KV --set rollout.prompts_per_step=16 --set dist.zero_stage=1
    train "$PRESET-1gpu-b8-again" "" $KV   # drift check: the one-GPU baseline again after the two-GPU runs
  fi
done

# Fault handling (0.5B): kill rank 1 in the middle of a step, then resume on 2 ranks and on 1.
kill_test() {  # kill_test NAME LAUNCH
  local name=$1 launch=$2 run=$W/$1
  rm -rf "$run"
  local common=(--set train.steps=40 --set checkpoint.every=2 --set checkpoint.save_final=false --set engine.kv_cache_mib=$KV_MIB
                --set rollout.prompts_per_step=16 --set dist.timeout_s=60)
  if [ "$launch" = mpi ]; then
    $MPI $B/grpo train "$CFG" --out "$run" "${common[@]}" > "$OUT/logs/$name.log" 2>&1 &
    JOB=$!
  else
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29542 \
        $B/grpo train "$CFG" --out "$run" "${common[@]}" > "$OUT/logs/$name.r$r.log" 2>&1 &
      eval "PID$r=\$!"
    done
    JOB=$PID0
  fi
  for _ in $(seq 1 1200); do [ -f "$run/checkpoint-2/trainer_state.json" ] && break; sleep 0.1; done
  [ -f "$run/checkpoint-2/trainer_state.json" ] || { echo "$name: no checkpoint-2"; tail -5 "$OUT/logs/$name"*.log; return; }
  sleep 0.7  # inside step 3 (rollout) ...
  local victim=""
  for p in $(pgrep -f "grpo train $CFG"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx -e "OMPI_COMM_WORLD_RANK=1" -e "RANK=1" && victim=$p
  done
  local t0=$(date +%s.%N)
  kill -9 "$victim"
  echo "$name: killed rank 1 (pid $victim) at step $(ls -d $run/checkpoint-* | sed 's/.*-//' | sort -n | tail -1)+"
  local waited=0
  while kill -0 "$JOB" 2>/dev/null && [ $waited -lt 900 ]; do sleep 0.1; waited=$((waited + 1)); done
  local dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
  kill -0 "$JOB" 2>/dev/null && { echo "$name: rank 0 still alive after 90 s; killing it"; kill -9 "$JOB"; }
  wait "$JOB"; local rc=$?
  echo "$name: rank 0 / the job ended $dt s after the kill, rc=$rc; its last lines:"
  tail -6 "$OUT/logs/$name"*.log | cut -c1-400
  echo "{\"name\": \"$name\", \"stop_s\": $dt, \"rc\": $rc}" > "$OUT/$name.fault.json"
}
if has kill || has killenv; then
  PRESET=qwen2.5-0.5b; MODEL=runs/models/bench-$PRESET; CFG=$W/bench-$PRESET.toml
  has kill && kill_test kill-mpi mpi
  has killenv && kill_test kill-env env
  if has kill; then
    last=$(ls -d $W/kill-mpi/checkpoint-* 2>/dev/null | sed 's/.*-//' | sort -n | tail -1)
    echo "resume from checkpoint-$last on 2 ranks, then on 1 rank"
    common=(--set train.steps=40 --set checkpoint.every=2 --set checkpoint.save_final=false --set engine.kv_cache_mib=$KV_MIB
            --set rollout.prompts_per_step=16 --set dist.timeout_s=60)
    cp -r $W/kill-mpi $W/kill-mpi-r1
    timeout 300 $MPI $B/grpo train "$CFG" --out $W/kill-mpi "${common[@]}" --resume --stop-after 2 > "$OUT/logs/resume2.log" 2>&1
    echo "resume on 2 ranks rc=$?"; grep -m3 -i "resum" "$OUT/logs/resume2.log" | cut -c1-300
    CUDA_VISIBLE_DEVICES=0 timeout 300 $B/grpo train "$CFG" --out $W/kill-mpi-r1 "${common[@]}" --resume --stop-after 2 \
      > "$OUT/logs/resume1.log" 2>&1
    echo "resume on 1 rank rc=$?"; grep -m3 -i "resum" "$OUT/logs/resume1.log" | cut -c1-300
    cp $W/kill-mpi/metrics.jsonl "$OUT/resume2.metrics.jsonl"; cp $W/kill-mpi-r1/metrics.jsonl "$OUT/resume1.metrics.jsonl"
  fi
fi

python3 tools/device/dp_report.py "$OUT" "$PRESETS" "$PARTS"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
