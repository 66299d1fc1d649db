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
# A mixture of experts from config.json alone (Qwen3-30B-A3B's layout, tiny: 16 experts, top 4).
MOE="$TMP/qwen3_moe_config_only"
mkdir -p "$MOE"
cat >"$MOE/config.json" <<'JSON'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 512,
 "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 16,
 "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1,
 "mlp_only_layers": [], "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
JSON
MOE_GEN=(generate --model "$MOE" --random-weights --prompt-ids 1,2,3,4,5 --max-tokens 12
  --temperature 0 --output json)
timeout 60 "$TESSERA" "${MOE_GEN[@]}" >"$TMP/moe1" 2>"$TMP/moe1.err"
rc=$?
if [ "$rc" = 0 ] && grep -q '"output_ids":\[[0-9,]*\]' "$TMP/moe1"; then
  pass "--random-weights generate builds a MoE model"
else
  fail "--random-weights MoE generate (exit $rc)"
  cat "$TMP/moe1" "$TMP/moe1.err"
fi
timeout 120 mpirun -np 2 --bind-to none "$TESSERA" "${MOE_GEN[@]}" --tp 2 \
  >"$TMP/moep" 2>"$TMP/moep.err"
rc=$?
if [ "$rc" = 0 ] && cmp -s "$TMP/moe1" "$TMP/moep"; then
  pass "--random-weights MoE --tp 2 gives the one-process tokens"
else
  fail "--random-weights MoE --tp 2 (exit $rc)"
  cat "$TMP/moep"
  head -c 800 "$TMP/moep.err"
fi
timeout 120 mpirun -np 2 --bind-to none "$TESSERA" "${MOE_GEN[@]}" --tp 2 --ep \
  >"$TMP/moee" 2>"$TMP/moee.err"
rc=$?
if [ "$rc" = 0 ] && cmp -s "$TMP/moe1" "$TMP/moee"; then
  pass "--random-weights MoE --tp 2 --ep gives the one-process tokens"
else
  fail "--random-weights MoE --tp 2 --ep (exit $rc)"
  cat "$TMP/moee"
  head -c 800 "$TMP/moee.err"
fi
timeout 120 "$TESSERA" bench --model "$MOE" --random-weights --batch-size 2 --input-len 16 \
  --output-len 4 --iterations 1 --json >"$TMP/moeb.json" 2>"$TMP/moeb.err"
if [ "$(field "$TMP/moeb.json" '["random_weights"]' 2>/dev/null)" = "True" ]; then
  pass "--random-weights MoE bench"
else
  fail "--random-weights MoE bench"
  cat "$TMP/moeb.json" "$TMP/moeb.err"
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

# --- Structured output: --guided-json / --guided-regex / --guided-grammar, the comparison. ---
SCHEMAS="$RUNFILES/tessera/tools/bench_schemas"
QWEN_TOK="$RUNFILES/shared/tokenizers/qwen3"
# The demo checkpoint (SentencePiece, 512 ids) and the golden qwen3 shape with its real
# 151,936-id vocabulary (random weights, the shared Qwen3 tokenizer): the masks over a real
# vocabulary, from outputs that random weights send anywhere the grammar allows.
Q3="$TMP/qwen3_vocab"
mkdir -p "$Q3"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['vocab_size']=151936; c['eos_token_id']=151645; c['bos_token_id']=None; json.dump(c, open(sys.argv[2], 'w'))" \
  "$GOLDEN/qwen3/config.json" "$Q3/config.json"
