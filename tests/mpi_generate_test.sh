#!/bin/bash
# Distributed generation under mpirun equals transformers: for every golden fixture and the
# demo checkpoint, greedy tokens at -np 2 --tp 2, -np 2 --pp 2 and -np 4 --tp 2 --pp 2, with
# weights sent by rank 0 and read locally, are exactly the golden output_ids (the same ids the
# single-process tests check). Also: a world size that is not tp × pp is one clear error.
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
TMP="${TEST_TMPDIR:-$(mktemp -d)}/mpi_generate"
mkdir -p "$TMP"
failures=0
cases=0

# Every golden case of $1/golden.json as prompts-file lines, and the expected output_ids: for
# Phi-3 with LongRoPE, transformers' no-cache tokens where they differ from its generate()'s
# (tests/testing/golden_cases.h says why).
extract() {
  python3 "$RUNFILES/tessera/tools/golden_prompts.py" "$1" "$TMP"
}

run_case() {  # name, model dir, max tokens, np, flags...
  local name="$1" model="$2" max="$3" np="$4"
  shift 4
  cases=$((cases + 1))
  timeout 120 mpirun -np "$np" --bind-to none "$TESSERA" generate --model "$model" \
    --prompts-file "$TMP/prompts.jsonl" --max-tokens "$max" --temperature 0 --output json \
    "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  grep -o '"output_ids":\[[0-9,]*\]' "$TMP/out" >"$TMP/got"
  if [ "$rc" -ne 0 ] || ! cmp -s "$TMP/got" "$TMP/want"; then
    failures=$((failures + 1))
    echo "FAIL: $name (exit $rc)"
    head -c 600 "$TMP/err"
    diff "$TMP/want" "$TMP/got" | head -5
  else
    echo "PASS: $name"
  fi
}

