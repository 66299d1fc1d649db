#!/bin/bash
# `tessera serve` end to end, as users deploy it: the official `openai` npm client
# (third_party/node, installed offline into a temp folder) for completions, chat, streaming
# and errors; curl; `promtool check metrics` on /metrics; SIGTERM finishing a request in
# flight and stopping cleanly; and the server under `mpirun -np 2 --tp 2` giving the same
# text as one process.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI names its session directory and the vader BTL's /dev/shm segments after mpirun's pid,
# and Bazel's sandboxes give concurrent tests the same small pids: a short directory of this
# test's own for both (unix socket paths must stay under 108 bytes; TEST_TMPDIR is longer).
MPI_TMP=$(mktemp -d /tmp/tessera-mpi.XXXXXX)
export TMPDIR="$MPI_TMP" OMPI_MCA_btl_vader_backing_directory="$MPI_TMP"
trap 'rm -rf "$MPI_TMP"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
RUNFILES="${TEST_SRCDIR:-$PWD/..}"
TESSERA="$RUNFILES/tessera/launch/tessera"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/serve"
rm -rf "$TMP" && mkdir -p "$TMP/model"
failures=0
cases=0
pass() { cases=$((cases + 1)); echo "PASS: $1"; }
fail() { cases=$((cases + 1)); failures=$((failures + 1)); echo "FAIL: $1"; }

