#!/bin/bash
# End-to-end tests of the `tessera` binary: the demo story, JSON lines, and for
# every kind of bad input a non-zero exit (not a signal), exactly one line on
# stderr starting with "tessera: ", and nothing on stdout.
#
# Runs under `bazel test //tests:cli_test` (cwd = the runfiles' tessera folder);
# needs nothing beyond coreutils, grep and sed.
set -u

RUNFILES="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
TESSERA="$RUNFILES/tessera/launch/tessera"
FIXTURES="$RUNFILES/tessera/tests/fixtures"
FIXTURE="$FIXTURES/golden/llama"  # vocab 512, context 256, no tokenizer.
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/cli_test"
rm -rf "$TMP"
mkdir -p "$TMP"

failures=0
cases=0

pass() {
  cases=$((cases + 1))
  echo "PASS: $1"
}

fail() {
  cases=$((cases + 1))
  failures=$((failures + 1))
  echo "FAIL: $1: $2"
}

# Runs tessera with the given arguments: stdout in $TMP/out, stderr in
# $TMP/err, exit code in $RC.
run_tessera() {
  "$TESSERA" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
}

# The first match of "KEY":[ids] in a JSON text (stdin), as "1,2,3".
json_ids() {
  grep -o "\"$1\": *\[[-0-9, ]*\]" | head -n 1 | sed 's/.*\[//; s/\].*//; s/ //g'
}

# expect_error NAME NEEDLE ARGS...: tessera ARGS must fail cleanly with a
# message containing NEEDLE.
expect_error() {
  local name="$1" needle="$2"
  shift 2
  run_tessera "$@"
  # A failure after the model loaded follows the startup summary (dtype, KV
  # cache, graphs): those lines aside, the error is one line.
  grep -v -e '^\[tessera\] model: ' -e '^\[tessera\] KV cache: ' \
    -e '^\[tessera\] decode CUDA graphs: ' "$TMP/err" >"$TMP/err.only"
  mv "$TMP/err.only" "$TMP/err"
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$RC" -eq 0 ]; then
    fail "$name" "exit code 0 (stderr: $(head -c 300 "$TMP/err"))"
  elif [ "$RC" -ge 128 ]; then
    fail "$name" "exit code $RC: killed by a signal (stderr: $(head -c 300 "$TMP/err"))"
  elif [ -s "$TMP/out" ]; then
    fail "$name" "stdout is not empty: $(head -c 300 "$TMP/out")"
  elif [ "$lines" -ne 1 ] || [ "$(tail -c 1 "$TMP/err" | od -An -c | tr -d ' ')" != '\n' ]; then
    fail "$name" "stderr is not exactly one line: $(head -c 500 "$TMP/err")"
  elif ! grep -q '^tessera: ' "$TMP/err"; then
    fail "$name" "stderr does not start with 'tessera: ': $(cat "$TMP/err")"
  elif ! grep -qF -- "$needle" "$TMP/err"; then
    fail "$name" "stderr does not mention '$needle': $(cat "$TMP/err")"
  else
    pass "$name (exit $RC: $(cat "$TMP/err"))"
  fi
}

# A writable copy of the llama fixture at $TMP/$1.
copy_fixture() {
  rm -rf "${TMP:?}/$1"
  cp -rL "$FIXTURE" "$TMP/$1"
  chmod -R u+w "$TMP/$1"
  echo "$TMP/$1"
}

# A JSON line of --output json: one object with the four keys.
is_json_line() {
  echo "$1" | grep -q '^{.*}$' &&
    echo "$1" | grep -q '"prompt_ids": *\[[0-9, ]*\]' &&
    echo "$1" | grep -q '"output_ids": *\[[0-9, ]*\]' &&
    echo "$1" | grep -q '"text": *\("\|null\)' &&
    echo "$1" | grep -q '"finish_reason": *"\(length\|stop\)"'
}

for f in "$TESSERA" "$FIXTURE/model.safetensors" "$DEMO/model.safetensors" \
  "$FIXTURES/stories260K_golden.json"; do
  if [ ! -e "$f" ]; then
    echo "FAIL: setup: $f is missing"
    exit 1
  fi
