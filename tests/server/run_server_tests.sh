#!/usr/bin/env bash
# Starts `grpo serve` on the tiny demo model (models/arith-tiny, given a chat
# template that renders each message as its content plus "\n"), once open (with
# a random LoRA adapter served by name, --lora-modules), once with --api-key and
# once on the adapter merged into the model (the adapter's reference), and runs the real-client tests against it: the OpenAI
# Node client (tests/server/clients/openai_client.test.mjs), Python requests on
# /generate, /tokenize, /detokenize (tests/server/clients/test_generate.py),
# Python http.client on `grpo api`'s GET /status-env with a body
# (tests/server/clients/test_status_env_body.py) and
# the fuzz test (tests/server/fuzz_server.py). The servers are stopped on every
# exit path. Exits non-zero if any part fails.
#
# Usage: [SERVE_DTYPE=f32|bf16] tests/server/run_server_tests.sh BUILD_DIR [--device cpu|cuda]
# Needs node, the npm packages of tests/server/clients (npm ci there) and a
# python3 with `requests`; scripts/setup.sh installs all three.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -lt 1 ]; then
  echo "usage: $0 BUILD_DIR [--device cpu|cuda]" >&2
  exit 2
fi
BUILD="$(cd "$1" && pwd)"
shift
DEVICE=cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:?--device needs cpu or cuda}"; shift 2 ;;
    *) echo "$0: unknown argument '$1' (expected --device cpu|cuda)" >&2; exit 2 ;;
  esac
done
GRPO="$BUILD/grpo"
CLIENTS="$ROOT/tests/server/clients"
[ -x "$GRPO" ] || { echo "$0: $GRPO not found; build it first (cmake --build $BUILD --target grpo)" >&2; exit 2; }
GRPO_HELP="$("$GRPO" --help 2>/dev/null || true)"
grep -qE "^ +serve " <<<"$GRPO_HELP" ||
  { echo "$0: $GRPO has no 'serve' subcommand; this test needs the server (src/server, grpo serve)" >&2; exit 2; }
command -v node >/dev/null || { echo "$0: node is not installed; run scripts/setup.sh (installs Debian's nodejs)" >&2; exit 2; }
[ -f "$CLIENTS/node_modules/openai/package.json" ] ||
  { echo "$0: the npm package 'openai' is missing; run scripts/setup.sh or (cd tests/server/clients && npm ci)" >&2; exit 2; }
PY=""
for p in ${PYTHON:-} /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c "import requests" 2>/dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || { echo "$0: no python3 with 'requests'; run scripts/setup.sh (installs Debian's python3-requests)" >&2; exit 2; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/grpo-serve-tests.XXXXXX")"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The demo model ships without a chat template; the chat tests need one whose
# rendering is known, so the served copy links the weights and adds it.
MODEL="$TMP/arith-tiny-chat"
mkdir "$MODEL"
for f in config.json model.safetensors tokenizer.json; do ln -s "$ROOT/models/arith-tiny/$f" "$MODEL/$f"; done
"$PY" - "$ROOT/models/arith-tiny/tokenizer_config.json" "$MODEL/tokenizer_config.json" <<'EOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["chat_template"] = "{% for message in messages %}{{ message['content'] }}{{ '\n' }}{% endfor %}"
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
EOF

# A LoRA adapter for the served model (random A and B on q_proj and v_proj, PEFT's
# files), served by name on the main server; a third server serves the merged model
# (grpo merge-lora) alone, the reference for the adapter's answers.
ADAPTER="$TMP/tiny-lora"
"$PY" - "$MODEL/config.json" "$ADAPTER" <<'EOF'
import json, os, random, struct, sys
cfg = json.load(open(sys.argv[1]))
out = sys.argv[2]
os.makedirs(out)
C, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
D = cfg.get("head_dim") or C // H
r, rng = 4, random.Random(7)
tensors = []
for l in range(cfg["num_hidden_layers"]):
    for proj, n_out in (("q_proj", H * D), ("v_proj", KV * D)):
        for ab, shape in (("A", (r, C)), ("B", (n_out, r))):
            sd = 0.6 / shape[1] ** 0.5
            vals = [rng.gauss(0.0, sd) for _ in range(shape[0] * shape[1])]
            tensors.append((f"base_model.model.model.layers.{l}.self_attn.{proj}.lora_{ab}.weight", shape, vals))
header, blob = {}, b""
for name, shape, vals in tensors:
    data = struct.pack(f"<{len(vals)}f", *vals)
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
    blob += data
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + blob)
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0,
           "target_modules": ["q_proj", "v_proj"], "bias": "none", "use_rslora": False, "use_dora": False,
           "base_model_name_or_path": "arith-tiny"}, open(os.path.join(out, "adapter_config.json"), "w"))
EOF
"$GRPO" merge-lora --model "$MODEL" --lora "$ADAPTER" --out "$TMP/merged" >/dev/null 2>"$TMP/merge.log" ||
  { echo "grpo merge-lora failed:" >&2; cat "$TMP/merge.log" >&2; exit 1; }

