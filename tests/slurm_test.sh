#!/bin/bash
# Tessera under a real Slurm: starts a private one-node cluster (munged, slurmctld, slurmd; see
# tests/testing/slurm_cluster.sh), then checks that
#   - `srun -n 2 --mpi=pmix tessera generate --tp 2` and `--pp 2` give exactly the output_ids of
#     one process for several prompts (greedy),
#   - launch/tessera.sbatch, submitted with `sbatch --wait -N 1 -n 2`, gives them too and
#     prints its header, and a job tessera refuses (--tp 3 on 2 tasks) fails the sbatch with
#     tessera's one error line, without hanging.
# Every daemon and job is stopped by PID at exit, pass or fail. Needs root and the Slurm and
# munge packages of tools/setup.sh; fails (never skips) without them.
#
# Runs outside Bazel's sandbox (tags no-sandbox, exclusive): slurmctld and slurmd call
# setgroups(), which the linux-sandbox's user namespace refuses. Everything the cluster writes
# is under one /tmp/tslurm.XXXXXX directory (short: UNIX socket paths), removed at exit.
#
# Open MPI needs no OMPI_MCA_* / OMPI_ALLOW_RUN_AS_ROOT under srun (those are mpirun's): srun's
# pmix plugin is the PMIx server that MPI_Init connects to.
set -u
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
RUNFILES="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
TESSERA="$RUNFILES/tessera/launch/tessera"
SBATCH_SCRIPT="$RUNFILES/tessera/launch/tessera.sbatch"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/slurm_test"
rm -rf "$TMP"
mkdir -p "$TMP"
failures=0
cases=0
start=$SECONDS

# shellcheck source=tests/testing/slurm_cluster.sh
source "$RUNFILES/tessera/tests/testing/slurm_cluster.sh"
trap slurm_cluster_stop EXIT
# Bazel's timeout sends SIGTERM: still run the EXIT trap. Bash runs a trap only once the
# foreground command has finished, so long commands run in the background under `bounded`,
# whose `wait` a signal interrupts at once.
trap 'exit 143' TERM INT
bounded() {  # seconds, command...: the command's exit status, 124 when it ran too long
  timeout "$@" &
  wait $!
}

if ! slurm_cluster_start; then
  echo "FAIL: could not start the Slurm cluster"
  exit 1
fi
echo "PASS: one-node Slurm cluster up after $((SECONDS - start)) s"

fail() {  # name, message; then details from the named files
  local name="$1" msg="$2" f
  shift 2
  failures=$((failures + 1))
  echo "FAIL: $name: $msg"
  for f in "$@"; do
    [[ -s "$f" ]] && { echo "--- $(basename "$f"):"; head -c 1500 "$f"; echo; }
  done
}

# The reference: one process, no launcher.
printf '%s\n' '{"prompt": "Once upon a time"}' '{"prompt": "Lily and Ben"}' \
  '{"prompt": "One day"}' '{"prompt": "The little dog"}' >"$TMP/prompts.jsonl"
GEN=(generate --model "$DEMO" --prompts-file "$TMP/prompts.jsonl" --max-tokens 32
  --temperature 0 --output json)
cases=$((cases + 1))
bounded 60 "$TESSERA" "${GEN[@]}" >"$TMP/ref.out" 2>"$TMP/ref.err"
rc=$?
grep -o '"output_ids":\[[0-9,]*\]' "$TMP/ref.out" >"$TMP/want"
if [[ $rc -ne 0 || $(wc -l <"$TMP/want") -ne 4 ]]; then
  fail "single-process reference" "exit $rc, $(wc -l <"$TMP/want") output_ids lines (want 4)" \
    "$TMP/ref.out" "$TMP/ref.err"
  exit 1
fi
echo "PASS: single-process reference (4 prompts)"