done

GOLDEN_PROMPT_IDS=$(json_ids prompt_ids <"$FIXTURES/stories260K_golden.json")
GOLDEN_STORY_IDS=$(json_ids output_ids <"$FIXTURES/stories260K_golden.json")
FIXTURE_PROMPT_IDS=$(json_ids prompt_ids <"$FIXTURE/golden.json")
FIXTURE_OUTPUT_IDS=$(json_ids output_ids <"$FIXTURE/golden.json")

# ---------------------------------------------------------------------------
# What works.

name="demo greedy story (text)"
run_tessera generate --model "$DEMO" --prompt "Once upon a time" \
  --temperature 0 --max-tokens 40
if [ "$RC" -ne 0 ]; then
  fail "$name" "exit code $RC: $(cat "$TMP/err")"
elif ! head -n 1 "$TMP/out" |
  grep -q '^Once upon a time, there was a little girl named Lily'; then
  fail "$name" "unexpected story: $(head -c 300 "$TMP/out")"
else
  pass "$name"
fi

name="demo greedy story (json)"
run_tessera generate --model "$DEMO" --prompt "Once upon a time" \
  --temperature 0 --max-tokens 40 --output json
line=$(head -n 1 "$TMP/out")
want_ids=$(echo "$GOLDEN_STORY_IDS" | cut -d, -f1-40)
if [ "$RC" -ne 0 ]; then
  fail "$name" "exit code $RC: $(cat "$TMP/err")"
elif [ "$(wc -l <"$TMP/out")" -ne 1 ] || ! is_json_line "$line"; then
  fail "$name" "not one JSON line: $(head -c 500 "$TMP/out")"
elif [ "$(echo "$line" | json_ids prompt_ids)" != "$GOLDEN_PROMPT_IDS" ]; then
  fail "$name" "prompt_ids $(echo "$line" | json_ids prompt_ids), want $GOLDEN_PROMPT_IDS"
elif [ "$(echo "$line" | json_ids output_ids)" != "$want_ids" ]; then
  fail "$name" "output_ids $(echo "$line" | json_ids output_ids), want $want_ids"
elif ! echo "$line" | grep -q '"finish_reason": *"length"' ||
  ! echo "$line" | grep -q '"text": *", there was a little girl named Lily'; then
  fail "$name" "unexpected line: $line"
else
  pass "$name"
fi

name="fixture --prompt-ids is used as given (json)"
run_tessera generate --model "$FIXTURE" --prompt-ids "$FIXTURE_PROMPT_IDS" \
  --temperature 0 --max-tokens 20 --output json
line=$(cat "$TMP/out")
if [ "$RC" -ne 0 ]; then
  fail "$name" "exit code $RC: $(cat "$TMP/err")"
elif [ "$(wc -l <"$TMP/out")" -ne 1 ] || ! is_json_line "$line"; then
  fail "$name" "not one JSON line: $line"
elif [ "$(echo "$line" | json_ids prompt_ids)" != "$FIXTURE_PROMPT_IDS" ] ||
  [ "$(echo "$line" | json_ids output_ids)" != "$FIXTURE_OUTPUT_IDS" ] ||
  ! echo "$line" | grep -q '"text": *null'; then
  fail "$name" "got $line, want output_ids [$FIXTURE_OUTPUT_IDS]"
else
  pass "$name"
fi

name="prompts file: one JSON line per prompt, each as if run alone"
printf '%s\n' '{"prompt": "Once upon a time"}' \
  "{\"prompt_ids\": [$GOLDEN_PROMPT_IDS]}" '{"prompt": "The cat"}' \
  >"$TMP/prompts.jsonl"
run_tessera generate --model "$DEMO" --prompts-file "$TMP/prompts.jsonl" \
  --temperature 0 --max-tokens 20 --output json
cp "$TMP/out" "$TMP/all.jsonl"
problem=""
if [ "$RC" -ne 0 ]; then
  problem="exit code $RC: $(cat "$TMP/err")"
