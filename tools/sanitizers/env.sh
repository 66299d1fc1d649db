#!/bin/bash
# `--run_under` wrapper of --config=asan / --config=tsan (.bazelrc): runs the test with the
# sanitizer options and this folder's suppression files. Bazel's --test_env cannot name a file of
# the workspace, so the options are set here, where the files' runfiles path is known. Child
# processes (the tessera binary of sh_tests, mpirun's ranks) inherit them.
# Every suppression names third-party code only; docs/RELIABILITY.md ("Sanitizers") says why.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
# fast_unwind_on_malloc=0: Open MPI is built without frame pointers, and only the slow unwinder
# reaches the frame naming libmpi/libopen-pal in its leak stacks (lsan.supp). It makes every
# malloc several times dearer (chat_template_test's runaway templates: over 300 s instead of
# 134 s), so it is used only where Open MPI can be in the process: a test binary that links
# libmpi, and every sh_test (they start mpirun and tessera). Elsewhere the fast unwinder only
# shortens the allocation stacks of a report; nothing to suppress is there.
unwind=0
if [[ -f "$1" && "$(head -c 4 "$1" | tail -c 3)" == ELF ]] &&
  ! readelf -d "$1" 2>/dev/null | grep -q 'NEEDED.*libmpi'; then
  unwind=1
fi
# Options a caller set (e.g. ASAN_OPTIONS=detect_leaks=0) come after ours and so win.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:fast_unwind_on_malloc=${unwind}${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$dir/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="suppressions=$dir/ubsan.supp:print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export TSAN_OPTIONS="suppressions=$dir/tsan.supp:halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
exec "$@"