# PASS when the job (exit status $3) ended well and the output_ids in its stdout ($2) are the
# reference's; else FAIL with the job's output and the other named files.
check_ids() {  # name, stdout file, exit status, more files to show on failure...
  local name="$1" out="$2" rc="$3"
  shift 3
  grep -o '"output_ids":\[[0-9,]*\]' "$out" >"$TMP/got"
  if [[ $rc -eq 124 ]]; then
    fail "$name" "timed out" "$out" "$@"
  elif [[ $rc -ne 0 ]]; then
    fail "$name" "exit $rc" "$out" "$@"
  elif ! cmp -s "$TMP/got" "$TMP/want"; then
    fail "$name" "output_ids differ from one process's" "$out" "$@"
    diff "$TMP/want" "$TMP/got" | head -6
  else
    echo "PASS: $name"
    return 0
  fi
  return 1
}

# (a) srun -n 2: tensor parallel, pipeline parallel, and pipeline with local weights.
for layout in "--tp 2" "--pp 2" "--pp 2 --weights local"; do
  cases=$((cases + 1))
  # shellcheck disable=SC2086
  bounded 90 srun -n 2 --immediate=60 --mpi=pmix --kill-on-bad-exit=1 "$TESSERA" "${GEN[@]}" \
    $layout >"$TMP/srun.out" 2>"$TMP/srun.err"
  check_ids "srun -n 2 $layout" "$TMP/srun.out" $? "$TMP/srun.err"
done

# (b) launch/tessera.sbatch. -n 2 with --ntasks-per-node 2: the script's default of 8 tasks per
# node does not fit this node's CPUs (see the script). No --gpus-per-node: CPU-only cluster.
export TESSERA
run_sbatch() {  # output file, tessera args...
  local out="$1"
  shift
  bounded 120 sbatch --wait --quiet -N 1 -n 2 --ntasks-per-node 2 --time 5 \
    --job-name "tessera-test" --output "$out" "$SBATCH_SCRIPT" "$@" >"$TMP/sbatch.err" 2>&1
}

cases=$((cases + 1))
run_sbatch "$TMP/job_tp.out" "${GEN[@]}" --tp 2
rc=$?
if check_ids "sbatch tessera.sbatch -N 1 -n 2 generate --tp 2" "$TMP/job_tp.out" "$rc" \
  "$TMP/sbatch.err"; then
  cases=$((cases + 1))
  if grep -q '^tessera.sbatch: job [0-9]* (tessera-test) on 1 node(s) .*2 task(s)' \
    "$TMP/job_tp.out" && grep -qx "tessera.sbatch: rank 0 on $(hostname -s)" "$TMP/job_tp.out"; then
    echo "PASS: sbatch header"
  else
    fail "sbatch header" "no 'tessera.sbatch: job N (tessera-test) on 1 node(s) ... 2 task(s)' \
or no 'tessera.sbatch: rank 0 on $(hostname -s)'" "$TMP/job_tp.out"
  fi
fi

cases=$((cases + 1))
run_sbatch "$TMP/job_pp.out" "${GEN[@]}" --pp 2
check_ids "sbatch tessera.sbatch -N 1 -n 2 generate --pp 2" "$TMP/job_pp.out" $? "$TMP/sbatch.err"

# A job tessera refuses: sbatch --wait exits non-zero, the job's output has tessera's error.
cases=$((cases + 1))
run_sbatch "$TMP/job_bad.out" "${GEN[@]}" --tp 3
rc=$?
if [[ $rc -eq 0 || $rc -eq 124 ]] ||
  ! grep -q '^tessera: the job has 2 ranks but tp × pp = 3 × 1 = 3' "$TMP/job_bad.out"; then
  fail "sbatch of a refused job (--tp 3 on 2 tasks)" "exit $rc" "$TMP/job_bad.out" \
    "$TMP/sbatch.err"
else
  echo "PASS: sbatch of a refused job (--tp 3 on 2 tasks) fails with tessera's error (exit $rc)"
fi