elif [ "$(wc -l <"$TMP/all.jsonl")" -ne 3 ]; then
  problem="$(wc -l <"$TMP/all.jsonl") lines, want 3: $(cat "$TMP/all.jsonl")"
else
  i=0
  for args in "--prompt=Once upon a time" "--prompt-ids=$GOLDEN_PROMPT_IDS" \
    "--prompt=The cat"; do
    i=$((i + 1))
    line=$(sed -n "${i}p" "$TMP/all.jsonl")
    run_tessera generate --model "$DEMO" "$args" --temperature 0 \
      --max-tokens 20 --output json
    if ! is_json_line "$line"; then
      problem="line $i is not a JSON line: $line"
    elif [ "$RC" -ne 0 ] || [ "$line" != "$(cat "$TMP/out")" ]; then
      problem="line $i: $line; alone ($args): $(cat "$TMP/out" "$TMP/err")"
    fi
  done
fi
if [ -n "$problem" ]; then fail "$name" "$problem"; else pass "$name"; fi

name="seeded sampling is reproducible"
sample() {
  run_tessera generate --model "$DEMO" --prompt "Once upon a time" \
    --temperature 0.8 --top-k 20 --top-p 0.9 --seed "$1" --max-tokens 64 \
    --ignore-eos --output json
  cat "$TMP/out"
}
a=$(sample 42)
b=$(sample 42)
c=$(sample 43)
if [ -z "$a" ] || [ "$a" != "$b" ]; then
  fail "$name" "seed 42 twice: '$a' vs '$b'"
elif [ "$(echo "$a" | json_ids output_ids | tr ',' '\n' | wc -l)" -ne 64 ]; then
  fail "$name" "want 64 tokens: $a"
elif [ "$a" = "$c" ]; then
  fail "$name" "seeds 42 and 43 gave the same tokens: $a"
else
  pass "$name"
fi

name="--help"
run_tessera generate --help
if [ "$RC" -ne 0 ] || ! grep -q -- '--prompt-ids' "$TMP/out"; then
  fail "$name" "exit code $RC, stdout: $(head -c 300 "$TMP/out")"
else
  pass "$name"
fi

# ---------------------------------------------------------------------------
# Bad input: one clear line on stderr, non-zero exit, no crash.

expect_error "missing model dir" "does not exist" \
  generate --model "$TMP/no_such_model" --prompt-ids 1,2,3

expect_error "no --model" "--model" generate --prompt-ids 1,2,3

expect_error "negative --gpus-per-node" "--gpus-per-node must be in [0, 1024]" \
  generate --model "$DEMO" --prompt-ids 1,2,3 --gpus-per-node -1

dir=$(copy_fixture no_config)
rm "$dir/config.json"
expect_error "missing config.json" "config.json" \
  generate --model "$dir" --prompt-ids 1,2,3

dir=$(copy_fixture truncated)
head -c 3000 "$FIXTURE/model.safetensors" >"$dir/model.safetensors"
expect_error "truncated safetensors (data)" "model.safetensors" \
  generate --model "$dir" --prompt-ids 1,2,3
head -c 100 "$FIXTURE/model.safetensors" >"$dir/model.safetensors"
expect_error "truncated safetensors (header)" "truncated" \
  generate --model "$dir" --prompt-ids 1,2,3
: >"$dir/model.safetensors"
expect_error "empty safetensors" "too short" \
  generate --model "$dir" --prompt-ids 1,2,3
echo "this is not a checkpoint" >"$dir/model.safetensors"
expect_error "text file as safetensors" "model.safetensors" \
  generate --model "$dir" --prompt-ids 1,2,3
rm "$dir/model.safetensors"
expect_error "no safetensors" "no .safetensors files" \
  generate --model "$dir" --prompt-ids 1,2,3

dir=$(copy_fixture gpt2)
sed -i 's/"model_type": *"llama"/"model_type": "gpt2"/' "$dir/config.json"
if grep -q '"gpt2"' "$dir/config.json"; then
  expect_error "unknown model_type" "gpt2" \
    generate --model "$dir" --prompt-ids 1,2,3