# Bazel shards (shard_count in tests/BUILD.bazel): the golden fixtures are spread over shards
# 1.., shard 0 runs everything after them. Each mpirun is mostly start-up time, so the shards
# run side by side even on two cores.
SHARDS=${TEST_TOTAL_SHARDS:-1}
SHARD=${TEST_SHARD_INDEX:-0}
[ -n "${TEST_SHARD_STATUS_FILE:-}" ] && touch "$TEST_SHARD_STATUS_FILE"
fixture_index=0
for dir in "$GOLDEN"/*/; do
  fixture=$(basename "$dir")
  fixture_index=$((fixture_index + 1))
  if [ "$SHARDS" -gt 1 ] && [ $(((fixture_index - 1) % (SHARDS - 1) + 1)) -ne "$SHARD" ]; then
    continue
  fi
  extract "$dir"
  for layout in "2 --tp 2" "2 --pp 2" "4 --tp 2 --pp 2"; do
    for weights in rank0 local; do
      # shellcheck disable=SC2086
      run_case "$fixture np=$layout weights=$weights" "$dir" 20 $layout --weights "$weights"
    done
  done
  # Prefill logits through the vocabulary-parallel head, within 1e-4 of transformers'.
  for layout in "2 2 1" "2 1 2" "4 2 2"; do
    set -- $layout
    cases=$((cases + 1))
    if timeout 120 mpirun -np "$1" --bind-to none "$RUNFILES/tessera/tests/mpi_logits_check" \
      "$dir" "$2" "$3" >"$TMP/out" 2>"$TMP/err"; then
      echo "PASS: logits $(basename "$dir") tp$2 pp$3"
    else
      failures=$((failures + 1))
      echo "FAIL: logits $(basename "$dir") tp$2 pp$3"
      cat "$TMP/out"
      head -c 600 "$TMP/err"
    fi
  done
done
if [ "$SHARDS" -gt 1 ] && [ "$SHARD" -ne 0 ]; then
  echo "$((cases - failures)) of $cases cases passed (shard $SHARD of $SHARDS)"
  [ "$failures" -eq 0 ]
  exit
fi

# Mixtures of experts with expert parallelism (--ep: each rank holds whole experts).
for fixture in mixtral qwen3_moe qwen2_moe; do
  extract "$GOLDEN/$fixture"
  for layout in "2 --tp 2 --ep" "4 --tp 2 --pp 2 --ep" "4 --tp 4 --ep"; do
    # shellcheck disable=SC2086
    run_case "$fixture np=$layout" "$GOLDEN/$fixture" 20 $layout
  done
done

# The demo checkpoint: transformers' 200-token greedy story for "Once upon a time".
grep -o '"prompt_ids": *\[[0-9, ]*\]' "$RUNFILES/tessera/tests/fixtures/stories260K_golden.json" |
  head -n 1 | tr -d ' ' | sed 's/^/{/; s/$/}/' >"$TMP/prompts.jsonl"
grep -o '"output_ids": *\[[0-9, ]*\]' "$RUNFILES/tessera/tests/fixtures/stories260K_golden.json" |
  head -n 1 | tr -d ' ' >"$TMP/want"
for layout in "2 --tp 2" "2 --pp 2" "4 --tp 2 --pp 2" "2 --pp 2 --pp-layers 4,1" \
  "2 --pp 2 --pp-layers 1,4 --weights local"; do
  # shellcheck disable=SC2086
  run_case "stories260K np=$layout" "$DEMO" 200 $layout
done

# The scheduler across ranks: every golden case at once through a KV pool too small for all
# of them (preemption by recompute on every rank), an 8-token step budget (chunked prefills
# mixed with decodes), and the static attention backend: still transformers' tokens.
for fixture in llama qwen3 mistral_1kv; do
  extract "$GOLDEN/$fixture"
  for layout in "2 --tp 2" "2 --pp 2"; do
    # shellcheck disable=SC2086
    run_case "$fixture np=$layout tiny pool" "$GOLDEN/$fixture" 20 $layout --num-kv-blocks 24 \
      --block-size 4 --max-num-batched-tokens 8 --max-num-seqs 4 --stats-json "$TMP/stats.json"
    cases=$((cases + 1))
    if grep -Eq '"preemptions": [1-9]' "$TMP/stats.json"; then
      echo "PASS: $fixture np=$layout tiny pool preempted"
    else
      failures=$((failures + 1))
      echo "FAIL: $fixture np=$layout tiny pool: no preemption counted"
      cat "$TMP/stats.json"
    fi
    # shellcheck disable=SC2086
    run_case "$fixture np=$layout static attention" "$GOLDEN/$fixture" 20 $layout --attention static
  done
done

# min_tokens travels with the sampling parameters to the sampling rank: with a stop id that
# greedy decoding makes second, --min-tokens 8 gives under TP2 and PP2 the tokens it gives in
# one process (which tests/golden_test.cc ties to transformers' min_new_tokens). And
# --max-model-len reaches every rank: with the static layout each rank's KV blocks are one
# context long, so a rank that missed it would read the wrong slots.
for fixture in qwen3 llama; do
  grep -o '"prompt_ids":\[[0-9,]*\]' "$GOLDEN/$fixture/golden.json" | head -n 2 |
    sed 's/^/{/; s/$/}/' >"$TMP/prompts.jsonl"
  second=$(grep -o '"output_ids":\[[0-9,]*\]' "$GOLDEN/$fixture/golden.json" | head -n 1 |
    sed 's/.*\[//; s/\].*//' | cut -d, -f2)
  for flags in "--min-tokens 8 --stop-token-ids $second" \
    "--max-model-len 24 --attention static --ignore-eos"; do
    # shellcheck disable=SC2086
    "$TESSERA" generate --model "$GOLDEN/$fixture" --prompts-file "$TMP/prompts.jsonl" \
      --max-tokens 20 --temperature 0 --output json $flags 2>/dev/null |
      grep -o '"output_ids":\[[0-9,]*\]' >"$TMP/want"
    for layout in "2 --tp 2" "2 --pp 2"; do
      # shellcheck disable=SC2086
      run_case "$fixture np=$layout $flags" "$GOLDEN/$fixture" 20 $layout $flags
    done
  done
done

