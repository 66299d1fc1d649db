#!/usr/bin/env bash
# Runs on the GPU machine (carry .carry/gpu, made by tools/gpu_build.sh): the CUDA kernel
# tests against the CPU reference, then `tessera generate --device cuda` on every golden
# fixture and the demo checkpoint against transformers' greedy tokens (f32 golden mode:
# exact; bf16: agreement reported), paged attention with decode CUDA graphs (the default) and
# with --no-graphs, static attention, and a decode benchmark with and without graphs.
# With two GPUs it also runs TP2 and PP2 under mpirun (NCCL).
set -uo pipefail
for part in bin lib qwen3_tokenizer; do  # tools/gpu_build.sh packed them
  [ -d ".carry/gpu/$part" ] || tar -C .carry/gpu -xJf ".carry/gpu/$part.tar.xz"
done
export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
BIN=.carry/gpu/bin
T=$BIN/tessera
DEMO=.carry/gpu/stories260K
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
TMP=$(mktemp -d)
failures=0
cases=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
GPUS=$(nvidia-smi -L | wc -l)

# decode_allocations_cuda_test reads the demo checkpoint from Bazel's runfiles layout.
mkdir -p "$TMP/runfiles/shared/models"
ln -s "$PWD/$DEMO" "$TMP/runfiles/shared/models/stories260K"
# fp8_accuracy_cuda_test reads the golden fixtures from there too.
mkdir -p "$TMP/runfiles/tessera/tests"
ln -s "$PWD/tests/fixtures" "$TMP/runfiles/tessera/tests/fixtures"
for test in cuda_memory_source_test elementwise_kernels_test sampling_kernels_test sample_parity_test \
  decode_allocations_cuda_test decode_graphs_cuda_test attention_kernels_test gemm_plans_test \
  cuda_ops_test fused_ops_test skinny_gemm_test flash_prefill_test decode_attention_test \
  moe_kernels_test moe_model_cuda_test gemma_model_cuda_test fp8_gemm_test \
  fp8_accuracy_cuda_test; do
  # TESTS="a b" runs only those test binaries (default: all of them).
  [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $test "* ]] && continue
  cases=$((cases + 1))
  if TEST_SRCDIR="$TMP/runfiles" TEST_TMPDIR="$TMP" TESSERA_TEST_DEVICE=cuda \
    timeout 300 "$BIN/$test" >"$OUT/$test.log" 2>&1; then
    echo "PASS: $test ($(grep -c '^\[       OK' "$OUT/$test.log") tests)"
    grep "^FP8ACCURACY" "$OUT/$test.log"
  else
    failures=$((failures + 1))
    echo "FAIL: $test"
    grep -E "Failure|FAILED|error" "$OUT/$test.log" | head -20
  fi
done

extract() {  # golden dir -> prompts.jsonl, want
  python3 tools/golden_prompts.py "$1" "$TMP"
}
LAUNCH=("$T")  # What runs tessera: itself, or mpirun in front of it.
# FIXTURES="qwen3 gemma2 ..." runs only those golden fixtures (default: all of them); the
# fixtures run in f32 (exact) also run in bf16, where fp8 checkpoints compute in fp8
# (agreement reported).
if [ -n "${FIXTURES:-}" ]; then
  FIXTURE_DIRS=()
  for f in $FIXTURES; do FIXTURE_DIRS+=("tests/fixtures/golden/$f/"); done
else
  FIXTURE_DIRS=(tests/fixtures/golden/*/)
fi
run_case() {  # name, model, max tokens, generate flags...
  local name="$1" model="$2" max="$3"
  shift 3
  cases=$((cases + 1))
  timeout 300 "${LAUNCH[@]}" generate --model "$model" --prompts-file "$TMP/prompts.jsonl" \
    --max-tokens "$max" --temperature 0 --output json --device cuda "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  grep -o '"output_ids":\[[0-9,]*\]' "$TMP/out" >"$TMP/got"
  if [ "$rc" -ne 0 ] || ! cmp -s "$TMP/got" "$TMP/want"; then
    failures=$((failures + 1))
    echo "FAIL: $name (exit $rc)"
    head -c 800 "$TMP/err"
    diff "$TMP/want" "$TMP/got" | head -4
  else
    echo "PASS: $name"
  fi
}
agreement() {  # name: token agreement of got vs want, position by position
  python3 - "$TMP/want" "$TMP/got" "$1" <<'PY'
import json, sys
want = [json.loads(l.split(":", 1)[1]) for l in open(sys.argv[1])]
got = [json.loads(l.split(":", 1)[1]) for l in open(sys.argv[2])]
same = total = 0
for w, g in zip(want, got):
    n = 0
    while n < min(len(w), len(g)) and w[n] == g[n]:
        n += 1
    same += n; total += len(w)
print(f"INFO: {sys.argv[3]}: greedy prefix agreement {same}/{total} tokens")
PY
}

for dir in "${FIXTURE_DIRS[@]}"; do
  name=$(basename "$dir")
  extract "$dir"
  run_case "$name cuda f32 paged (graphs)" "$dir" 20 --dtype float32
  run_case "$name cuda f32 paged --no-graphs" "$dir" 20 --dtype float32 --no-graphs
  run_case "$name cuda f32 static" "$dir" 20 --dtype float32 --attention static
  # Dynamic NTK and LongRoPE rotate a prefill chunk for the length at its end, transformers
  # the whole prompt for its own: chunked prefills have no transformers reference there.
  if grep -Eq '"(rope_type|type)": *"(dynamic|longrope|su)"' "$dir/config.json"; then
    echo "INFO: $name: no tiny-pool run (length-dependent rope; chunked prefills differ)"
  else
    run_case "$name cuda f32 tiny pool" "$dir" 20 --dtype float32 --num-kv-blocks 24 \
      --block-size 4 --max-num-batched-tokens 8 --max-num-seqs 4
  fi
  timeout 300 "$T" generate --model "$dir" --prompts-file "$TMP/prompts.jsonl" --max-tokens 20 \
    --temperature 0 --output json --device cuda >"$TMP/out" 2>"$TMP/err"
  rc=$?
  grep -o '"output_ids":\[[0-9,]*\]' "$TMP/out" >"$TMP/got"
  agreement "$name cuda bf16"
  if [ "$rc" -ne 0 ]; then  # Agreement is reported, but a failed run is a failure.
    cases=$((cases + 1)) failures=$((failures + 1))
    echo "FAIL: $name cuda bf16 (exit $rc)"
    head -c 800 "$TMP/err"
  fi
done

# FIXTURES_ONLY=1: stop after the test binaries and the golden fixtures.
if [ -n "${FIXTURES_ONLY:-}" ]; then
  echo "$((cases - failures)) of $cases cases passed"
  [ "$failures" -eq 0 ]
  exit
fi

grep -o '"prompt_ids": *\[[0-9, ]*\]' tests/fixtures/stories260K_golden.json | tr -d ' ' |
  sed 's/^/{/; s/$/}/' | head -n 1 >"$TMP/prompts.jsonl"
grep -o '"output_ids": *\[[0-9, ]*\]' tests/fixtures/stories260K_golden.json | tr -d ' ' |
  head -n 1 >"$TMP/want"
run_case "stories260K cuda f32 (graphs)" "$DEMO" 200 --dtype float32
run_case "stories260K cuda f32 --no-graphs" "$DEMO" 200 --dtype float32 --no-graphs
run_case "stories260K cuda f32 static" "$DEMO" 200 --dtype float32 --attention static
"$T" generate --model "$DEMO" --prompt "Once upon a time" --max-tokens 60 --temperature 0 \
  --device cuda 2>&1 | tail -2

# Sampling on the device: a seeded request draws the same tokens twice, and alone or in a
# batch of others; logprobs agree with the CPU's.
check() {  # name, command...
  local name="$1"
  shift
  cases=$((cases + 1))
  if "$@"; then echo "PASS: $name"; else failures=$((failures + 1)); echo "FAIL: $name"; fi
}
S=(--model "$DEMO" --max-tokens 48 --temperature 0.9 --top-p 0.95 --top-k 50 --min-p 0.02
  --repetition-penalty 1.1 --device cuda --output json --ignore-eos)
"$T" generate "${S[@]}" --prompt "Once upon a time" --seed 11 >"$TMP/s1" 2>/dev/null
"$T" generate "${S[@]}" --prompt "Once upon a time" --seed 11 >"$TMP/s2" 2>/dev/null
"$T" generate "${S[@]}" --prompt "Once upon a time" --seed 12 >"$TMP/s3" 2>/dev/null
check "device sampling: same seed, same tokens" cmp -s "$TMP/s1" "$TMP/s2"
check "device sampling: another seed, other tokens" bash -c "! cmp -s $TMP/s1 $TMP/s3"
printf '{"prompt": "Lily and Ben"}\n{"prompt": "Once upon a time"}\n{"prompt": "The cat"}\n' \
  >"$TMP/three.jsonl"
"$T" generate "${S[@]/--prompt/}" --prompts-file "$TMP/three.jsonl" --seed 10 2>/dev/null |
  sed -n 2p >"$TMP/batched"
check "device sampling: seeded request alone == in a batch" cmp -s "$TMP/s1" "$TMP/batched"
for device in cpu cuda; do
  "$T" generate --model "$DEMO" --prompt "Once upon a time" --max-tokens 32 --temperature 0 \
    --logprobs 5 --output json --device "$device" --dtype "$([ $device = cuda ] && echo float32 || echo auto)" \
    >"$TMP/lp_$device" 2>/dev/null
done
check "logprobs: cuda f32 equals cpu (ids; values within 1e-4)" python3 - "$TMP/lp_cpu" "$TMP/lp_cuda" <<'PY'
import json, sys
a, b = (json.loads(open(p).read()) for p in sys.argv[1:3])
assert a["output_ids"] == b["output_ids"], (a["output_ids"], b["output_ids"])
for x, y in zip(a["logprobs"], b["logprobs"]):
    assert abs(x["logprob"] - y["logprob"]) < 1e-4, (x, y)
    assert [t[0] for t in x["top"]] == [t[0] for t in y["top"]], (x, y)
    for s, t in zip(x["top"], y["top"]):
        assert abs(s[1] - t[1]) < 1e-4, (s, t)
PY

# min_tokens on the device: transformers' min_new_tokens references for two fixtures (written
# to $OUT/min_tokens/<name>/min_tokens.json, to be committed next to golden.json), and
# `tessera generate --min-tokens --device cuda --dtype float32` against them, token for token.
cases=$((cases + 1))
if PYTHONUNBUFFERED=1 timeout 300 python3 tools/make_min_tokens_golden.py \
  --golden tests/fixtures/golden --out "$OUT/min_tokens" --fixtures qwen3 llama \
  --tessera "$T" --device cuda >"$OUT/min_tokens.log" 2>&1; then
  echo "PASS: min_tokens on cuda equals transformers' min_new_tokens"
else
  failures=$((failures + 1))
  echo "FAIL: min_tokens on cuda"
  grep -E "MISMATCH|Error|error" "$OUT/min_tokens.log" | head -10
fi

if [ "$GPUS" -ge 2 ]; then
  LAUNCH=(mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$T")
  for dir in "${FIXTURE_DIRS[@]}"; do
    name=$(basename "$dir")
    extract "$dir"
    for layout in "--tp 2" "--pp 2"; do
      # shellcheck disable=SC2086
      run_case "$name mpirun -np 2 $layout cuda f32" "$dir" 20 $layout --dtype float32
    done
  done
  LAUNCH=("$T")
fi

# One rank of an MPI job: the fault monitor is installed, so every device wait on the step's
# path is a polled wait (runtime/core/device_wait.h). Same tokens, and its decode speed beside
# one process's.
if command -v mpirun >/dev/null; then
  LAUNCH=(mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH "$T")
  for dir in "${FIXTURE_DIRS[@]}"; do
    name=$(basename "$dir")
    extract "$dir"
    run_case "$name mpirun -np 1 cuda f32 (polled device waits)" "$dir" 20 --dtype float32
  done
  LAUNCH=("$T")
  for launch in "" "mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH"; do
    echo "bench batch 1, ${launch:-one process}:"
    # shellcheck disable=SC2086
    $launch "$T" bench --model "$DEMO" --device cuda --batch-size 1 --input-len 128 \
      --output-len 256 --iterations 3 2>&1 | grep -i "decode\|tok/s" | tail -2
  done
else
  echo "SKIP: no mpirun on this machine (polled device waits not run)"
fi

"$T" bench --model "$DEMO" --device cuda --batch-size 1 --input-len 128 --output-len 128 \
  --iterations 3 2>&1 | tail -4
"$T" bench --model "$DEMO" --device cuda --batch-size 64 --input-len 128 --output-len 128 \
  --iterations 3 2>&1 | tail -4
for batch in 1 64; do
  echo "bench --no-graphs, batch $batch:"
  "$T" bench --model "$DEMO" --device cuda --batch-size "$batch" --input-len 128 --output-len 128 \
    --iterations 3 --no-graphs 2>&1 | tail -4
done
echo "$((cases - failures)) of $cases cases passed"
[ "$failures" -eq 0 ]
