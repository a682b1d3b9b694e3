#!/usr/bin/env bash
# Issue 20, item 3: the cost of the data-parallel path on one GPU. In one call,
# `bench_grpo --config examples/bench-qwen2.5-0.5b.toml` plain and under
# `mpirun -np 1 ... --dist` (NCCL communicator of world size 1 bootstrapped over
# MPI, bucketed gradient all-reduce overlapped with the backward, [dist] settings
# of the config; DIST_SETS adds e.g. "--set dist.zero_stage=1"), rounds
# interleaved (plain, dist, plain, dist) so that clock drift hits both alike.
# Prints each run's mean step time (steps after the first) and the dist/plain
# ratio (target <= 1.02), and writes bench/results/dist_cost-qwen2.5-0.5b.json.
# Binaries from build-static/ (tools/device/pack.sh grpo bench_grpo; carried in
# .carry/bin.tar.xz); tokenizer from .carry/shared or ../shared. About 2-3 minutes.
# Usage: bash tools/device/dist_cost.sh            (STEPS=6 ROUNDS=2 DIST_SETS="")
set -uo pipefail
B=${BUILD:-build-static}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-2}
DIST_SETS=${DIST_SETS:-}
PRESET=qwen2.5-0.5b
CFG=examples/bench-$PRESET.toml
[ -f .carry/bin.tar.xz ] && tar xJf .carry/bin.tar.xz
TOK=.carry/shared/tokenizers/qwen2
[ -d "$TOK" ] || TOK=../shared/data/tokenizers/qwen2
OUT=${OUT:-/tmp/dist_cost}
mkdir -p bench/results "$OUT/logs" runs/models
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
model=runs/models/bench-$PRESET
[ -f $model/config.json ] || $B/grpo init-model --preset $PRESET --out $model --tokenizer-dir $TOK || exit 1
# Without OpenMPI there, the torchrun-style launch (RANK / WORLD_SIZE / MASTER_ADDR) bootstraps the same NCCL path.
if command -v mpirun >/dev/null; then MPI="mpirun --allow-run-as-root -np 1"
else MPI="env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533"; echo "launch: $MPI"; fi
for round in $(seq 1 "$ROUNDS"); do
  timeout 120 $B/bench_grpo --config $CFG --steps $STEPS --out-dir "$OUT" > "$OUT/logs/plain-$round.log" 2>&1
  echo "plain round $round rc=$?"; tail -1 "$OUT/logs/plain-$round.log"
  cp "$OUT/loop_step-bench-$PRESET.json" "$OUT/plain-$round.json" 2>/dev/null
  # shellcheck disable=SC2086
  timeout 120 $MPI $B/bench_grpo --config $CFG --steps $STEPS --out-dir "$OUT" --dist $DIST_SETS \
    > "$OUT/logs/dist-$round.log" 2>&1
  echo "dist round $round rc=$?"; grep -m1 "^dist:" "$OUT/logs/dist-$round.log"; tail -1 "$OUT/logs/dist-$round.log"
  cp "$OUT/loop_step-bench-$PRESET-dist.json" "$OUT/dist-$round.json" 2>/dev/null
done
python3 - "$OUT" "$ROUNDS" "$DIST_SETS" "$STEPS" <<'PY'
import datetime, json, os, sys
out, rounds, sets, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def load(kind):
    runs = []
    for r in range(1, rounds + 1):
        p = f"{out}/{kind}-{r}.json"
        if os.path.exists(p):
            runs.append(json.load(open(p)))
    return runs
plain, dist = load("plain"), load("dist")
if not plain or not dist:
    sys.exit("missing runs: see the logs under " + out + "/logs")
mean = lambda runs, k: sum(r["metrics"][k] for r in runs) / len(runs)
p, d = mean(plain, "seconds"), mean(dist, "seconds")
ar, ex = mean(dist, "allreduce_s"), mean(dist, "allreduce_exposed_s")
print(f"step: plain {p:.4f} s, dist (world size 1) {d:.4f} s, ratio {d / p:.4f} (target <= 1.02)")
print(f"dist all-reduce {ar * 1e3:.2f} ms per step, exposed {ex * 1e3:.2f} ms")
res = {"bench": "dist_cost", "date": datetime.date.today().isoformat(), "device": dist[0]["device"],
       "command": "bash tools/device/dist_cost.sh" + (f" DIST_SETS='{sets}'" if sets else ""),
       "config": {"config": "examples/bench-qwen2.5-0.5b.toml", "rounds": rounds, "dist_sets": sets,
                  "steps_per_run": steps},
       "metrics": {"step_s": d, "train_s": mean(dist, "train_s"), "allreduce_s": ar, "allreduce_exposed_s": ex},
       "peer": {"name": "bench_grpo without [dist]", "metrics": {"step_s": p, "train_s": mean(plain, "train_s")}},
       "ratios": {"dist_over_plain_step": d / p, "dist_over_plain_train": mean(dist, "train_s") / mean(plain, "train_s")}}
json.dump(res, open("bench/results/dist_cost-qwen2.5-0.5b.json", "w"), indent=2)
print("wrote bench/results/dist_cost-qwen2.5-0.5b.json")
PY
