#!/bin/bash
# Prints the tests a default CI run (.ci/run) runs under ASan+UBSan, one a line: every cc_test
# that is not tagged gpu (they only skip without a GPU) or slurm, that is every unit and golden
# test, new ones included, and the sh_tests listed in asan_tests.txt (the MPI layer's). Run from
# the workspace: bazel test --config=asan -- $(tools/sanitizers/asan_targets.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel query --noshow_progress \
  'kind(cc_test, tests(//...)) except attr(tags, "gpu|slurm", tests(//...))' 2>/dev/null
grep -v '^#' tools/sanitizers/asan_tests.txt
