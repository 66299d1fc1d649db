#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in a
# Bazel output base of their own (the main build's gcc cache is untouched),
# then runs each for FUZZ_SECONDS (default 20) over a scratch copy of its
# committed corpus (tests/fuzz/corpus/<target>). A crash, leak, timeout or
# sanitizer report fails the run; the input is left as crash-* in
# $FUZZ_OUT/<target> (default /tmp/tessera_fuzz): fix the bug, then commit the
# input under tests/fuzz/corpus/<target>/ so its corpus test keeps it fixed.
# Prints one line per target with libFuzzer's execution count. (Bazel links with the
# clang C driver, so the C++ part of the UBSan runtime is asked for by name.)
#   FUZZ_SECONDS=60 FUZZ_TARGETS="config_json tokenizer" bash tools/fuzz/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
CLANG=${CLANG:-clang-14}
command -v "$CLANG" >/dev/null || { echo "tools/fuzz/run.sh: $CLANG not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
SECONDS_EACH=${FUZZ_SECONDS:-20}
TARGETS=${FUZZ_TARGETS:-"config_json openai_request chat_template tokenizer safetensors_header structured_output"}
OUT=${FUZZ_OUT:-/tmp/tessera_fuzz}
OUTPUT_BASE=${FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel-tessera-fuzz}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
labels=()
for t in $TARGETS; do labels+=("//tests/fuzz:${t}_fuzzer"); done
# --symlink_prefix=/: no bazel-* links, so the workspace's links keep pointing at the gcc build's
# output base (links to this one would make `bazel query //...` there descend into them).
if ! bazel --output_base="$OUTPUT_BASE" build -c opt --symlink_prefix=/ \
  --repo_env=CC="$CLANG" --copt=-g --copt=-fno-omit-frame-pointer \
  --copt=-fsanitize=fuzzer-no-link $(for f in $SAN; do echo "--copt=$f --linkopt=$f"; done) \
  --linkopt=-fsanitize-link-c++-runtime \
  "${labels[@]}" >"$OUT.build.log" 2>&1; then
  echo "tools/fuzz/run.sh: the clang build failed (see $OUT.build.log)" >&2
  tail -20 "$OUT.build.log" >&2
  exit 1
fi
bin=$(bazel --output_base="$OUTPUT_BASE" info -c opt --repo_env=CC="$CLANG" bazel-bin 2>/dev/null)
failed=0
for t in $TARGETS; do
  dir="$OUT/$t"
  rm -rf "$dir" && mkdir -p "$dir/corpus"
  cp -r "tests/fuzz/corpus/$t/." "$dir/corpus/"
  log="$dir/fuzz.log"
  (cd "$dir" && TEST_TMPDIR="$dir" UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin/tests/fuzz/${t}_fuzzer" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 corpus >"$log" 2>&1)
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  [ -z "$execs" ] && execs=$(grep -Eo '#[0-9]+' "$log" | tail -1 | tr -d '#')
  if [ $rc -ne 0 ]; then
    failed=$((failed + 1))
    echo "FAIL: $t (exit $rc; $(ls "$dir" | grep -E '^(crash|leak|timeout|oom)-' | head -3 | tr '\n' ' ')see $log)"
    grep -E "ERROR|runtime error|SUMMARY" "$log" | head -5
  else
    echo "PASS: $t, ${execs:-?} executions in ${SECONDS_EACH} s"
  fi
done
exit $failed
