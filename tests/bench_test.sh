#!/bin/bash
# `tessera bench` measures what the model runs, and --random-weights runs a model from its
# config.json alone:
#  - bench with two iterations reports the prefill rate of one iteration with the prefix cache
#    off (within 1.5x): the warm-up's KV serves no timed prompt (fresh prompts, cache off);
#  - its JSON has the per-step latency and TTFT percentiles and the memory breakdown
#    (weights, workspace, graphs, KV) that adds up;
#  - --profile-ops adds the per-op tables (decode per step, prefill per iteration) and
#    "op_profile" in JSON, with Linear rows, sorted, within the steps' wall time;
#  - --random-weights on a golden config's shape (no safetensors) runs generate and bench,
#    gives the same tokens twice and at --tp 2 / --pp 2 under mpirun as in one process, and
#    serves a completion;
#  - an absurd shape (10^12 parameters) and an unknown torch_dtype are one clear error, at once.
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
GOLDEN="$RUNFILES/tessera/tests/fixtures/golden"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/bench_test"
rm -rf "$TMP"
mkdir -p "$TMP"
failures=0

pass() { echo "PASS: $1"; }
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}

# A field of a one-line JSON object.
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))$2)" "$1"; }

# --- Honest prefill: 2 iterations (flags leave the cache on) vs 1 iteration, cache off. ---
SHAPE=(--batch-size 4 --input-len 256 --output-len 4)
ok=0
for attempt in 1 2 3; do  # Timing on a shared machine: a few tries for noise.
  timeout 120 "$TESSERA" bench --model "$DEMO" "${SHAPE[@]}" --iterations 2 --json \
    >"$TMP/two.json" 2>"$TMP/two.err" || { cat "$TMP/two.err"; break; }
  timeout 120 "$TESSERA" bench --model "$DEMO" "${SHAPE[@]}" --iterations 1 \
    --no-prefix-cache --json >"$TMP/one.json" 2>"$TMP/one.err" || { cat "$TMP/one.err"; break; }
  two=$(field "$TMP/two.json" '["prefill_tokens_per_s"]')
  one=$(field "$TMP/one.json" '["prefill_tokens_per_s"]')
  echo "attempt $attempt: prefill $two tokens/s (2 iterations) vs $one (1, cache off)"
  if python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if max(a,b)/min(a,b) <= 1.5 else 1)" "$two" "$one"; then
    ok=1
    break
  fi
done
[ "$ok" = 1 ] && pass "bench prefill rate with 2 iterations = 1 iteration without cache" ||
  fail "bench prefill rate with 2 iterations differs from 1 iteration without cache"

# --- The JSON report: percentiles, no cached token, the memory breakdown. ---
if python3 - "$TMP/two.json" <<'EOF'; then
import json, sys
j = json.load(open(sys.argv[1]))
m = j["memory"]
checks = {
    "cached_prompt_tokens == 0": j["cached_prompt_tokens"] == 0,
    "decode steps = iterations x (output_len - 1)": j["decode_steps"] == 2 * 3,
    "0 < step p50 <= p99": 0 < j["decode_step_ms_p50"] <= j["decode_step_ms_p99"],
    "0 < ttft p50 <= p99": 0 < j["ttft_ms_p50"] <= j["ttft_ms_p99"],
    "ttft p99 <= prefill": j["ttft_ms_p99"] <= j["prefill_seconds"] * 1e3 + 1e-6,
    "weights > 0": m["weights_bytes"] > 0,
    "workspace > 0": m["workspace_bytes"] > 0,
    "graphs == 0 on the CPU": m["graphs_bytes"] == 0,
    "kv > 0": m["kv_bytes"] > 0,
    "total = sum": m["total_bytes"] == m["weights_bytes"] + m["workspace_bytes"]
    + m["graphs_bytes"] + m["kv_bytes"],
}
bad = [k for k, v in checks.items() if not v]
if bad:
    print(json.dumps(j))
    print("failed:", bad)
    sys.exit(1)
EOF
  pass "bench --json: percentiles and memory breakdown"
else
  fail "bench --json: percentiles and memory breakdown"
fi
timeout 120 "$TESSERA" bench --model "$DEMO" --batch-size 2 --input-len 16 --output-len 4 \
  --iterations 1 >"$TMP/text" 2>&1