else
  fail "unknown model_type" "could not edit $dir/config.json"
fi

dir=$(copy_fixture awq)
sed -i 's/"model_type": *"llama",/&\n  "quantization_config": {"quant_method": "awq", "bits": 4},/' \
  "$dir/config.json"
if grep -q '"awq"' "$dir/config.json"; then
  expect_error "awq quantization" "not supported yet" \
    generate --model "$dir" --prompt-ids 1,2,3
else
  fail "awq quantization" "could not edit $dir/config.json"
fi

dir=$(copy_fixture wide)
sed -i 's/"hidden_size": *64/"hidden_size": 128/' "$dir/config.json"
expect_error "config disagrees with the weights" "expected shape [512, 128]" \
  generate --model "$dir" --prompt-ids 1,2,3

expect_error "prompt longer than max_position_embeddings" "300 tokens" \
  generate --model "$FIXTURE" --prompt-ids "$(seq -s, 1 300)"
expect_error "token id outside the vocabulary" "vocabulary" \
  generate --model "$FIXTURE" --prompt-ids 1,512
expect_error "malformed --prompt-ids" "--prompt-ids" \
  generate --model "$FIXTURE" --prompt-ids 1,,2
expect_error "text prompt without a tokenizer" "tokenizer" \
  generate --model "$FIXTURE" --prompt "hello"
expect_error "no prompt" "exactly one of" generate --model "$FIXTURE"
expect_error "two prompt sources" "exactly one of" \
  generate --model "$FIXTURE" --prompt "hello" --prompt-ids 1,2
expect_error "missing prompts file" "$TMP/none.jsonl" \
  generate --model "$FIXTURE" --prompts-file "$TMP/none.jsonl"
printf '%s\n' '{"prompt_ids": [1, 2]}' 'not json' >"$TMP/bad.jsonl"
expect_error "malformed prompts file" "bad.jsonl:2:" \
  generate --model "$FIXTURE" --prompts-file "$TMP/bad.jsonl"

expect_error "unknown flag" "--bogus" \
  generate --model "$FIXTURE" --prompt-ids 1 --bogus
expect_error "positional argument" "stray" \
  generate --model "$FIXTURE" --prompt-ids 1 stray
expect_error "bad number (--max-tokens)" "--max-tokens" \
  generate --model "$FIXTURE" --prompt-ids 1 --max-tokens abc
expect_error "bad number (--temperature)" "--temperature" \
  generate --model "$FIXTURE" --prompt-ids 1 --temperature hot
expect_error "missing flag value" "--max-tokens" \
  generate --model "$FIXTURE" --prompt-ids 1 --max-tokens
expect_error "--max-tokens 0" "--max-tokens" \
  generate --model "$FIXTURE" --prompt-ids 1 --max-tokens 0
expect_error "negative temperature" "temperature" \
  generate --model "$FIXTURE" --prompt-ids 1 --temperature -1
expect_error "negative --top-k" "--top-k" \
  generate --model "$FIXTURE" --prompt-ids 1 --top-k -1
expect_error "--top-p out of range" "top_p" \
  generate --model "$FIXTURE" --prompt-ids 1 --top-p 1.5
expect_error "--output other" "--output" \
  generate --model "$FIXTURE" --prompt-ids 1 --output xml

expect_error "negative --seed" "--seed" \
  generate --model "$FIXTURE" --prompt-ids 1 --seed -7
expect_error "--min-tokens above --max-tokens" "--min-tokens" \
  generate --model "$FIXTURE" --prompt-ids 1 --max-tokens 5 --min-tokens 6
expect_error "--max-model-len above max_position_embeddings" "--max-model-len 300" \
  generate --model "$FIXTURE" --prompt-ids 1 --max-model-len 300
expect_error "prompt longer than --max-model-len" "context of 4" \
  generate --model "$FIXTURE" --prompt-ids 1,2,3,4,5 --max-model-len 4
expect_error "--generation-config neither mode nor folder" "--generation-config" \
  generate --model "$FIXTURE" --prompt-ids 1 --generation-config bogus

