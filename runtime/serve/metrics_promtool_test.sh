#!/bin/bash
# Checks that MetricsRegistry::Render() output is valid Prometheus text format
# 0.0.4 and lint-clean: pipes //runtime/serve:metrics_dump into
# `promtool check metrics` and fails on any complaint (non-zero exit or any
# output). Skips (exit 0) when /usr/bin/promtool (Debian package
# `prometheus`) is not installed.
set -u

PROMTOOL="${PROMTOOL:-/usr/bin/promtool}"
if [[ ! -x "$PROMTOOL" ]]; then
  echo "SKIP: $PROMTOOL not found (apt-get install prometheus); nothing checked."
  exit 0
fi

RUNFILES="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
DUMP="$RUNFILES/tessera/runtime/serve/metrics_dump"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/metrics_promtool_test"
mkdir -p "$TMP"

if ! "$DUMP" >"$TMP/metrics.txt"; then
  echo "FAIL: $DUMP exited with status $?"
  exit 1
fi
if [[ ! -s "$TMP/metrics.txt" ]]; then
  echo "FAIL: metrics_dump printed nothing"
  exit 1
fi
# The dump must cover every kind, labels and escapes, or the check proves little.
for needle in '# TYPE .* counter$' '# TYPE .* gauge$' '# TYPE .* histogram$' \
    '_bucket{.*le="+Inf"}' '\\"' '\\\\' '\\n' ' NaN$' ' +Inf$' ' -Inf$'; do
  if ! grep -q -- "$needle" "$TMP/metrics.txt"; then
    echo "FAIL: the dump has no line matching /$needle/"
    exit 1
  fi
done

"$PROMTOOL" check metrics <"$TMP/metrics.txt" >"$TMP/promtool.out" 2>&1
rc=$?
if [[ $rc -ne 0 || -s "$TMP/promtool.out" ]]; then
  echo "FAIL: promtool check metrics (exit $rc):"
  cat "$TMP/promtool.out"
  echo "--- input ---"
  cat "$TMP/metrics.txt"
  exit 1
fi
echo "PASS: promtool check metrics accepted $(wc -l <"$TMP/metrics.txt") lines."
