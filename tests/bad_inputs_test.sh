#!/bin/bash
# `tessera generate` on a model folder with one bad input each (the bad-input
# matrix of docs/RELIABILITY.md): a FIFO (or directory) in place of a file the
# loader opens, a safetensors length field a few bytes off, a huge
# max_position_embeddings, token ids beyond int32. Each must fail within
# seconds, with a non-zero exit (not a signal, not the timeout) and an error
# naming the problem. Every run is under `timeout 10`: a FIFO that blocks
# open() (the bug this guards) fails the case instead of hanging CI.
#
# Runs under `bazel test //tests:bad_inputs_test`; needs coreutils, grep, sed.
set -u

RUNFILES="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
TESSERA="$RUNFILES/tessera/launch/tessera"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/bad_inputs_test"
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

# A fresh copy of the demo model in $TMP/model (files, not links, so that one
# can be replaced).
fresh_model() {
  rm -rf "$TMP/model"
  mkdir -p "$TMP/model"
  cp -L "$DEMO"/config.json "$DEMO"/model.safetensors "$DEMO"/tokenizer.model \
    "$TMP/model/"
  chmod u+w "$TMP/model"/*
}

generate() {
  timeout 10 "$TESSERA" generate --model "$TMP/model" \
    --prompt "Once upon a time" --temperature 0 --max-tokens 8 \
    >"$TMP/out" 2>"$TMP/err"
  RC=$?
}

# expect_refused NAME NEEDLE: generate on $TMP/model must fail cleanly with a
# message containing NEEDLE.
expect_refused() {
  local name="$1" needle="$2"
  generate
  if [ "$RC" -eq 124 ]; then
    fail "$name" "still running after 10 s (hung)"
  elif [ "$RC" -eq 0 ]; then
    fail "$name" "exit code 0 (stdout: $(head -c 300 "$TMP/out"))"
  elif [ "$RC" -ge 128 ]; then
    fail "$name" "exit code $RC: killed by a signal ($(head -c 300 "$TMP/err"))"
  elif ! grep -qF -- "$needle" "$TMP/err"; then
    fail "$name" "stderr lacks \"$needle\": $(head -c 500 "$TMP/err")"
  elif ! grep -q '^tessera: ' "$TMP/err"; then
    fail "$name" "no \"tessera: \" line: $(head -c 500 "$TMP/err")"
  else
    pass "$name"
  fi
}

# The unmodified copy works (so that every refusal below is the edit's).
fresh_model
generate
if [ "$RC" -ne 0 ] || ! grep -q '^Once upon a time' "$TMP/out"; then
  fail "unmodified demo model" "exit $RC: $(head -c 500 "$TMP/err")"
else
  pass "unmodified demo model"
fi

# A FIFO, then a directory, in place of each file the loader opens.
for file in config.json model.safetensors tokenizer.model; do
  fresh_model
  rm "$TMP/model/$file"
  mkfifo "$TMP/model/$file"
  expect_refused "FIFO $file" "$TMP/model/$file is a FIFO, not a regular file"
  fresh_model
  rm "$TMP/model/$file"
  mkdir "$TMP/model/$file"
  expect_refused "directory $file" "$TMP/model/$file is a directory"
done
# Optional files: present as FIFOs they are refused too, not skipped or read.
for file in generation_config.json tokenizer_config.json; do
  fresh_model
  mkfifo "$TMP/model/$file"
  expect_refused "FIFO $file" "$TMP/model/$file is a FIFO, not a regular file"
done

# The safetensors header-length field (8 bytes, little-endian) off by a few
# bytes: the demo header ends in 3 spaces of padding, so 1-3 short still
# parses; before, every tensor then loaded shifted and generate printed
# garbage with exit 0.
header_len=$(od -An -t u8 -N 8 "$DEMO/model.safetensors" | tr -d ' ')
for delta in -1 -2 -3 -4 1 2; do
  fresh_model
  n=$((header_len + delta))
  bytes=""
  for i in 0 1 2 3 4 5 6 7; do
    bytes="$bytes\\$(printf '%03o' $(((n >> (8 * i)) & 255)))"
  done
  printf "$bytes" | dd of="$TMP/model/model.safetensors" bs=1 count=8 \
    conv=notrunc status=none
  expect_refused "header length $delta" "$TMP/model/model.safetensors"
done

# config.json values out of range.
fresh_model
sed -i 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 4611686018427387904/' \
  "$TMP/model/config.json"
expect_refused "max_position_embeddings 2^62" \
  '"max_position_embeddings" is 4611686018427387904, more than the 2147483647 supported'
fresh_model
sed -i 's/"bos_token_id": *[0-9]*/"bos_token_id": 4294967296/' "$TMP/model/config.json"
expect_refused "bos_token_id 2^32" '"bos_token_id" holds token id 4294967296'
fresh_model
sed -i 's/"eos_token_id": *[0-9]*/"eos_token_id": 2147483648/' "$TMP/model/config.json"
expect_refused "eos_token_id 2^31" '"eos_token_id" holds token id 2147483648'

echo
if [ "$failures" -ne 0 ]; then
  echo "$failures of $cases cases FAILED"
  exit 1
fi
echo "all $cases cases passed"