# --max-model-len caps the continuation: 16 - 5 + 1 tokens.
name="--max-model-len is the context"
run_tessera generate --model "$FIXTURE" --prompt-ids 1,5,9,13,17 --max-tokens 100 \
  --ignore-eos --temperature 0 --max-model-len 16 --output json
n=$(json_ids output_ids <"$TMP/out" | tr ',' '\n' | wc -l)
if [ "$RC" -ne 0 ] || [ "$n" -ne 12 ]; then
  fail "$name" "exit $RC, $n tokens: $(cat "$TMP/out") $(head -c 300 "$TMP/err")"
else
  pass "$name"
fi

# --min-tokens: a stop id greedy decoding makes second cannot end the sequence before 8.
golden_prompt=$(json_ids prompt_ids <"$FIXTURE/golden.json")
golden_second=$(json_ids output_ids <"$FIXTURE/golden.json" | cut -d, -f2)
name="--min-tokens keeps a stop id away"
run_tessera generate --model "$FIXTURE" --prompt-ids "$golden_prompt" --max-tokens 20 \
  --temperature 0 --stop-token-ids "$golden_second" --output json
early=$(json_ids output_ids <"$TMP/out" | tr ',' '\n' | wc -l)
run_tessera generate --model "$FIXTURE" --prompt-ids "$golden_prompt" --max-tokens 20 \
  --temperature 0 --stop-token-ids "$golden_second" --min-tokens 8 --output json
ids=$(json_ids output_ids <"$TMP/out")
n=$(echo "$ids" | tr ',' '\n' | wc -l)
if [ "$RC" -ne 0 ] || [ "$early" -ne 2 ] || [ "$n" -le 8 ] ||
  echo "$ids" | cut -d, -f1-8 | tr ',' '\n' | grep -qx "$golden_second"; then
  fail "$name" "exit $RC, $early tokens without, with: $ids $(head -c 300 "$TMP/err")"
else
  pass "$name"
fi

# generation_config.json defaults (vLLM's --generation-config auto): they fill
# what the flags leave unset, one startup line says so, and vllm turns them off.
dir=$(copy_fixture gen_defaults)
sed -i 's/"bos_token_id": 1,/"bos_token_id": 1, "temperature": 0.0, "max_new_tokens": 3,/' \
  "$dir/generation_config.json"
name="generation_config.json defaults"
run_tessera generate --model "$dir" --prompt-ids "$golden_prompt" --output json
want3=$(json_ids output_ids <"$FIXTURE/golden.json" | cut -d, -f1-3)
want5=$(json_ids output_ids <"$FIXTURE/golden.json" | cut -d, -f1-5)
got=$(json_ids output_ids <"$TMP/out")
if [ "$RC" -ne 0 ] || [ "$got" != "$want3" ] ||
  ! grep -q '^\[tessera\] generation_config.json defaults: temperature=0, max_tokens=3 (--generation-config vllm turns them off)$' "$TMP/err"; then
  fail "$name" "exit $RC, got $got (want $want3), stderr: $(head -c 400 "$TMP/err")"
else
  pass "$name"
fi
name="generation_config.json defaults: a flag wins"
run_tessera generate --model "$dir" --prompt-ids "$golden_prompt" --max-tokens 5 --output json
got=$(json_ids output_ids <"$TMP/out")
if [ "$RC" -ne 0 ] || [ "$got" != "$want5" ]; then
  fail "$name" "exit $RC, got $got (want $want5)"
else
  pass "$name"
fi
name="--generation-config vllm turns the defaults off"
run_tessera generate --model "$dir" --prompt-ids "$golden_prompt" --temperature 0 \
  --generation-config vllm --output json
n=$(json_ids output_ids <"$TMP/out" | tr ',' '\n' | wc -l)
if [ "$RC" -ne 0 ] || [ "$n" -le 3 ] || grep -q 'generation_config.json defaults' "$TMP/err"; then
  fail "$name" "exit $RC, $n tokens, stderr: $(head -c 400 "$TMP/err")"
else
  pass "$name"