# Each rank sizes its static KV blocks (one context each) by the --max-model-len it got in the
# manifest: the two stages (one layer each) report the same KV cache size, smaller than with
# the model's whole context.
kv_sizes() {  # extra flags...; prints each rank's distinct KV cache size
  timeout 120 mpirun -np 2 --bind-to none "$TESSERA" generate --model "$GOLDEN/llama" \
    --prompt-ids 1 --max-tokens 2 --pp 2 --attention static "$@" >"$TMP/out" 2>"$TMP/err" &&
    grep -o '^\[tessera\]   rank [01] on .*KV cache [0-9.]* MiB$' "$TMP/err" |
    sed 's/.*KV cache //; s/ MiB//' | sort -u
}
cases=$((cases + 1))
kv=$(kv_sizes --max-model-len 24)
kv_full=$(kv_sizes)
if [ "$(echo "$kv" | wc -l)" -eq 1 ] && [ -n "$kv" ] && [ -n "$kv_full" ] &&
  awk -v a="$kv" -v b="$kv_full" 'BEGIN { exit !(a < b) }'; then
  echo "PASS: --max-model-len reaches every rank (KV cache $kv MiB on both, $kv_full without)"
else
  failures=$((failures + 1))
  echo "FAIL: --max-model-len on every rank: KV cache sizes '$kv' (without: '$kv_full')"
  head -c 800 "$TMP/err"
fi

# int8 KV under TP2 and PP2 gives the tokens it gives in one process (the demo's stories).
printf '{"prompt": "Once upon a time"}\n{"prompt": "Lily and Ben"}\n{"prompt": "One day"}\n' \
  >"$TMP/prompts.jsonl"
"$TESSERA" generate --model "$DEMO" --prompts-file "$TMP/prompts.jsonl" --max-tokens 64 \
  --temperature 0 --output json --kv-dtype int8 2>/dev/null |
  grep -o '"output_ids":\[[0-9,]*\]' >"$TMP/want"
for layout in "2 --tp 2" "2 --pp 2"; do
  # shellcheck disable=SC2086
  run_case "stories260K np=$layout int8 KV" "$DEMO" 64 $layout --kv-dtype int8
done

