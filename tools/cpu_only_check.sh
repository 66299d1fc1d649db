#!/bin/bash
# README command 1's build path on a machine without CUDA, as CI checks it (.ci/run runs this as
# its own suite): the working tree (tracked and untracked files git does not ignore) is copied
# to $CPU_ONLY_DIR/tessera, with ../shared beside it, and there, with the CUDA toolkit hidden
# (TESSERA_CUDA_PATH=/nonexistent, which third_party/cuda_configure.bzl honours):
#
#   demo             bash tools/demo.sh, README command 1 (setup, `bazel build //launch:tessera`,
#                    the story on the CPU), exits 0 and tells a story;
#   device-cuda      `tessera generate --device cuda` fails at once, in one line saying the
#                    binary was built without CUDA and where the toolkit was looked for;
#   analysis         `bazel build --nobuild //...`: every target of the tree analyses without
#                    CUDA (none still names @cuda's libraries; the CUDA ones are left out);
#   backend-test     //kernels/backend:backend_test, the no-CUDA half of the backend.
#
# Each check prints PASS: or FAIL:; the exit status is the number of failures. The copy has an
# output base of its own (Bazel's, for its path: the main tree's bazel-* links and build are
# untouched), whose server is shut down at the end; the disk cache of ~/.bazelrc is shared, so
# after the first run only what changed is rebuilt. Measured on 2 shared cores: 12 s again with
# its output base in place, 35 s with a fresh one (a new CI machine's clone, disk cache warm);
# a change to a header under the backend rebuilds its dependents once (about a minute more).
#   CPU_ONLY_DIR=/tmp/x bash tools/cpu_only_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
shared=$(cd ../shared 2>/dev/null && pwd) || {
  echo "FAIL: setup (no ../shared beside $src)"
  exit 1
}
dir=${CPU_ONLY_DIR:-$HOME/.cache/tessera-cpu-only}
work="$dir/tessera"
log="$dir/log"
failed=0
pass() { echo "PASS: $1"; }
fail() {
  echo "FAIL: $1"
  failed=$((failed + 1))
}

rm -rf "$work" "$log" && mkdir -p "$work" "$log" || {
  echo "FAIL: setup (cannot write $dir)"
  exit 1
}
ln -sfn "$shared" "$dir/shared"
# Files deleted in the tree but still tracked are skipped (--ignore-failed-read).
git ls-files -z --cached --others --exclude-standard |
  tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$work" || {
  echo "FAIL: setup (copying the tree to $work)"
  exit 1
}

cd "$work" || exit 1
export TESSERA_CUDA_PATH=/nonexistent
unset CUDA_PATH
start=$SECONDS
# README command 1 itself; the CUDA note of setup.sh names the hidden path.
# The story is stdout's line that starts with the prompt (setup.sh's notes come before it).
if bash tools/demo.sh >"$log/demo.out" 2>"$log/demo.err" &&
  story=$(grep -m1 '^Once upon a time' "$log/demo.out") && (($(wc -w <<<"$story") >= 20)) &&
  grep -q "no CUDA toolkit at /nonexistent" "$log/demo.out"; then
  pass "demo: README command 1 without CUDA, $(wc -w <<<"$story") words ($((SECONDS - start)) s)"
else
  fail "demo: README command 1 without CUDA (see $log/demo.err)"
  tail -20 "$log/demo.err"
fi

want="tessera: --device cuda: this tessera was built without CUDA (no CUDA toolkit found at /nonexistent when it was built; install CUDA 13, or set TESSERA_CUDA_PATH to it, and rebuild)"
bazel-bin/launch/tessera generate --model ../shared/models/stories260K --prompt "Once upon a time" \
  --max-tokens 8 --device cuda >"$log/cuda.out" 2>"$log/cuda.err"
rc=$?
if [[ $rc -ne 0 && "$(cat "$log/cuda.err")" == "$want" && ! -s "$log/cuda.out" ]]; then
  pass "device-cuda: exit $rc, \"$want\""
else
  fail "device-cuda: exit $rc, stderr:"
  cat "$log/cuda.err"
fi

if bazel build --nobuild //... >"$log/analysis.log" 2>&1; then
  pass "analysis: bazel build --nobuild //... without CUDA"
else
  fail "analysis: bazel build --nobuild //... without CUDA:"
  grep -E "ERROR" "$log/analysis.log" | head -10
fi

if bazel test --test_output=errors //kernels/backend:backend_test >"$log/backend_test.log" 2>&1; then
  pass "backend-test: //kernels/backend:backend_test without CUDA"
else
  fail "backend-test: //kernels/backend:backend_test without CUDA:"
  tail -30 "$log/backend_test.log"
fi

bazel shutdown >/dev/null 2>&1
echo "cpu-only: $((SECONDS - start)) s"
exit "$failed"