# The demo model with a chat template (Llama 2's), so /v1/chat/completions works.
cp "$DEMO"/* "$TMP/model/"
python3 - "$RUNFILES/tessera/tests/fixtures/chat_templates/llama2.jinja" \
  "$TMP/model/tokenizer_config.json" <<'PY'
import json, sys
json.dump({"chat_template": open(sys.argv[1]).read(), "bos_token": "<s>",
           "eos_token": "</s>"}, open(sys.argv[2], "w"))
PY

# Starts a server (launcher words first, then SERVE_FLAGS), sets PID and PORT.
SERVE_FLAGS=()
start() {
  "$@" serve --model "$TMP/model" --port 0 --served-model-name demo "${SERVE_FLAGS[@]}" \
    2>"$TMP/serve.err" &
  PID=$!
  PORT=""
  for _ in $(seq 1 200); do
    PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/serve.err" | head -n 1 | cut -d: -f3)
    [ -n "$PORT" ] && return 0
    sleep 0.05
  done
  echo "server did not start:"; cat "$TMP/serve.err"
  return 1
}
stop() {  # SIGTERM, then the exit code (124 if it hangs)
  kill -TERM "$PID"
  for _ in $(seq 1 200); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID"; wait "$PID"; return 124; fi
  wait "$PID"
}

expected=$("$TESSERA" generate --model "$TMP/model" --prompt "Once upon a time" --max-tokens 24 \
  --temperature 0 --output json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["text"], end="")')

# A drain long enough for the SIGTERM case below to finish its requests on a slow machine.
SERVE_FLAGS=(--drain-timeout 120 --tool-call-parser hermes --reasoning-parser qwen3)
start "$TESSERA" || exit 1
BASE="http://127.0.0.1:$PORT"

# The official client.
if command -v node >/dev/null; then
  mkdir -p "$TMP/node_modules"
  tar -xzf "$RUNFILES/tessera/third_party/node/openai-7.59.0.tgz" -C "$TMP/node_modules"
  mv "$TMP/node_modules/package" "$TMP/node_modules/openai"
  cp "$RUNFILES/tessera/tests/openai_client_test.mjs" "$TMP/"
  if timeout 120 node "$TMP/openai_client_test.mjs" "$BASE/v1" demo "$expected" >"$TMP/node.out" 2>&1; then
    pass "openai npm client ($(grep -c '^PASS' "$TMP/node.out") checks)"
  else
    fail "openai npm client"
    cat "$TMP/node.out"
  fi
else
  echo "SKIP: node is not installed"
fi

# Structured output (tests/structured_output_check.py): many JSON schemas, regexes, choices and a
# grammar on both endpoints, plain and streamed, each output validated with jsonschema.
if python3 -c 'import jsonschema' 2>/dev/null; then
  if timeout 600 python3 "$RUNFILES/tessera/tests/structured_output_check.py" "$BASE" demo \
      >"$TMP/structured.out" 2>&1; then
    pass "structured output ($(grep -c '^PASS' "$TMP/structured.out") checks)"
  else
    fail "structured output"
    grep -v '^PASS' "$TMP/structured.out" | head -60
  fi
else
  fail "structured output: python3-jsonschema is not installed (tools/setup.sh --test)"
fi

# Tool calls (required, named, auto through the hermes parser) and the qwen3 reasoning parser
# (tests/tool_calls_check.py), each call's arguments validated against its tool's schema.
if python3 -c 'import jsonschema' 2>/dev/null; then
  if timeout 600 python3 "$RUNFILES/tessera/tests/tool_calls_check.py" "$BASE" demo \
      >"$TMP/tools.out" 2>&1; then
    pass "tool calls and reasoning ($(grep -c '^PASS' "$TMP/tools.out") checks)"
  else
    fail "tool calls and reasoning"
    grep -v '^PASS' "$TMP/tools.out" | head -60
  fi
else
  fail "tool calls: python3-jsonschema is not installed (tools/setup.sh --test)"
fi

# curl: a completion, the health check, the model list.
got=$(curl -s "$BASE/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "demo", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")')
[ "$got" = "$expected" ] && pass "curl completion" || fail "curl completion: '$got' vs '$expected'"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && pass "health" || fail "health"
status=$(curl -s -o "$TMP/err.json" -w '%{http_code}' "$BASE/v1/completions" -d '{"model": 3}')
[ "$status" = 400 ] && grep -q '"param":"model"' "$TMP/err.json" && pass "curl 400" ||
  fail "curl 400: $status $(cat "$TMP/err.json")"

# Routes, limits and versions, as curl sees them: JSON 404/405/413 bodies, /version,
# /v1/models/{id} with max_model_len, `tessera --version`.
json_error() {  # STATUS, then curl's arguments: the status and an OpenAI-shaped error body
  local want=$1
  shift
  local got
  got=$(curl -s -o "$TMP/err.json" -w '%{http_code}' "$@")
  [ "$got" = "$want" ] && python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert isinstance(e["message"], str)' "$TMP/err.json" 2>/dev/null
}
json_error 404 "$BASE/nope" && pass "404 JSON" || fail "404: $(cat "$TMP/err.json")"
json_error 405 "$BASE/v1/completions" && pass "405 JSON" || fail "405: $(cat "$TMP/err.json")"
head -c 9000000 /dev/zero | tr '\0' a >"$TMP/big.txt"
json_error 413 "$BASE/v1/completions" -H 'Content-Type: application/json' --data-binary @"$TMP/big.txt" &&
  pass "413 JSON" || fail "413: $(head -c 300 "$TMP/err.json")"
[ "$(curl -s "$BASE/version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')" = \
  "$("$TESSERA" --version | cut -d' ' -f2)" ] && pass "GET /version = tessera --version" || fail "/version"
[ "$(curl -s "$BASE/v1/models/demo" | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_model_len"])')" = 512 ] &&
  pass "/v1/models/demo with max_model_len" || fail "/v1/models/demo: $(curl -s "$BASE/v1/models/demo")"
json_error 404 "$BASE/v1/models/other" && pass "/v1/models/other 404" || fail "/v1/models/other"

# More concurrent streams than httplib's old 256 threads: all complete, none refused.
if "$TESSERA" loadgen --url "$BASE" --model demo --concurrency 300 --requests 300 --max-tokens 4 \
  --json >"$TMP/loadgen300.json" 2>"$TMP/loadgen300.err" &&
  grep -q '"requests":300,' "$TMP/loadgen300.json" && grep -q '"errors":0,' "$TMP/loadgen300.json"; then
  pass "300 concurrent streams"
else
  fail "300 concurrent streams: $(cat "$TMP/loadgen300.json" "$TMP/loadgen300.err" | head -c 600)"
fi

# tessera loadgen: every request completes with the server's token counts.
if "$TESSERA" loadgen --url "$BASE" --model demo --concurrency 4 --requests 12 --max-tokens 16 \
  --json >"$TMP/loadgen.json" 2>"$TMP/loadgen.err" &&
  grep -q '"requests":12,' "$TMP/loadgen.json" && grep -q '"errors":0,' "$TMP/loadgen.json" &&
  grep -q '"output_tokens":192,' "$TMP/loadgen.json"; then
  pass "tessera loadgen"
else
  fail "tessera loadgen: $(cat "$TMP/loadgen.json" "$TMP/loadgen.err")"
fi
# A model the server does not serve: every request fails, and loadgen says so.
if "$TESSERA" loadgen --url "$BASE" --model nope --requests 2 >"$TMP/loadgen.out" 2>&1; then
  fail "tessera loadgen with a wrong model exited 0"
else
  grep -q "2 of 2 requests failed.*404" "$TMP/loadgen.out" && pass "tessera loadgen errors" ||
    fail "tessera loadgen errors: $(cat "$TMP/loadgen.out")"
fi

# Prometheus text that promtool accepts (runtime/serve/promtool_check.sh: only the findings
# vLLM's own names carry), with vLLM's families labelled with the served model's name and the
# engine's numbers in them, after the requests above.
curl -s "$BASE/metrics" >"$TMP/metrics.txt"
PROMTOOL_CHECK="$RUNFILES/tessera/runtime/serve/promtool_check.sh"
families_ok=1
for re in '^vllm:generation_tokens_total{model_name="demo"} [1-9]' \
    '^vllm:prompt_tokens_total{model_name="demo"} [1-9]' \
    '^vllm:request_success_total{model_name="demo",finished_reason="length"} [1-9]' \
    '^vllm:time_to_first_token_seconds_count{model_name="demo"} [1-9]' \
    '^vllm:inter_token_latency_seconds_count{model_name="demo"} [1-9]' \
    '^vllm:e2e_request_latency_seconds_count{model_name="demo"} [1-9]' \
    '^vllm:request_queue_time_seconds_bucket{model_name="demo",le="+Inf"} [1-9]' \
    '^vllm:iteration_tokens_total_count{model_name="demo"} [1-9]' \
    '^vllm:kv_cache_usage_perc{model_name="demo"} ' \
    '^tessera_engine_steps_total{model_name="demo"} [1-9]' \
    '^process_resident_memory_bytes [1-9]'; do
  if ! grep -q -- "$re" "$TMP/metrics.txt"; then
    echo "no line matching /$re/ on /metrics"
    families_ok=0
  fi
done
if [[ $families_ok -eq 1 ]]; then
  pass "/metrics has vLLM's families with model_name"
else
  fail "/metrics families"
  head -60 "$TMP/metrics.txt"
fi
"$PROMTOOL_CHECK" "$TMP/metrics.txt" >"$TMP/promtool.out" 2>&1
case $? in
  0) pass "promtool check metrics" ;;
  2) echo "SKIP: promtool is not installed" ;;
  *)
    fail "promtool check metrics"
    cat "$TMP/promtool.out"
    ;;
esac

# SIGTERM with a request in flight: it finishes (all 400 tokens and [DONE]), then the server
# exits 0.
curl -sN "$BASE/v1/completions" -d '{"model": "demo", "prompt": "Once upon a time",
  "max_tokens": 400, "ignore_eos": true, "temperature": 0, "stream": true}' >"$TMP/inflight" &
CURL=$!
sleep 0.2
# Draining: /health says 503 while the request finishes.
# A second, longer request keeps the server draining while /health is asked.
curl -s "$BASE/v1/completions" -d '{"model": "demo", "prompt": "Once upon a time",
  "max_tokens": 500, "ignore_eos": true, "temperature": 0.7, "n": 16}' >/dev/null &
LONG=$!
sleep 0.1
kill -TERM "$PID"
drain_health=none
for _ in $(seq 1 50); do
  drain_health=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")
  [ "$drain_health" = 503 ] && break
  sleep 0.01
done
wait "$LONG"
[ "$drain_health" = 503 ] && pass "health 503 while draining" || fail "health while draining: $drain_health"
stop
rc=$?
wait "$CURL"
chunks=$(grep -c '"text_completion"' "$TMP/inflight")
if [ "$rc" -eq 0 ] && tail -n 2 "$TMP/inflight" | grep -q 'data: \[DONE\]' && [ "$chunks" -eq 400 ]; then
  pass "SIGTERM drains the request in flight, then exits 0"
else
  fail "SIGTERM drain (exit $rc, $chunks chunks)"
  tail -5 "$TMP/serve.err"
fi

# SIGTERM with more work than the drain allows (--drain-timeout 0.3, one sequence at a time):
# requests that finish in time end normally; the rest are aborted, and each client is told:
# a stream gets an error event naming the drain timeout, then [DONE]; a plain request a 503
# JSON error. A request sent during the drain gets 503. The server exits 0.
SERVE_FLAGS=(--drain-timeout 0.3 --max-num-seqs 1)
if start "$TESSERA"; then
  BASE="http://127.0.0.1:$PORT"
  for i in $(seq 8); do
    curl -sN -w '\n%{http_code}' "$BASE/v1/completions" -d '{"model": "demo",
      "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": true, "stream": true}' \
      >"$TMP/drain$i" &
  done
  curl -s -w '\n%{http_code}' "$BASE/v1/completions" -d '{"model": "demo", "prompt": "Once",
    "max_tokens": 480, "ignore_eos": true}' >"$TMP/drain.plain" &
  sleep 0.3
  kill -TERM "$PID"
  sleep 0.05
  during=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/completions" \
    -d '{"model": "demo", "prompt": "x", "max_tokens": 2}')
  for _ in $(seq 1 200); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$PID" 2>/dev/null && kill -KILL "$PID"
  wait "$PID"
  rc=$?
  wait
  python3 "$RUNFILES/tessera/tests/sse_check.py" "$TMP"/drain[0-9] >"$TMP/ends"
  plain=$(python3 "$RUNFILES/tessera/tests/sse_check.py" "$TMP/drain.plain")
  # A stream aborted before its first token gets the 503 as its status (no 200 went out).
  told='the server is shutting down (SIGTERM) and aborted this request: it did not finish within the 0.3 s drain timeout'
  finished=$(grep -c '^finished 480$' "$TMP/ends")
  aborted=$(grep -c "^\(error [0-9]*\|http 503\) $told" "$TMP/ends")
  if [ "$rc" -eq 0 ] && [ $((finished + aborted)) -eq 8 ] && [ "$aborted" -ge 1 ] &&
    { [ "$plain" = "http 503 $told (--drain-timeout)" ] || [ "$plain" = "plain 200" ]; } &&
    [ "$during" = 503 ] &&
    grep -q 'drain timeout: aborted [0-9]* requests in flight' "$TMP/serve.err"; then
    pass "SIGTERM past the drain timeout: $finished finished, $aborted told (plain: ${plain:0:8})"
  else
    fail "SIGTERM past the drain timeout (exit $rc, during the drain $during, plain: ${plain:0:60}): $(sort "$TMP/ends" | uniq -c | cut -c1-160)"
    tail -5 "$TMP/serve.err"
  fi
else
  fail "serve --drain-timeout 0.3 did not start"
fi

# --max-model-len reaches the server (/v1/models), and generation_config.json's defaults fill
# what a request leaves unset (greedy, 5 tokens here), announced at startup.
printf '{"temperature": 0.0, "max_new_tokens": 5}\n' >"$TMP/model/generation_config.json"
SERVE_FLAGS=(--max-model-len 64)
if start "$TESSERA"; then
  BASE="http://127.0.0.1:$PORT"
  len=$(curl -s "$BASE/v1/models/demo" | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_model_len"])')
  got=$(curl -s "$BASE/v1/completions" -d '{"model": "demo", "prompt": "Once upon a time"}' |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["usage"]["completion_tokens"], r["choices"][0]["text"] == sys.argv[1][:len(r["choices"][0]["text"])])' "$expected")
  if [ "$len" = 64 ] && [ "$got" = "5 True" ] &&
    grep -q '^\[tessera\] generation_config.json defaults: temperature=0, max_tokens=5 (--generation-config vllm turns them off)$' "$TMP/serve.err"; then
    pass "serve --max-model-len and generation_config.json defaults"
  else
    fail "serve --max-model-len 64 / defaults: max_model_len $len, completion '$got'"
    tail -5 "$TMP/serve.err"
  fi
  stop
else
  fail "serve --max-model-len did not start"
fi
rm -f "$TMP/model/generation_config.json"

# Endpoints and access (issue 18): /tokenize and /detokenize round trip; --api-key (401 without
# it, probes open); a CORS preflight without the key; Retry-After on a 429 (--max-pending 1 and
# one long request holding the place); one connection for 20 requests (keep-alive); the startup
# summary, a stats line (--log-stats-interval 0.5) and access log lines in the log.
SERVE_FLAGS=(--api-key sk-e2e --allowed-origins '["http://app.test"]' --log-stats-interval 0.5
  --access-log --max-pending 1)
if start "$TESSERA"; then
  BASE="http://127.0.0.1:$PORT"
  KEY=(-H 'Authorization: Bearer sk-e2e')
  tok=$(curl -s "${KEY[@]}" "$BASE/tokenize" -d '{"model": "demo", "prompt": "Once upon a time",
    "add_special_tokens": false, "return_token_strs": true}')
  ids=$(echo "$tok" | python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 512 and len(r["token_strs"]) == r["count"]; print(json.dumps(r["tokens"]))')
  back=$(curl -s "${KEY[@]}" "$BASE/detokenize" -d "{\"model\": \"demo\", \"tokens\": $ids}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["prompt"], end="")')
  chat=$(curl -s "${KEY[@]}" "$BASE/tokenize" -d '{"messages": [{"role": "user", "content": "Hi"}]}' |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["count"] > 0 and r["token_strs"] is None)')
  bad=$(curl -s -o /dev/null -w '%{http_code}' "${KEY[@]}" "$BASE/detokenize" -d '{"tokens": [99999999]}')
  other=$(curl -s -o /dev/null -w '%{http_code}' "${KEY[@]}" "$BASE/tokenize" -d '{"model": "x", "prompt": "a"}')
  [ "$back" = "Once upon a time" ] && [ "$chat" = True ] && [ "$bad" = 400 ] && [ "$other" = 404 ] &&
    pass "/tokenize and /detokenize round trip (chat form, 400, 404)" ||
    fail "/tokenize /detokenize: '$tok' -> '$back', chat $chat, bad id $bad, other model $other"

  guarded() {  # curl's arguments: the status, and whether the body is OpenAI's 401
    local code
    code=$(curl -s -o "$TMP/401.json" -w '%{http_code}' "$@")
    python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["code"] == "invalid_api_key"' \
      "$TMP/401.json" 2>/dev/null && echo "$code" || echo "$code(body: $(head -c 200 "$TMP/401.json"))"
  }
  codes="$(guarded "$BASE/v1/models") $(guarded -H 'Authorization: Bearer wrong' "$BASE/v1/models")"
  codes+=" $(guarded "$BASE/v1/completions" -d '{}') $(guarded "$BASE/tokenize" -d '{}')"
  codes+=" $(guarded "$BASE/v1/nope")"
  open=""
  for path in /health /metrics /version; do
    open+="$(curl -s -o /dev/null -w '%{http_code}' "$BASE$path") "
  done
  good=$(curl -s -o /dev/null -w '%{http_code}' "${KEY[@]}" "$BASE/v1/models")
  [ "$codes" = "401 401 401 401 401" ] && [ "$open" = "200 200 200 " ] && [ "$good" = 200 ] &&
    pass "--api-key: 401 without the key, probes open" ||
    fail "--api-key: guarded '$codes', open '$open', with the key $good"

  pre=$(curl -s -D - -o /dev/null -X OPTIONS "$BASE/v1/chat/completions" -H 'Origin: http://app.test' \
    -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization' | tr -d '\r')
  simple=$(curl -s -D - -o /dev/null "${KEY[@]}" -H 'Origin: http://app.test' "$BASE/v1/models" | tr -d '\r')
  if echo "$pre" | grep -q '^HTTP/1.1 200' &&
    echo "$pre" | grep -qi '^access-control-allow-origin: http://app.test$' &&
    echo "$pre" | grep -qi '^access-control-allow-headers: authorization$' &&
    echo "$simple" | grep -qi '^access-control-allow-origin: http://app.test$'; then
    pass "CORS preflight without the key, headers on responses"
  else
    fail "CORS: preflight $(echo "$pre" | head -c 400) / simple $(echo "$simple" | head -c 300)"
  fi

  # A long request holds the only place; the next one is 429 with Retry-After.
  curl -sN "${KEY[@]}" "$BASE/v1/completions" -d '{"model": "demo", "prompt": "Once upon a time",
    "max_tokens": 480, "ignore_eos": true, "stream": true}' >"$TMP/hold" &
  HOLD=$!
  for _ in $(seq 1 100); do [ -s "$TMP/hold" ] && break; sleep 0.02; done
  rejected=$(curl -s -D - -o /dev/null "${KEY[@]}" "$BASE/v1/completions" \
    -d '{"model": "demo", "prompt": "x", "max_tokens": 2}' | tr -d '\r')
  wait "$HOLD"
  echo "$rejected" | grep -q '^HTTP/1.1 429' && echo "$rejected" | grep -qi '^retry-after: 1$' &&
    pass "429 with Retry-After" || fail "429 with Retry-After: $(echo "$rejected" | head -c 400)"

  # Keep-alive: 20 requests, one connection (http.client opens a new one if the server closes).
  if python3 - "$PORT" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
c.connect()
first = c.sock
for i in range(20):
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    assert r.status == 200 and c.sock is first, f"request {i}: a new connection"
PY
  then pass "keep-alive: one connection serves 20 requests"; else fail "keep-alive"; fi

  # A completion for the access log, then a stats interval for its stats line.
  curl -s "${KEY[@]}" "$BASE/v1/completions" -d '{"model": "demo", "prompt": "Once upon a time",
    "max_tokens": 8, "ignore_eos": true}' >/dev/null
  sleep 1.2
  stop
  if grep -Eq '^\[tessera\] model: float32 weights, .* on cpu; context 512 tokens$' "$TMP/serve.err" &&
    grep -Eq '^\[tessera\] KV cache: [0-9]+ blocks x 16 tokens = [0-9]+ tokens .*; Maximum concurrency for 512 tokens per request: [0-9.]+x$' "$TMP/serve.err" &&
    grep -q '^\[tessera\] decode CUDA graphs: none (CPU' "$TMP/serve.err"; then
    pass "startup summary in the serve log"
  else
    fail "startup summary: $(head -c 600 "$TMP/serve.err")"
  fi
  grep -Eq '^\[tessera\] stats: Avg prompt throughput: [0-9.]+ tokens/s, Avg generation throughput: [0-9.]+ tokens/s, Running: [0-9]+ reqs, Waiting: [0-9]+ reqs, KV cache usage: [0-9.]+%, Prefix cache hit rate: [0-9.]+%$' "$TMP/serve.err" &&
    pass "stats line in the serve log" || fail "stats line: $(grep stats "$TMP/serve.err" | head -3)"
  grep -Eq '^\[tessera\] access: 127\.0\.0\.1:[0-9]+ "POST /v1/completions" 200 [0-9.]+s prompt_tokens=5 generation_tokens=8$' "$TMP/serve.err" &&
    grep -Eq '^\[tessera\] access: 127\.0\.0\.1:[0-9]+ "GET /v1/models" 401 ' "$TMP/serve.err" &&
    pass "access log lines" || fail "access log: $(grep access: "$TMP/serve.err" | head -5)"
else
  fail "serve --api-key did not start"
fi

# TESSERA_API_KEY: the same check without the flag (the key stays out of `ps`).
SERVE_FLAGS=()
if start env TESSERA_API_KEY=sk-env "$TESSERA"; then
  without=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/models")
  with=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sk-env' "http://127.0.0.1:$PORT/v1/models")
  stop
  [ "$without" = 401 ] && [ "$with" = 200 ] && grep -q 'key from TESSERA_API_KEY' "$TMP/serve.err" &&
    pass "TESSERA_API_KEY" || fail "TESSERA_API_KEY: without $without, with $with"
else
  fail "serve with TESSERA_API_KEY did not start"
fi

# Two ranks (TP2): the same greedy text; SIGTERM stops every rank.
SERVE_FLAGS=(--tp 2)
if start timeout 120 mpirun -np 2 --bind-to none "$TESSERA"; then
  got=$(curl -s "http://127.0.0.1:$PORT/v1/completions" \
    -d '{"model": "demo", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")')
  # The launcher is `timeout`; signal the server itself (rank 0) so it drains.
  PID_TIMEOUT=$PID
  PID=$(pgrep -f "serve --model $TMP/model" | while read -r p; do
    [ "$(cat /proc/$p/comm)" = tessera ] && grep -q OMPI_COMM_WORLD_RANK=0 /proc/$p/environ 2>/dev/null &&
      echo "$p"; done | head -n 1)
  kill -TERM "$PID" 2>/dev/null
  wait "$PID_TIMEOUT"
  rc=$?
  if [ "$got" = "$expected" ] && [ "$rc" -eq 0 ]; then
    pass "mpirun -np 2 serve --tp 2"
  else
    fail "mpirun -np 2 serve --tp 2 (exit $rc): '$got'"
    tail -5 "$TMP/serve.err"
  fi
else
  fail "mpirun -np 2 serve --tp 2 did not start"
fi

# Two ranks (PP2): the sampling rank is rank 1, so the grammar's vocabulary and every mask live
# on a worker; structured output must still hold.
SERVE_FLAGS=(--pp 2)
if start timeout 120 mpirun -np 2 --bind-to none "$TESSERA"; then
  got=$(curl -s "http://127.0.0.1:$PORT/v1/completions" -d '{"model": "demo",
      "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0.9, "seed": 2,
      "guided_json": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
      "maximum": 50}, "w": {"enum": ["cat", "dog"]}}, "required": ["n", "w"],
      "additionalProperties": false}}' | python3 -c '
import json, sys
c = json.load(sys.stdin)["choices"][0]
v = json.loads(c["text"])
ok = c["finish_reason"] == "stop" and set(v) == {"n", "w"} and 0 <= v["n"] <= 50 and v["w"] in ("cat", "dog")
print("ok" if ok else c["text"], end="")' 2>&1)
  PID_TIMEOUT=$PID
  PID=$(pgrep -f "serve --model $TMP/model" | while read -r p; do
    [ "$(cat /proc/$p/comm)" = tessera ] && grep -q OMPI_COMM_WORLD_RANK=0 /proc/$p/environ 2>/dev/null &&
      echo "$p"; done | head -n 1)
  kill -TERM "$PID" 2>/dev/null
  wait "$PID_TIMEOUT"
  rc=$?
  if [ "$got" = ok ] && [ "$rc" -eq 0 ]; then
    pass "mpirun -np 2 serve --pp 2: guided_json on the sampling rank 1"
  else
    fail "mpirun -np 2 serve --pp 2 guided_json (exit $rc): '$got'"
    tail -5 "$TMP/serve.err"
  fi
else
  fail "mpirun -np 2 serve --pp 2 did not start"
fi

echo "$((cases - failures)) of $cases cases passed"
[ "$failures" -eq 0 ]