MAX_BODY=65536
# Two servers share the GPU: a fixed KV pool each, not gpu_memory_utilization of the whole card.
DEVICE_FLAGS=()
[ "$DEVICE" = cuda ] && DEVICE_FLAGS=(--kv-cache-mib 1024)
# SERVE_DTYPE=f32|bf16: the servers' weights (default: grpo serve's, f32 on the CPU, bf16 on CUDA).
[ -n "${SERVE_DTYPE:-}" ] && DEVICE_FLAGS+=(--dtype "$SERVE_DTYPE")
# start_server LOG ARGS...: starts the server and waits for its "listening
# on" line; sets SERVER_URL and SERVER_PID (no subshell, so PIDS keeps it).
start_server() {
  local log="$1"; shift
  "$GRPO" serve --model "${SERVE_MODEL:-$MODEL}" --device "$DEVICE" --host 127.0.0.1 --port 0 --max-body-bytes "$MAX_BODY" \
    --max-prompt-tokens 512 --max-tokens-limit 64 --max-n 8 --max-queued-requests 256 --read-timeout 3 \
    "${DEVICE_FLAGS[@]}" "$@" 2>"$log" >/dev/null &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  local url=""
  for _ in $(seq 300); do
    url="$(sed -n 's|.*grpo serve: listening on \(http://[^ ]*\).*|\1|p' "$log" | head -n1)"
    [ -n "$url" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "grpo serve exited before listening:" >&2; cat "$log" >&2; return 1; }
    sleep 0.2
  done
  [ -n "$url" ] || { echo "grpo serve did not print 'listening on' within 60 s:" >&2; cat "$log" >&2; return 1; }
  SERVER_URL="$url"
}

start_server "$TMP/serve.log" --lora-modules "tiny-lora=$ADAPTER" --max-loras 2 --enable-lora-updates
URL="$SERVER_URL" MAIN_PID=$SERVER_PID
SERVE_MODEL="$TMP/merged" start_server "$TMP/serve-merged.log" --served-model-name merged
MERGED_URL="$SERVER_URL"
KEY="grpo-test-key-$$"
start_server "$TMP/serve-auth.log" --api-key "$KEY"
AUTH_URL="$SERVER_URL"
echo "grpo serve ($DEVICE): $URL, with --api-key: $AUTH_URL"
export GRPO_SERVE_URL="$URL" GRPO_SERVE_MODEL_DIR="$MODEL" GRPO_SERVE_AUTH_URL="$AUTH_URL" GRPO_SERVE_AUTH_KEY="$KEY"
export GRPO_SERVE_LORA_NAME=tiny-lora GRPO_SERVE_LORA_DIR="$ADAPTER" GRPO_SERVE_MERGED_URL="$MERGED_URL"
# The servers' weights: f32 on the CPU, bf16 on CUDA (grpo serve's defaults); the adapter's
# logprobs are compared with the merged model's within that dtype's rounding.
GRPO_SERVE_DTYPE=f32
[ "$DEVICE" = cuda ] && GRPO_SERVE_DTYPE=bf16
[ -n "${SERVE_DTYPE:-}" ] && GRPO_SERVE_DTYPE="$SERVE_DTYPE"
export GRPO_SERVE_DTYPE

failed=()
run_part() {
  local name="$1"; shift
  local t0=$SECONDS
  echo "=== $name"
  if "$@"; then echo "=== $name: passed ($((SECONDS - t0)) s)"; else echo "=== $name: FAILED ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}
run_part "python requests: /generate /tokenize /detokenize" \
  bash -c 'cd "$1" && "$2" -m unittest -v test_generate' _ "$CLIENTS" "$PY"
run_part "python http.client: GET /status-env with a JSON body (grpo api)" \
  bash -c 'cd "$1" && GRPO_BIN="$3" "$2" -m unittest -v test_status_env_body' _ "$CLIENTS" "$PY" "$GRPO"
run_part "node openai client" bash -c 'cd "$1" && node --test openai_client.test.mjs' _ "$CLIENTS"
run_part "fuzz" "$PY" "$ROOT/tests/server/fuzz_server.py" --url "$URL" --server-pid "$MAIN_PID" \
  --max-body-bytes "$MAX_BODY" --kv-metric grpo_kv_blocks_free --count 1000 --time-limit 150

# SIGTERM must drain and exit cleanly.
kill -TERM "$MAIN_PID"
rc=0
for _ in $(seq 100); do kill -0 "$MAIN_PID" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$MAIN_PID" 2>/dev/null; then
  echo "=== SIGTERM: the server did not exit within 20 s"; failed+=("SIGTERM")
else
  wait "$MAIN_PID" || rc=$?
  if [ "$rc" -ne 0 ]; then echo "=== SIGTERM: the server exited with status $rc"; failed+=("SIGTERM"); fi
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "server log (last 40 lines):"; tail -n 40 "$TMP/serve.log"
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all server client tests passed"