if grep -q '^decode: .*step p50 [0-9.]* ms, p99 [0-9.]* ms' "$TMP/text" &&
  grep -q '^prefill: .*TTFT p50 [0-9.]* ms, p99 [0-9.]* ms' "$TMP/text" &&
  grep -q '^memory:  weights [0-9.]* MiB, workspace [0-9.]* MiB, graphs 0.0 MiB, KV [0-9.]* MiB' "$TMP/text"; then
  pass "bench text report"
else
  fail "bench text report"
  cat "$TMP/text"
fi

# --- --profile-ops: per-op tables in text, op_profile in JSON (wall clock on the CPU). ---
timeout 120 "$TESSERA" bench --model "$DEMO" --batch-size 2 --input-len 16 --output-len 4 \
  --iterations 1 --profile-ops >"$TMP/prof" 2>&1
if grep -q '^op profile: ' "$TMP/prof" &&
  grep -q '^op profile, decode (per step):' "$TMP/prof" &&
  grep -q '^op profile, prefill (per iteration):' "$TMP/prof" &&
  grep -Eq '^ +[0-9.]+% +[0-9.]+ +[0-9.]+ +Linear [0-9]+x[0-9]+' "$TMP/prof" &&
  grep -Eq '^  ops [0-9.]+ us of [0-9.]+ us wall per step' "$TMP/prof"; then
  pass "bench --profile-ops text tables"
else
  fail "bench --profile-ops text tables"
  cat "$TMP/prof"
fi
timeout 120 "$TESSERA" bench --model "$DEMO" --batch-size 2 --input-len 16 --output-len 4 \
  --iterations 2 --profile-ops --json >"$TMP/prof.json" 2>"$TMP/prof.err"
if python3 - "$TMP/prof.json" <<'EOF'; then
import json, sys
j = json.load(open(sys.argv[1]))
p = j["op_profile"]
dec, pre = p["decode"], p["prefill"]
labels = [r["label"] for r in dec]
checks = {
    "decode steps = iterations x (output_len - 1)": p["decode_steps"] == 2 * 3,
    "a Linear row in decode": any(l.startswith("Linear ") for l in labels),
    "DecodeAttention and Sample in decode": "DecodeAttention" in labels and "Sample" in labels,
    "PrefillAttention in prefill": any(r["label"] == "PrefillAttention" for r in pre),
    "rows sorted by time": [r["us_per_step"] for r in dec]
    == sorted((r["us_per_step"] for r in dec), reverse=True),
    "shares add up to 1": abs(sum(r["share"] for r in dec) - 1) < 1e-6,
    "positive times and calls": all(r["us_per_step"] > 0 and r["calls_per_step"] > 0 for r in dec)
    and all(r["ms_per_iteration"] > 0 and r["calls_per_iteration"] > 0 for r in pre),
    "ops within the steps' wall time": 0 < p["decode_op_us_per_step"]
    <= p["decode_wall_us_per_step"] and 0 < p["prefill_op_ms_per_iteration"]
    <= p["prefill_wall_ms_per_iteration"],
    "one Embedding call per decode step": any(r["label"] == "Embedding"
    and r["calls_per_step"] == 1 for r in dec),
}
bad = [k for k, v in checks.items() if not v]
if bad:
    print(json.dumps(p, indent=1))
    print("failed:", bad)
    sys.exit(1)
EOF
  pass "bench --profile-ops --json op_profile"
else
  fail "bench --profile-ops --json op_profile"
  cat "$TMP/prof.err"
fi

# --- --random-weights: a folder with only config.json (the golden qwen3 shape). ---
RW="$TMP/qwen3_config_only"
mkdir -p "$RW"
cp "$GOLDEN/qwen3/config.json" "$RW/"
GEN=(generate --model "$RW" --random-weights --prompt-ids 1,2,3,4,5 --max-tokens 12
  --temperature 0 --output json)
timeout 60 "$TESSERA" "${GEN[@]}" >"$TMP/rw1" 2>"$TMP/rw1.err"
rc1=$?
timeout 60 "$TESSERA" "${GEN[@]}" >"$TMP/rw2" 2>"$TMP/rw2.err"
if [ "$rc1" = 0 ] && grep -q '"output_ids":\[[0-9,]*\]' "$TMP/rw1" && cmp -s "$TMP/rw1" "$TMP/rw2"; then
  pass "--random-weights generate runs and is deterministic"
else
  fail "--random-weights generate (exit $rc1)"
  cat "$TMP/rw1" "$TMP/rw1.err" "$TMP/rw2"
