#!/bin/bash
# promtool_check.sh FILE: lints Prometheus text (GET /metrics, metrics_dump) with
# `promtool check metrics` and fails (exit 1, saying why) on any problem but the two that
# vLLM's names carry and dashboards need (runtime/serve/metrics.h, "Names"):
#   <vllm:name> metric names should not contain ':'
#   vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix
# A parse error is always a failure. So that the ':' findings hide nothing, a copy with
# "vllm:" written "vllm_" must lint clean too (but for that histogram's "_total").
# Exit 2: promtool is not installed (the caller decides whether that is a skip).
set -u
PROMTOOL="${PROMTOOL:-promtool}"
if ! command -v "$PROMTOOL" >/dev/null; then
  echo "promtool_check: $PROMTOOL not found (apt-get install prometheus)"
  exit 2
fi
in="$1"
out="$(mktemp)"
trap 'rm -f "$out" "$out.renamed"' EXIT

# lint FILE ALLOWED_REGEX: promtool must exit 0, or 3 (lint findings) with every finding
# matching ALLOWED_REGEX.
lint() {
  "$PROMTOOL" check metrics <"$1" >"$out" 2>&1
  local rc=$?
  if [[ $rc -ne 0 && $rc -ne 3 ]]; then
    echo "promtool_check: promtool failed (exit $rc) on $2:"
    cat "$out"
    return 1
  fi
  local bad
  bad="$(grep -v -E -- "$3" "$out")"
  if [[ -n "$bad" || ($rc -eq 3 && ! -s "$out") ]]; then
    echo "promtool_check: lint problems in $2:"
    echo "$bad"
    return 1
  fi
  return 0
}

iteration='^vllm[:_]iteration_tokens_total non-counter metrics should not have "_total" suffix$'
lint "$in" "the metrics" "^vllm:[a-zA-Z0-9_:]+ metric names should not contain ':'\$|$iteration" ||
  exit 1
sed 's/^\(# [A-Z]* \)\{0,1\}vllm:/\1vllm_/' "$in" >"$out.renamed"
if grep -q 'vllm:' "$out.renamed"; then
  echo "promtool_check: a vllm: name is left after renaming (in a label value?)"
  exit 1
fi
lint "$out.renamed" "the metrics with vllm: renamed vllm_" "$iteration" || exit 1
exit 0