# (c) scancel while `srun -n 2 tessera serve --tp 2` streams: Slurm sends every task SIGTERM,
# then SIGKILL after KillWait (5 s in this cluster). Rank 0 stops accepting, lets requests
# finish for --drain-timeout 0.5 s (inside KillWait), aborts the rest with an error each
# client sees, and the job ends before the kill. Sixteen requests of 480 tokens, one at a time:
# seconds of work even on a fast machine.
cases=$((cases + 1))
timeout 90 srun -n 2 --immediate=60 --mpi=pmix --kill-on-bad-exit=1 --job-name tessera-serve \
  "$TESSERA" serve --model "$DEMO" --port 0 --tp 2 --max-num-seqs 1 --drain-timeout 0.5 \
  >"$TMP/serve.out" 2>"$TMP/serve.err" &
srun_pid=$!
port=""
for _ in $(seq 1 600); do
  port=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/serve.err" | head -n 1 | cut -d: -f3)
  [[ -n "$port" ]] && break
  sleep 0.1
done
if [[ -z "$port" ]]; then
  fail "scancel of srun serve" "the server did not start" "$TMP/serve.err"
  kill "$srun_pid" 2>/dev/null
else
  clients=()
  for i in $(seq 16); do
    curl -sN -m 60 -w '\n%{http_code}' "http://127.0.0.1:$port/v1/completions" -d '{"model":
      "stories260K", "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": true,
      "stream": true}' >"$TMP/scancel_stream$i" 2>/dev/null &
    clients+=($!)
  done
  for _ in $(seq 1 300); do
    cat "$TMP"/scancel_stream* 2>/dev/null | grep -q '"text_completion"' && break
    sleep 0.02
  done
  t0=$SECONDS
  timeout 10 scancel --name tessera-serve
  wait "$srun_pid"
  took=$((SECONDS - t0))
  wait "${clients[@]}"  # Not a bare wait: the cluster's daemons are children too.
  python3 "$RUNFILES/tessera/tests/sse_check.py" "$TMP"/scancel_stream* >"$TMP/scancel.ends"
  summary=$(cut -d' ' -f1 "$TMP/scancel.ends" | sort | uniq -c | tr -s ' \n' ' ')
  if grep -q '^cut\|^bad' "$TMP/scancel.ends"; then
    fail "scancel of srun serve" "a response ended without a word: $summary" "$TMP/serve.err"
  elif ! grep -q '^\(error [0-9]*\|http 503\) the server is shutting down (SIGTERM) and aborted this request: it did not finish within the 0.5 s drain timeout' "$TMP/scancel.ends"; then
    fail "scancel of srun serve" "no client was told of the abort: $summary" "$TMP/serve.err"
  elif ! grep -q 'SIGTERM: not accepting requests' "$TMP/serve.err" || ((took >= 5)); then
    fail "scancel of srun serve" "no drain, or it ran into KillWait ($took s)" "$TMP/serve.err"
  else
    echo "PASS: scancel of srun serve: drained and ended in $took s; clients: $summary"
  fi
fi

# No job may be left behind in the queue. A finished job stays COMPLETING
# while slurmd cleans up its step (seconds on a loaded machine), so that state
# is waited out, for up to 30 s; any other state left is a failure.
cases=$((cases + 1))
for _ in $(seq 30); do
  left=$(timeout 10 squeue -h -o '%i %j %T' 2>&1)
  # Done when empty, or when something is left in another state.
  if [[ -z "$left" ]] || grep -qv ' COMPLETING$' <<<"$left"; then break; fi
  sleep 1
done
if [[ -n "$left" ]]; then
  fail "empty queue at the end" "$left"
else
  echo "PASS: empty queue at the end"
fi

echo "$((cases - failures)) of $cases cases passed in $((SECONDS - start)) s"
if [[ "$failures" -ne 0 ]]; then
  timeout 10 scontrol show node
  slurm_cluster_dump_logs
fi
[[ "$failures" -eq 0 ]]
