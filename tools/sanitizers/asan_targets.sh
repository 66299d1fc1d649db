#!/bin/bash
# Prints the tests a default CI run (.ci/run) runs under ASan+UBSan, one a line: every cc_test
# that is not tagged gpu (they only skip without a GPU) or slurm, that is every unit and golden
# test, new ones included, and the sh_tests listed in asan_tests.txt (the MPI layer's). Run from
# the workspace: bazel test --config=asan -- $(tools/sanitizers/asan_targets.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
query='kind(cc_test, tests(//...)) except attr(tags, "gpu|slurm", tests(//...))'
err=$(mktemp)
trap 'rm -f "$err"' EXIT
# Bazel's messages go to a file, shown only if the query fails (twice: a server that was just
# restarted by another command can refuse the first).
if ! bazel query --noshow_progress "$query" 2>"$err"; then
  sleep 5
  if ! bazel query --noshow_progress "$query" 2>>"$err"; then
    cat "$err" >&2
    exit 1
  fi
fi
grep -v '^#' tools/sanitizers/asan_tests.txt
