#!/bin/bash
# The rank-fault matrix for `tessera generate` (parallel/fault_monitor.h; docs/RELIABILITY.md,
# "Rank faults"): SIGKILL and SIGSTOP of rank 1, the last rank and rank 0, while the job loads,
# prefills or decodes, under mpirun -np 2 (--tp 2, --pp 2) and -np 4 (--tp 2 --pp 2, --tp 4).
# Usage: mpi_fault_matrix_test.sh PHASE NP (one Bazel target per pair, so they run in parallel).
#
# Every case asserts: every process of the job is gone within the bound (the limit in force, as
# the fault line states it, + the issue's 10 s; docs/RELIABILITY.md says what fills them), mpirun
# exits non-zero, and a line names the rank: for SIGSTOP ours, "tessera: rank R (host H, tp T,
# stage S) stopped responding" (rank 0 prints it for a worker, a worker for rank 0); for SIGKILL
# ours or Open MPI's ("process rank R with PID ... exited on signal 9").
#
# Phases, and how each case knows it hit the phase:
#   load:    TESSERA_TEST_LOAD_DELAY_MS (test-only, parallel/worker.cc) makes each weight part
#            take 400 ms; the signal goes after the hook's line, and the startup log ("grid:",
#            printed once every rank has loaded) must never appear. --startup-timeout 3.
#            Weights alternate between --weights rank0 (rank 0 sends) and --weights local.
#   prefill: 128 prompts of ~450 tokens, --max-tokens 1, --max-num-batched-tokens 16, no prefix
#            cache: every step of the job is a prefill chunk (there is no decode step at all).
#   decode:  128 short prompts, 450 tokens each in waves of 8: after the first step every step
#            is a decode step (the first wave's prompts are prefilled in one step).
set -u
PHASE="$1"
NP="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
RUNFILES="${TEST_SRCDIR:-$PWD/..}"
TESSERA="$RUNFILES/tessera/launch/tessera"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/mpi_fault_matrix_${PHASE}_$NP"
mkdir -p "$TMP"
# Open MPI names its session directory (PMIx's shared-memory store is in it) and the vader BTL
# its /dev/shm segments after mpirun's pid, and Bazel's sandboxes give concurrent tests the same
# small pids: two of these targets at once then share them and fail in MPI_Init ("PMIX ERROR ...
# dstore", "unable to reach each other") or crash in mca_btl_vader. A short directory of our own
# for both (unix socket paths must stay under 108 bytes, TEST_TMPDIR is longer).
MPI_TMP=$(mktemp -d /tmp/tessera-mpi.XXXXXX)
export TMPDIR="$MPI_TMP" OMPI_MCA_btl_vader_backing_directory="$MPI_TMP"
trap 'rm -rf "$MPI_TMP"' EXIT
STEP_TIMEOUT=2
STARTUP_TIMEOUT=3
GRACE=2
failures=0

PROMPTS="$TMP/prompts.jsonl"
case "$PHASE" in
  load)
    LIMIT=$STARTUP_TIMEOUT
    for i in $(seq 8); do echo '{"prompt": "Once upon a time"}'; done >"$PROMPTS"
    FLAGS=(--max-tokens 20 --startup-timeout "$STARTUP_TIMEOUT")
    ;;
  prefill)
    LIMIT=$STEP_TIMEOUT
    long=$(printf 'Once upon a time there was a little girl named Lily who loved to play in the %s' \
      'park with her dog. ' | sed 's/.*/&&&&&&&&&&&&&&&/')
    for i in $(seq 128); do echo "{\"prompt\": \"$long\"}"; done >"$PROMPTS"
    FLAGS=(--max-tokens 1 --max-num-batched-tokens 16 --max-num-seqs 8 --no-prefix-cache)
    ;;
  decode)
    LIMIT=$STEP_TIMEOUT
    for i in $(seq 128); do echo '{"prompt": "Once upon a time"}'; done >"$PROMPTS"
    FLAGS=(--max-tokens 450 --temperature 1 --seed 3 --max-num-seqs 8)
    ;;
  *)
    echo "unknown phase $PHASE"
    exit 2
    ;;
