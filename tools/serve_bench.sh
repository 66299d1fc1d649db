#!/usr/bin/env bash
# Tokens/s through `tessera serve` at concurrency 1, 4, 16, 64 and 256 (client: `tessera
# loadgen`), against `tessera generate` offline for the same requests one after another (the
# issue 8 comparison: goal ≤ 5% lost at concurrency 1; three interleaved rounds, a fresh
# server each), and the batched offline rate for reference. Models: the demo checkpoint,
# and with QWEN=1 (GPU machine: needs torch and transformers) a random-weight
# Qwen3-0.6B-shaped bf16 checkpoint written there by save_pretrained (with the real Qwen3
# tokenizer from .carry/gpu/qwen3_tokenizer), so the per-token cost is that of a real-sized
# model rather than of launches alone.
#   GPU machine: carry .carry/gpu (tools/gpu_build.sh), run `QWEN=1 bash tools/serve_bench.sh`.
#   CPU: `DEVICE=cpu TESSERA=bazel-bin/launch/tessera MODEL=../shared/models/stories260K
#   bash tools/serve_bench.sh` (after `bazel build -c opt //launch:tessera`).
set -uo pipefail
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  [ -d .carry/gpu/lib ] || tar -C .carry/gpu -xJf .carry/gpu/lib.tar.xz
  export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
  nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
fi
T=${TESSERA:-.carry/gpu/bin/tessera}
MODEL=${MODEL:-.carry/gpu/stories260K}
"$T" --help >/dev/null 2>&1 || { "$T" --help 2>&1 | tail -n 3; exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)"
git log -1 --format='commit %h' 2>/dev/null
TOKENS=128
TMP=$(mktemp -d)
PORT=18500

offline() {  # MODEL N EXTRA...: N requests one after another, offline
  local model=$1 n=$2
  shift 2
  head -n "$n" "$TMP/p64.jsonl" >"$TMP/pseq.jsonl"
  "$T" generate --model "$model" --device "$DEVICE" --prompts-file "$TMP/pseq.jsonl" \
    --max-tokens $TOKENS --ignore-eos --temperature 0 --max-num-seqs 1 --no-prefix-cache \
    --output json "$@" 2>&1 >/dev/null | tail -1
}

start_server() {  # MODEL EXTRA...: sets SERVER and PORT
  local model=$1
  shift
  PORT=$((PORT + 1))
  "$T" serve --model "$model" --device "$DEVICE" --port $PORT "$@" 2>"$TMP/serve.err" &
  SERVER=$!
  for _ in $(seq 1 600); do grep -q "serving" "$TMP/serve.err" && break; sleep 0.1; done
}

stop_server() {
  kill -TERM "$SERVER"
  wait "$SERVER"
  tail -n 1 "$TMP/serve.err"
}

load() {  # NAME CONCURRENCY REQUESTS
  "$T" loadgen --url "http://127.0.0.1:$PORT" --model "$1" --concurrency "$2" \
    --requests "$3" --max-tokens $TOKENS
}

sweep() {  # MODEL SEQUENTIAL_REQUESTS KV_FLAGS...
  local model=$1 n=$2 name
  shift 2
  name=$(basename "$model")
  echo "######## $name"
  printf '{"prompt": "Once upon a time"}\n%.0s' $(seq 1 64) >"$TMP/p64.jsonl"
  echo "== concurrency 1: offline one after another, then the server (fresh each round)"
  for round in 1 2 3; do
    offline "$model" "$n" "$@"
    start_server "$model" "$@"
    load "$name" 1 "$n"
    stop_server
  done
  echo "== offline, 64 together"
  "$T" generate --model "$model" --device "$DEVICE" --prompts-file "$TMP/p64.jsonl" \
    --max-tokens $TOKENS --ignore-eos --temperature 0 --output json "$@" 2>&1 >/dev/null |
    tail -1
  echo "== concurrency sweep through one server, then concurrency 1 twice more"
  start_server "$model" "$@"
  for c in 1 4 16 64 256; do load "$name" $c $((c < 16 ? n : 2 * c)); done
  load "$name" 1 "$n"
  load "$name" 1 "$n"
  stop_server
}

sweep "$MODEL" 32
if [ "${QWEN:-0}" = 1 ]; then
  python3 - "$TMP/qwen3_0p6b_shape" <<'PY'
import shutil, sys, torch, transformers
config = transformers.Qwen3Config(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
    tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
model.save_pretrained(sys.argv[1])
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(".carry/gpu/qwen3_tokenizer/" + f, sys.argv[1])
PY
  sweep "$TMP/qwen3_0p6b_shape" 16 --kv-cache-memory 8589934592
fi
