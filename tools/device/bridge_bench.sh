#!/usr/bin/env bash
# Reload bridge timing (issue 19, item 3a; target <= 1 s for Qwen2.5-0.5B) on the GPU
# machine: `grpo serve --watch RUN --device cuda` on a random-init preset, then N new
# checkpoints published the way grpo train publishes them (built in
# checkpoint-<step>.partial-<pid>, renamed into place; each with other weights).
# For each: the server's own figures (read, of which the copy up to the device; wait
# for in-flight requests; swap) and
# the wall time from the rename until /health reports the new policy version.
# Writes bench/results/bridge_reload-<preset>.json.
# Usage: PRESET=qwen2.5-0.5b N=5 bash tools/device/bridge_bench.sh
# (DEVICE=cpu PRESET=tiny-qwen2 BUILD=build-cpu checks the script itself without a GPU.)
set -uo pipefail
B=${BUILD:-build-static}
[ -f .carry/bin.tar.xz ] && [ ! -x "$B/grpo" ] && tar xJf .carry/bin.tar.xz
PRESET=${PRESET:-qwen2.5-0.5b}
DEVICE=${DEVICE:-cuda}
DTYPE=bf16; [ "$DEVICE" = cpu ] && DTYPE=f32
N=${N:-5}
W=$(mktemp -d)
RUN=$W/run
mkdir -p "$RUN" bench/results
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
$B/grpo init-model --preset "$PRESET" --out "$W/base" --seed 1 --dtype $DTYPE --no-tokenizer || exit 1
for k in $(seq 1 "$N"); do
  $B/grpo init-model --preset "$PRESET" --out "$W/src-$k" --seed $((k + 1)) --dtype $DTYPE --no-tokenizer >/dev/null || exit 1
done
$B/grpo serve --model "$W/base" --device "$DEVICE" --port 0 --watch "$RUN" --watch-interval 0.05 \
  --kv-cache-mib 2048 > "$W/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 1 600); do grep -q "listening on" "$W/serve.log" && break; sleep 0.1; done
PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$W/serve.log" | grep -o '[0-9]*$')
[ -n "$PORT" ] || { cat "$W/serve.log"; kill $SERVE; exit 1; }
python3 - "$RUN" "$W" "$PORT" "$N" "$PRESET" "$W/serve.log" "$DEVICE" "$DTYPE" <<'PY'
import json, os, re, subprocess, sys, time, urllib.request, datetime
run, w, port, n, preset, log, device, dtype = sys.argv[1:3] + [int(sys.argv[3]), int(sys.argv[4])] + sys.argv[5:9]
def version():
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return json.load(r)["policy_version"]
walls = []
for k in range(1, n + 1):
    step = 10 * k
    part = os.path.join(run, f"checkpoint-{step}.partial-{os.getpid()}")
    subprocess.run(["cp", "-r", os.path.join(w, f"src-{k}"), part], check=True)
    # The files grpo train adds to a checkpoint; the reload reads only the model files.
    json.dump({"format": "grpo.cpp trainer_state v1", "step": step}, open(os.path.join(part, "trainer_state.json"), "w"))
    open(os.path.join(part, "optimizer.safetensors"), "wb").close()
    os.sync()
    t0 = time.perf_counter()
    os.rename(part, os.path.join(run, f"checkpoint-{step}"))
    while version() != step:
        if time.perf_counter() - t0 > 60: sys.exit(f"checkpoint-{step} not loaded in 60 s; see {log}")
        time.sleep(0.002)
    walls.append(time.perf_counter() - t0)
    print(f"checkpoint-{step}: live after {walls[-1]:.3f} s")
pat = re.compile(r"loaded .* as policy version (\d+) in ([0-9.]+) s \(read ([0-9.]+) s, wait for in-flight requests ([0-9.]+) s, swap ([0-9.]+) s\); the read's copy to the device ([0-9.]+) s")
rows = [tuple(map(float, m.groups()[1:])) for m in map(pat.search, open(log)) if m]
if len(rows) != n: sys.exit(f"{len(rows)} load lines of the expected form in {log}, expected {n}")
dev = "cpu" if device == "cpu" else subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                                   capture_output=True, text=True).stdout.strip()
load = [r[0] for r in rows]
metrics = {"load_s_median": sorted(load)[len(load) // 2], "load_s_max": max(load),
           "read_s_median": sorted(r[1] for r in rows)[len(rows) // 2],
           "swap_s_median": sorted(r[3] for r in rows)[len(rows) // 2],
           "read_upload_s_median": sorted(r[4] for r in rows)[len(rows) // 2],
           "rename_to_live_s_median": sorted(walls)[len(walls) // 2], "rename_to_live_s_max": max(walls),
           "n_reloads": len(rows), "target_s": 1.0}
out = {"bench": "bridge_reload", "date": datetime.date.today().isoformat(), "device": dev,
       "command": "tools/device/bridge_bench.sh", "config": {"preset": preset, "dtype": dtype, "watch_interval_s": 0.05},
       "metrics": metrics}
json.dump(out, open(os.path.join(w if device == "cpu" else "bench/results", f"bridge_reload-{preset}.json"), "w"), indent=2)
print(json.dumps(metrics, indent=2))
PY
RC=$?
kill $SERVE; wait $SERVE
grep "serve --watch" "$W/serve.log"
[ -n "${OUT:-}" ] && cp bench/results/bridge_reload-*.json "$OUT/" 2>/dev/null
rm -rf "$W"
exit $RC