# tessera bench runs under mpirun too (rank 0 prints one JSON object).
for layout in "2 --tp 2" "2 --pp 2"; do
  cases=$((cases + 1))
  # shellcheck disable=SC2086
  if timeout 120 mpirun -np ${layout%% *} --bind-to none "$TESSERA" bench --model "$DEMO" \
    ${layout#* } --batch-size 4 --input-len 16 --output-len 8 --iterations 1 --json \
    >"$TMP/out" 2>"$TMP/err" && grep -q '"decode_tokens_per_s"' "$TMP/out" &&
    [ "$(wc -l <"$TMP/out")" -eq 1 ]; then
    echo "PASS: bench np=$layout"
  else
    failures=$((failures + 1))
    echo "FAIL: bench np=$layout"
    head -c 600 "$TMP/err"
  fi
done

# --trace under mpirun: one Chrome trace on rank 0 with every rank's forwards (pid = rank, one
# per step on each rank, inside rank 0's step after the clock alignment) and rank 0's steps.
for layout in "2 --tp 2" "2 --pp 2"; do
  cases=$((cases + 1))
  rm -f "$TMP/trace.json"
  # shellcheck disable=SC2086
  if timeout 120 mpirun -np ${layout%% *} --bind-to none "$TESSERA" generate --model "$DEMO" \
    ${layout#* } --prompt-ids 1,2,3 --max-tokens 8 --ignore-eos --trace "$TMP/trace.json" \
    >"$TMP/out" 2>"$TMP/err" && python3 - "$TMP/trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
assert names == {0: "rank 0", 1: "rank 1"}, names
steps = [e for e in events if e["name"] == "step"]
forwards = {p: [e for e in events if e["name"] == "forward" and e["pid"] == p] for p in (0, 1)}
assert len(steps) == 8 and all(len(f) == 8 for f in forwards.values()), (len(steps), forwards)
# Rank 1's forwards fall inside rank 0's steps (clocks aligned to within 50 ms).
for s, f in zip(steps, forwards[1]):
    assert s["ts"] - 50e3 <= f["ts"] <= s["ts"] + s["dur"] + 50e3, (s, f)
PY
  then
    echo "PASS: --trace np=$layout"
  else
    failures=$((failures + 1))
    echo "FAIL: --trace np=$layout"
    head -c 600 "$TMP/err"
  fi
done

# The startup log, printed by rank 0 alone: the grid, each rank's host, node, layers and sizes,
# the weights progress (in quarters, since stderr is not a terminal), and no placement warning
# when every rank shares one node.
cases=$((cases + 1))
timeout 120 mpirun -np 4 --bind-to none "$TESSERA" generate --model "$DEMO" --prompt-ids 1 \
  --max-tokens 2 --tp 2 --pp 2 >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c '^\[tessera\] grid: tp 2 x pp 2 = 4 ranks on 1 node, cpu; loaded in' "$TMP/err")" -eq 1 ] &&
  grep -Eq '^\[tessera\]   rank 3 on [^ ]+ \(node 0, local rank 3 of 4\): tp 1, stage 1, layers 3-4, 4 heads, 2 KV heads, vocab rows 256-511; weights 0\.[0-9] MiB, workspace [0-9.]+ MiB, graphs 0\.0 MiB, KV cache [0-9.]+ MiB$' "$TMP/err" &&
  [ "$(grep -c '^\[tessera\]   rank [0-3] on ' "$TMP/err")" -eq 4 ] &&
  [ "$(grep -c '^\[tessera\] loading weights: ' "$TMP/err")" -eq 5 ] &&
  grep -q '^\[tessera\] loading weights: 100% (14/14)' "$TMP/err" &&
  ! grep -q 'warning' "$TMP/err"; then
  echo "PASS: startup log"
else
  failures=$((failures + 1))
  echo "FAIL: startup log (exit $rc)"
  cat "$TMP/err"
fi

# A job that must refuse to start: non-zero exit without hanging, and exactly one line from
# rank 0 that starts with `pattern`.
expect_job_error() {  # name, pattern, np, generate flags...
  local name="$1" pattern="$2" np="$3"
  shift 3
  cases=$((cases + 1))
  timeout 60 mpirun -np "$np" --bind-to none "$TESSERA" generate --model "$DEMO" \
    --prompt-ids 1 "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q "^tessera: $pattern" "$TMP/err" ||
    [ "$(grep -c '^tessera: ' "$TMP/err")" -ne 1 ]; then
    failures=$((failures + 1))
    echo "FAIL: $name (exit $rc): $(head -c 400 "$TMP/err")"
  else
    echo "PASS: $name"
  fi
}

expect_job_error "bad --pp-layers" "--pp-layers 3,3" 2 --pp 2 --pp-layers 3,3
expect_job_error "world size mismatch" "the job has 3 ranks but tp × pp = 2 × 1 = 2" 3 --tp 2
expect_job_error "unsplittable model" "cannot split" 3 --tp 3
# A bad flag is found before MPI starts, by every rank alike: still one line, from rank 0.
expect_job_error "bad --gpus-per-node" "--gpus-per-node must be in \\[0, 1024\\]" 2 --tp 2 \
  --gpus-per-node -1
expect_job_error "bad --max-tokens" "--max-tokens" 2 --tp 2 --max-tokens -5

# One rank's own failure while the job assembles ends the whole job at once: non-zero (not
# the timeout), with that rank's message from MpiWorld::Abort, and no rank left waiting. The
# checkpoint lacks model.norm.weight, which only the last pipeline stage (rank 1) needs: with
# --weights local rank 1 fails to read it while rank 0 has loaded and waits for the others;
# with --weights rank0 rank 0 fails reading rank 1's shard while rank 1 waits to receive it.
BROKEN="$TMP/no_final_norm"
mkdir -p "$BROKEN"
cp "$DEMO/config.json" "$DEMO/tokenizer.model" "$BROKEN/"
LC_ALL=C perl -0777 -pe 's/"model\.norm\.weight"/"model.norm.weigxt"/' \
  "$DEMO/model.safetensors" >"$BROKEN/model.safetensors"
expect_rank_failure() {  # name, failing rank, generate flags...
  local name="$1" rank="$2"
  shift 2
  cases=$((cases + 1))
  timeout 60 mpirun -np 2 --bind-to none "$TESSERA" generate --model "$BROKEN" \
    --prompt-ids 1 --max-tokens 2 "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] ||
    ! grep -q "^tessera: rank $rank: .*model\.norm\.weight" "$TMP/err"; then
    failures=$((failures + 1))
    echo "FAIL: $name (exit $rc): $(head -c 600 "$TMP/err")"
  else
    echo "PASS: $name"
  fi
}
expect_rank_failure "a worker cannot read its weights (--weights local)" 1 --pp 2 --weights local
expect_rank_failure "rank 0 cannot read a worker's shard (--weights rank0)" 0 --pp 2

echo "$((cases - failures)) of $cases cases passed"
[ "$failures" -eq 0 ]