fi
if timeout 60 "$TESSERA" generate --model "$RW" --prompt-ids 1,2 --max-tokens 2 \
  >/dev/null 2>"$TMP/nock.err"; then
  fail "a config-only folder without --random-weights must fail"
else
  pass "a config-only folder needs --random-weights ($(head -c 120 "$TMP/nock.err"))"
fi
for layout in "--tp 2" "--pp 2"; do
  # shellcheck disable=SC2086
  timeout 120 mpirun -np 2 --bind-to none "$TESSERA" "${GEN[@]}" $layout \
    >"$TMP/rwp" 2>"$TMP/rwp.err"
  rc=$?
  if [ "$rc" = 0 ] && cmp -s "$TMP/rw1" "$TMP/rwp"; then
    pass "--random-weights $layout gives the one-process tokens"
  else
    fail "--random-weights $layout (exit $rc)"
    cat "$TMP/rwp"
    head -c 800 "$TMP/rwp.err"
  fi
done
timeout 120 "$TESSERA" bench --model "$RW" --random-weights --batch-size 2 --input-len 16 \
  --output-len 4 --iterations 1 --json >"$TMP/rwb.json" 2>"$TMP/rwb.err"
if [ "$(field "$TMP/rwb.json" '["random_weights"]' 2>/dev/null)" = "True" ]; then
  pass "--random-weights bench"
else
  fail "--random-weights bench"
  cat "$TMP/rwb.json" "$TMP/rwb.err"
fi
if timeout 60 "$TESSERA" generate --model "$RW" --random-weights --weights local --tp 1 \
  --prompt-ids 1 --max-tokens 1 >/dev/null 2>"$TMP/local.err"; then
  fail "--random-weights --weights local must be refused"
else
  grep -q '^tessera: --random-weights: every rank makes its own weights' "$TMP/local.err" &&
    pass "--random-weights refuses --weights local" || {
    fail "--random-weights --weights local message"
    cat "$TMP/local.err"
  }
fi

# serve over random weights: a completion of token ids (the golden shape's vocabulary is tiny).
"$TESSERA" serve --model "$RW" --random-weights --tokenizer "$RUNFILES/shared/tokenizers/qwen3" --served-model-name m --port 0 >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
port=""
for _ in $(seq 1 100); do
  port=$(grep -o 'on http://127.0.0.1:[0-9]*' "$TMP/serve.err" | sed 's/.*://')
  [ -n "$port" ] && break
  sleep 0.1
done
if [ -n "$port" ] && python3 - "$port" <<'EOF'; then
import json, sys, urllib.request
req = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
    data=json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4,
                     "temperature": 0}).encode(),
    headers={"content-type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
r = json.load(opener.open(req, timeout=30))
print(json.dumps(r))
sys.exit(0 if r["usage"]["completion_tokens"] == 4 else 1)
EOF
  pass "--random-weights serve"
else
  fail "--random-weights serve"
  cat "$TMP/serve.err"
fi
kill "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null

# --- Hostile shapes: refused before anything is allocated, in a moment. ---
hostile() {  # name, python edit of the config dict c, expected stderr regex
  local dir="$TMP/$1"
  mkdir -p "$dir"
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); $2; json.dump(c, open(sys.argv[2], 'w'))" \
    "$GOLDEN/qwen3/config.json" "$dir/config.json"
  local start=$SECONDS
  timeout 30 "$TESSERA" generate --model "$dir" --random-weights --prompt-ids 1 --max-tokens 1 \
    >/dev/null 2>"$dir/err"
  local rc=$?
  if [ "$rc" = 1 ] && [ "$(wc -l <"$dir/err")" = 1 ] && grep -Eq "$3" "$dir/err" &&
    [ $((SECONDS - start)) -le 10 ]; then
    pass "$1 refused: $(cat "$dir/err")"
  else
    fail "$1 (exit $rc)"
    cat "$dir/err"
  fi
}
hostile params_1e12 "c['vocab_size']=4194304; c['hidden_size']=262144" \
  '^tessera: .*--random-weights: this rank.s weights need [0-9.]+ GiB .* but only [0-9.]+ GiB'
hostile huge_dim "c['intermediate_size']=2**40" \
  '^tessera: .*--random-weights: intermediate_size is 1099511627776, more than'
hostile unknown_dtype "c.pop('torch_dtype', None); c['dtype']='int4'" \
  '^tessera: .*torch_dtype "int4" is not a dtype random weights are made in'

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