printf 'root ::= "[" item ("," item)* "]"\nitem ::= "{\\"n\\":" [0-9]+ "}"\n' >"$TMP/list.gbnf"
guided_case() {  # name, model args..., -- , guided args...
  local name=$1
  shift
  local model=() guided=()
  while [ "$1" != "--" ]; do model+=("$1"); shift; done
  shift
  guided=("$@")
  timeout 300 "$TESSERA" bench "${model[@]}" --batch-size 2 --input-len 8 --output-len 24 \
    --iterations 1 --json "${guided[@]}" >"$TMP/$name.json" 2>"$TMP/$name.err"
  local rc=$?
  if [ "$rc" = 0 ] && python3 - "$TMP/$name.json" "${guided[0]}" <<'EOF2'; then
import json, sys
j = json.load(open(sys.argv[1]))
so = j["structured_output"]
kind = {"--guided-json": "json_schema", "--guided-regex": "regex",
        "--guided-grammar": "grammar"}[sys.argv[2]]
c = so["constrained"]
checks = {
    "kind": so["kind"] == kind,
    "compile_ms > 0": so["compile_ms"] > 0,
    "cached < cold": 0 <= so["cached_compile_ms"] < so["compile_ms"],
    "tokens per request in (0, 24]": 0 < c["output_tokens_per_request"] <= 24,
    "decode steps counted": c["decode_steps"] == j["decode_steps"],
    "top level is the constrained run": c["decode_step_ms_p50"] == j["decode_step_ms_p50"],
    "no comparison without the flag": "ratio" not in so and "unconstrained" not in so,
}
bad = [k for k, v in checks.items() if not v]
if bad:
    print(json.dumps(j))
    print("failed:", bad)
    sys.exit(1)
EOF2
    pass "bench $name"
  else
    fail "bench $name (exit $rc)"
    cat "$TMP/$name.json" "$TMP/$name.err"
  fi
}
DEMO_ARGS=(--model "$DEMO")
Q3_ARGS=(--model "$Q3" --random-weights --tokenizer "$QWEN_TOK")
guided_case demo_json "${DEMO_ARGS[@]}" -- --guided-json "$SCHEMAS/array_of_objects.json"
guided_case demo_regex "${DEMO_ARGS[@]}" -- --guided-regex '[a-z ]{1,10}\.'
guided_case demo_grammar "${DEMO_ARGS[@]}" -- --guided-grammar "$TMP/list.gbnf"
guided_case qwen3_json "${Q3_ARGS[@]}" -- --guided-json "$SCHEMAS/array_of_records.json"
guided_case qwen3_regex "${Q3_ARGS[@]}" -- --guided-regex '(yes|no)'
guided_case qwen3_grammar "${Q3_ARGS[@]}" -- --guided-grammar "$TMP/list.gbnf"
# '(yes|no)' completes after a token or two: EOS ends the request, the counts are real.
if [ "$(field "$TMP/qwen3_regex.json" '["structured_output"]["constrained"]["output_tokens_per_request"] <= 4')" = "True" ]; then
  pass "a grammar that completes early ends its requests"
else
  fail "a grammar that completes early ends its requests"
  cat "$TMP/qwen3_regex.json"
fi

# --compare-unconstrained: both runs side by side, JSON and text.
for model in demo q3; do
  if [ "$model" = demo ]; then args=("${DEMO_ARGS[@]}"); else args=("${Q3_ARGS[@]}"); fi
  timeout 300 "$TESSERA" bench "${args[@]}" --batch-size 4 --input-len 8 --output-len 32 \
    --iterations 2 --json --guided-json "$SCHEMAS/array_of_records.json" --compare-unconstrained \
    >"$TMP/cmp_$model.json" 2>"$TMP/cmp_$model.err"
  rc=$?
  if [ "$rc" = 0 ] && python3 - "$TMP/cmp_$model.json" <<'EOF2'; then
import json, sys
j = json.load(open(sys.argv[1]))
so = j["structured_output"]
keys = {"decode_tokens_per_s", "decode_step_ms_p50", "decode_step_ms_p99",
        "prefill_seconds", "prefill_tokens_per_s", "output_tokens_per_request", "decode_steps"}
u, c, r = so["unconstrained"], so["constrained"], so["ratio"]
checks = {
    "kind, compile times": so["kind"] == "json_schema" and so["compile_ms"] > 0
    and so["cached_compile_ms"] >= 0,
    "keys of both runs": keys <= set(u) and keys <= set(c),
    "ratio keys": set(r) == {"decode_step_p50", "decode_step_p99", "decode_tokens_per_s"},
    "ratio = constrained / unconstrained": abs(r["decode_step_p50"]
    - c["decode_step_ms_p50"] / u["decode_step_ms_p50"]) < 1e-9
    and abs(r["decode_tokens_per_s"] - c["decode_tokens_per_s"] / u["decode_tokens_per_s"]) < 1e-9,
    # minItems 64: 32 tokens stay inside the grammar, so both runs make every token.
    "full length both ways": u["output_tokens_per_request"] == 32
    and c["output_tokens_per_request"] == 32,
    "same steps both ways": u["decode_steps"] == c["decode_steps"] == 2 * 31,
    "positive rates": u["decode_tokens_per_s"] > 0 and c["decode_tokens_per_s"] > 0,
}
bad = [k for k, v in checks.items() if not v]
if bad:
    print(json.dumps(j))
    print("failed:", bad)
    sys.exit(1)
