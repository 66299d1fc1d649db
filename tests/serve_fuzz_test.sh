#!/bin/bash
# A bounded, seeded run of tests/serve_fuzz.py against the real server: hostile and malformed
# requests of every kind (deep nesting, broken JSON and HTTP, huge and truncated bodies, odd
# routes and methods, every field with odd values, trickled bytes); afterwards the server is
# alive, /health is 200, no answer was a 5xx, and a greedy completion still gives the offline
# `generate` text. Then SIGTERM stops it cleanly. FUZZ_REQUESTS / FUZZ_SEED override the run
# (the 10,000-request acceptance run: FUZZ_REQUESTS=10000).
set -u
RUNFILES="${TEST_SRCDIR:-$PWD/..}"
TESSERA="$RUNFILES/tessera/launch/tessera"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/fuzz"
rm -rf "$TMP" && mkdir -p "$TMP/model"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# The demo model with Llama 2's chat template, so the chat endpoint renders templates.
cp "$DEMO"/* "$TMP/model/"
python3 - "$RUNFILES/tessera/tests/fixtures/chat_templates/llama2.jinja" \
  "$TMP/model/tokenizer_config.json" <<'PY'
import json, sys
json.dump({"chat_template": open(sys.argv[1]).read(), "bos_token": "<s>",
           "eos_token": "</s>"}, open(sys.argv[2], "w"))
PY

expected=$("$TESSERA" generate --model "$TMP/model" --prompt "Once upon a time" --max-tokens 24 \
  --temperature 0 --output json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["text"], end="")')

"$TESSERA" serve --model "$TMP/model" --port 0 --served-model-name demo 2>"$TMP/serve.err" &
PID=$!
PORT=""
for _ in $(seq 1 200); do
  PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/serve.err" | head -n 1 | cut -d: -f3)
  [ -n "$PORT" ] && break
  sleep 0.05
done
if [ -z "$PORT" ]; then
  echo "FAIL: the server did not start"; cat "$TMP/serve.err"; exit 1
fi

python3 "$RUNFILES/tessera/tests/serve_fuzz.py" --port "$PORT" \
  --seed "${FUZZ_SEED:-14}" --requests "${FUZZ_REQUESTS:-2000}" --workers 4 \
  --big-bytes $((4 << 20)) --expected "$expected"
fuzz_rc=$?

alive=1
kill -0 "$PID" 2>/dev/null || alive=0
kill -TERM "$PID" 2>/dev/null
for _ in $(seq 1 200); do
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.05
done
if kill -0 "$PID" 2>/dev/null; then
  kill -KILL "$PID"
  echo "FAIL: the server did not stop on SIGTERM"
  fuzz_rc=1
fi
wait "$PID"
serve_rc=$?
if [ "$alive" -eq 0 ] || [ "$serve_rc" -ne 0 ]; then
  echo "FAIL: the server died or exited $serve_rc"
  tail -20 "$TMP/serve.err"
  exit 1
fi
[ "$fuzz_rc" -eq 0 ] || { tail -20 "$TMP/serve.err"; exit 1; }
echo "PASS: the server survived the fuzz run and stopped cleanly"
