#!/usr/bin/env bash
# Runs on the GPU machine (carry .carry/gpu from tools/gpu_build.sh, plus tools/loadgen.py,
# which travels with the repository): tokens/s through `tessera serve --device cuda` at
# concurrency 1, 4, 16, 64 and 256 on the demo checkpoint, against `tessera generate` offline
# for the same requests one after another (the issue 8 comparison: goal ≤ 5% lost at
# concurrency 1), and the 64-request batched offline rate for reference.
set -uo pipefail
[ -d .carry/gpu/lib ] || tar -C .carry/gpu -xJf .carry/gpu/lib.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
T=.carry/gpu/bin/tessera
MODEL=${MODEL:-.carry/gpu/stories260K}
NAME=$(basename "$MODEL")
PORT=18500
TOKENS=128
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
lscpu | grep -E "Model name|^CPU\(s\)"
TMP=$(mktemp -d)
printf '{"prompt": "Once upon a time"}\n%.0s' $(seq 1 64) >"$TMP/p64.jsonl"
head -n 32 "$TMP/p64.jsonl" >"$TMP/p32.jsonl"
echo "== offline, one after another"
"$T" generate --model "$MODEL" --device cuda --prompts-file "$TMP/p32.jsonl" --max-tokens $TOKENS \
  --ignore-eos --temperature 0 --max-num-seqs 1 --no-prefix-cache --output json 2>&1 >/dev/null | tail -1
echo "== offline, 64 together"
"$T" generate --model "$MODEL" --device cuda --prompts-file "$TMP/p64.jsonl" --max-tokens $TOKENS \
  --ignore-eos --temperature 0 --output json 2>&1 >/dev/null | tail -1
echo "== through tessera serve"
"$T" serve --model "$MODEL" --device cuda --port $PORT 2>"$TMP/serve.err" &
SERVER=$!
for _ in $(seq 1 200); do grep -q "serving" "$TMP/serve.err" && break; sleep 0.1; done
for c in 1 4 16 64 256; do
  python3 tools/loadgen.py --url "http://127.0.0.1:$PORT" --model "$NAME" --concurrency $c \
    --requests $((c < 16 ? 32 : 2 * c)) --max-tokens $TOKENS
done
kill -TERM $SERVER
wait $SERVER