fi
expect_error "unknown command" 'unknown command "frobnicate"' frobnicate
expect_error "no command" "no command given"

# tessera tokenize: JSON lines in, JSON lines out, on a folder with only tokenizer files.
QWEN3="$RUNFILES/shared/tokenizers/qwen3"
name="tokenize qwen3 (tokenizer files only)"
printf '%s\n' '{"text": "Hello world"}' '{"text": "<|im_start|>user\nhi<|im_end|>"}' '{"text": ""}' >"$TMP/tok_in"
"$TESSERA" tokenize --model "$QWEN3" <"$TMP/tok_in" >"$TMP/out" 2>"$TMP/err"
RC=$?
want=$'{"ids":[9707,1879]}\n{"ids":[151644,872,198,6023,151645]}\n{"ids":[]}'
if [ "$RC" -ne 0 ] || [ "$(cat "$TMP/out")" != "$want" ]; then
  fail "$name" "exit $RC, got: $(cat "$TMP/out") $(cat "$TMP/err")"
else
  pass "$name"
fi

name="tokenize --decode round trip (demo SentencePiece)"
printf '%s\n' '{"text": "Once upon a time, Lily 🙂 ran."}' >"$TMP/tok_in"
"$TESSERA" tokenize --model "$DEMO" <"$TMP/tok_in" >"$TMP/ids" 2>"$TMP/err" &&
  "$TESSERA" tokenize --model "$DEMO" --decode <"$TMP/ids" >"$TMP/out" 2>>"$TMP/err"
RC=$?
if [ "$RC" -ne 0 ] || [ "$(cat "$TMP/out")" != '{"text":"Once upon a time, Lily 🙂 ran."}' ]; then
  fail "$name" "exit $RC, got: $(cat "$TMP/out") $(cat "$TMP/err")"
else
  pass "$name"
fi

name="tokenize: a malformed line is one clear error"
printf '%s\n' '{"text": "ok"}' 'not json' >"$TMP/tok_in"
"$TESSERA" tokenize --model "$QWEN3" <"$TMP/tok_in" >"$TMP/out" 2>"$TMP/err"
RC=$?
if [ "$RC" -eq 0 ] || [ "$RC" -ge 128 ] || [ "$(wc -l <"$TMP/err")" -ne 1 ] ||
  ! grep -q '^tessera: stdin line 2' "$TMP/err"; then
  fail "$name" "exit $RC, stderr: $(cat "$TMP/err")"
else
  pass "$name"
fi
expect_error "tokenize: no tokenizer in the folder" "no tokenizer.json or tokenizer.model" \
  tokenize --model "$FIXTURE"

# The startup summary, in generate and bench alike: dtype and weight bytes,
# the KV cache in tokens with vLLM's "Maximum concurrency" line, the context,
# and the graphs (none on the CPU).
name="startup summary (generate, bench)"
ok=1
for cmd in "generate --prompt-ids 1,2 --max-tokens 2 --num-kv-blocks 64" \
  "bench --batch-size 1 --input-len 4 --output-len 2 --iterations 1 --num-kv-blocks 64"; do
  # shellcheck disable=SC2086
  run_tessera $cmd --model "$DEMO"
  if [ "$RC" -ne 0 ] ||
    ! grep -Eq '^\[tessera\] model: float32 weights, [0-9.]+ MiB \([0-9]+ bytes\) on cpu; context 512 tokens$' "$TMP/err" ||
    ! grep -q '^\[tessera\] KV cache: 64 blocks x 16 tokens = 1024 tokens (float32, .*); Maximum concurrency for 512 tokens per request: 2.00x$' "$TMP/err" ||
    ! grep -q '^\[tessera\] decode CUDA graphs: none (CPU: decode steps run eagerly)$' "$TMP/err"; then
    ok=0
    echo "$cmd: exit $RC: $(cat "$TMP/err")"
  fi
done
[ "$ok" = 1 ] && pass "$name" || fail "$name" "see above"

echo
if [ "$failures" -ne 0 ]; then
  echo "$failures of $cases cases FAILED"
  exit 1
fi
echo "all $cases cases passed"