esac
# The issue's bound: 10 s past the limit in force. Within it: the fault round (GRACE) or, for a
# stopped rank 0, a worker's wait for rank 0 to end the job (2 x GRACE + 1 s + stagger).
BOUND=$((LIMIT + 10))

# The pid of the tessera process of this job with OMPI_COMM_WORLD_RANK=$2 (children of $1).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}

# Whether process $1 still exists and is not a zombie (one read of its state: a process reaped
# between two looks is gone).
rank_alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null)
  [ -n "$state" ] && [ "${state:0:1}" != Z ]
}

wait_for() {  # pattern, tenths of a second
  local waited=0
  until grep -q "$1" "$TMP/err" 2>/dev/null || [ $waited -ge "$2" ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  grep -q "$1" "$TMP/err" 2>/dev/null
}

run_case() {  # signal, rank, weights mode, layout flags...
  local sig="$1" victim="$2" weights="$3"
  shift 3
  local name="$PHASE -np $NP: SIG$sig rank $victim $* --weights $weights"
  local delay=0
  [ "$PHASE" = load ] && delay=400
  : >"$TMP/err"
  TESSERA_TEST_LOAD_DELAY_MS=$delay timeout -k 5 120 mpirun -np "$NP" --bind-to none \
    -x TESSERA_TEST_LOAD_DELAY_MS "$TESSERA" generate --model "$DEMO" \
    --prompts-file "$PROMPTS" --step-timeout "$STEP_TIMEOUT" --weights "$weights" \
    "${FLAGS[@]}" "$@" >"$TMP/out" 2>"$TMP/err" &
  local job=$!
  # Every rank's pid first (the ranks are mpirun's children, mpirun is timeout's), so that the
  # signal follows the phase's evidence at once, even on a loaded machine.
  local pid="" child="" r p ranks=() tries=0
  while [ ${#ranks[@]} -lt "$NP" ] && [ $tries -lt 600 ] && kill -0 "$job" 2>/dev/null; do
    ranks=()
    [ -z "$child" ] && child=$(pgrep -P "$job" | head -n 1)
    if [ -n "$child" ]; then
      for r in $(seq 0 $((NP - 1))); do
        p=$(rank_pid "$child" "$r")
        [ -n "$p" ] && ranks+=("$p")
        [ "$r" = "$victim" ] && pid="$p"
      done
    fi
    [ ${#ranks[@]} -lt "$NP" ] && sleep 0.1
    tries=$((tries + 1))
  done
  local ready=1
  if [ "$PHASE" = load ]; then
    wait_for "^tessera: test hook: rank" 600 || ready=0
    grep -q "grid:" "$TMP/err" && ready=0
  else
    wait_for "grid:" 600 || ready=0
    sleep 1
  fi
  if [ $ready = 0 ] || [ -z "$pid" ] || [ ${#ranks[@]} -lt "$NP" ] || ! kill -0 "$job" 2>/dev/null; then
    failures=$((failures + 1))
    echo "FAIL: $name: not in the $PHASE phase, or no rank $victim process to signal"
    head -c 1500 "$TMP/err"
    kill "$job" 2>/dev/null
    wait "$job"
    return
  fi
  local t0 t1 rc took
  t0=$(date +%s.%N)
  kill -"$sig" "$pid"
  wait "$job"
  rc=$?
  # The time until every rank process is gone too (mpirun may exit while one is still being
  # torn down).
  local alive=1 gone_by
  gone_by=$(echo "$t0 + 10 * $STEP_TIMEOUT + 10" | bc)
  while [ $alive = 1 ] && [ "$(echo "$(date +%s.%N) < $gone_by" | bc)" = 1 ]; do
    alive=0
    for p in "${ranks[@]}"; do
      rank_alive "$p" && alive=1
    done
    [ $alive = 1 ] && sleep 0.05
  done
  t1=$(date +%s.%N)
  took=$(printf '%.1f' "$(echo "$t1 - $t0" | bc)")
  local ok=1 line lines bound=$BOUND limit
  # A stall is found at the limit in force, which the line states: a step's is adaptive (the
  # first step's is 10 x --step-timeout, a later one 4 x the longest step so far, which a loaded
  # machine stretches), so the bound is 10 s past it; the limit itself must stay within the
  # first step's 10 x.
  if [ "$sig" = STOP ] && [ "$PHASE" != load ]; then
    limit=$(grep -o -m 1 "its limit of [0-9.]* s" "$TMP/err" | grep -o "[0-9.]*" | head -n 1)
    if [ -n "$limit" ]; then
      bound=$(echo "$limit + 10" | bc)
      [ "$(echo "$limit <= 10 * $STEP_TIMEOUT" | bc)" = 1 ] ||
        { ok=0; echo "  a limit of $limit s, above 10 x --step-timeout"; }
    fi
  fi
  [ "$rc" -ne 0 ] || { ok=0; echo "  exit code 0"; }
  [ "$(echo "$took < $bound" | bc)" = 1 ] || { ok=0; echo "  took $took s (bound $bound s)"; }
  if [ "$sig" = STOP ]; then
    line=$(grep -m 1 "^tessera: rank $victim (host [^,]*, tp [0-9]*, stage [0-9]*) stopped responding" \
      "$TMP/err")
    [ -n "$line" ] || { ok=0; echo "  no line names rank $victim"; }
    # One line: rank 0's, or (rank 0 stopped) the first worker's.
    lines=$(grep -c "^tessera: .* stopped responding\|^tessera: .* is stuck" "$TMP/err")
    [ "$lines" = 1 ] || { ok=0; echo "  $lines fault lines, not one"; }
    if [ "$PHASE" = load ] && ! echo "$line" | grep -q "startup ("; then
      ok=0
      echo "  the line does not name a startup phase"
    fi
  else
    line=$(grep -m 1 "process rank $victim with PID\|^tessera: rank $victim " "$TMP/err")
    [ -n "$line" ] || { ok=0; echo "  no line names rank $victim"; }
  fi
  if [ "$PHASE" = load ] && grep -q "grid:" "$TMP/err"; then
    ok=0
    echo "  the job finished loading: the fault did not hit the load"
  fi
  # Nothing of the job may survive it.
  if [ $alive = 1 ]; then
    ok=0
    for p in "${ranks[@]}"; do
      if rank_alive "$p"; then
        echo "  rank process $p left behind"
        kill -KILL "$p" 2>/dev/null
      fi
    done
  fi
  kill -CONT "$pid" 2>/dev/null
  if [ $ok = 1 ]; then
    echo "PASS: $name: exit $rc after $took s (bound $bound s): ${line:0:240}"
  else
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc after $took s (bound $bound s)"
    grep -v "^\[tessera\]" "$TMP/err" | head -c 2000
  fi
}

# SIGSTOP of rank 1 as soon as its process exists: usually inside MPI_Init, where nothing can be
# polled (StartupGuard: every other rank exits after max(--startup-timeout, 10 s), naming
# itself), or just after (the startup deadline names rank 1). Asserts that limit + 10 s, a
# non-zero exit and either line.
GUARD_LIMIT=$((STARTUP_TIMEOUT > 10 ? STARTUP_TIMEOUT : 10))
early_case() {  # layout flags...
  local name="start -np $NP: SIGSTOP rank 1 at exec $*"
  : >"$TMP/err"
  timeout -k 5 120 mpirun -np "$NP" --bind-to none "$TESSERA" generate --model "$DEMO" \
    --prompts-file "$PROMPTS" --step-timeout "$STEP_TIMEOUT" "${FLAGS[@]}" "$@" \
    >"$TMP/out" 2>"$TMP/err" &
  local job=$! pid="" child="" waited=0 p
  while [ -z "$pid" ] && [ $waited -lt 2000 ]; do
    [ -z "$child" ] && child=$(pgrep -P "$job" | head -n 1)
    [ -n "$child" ] && pid=$(rank_pid "$child" 1)
    waited=$((waited + 1))
  done
  if [ -z "$pid" ]; then
    failures=$((failures + 1))
    echo "FAIL: $name: no rank 1 process"
    kill "$job" 2>/dev/null
    wait "$job"
    return
  fi
  local t0 rc took line ok=1 bound=$((GUARD_LIMIT + 10))
  kill -STOP "$pid"
  t0=$(date +%s.%N)
  wait "$job"
  rc=$?
  took=$(printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)")
  kill -CONT "$pid" 2>/dev/null
  line=$(grep -m 1 "^tessera: rank [0-9]* (host [^)]*) did not finish starting MPI\|^tessera: rank 1 (host [^,]*, tp [0-9]*, stage [0-9]*) stopped responding" "$TMP/err")
  [ "$rc" -ne 0 ] || { ok=0; echo "  exit code 0"; }
  [ "$(echo "$took < $bound" | bc)" = 1 ] || { ok=0; echo "  took $took s (bound $bound s)"; }
  [ -n "$line" ] || { ok=0; echo "  no line"; }
  if [ $ok = 1 ]; then
    echo "PASS: $name: exit $rc after $took s (bound $bound s): ${line:0:240}"
  else
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc after $took s (bound $bound s)"
    grep -v "^\[tessera\]" "$TMP/err" | head -c 2000
  fi
}

# Each (signal, victim, phase) at both sizes, the layouts and weight modes alternating. At -np 2
# the last rank is rank 1; decode at -np 2 adds rank 0 to tests/mpi_fault_test.sh's cases.
case "$PHASE/$NP" in
  load/2)
    # The flag's range (no MPI needed: it is checked before anything starts).
    if "$TESSERA" generate --model "$DEMO" --prompt hi --startup-timeout -1 >"$TMP/out" \
      2>"$TMP/err" || ! grep -q -- "--startup-timeout must be in \[0, 86400\]" "$TMP/err"; then
      failures=$((failures + 1))
      echo "FAIL: --startup-timeout -1 is not refused"
      cat "$TMP/err"
    fi
    run_case STOP 1 rank0 --tp 2
    run_case STOP 0 local --pp 2
    run_case KILL 1 local --pp 2
    run_case KILL 0 rank0 --tp 2
    early_case --tp 2
    ;;
  load/4)
    run_case STOP 1 rank0 --tp 4
    run_case STOP 3 local --tp 2 --pp 2
    run_case STOP 0 rank0 --tp 2 --pp 2
    run_case KILL 1 local --tp 2 --pp 2
    run_case KILL 3 rank0 --tp 4
    run_case KILL 0 local --tp 4
    early_case --tp 2 --pp 2
    ;;
  prefill/2)
    run_case STOP 1 rank0 --pp 2
    run_case STOP 0 rank0 --tp 2
    run_case KILL 1 rank0 --tp 2
    run_case KILL 0 rank0 --pp 2
    ;;
  decode/2)
    run_case STOP 0 rank0 --tp 2
    run_case KILL 0 rank0 --tp 2
    ;;
  prefill/4)
    run_case STOP 1 rank0 --tp 2 --pp 2
    run_case STOP 3 rank0 --tp 4
    run_case STOP 0 rank0 --tp 4
    run_case KILL 1 rank0 --tp 4
    run_case KILL 3 rank0 --tp 2 --pp 2
    run_case KILL 0 rank0 --tp 2 --pp 2
    ;;
  decode/4)
    run_case STOP 1 rank0 --tp 4
    run_case STOP 3 rank0 --tp 2 --pp 2
    run_case STOP 0 rank0 --tp 2 --pp 2
    run_case KILL 1 rank0 --tp 2 --pp 2
    run_case KILL 3 rank0 --tp 4
    run_case KILL 0 rank0 --tp 4
    ;;
  *)
    echo "no cases for $PHASE at -np $NP"
    exit 2
    ;;
esac

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all $PHASE -np $NP fault cases passed"