EOF2
    pass "bench --compare-unconstrained --json ($model)"
  else
    fail "bench --compare-unconstrained --json ($model, exit $rc)"
    cat "$TMP/cmp_$model.json" "$TMP/cmp_$model.err"
  fi
done
timeout 300 "$TESSERA" bench "${DEMO_ARGS[@]}" --batch-size 2 --input-len 8 --output-len 16 \
  --iterations 1 --guided-regex '[a-z]{1,50}' --compare-unconstrained >"$TMP/cmp.txt" 2>&1
if grep -Eq '^structured output \(regex\): compile [0-9.]+ ms cold' "$TMP/cmp.txt" &&
  grep -Eq '^constrained: [0-9.]+ of 16 tokens per request on average' "$TMP/cmp.txt" &&
  grep -Eq '^step p50 ms +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$TMP/cmp.txt" &&
  grep -Eq '^decode tok/s +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$TMP/cmp.txt"; then
  pass "bench --compare-unconstrained text table"
else
  fail "bench --compare-unconstrained text table"
  cat "$TMP/cmp.txt"
fi

# Refusals: one line, non-zero, before the weights load.
printf '{"type": "object", "properties": {"a": {"type": "string", "uniqueItems": true}}' >"$TMP/truncated.json"
printf '{"type": "array", "uniqueItems": true}' >"$TMP/unsupported.json"
python3 -c "import sys; open(sys.argv[1], 'w').write('{\"enum\": [\"' + 'x' * (2 << 20) + '\"]}')" "$TMP/huge.json"
NOTOK="$TMP/no_tokenizer"
mkdir -p "$NOTOK"
cp "$GOLDEN/qwen3/config.json" "$NOTOK/"
refused() {  # name, expected stderr regex, bench args...
  local name=$1 re=$2
  shift 2
  timeout 60 "$TESSERA" bench --batch-size 1 --input-len 4 --output-len 4 --iterations 1 "$@" \
    >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  if [ "$rc" = 1 ] && [ "$(wc -l <"$TMP/$name.err")" = 1 ] && grep -Eq "$re" "$TMP/$name.err" &&
    [ ! -s "$TMP/$name.out" ]; then
    pass "$name refused: $(cat "$TMP/$name.err")"
  else
    fail "$name (exit $rc)"
    cat "$TMP/$name.out" "$TMP/$name.err"
  fi
}
refused two_flags '^tessera: --guided-json, --guided-regex and --guided-grammar exclude each other' \
  --model "$DEMO" --guided-json "$SCHEMAS/array_of_objects.json" --guided-regex 'a+'
refused missing_file '^tessera: --guided-json .*/nope.json: ' \
  --model "$DEMO" --guided-json "$TMP/nope.json"
refused missing_grammar '^tessera: --guided-grammar .*/nope.gbnf: ' \
  --model "$DEMO" --guided-grammar "$TMP/nope.gbnf"
refused not_json '^tessera: --guided-json .*truncated.json: not a JSON schema' \
  --model "$DEMO" --guided-json "$TMP/truncated.json"
refused bad_schema '^tessera: --guided-json .*unsupported.json: .*uniqueItems' \
  --model "$DEMO" --guided-json "$TMP/unsupported.json"
refused huge_schema '^tessera: --guided-json .*huge.json: .*at most 1048576 bytes' \
  --model "$DEMO" --guided-json "$TMP/huge.json"
refused bad_regex '^tessera: --guided-regex: ' --model "$DEMO" --guided-regex '(ab'
refused bad_grammar '^tessera: --guided-grammar .*: ' --model "$DEMO" --guided-grammar "$TMP/unsupported.json"
refused compare_alone '^tessera: --compare-unconstrained needs a constraint' \
  --model "$DEMO" --compare-unconstrained
refused no_tokenizer '^tessera: --guided-regex: structured output needs a tokenizer' \
  --model "$NOTOK" --random-weights --guided-regex 'a+'

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
