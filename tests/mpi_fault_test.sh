#!/bin/bash
# Rank faults end the job (parallel/fault_monitor.h): under mpirun -np 2 at --tp 2 and --pp 2,
# `tessera generate` is decoding when one rank is stopped (SIGSTOP) or killed (SIGKILL). Every
# process must be gone within the bound (step timeout + grace + 10 s), the exit code must be
# non-zero, and for a stop the line "tessera: rank R (host H, tp T, stage S) stopped responding"
# must name the stopped rank (rank 0 prints it for a stalled worker; a worker prints it for a
# stalled rank 0). A kill is Open MPI's to notice; its line names the rank. Serve: /health turns
# 503 after the stall, and an idle server survives past the step limit (heartbeats).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI names its session directory and the vader BTL's /dev/shm segments after mpirun's pid,
# and Bazel's sandboxes give concurrent tests the same small pids: a short directory of this
# test's own for both (unix socket paths must stay under 108 bytes; TEST_TMPDIR is longer).
MPI_TMP=$(mktemp -d /tmp/tessera-mpi.XXXXXX)
export TMPDIR="$MPI_TMP" OMPI_MCA_btl_vader_backing_directory="$MPI_TMP"
trap 'rm -rf "$MPI_TMP"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
RUNFILES="${TEST_SRCDIR:-$PWD/..}"
TESSERA="$RUNFILES/tessera/launch/tessera"
DEMO="$RUNFILES/shared/models/stories260K"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/mpi_fault"
mkdir -p "$TMP"
STEP_TIMEOUT=2
BOUND=$((STEP_TIMEOUT + 2 + 10))  # timeout + fault-round grace + the issue's 10 s.
failures=0
# 128 prompts in waves of 8 (--max-num-seqs below): tens of seconds of decode, so a fast
# machine cannot finish the job before the fault is injected.
for i in $(seq 128); do echo '{"prompt": "Once upon a time"}'; done >"$TMP/prompts.jsonl"

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

run_case() {  # signal, rank, layout flags...
  local sig="$1" victim="$2"
  shift 2
  local name="SIG$sig rank $victim $*"
  # Emptied first: the previous case's "grid:" must not be taken for this job's.
  : >"$TMP/err"
  timeout -k 5 120 mpirun -np 2 --bind-to none "$TESSERA" generate --model "$DEMO" \
    --prompts-file "$TMP/prompts.jsonl" --max-tokens 450 --temperature 1 --seed 3 \
    --max-num-seqs 8 --step-timeout "$STEP_TIMEOUT" "$@" >"$TMP/out" 2>"$TMP/err" &
  local job=$!
  # Wait for decode: the first tokens' line ("[tessera] ... first token") is printed at the end,
  # so wait until the job is past loading (the startup log) and then a little.
  local waited=0
  until grep -q "grid:" "$TMP/err" 2>/dev/null || [ $waited -ge 600 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  sleep 1.5
  local pid
  pid=$(rank_pid "$job" "$victim")
  local child
  child=$(pgrep -P "$job" | head -n 1)
  [ -z "$pid" ] && [ -n "$child" ] && pid=$(rank_pid "$child" "$victim")
  if [ -z "$pid" ] || ! kill -0 "$job" 2>/dev/null; then
    failures=$((failures + 1))
    echo "FAIL: $name: no rank $victim process to signal (job ended early?)"
    head -c 800 "$TMP/err"
    wait "$job"
    return
  fi
  local t0 t1 rc
  t0=$(date +%s.%N)
  kill -"$sig" "$pid"
  wait "$job"
  rc=$?
  t1=$(date +%s.%N)
  local took
  took=$(echo "$t1 - $t0" | bc)
  local line
  line=$(grep -m 1 "stopped responding\|exited on signal\|is stuck" "$TMP/err")
  local ok=1
  [ "$rc" -ne 0 ] || ok=0
  [ "$(echo "$took < $BOUND" | bc)" = 1 ] || ok=0
  if [ "$sig" = STOP ]; then
    grep -q "^tessera: rank $victim (host [^,]*, tp [0-9]*, stage [0-9]*) stopped responding" \
      "$TMP/err" || ok=0
  else
    grep -q "rank $victim" "$TMP/err" || ok=0
  fi
  # Nothing of the job may survive it.
  if pgrep -f "$TESSERA generate --model $DEMO --prompts-file $TMP/prompts.jsonl" >/dev/null; then
    ok=0
    echo "  processes left behind"
  fi
  kill -CONT "$pid" 2>/dev/null
  if [ $ok = 1 ]; then
    echo "PASS: $name: exit $rc after $took s: $line"
  else
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc after $took s (bound $BOUND s)"
    grep -v "^\[tessera\]" "$TMP/err" | head -c 1500
  fi
}

run_case STOP 1 --tp 2
run_case STOP 1 --pp 2
run_case STOP 0 --pp 2
run_case KILL 1 --tp 2
run_case KILL 1 --pp 2

# Serve: an idle server outlives several step limits (rank 0's heartbeats keep the workers'
# plan waits alive), then rank 1 is stopped while requests decode: /health turns 503 before the
# job ends, and the job ends as for generate.
serve_case() {
  local name="serve SIGSTOP rank 1 --tp 2"
  timeout -k 5 120 mpirun -np 2 --bind-to none "$TESSERA" serve --model "$DEMO" --port 0 \
    --tp 2 --step-timeout "$STEP_TIMEOUT" >"$TMP/out" 2>"$TMP/err" &
  local job=$! port="" i
  for i in $(seq 1 600); do
    port=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/err" | head -n 1 | cut -d: -f3)
    [ -n "$port" ] && break
    sleep 0.1
  done
  local base="http://127.0.0.1:$port" ok=1
  if [ -z "$port" ]; then
    echo "FAIL: $name: the server did not start"
    head -c 1500 "$TMP/err"
    kill "$job" 2>/dev/null
    wait "$job"
    failures=$((failures + 1))
    return
  fi
  sleep $((STEP_TIMEOUT * 2 + 1))  # Idle past two step limits.
  local idle_health
  idle_health=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$base/health")
  if [ "$idle_health" != 200 ] || ! kill -0 "$job" 2>/dev/null; then
    ok=0
    echo "  idle server: /health $idle_health, job alive: $(kill -0 "$job" 2>/dev/null && echo yes)"
  fi
  for i in $(seq 8); do
    curl -s -m 60 "$base/v1/completions" -d '{"model": "stories260K", "prompt": "Once upon a time",
      "max_tokens": 450, "temperature": 1, "stream": true}' >"$TMP/stream$i" 2>/dev/null &
  done
  # Stop the rank once tokens are streaming (the job is stepping): a fixed
  # pause could land before the first step on a loaded machine, and a stop
  # while idle is not a fault anyone can see.
  for i in $(seq 1 200); do
    grep -qs '^data: {' "$TMP"/stream* && break
    sleep 0.05
  done
  local pid
  pid=$(rank_pid "$(pgrep -P "$job" | head -n 1)" 1)
  local t0 t1 rc health=none saw503=0
  t0=$(date +%s.%N)
  kill -STOP "$pid"
  # Probes overlap (each may take a while on a loaded machine): the 503 window is the fault
  # round's grace period, between the deadline and the abort.
  : >"$TMP/health"
  while kill -0 "$job" 2>/dev/null; do
    curl -s -m 3 -o /dev/null -w '%{http_code}\n' "$base/health" >>"$TMP/health" 2>/dev/null &
    sleep 0.1
  done
  wait "$job"
  rc=$?
  t1=$(date +%s.%N)
  wait
  grep -q '^503$' "$TMP/health" && saw503=1
  health=$(sort "$TMP/health" | uniq -c | tr '\n' ' ')
  local took
  took=$(echo "$t1 - $t0" | bc)
  [ "$rc" -ne 0 ] || ok=0
  [ "$(echo "$took < $BOUND" | bc)" = 1 ] || ok=0
  [ $saw503 = 1 ] || { ok=0; echo "  /health never answered 503 (answers: $health)"; }
  grep -q "^tessera: rank 1 (host [^,]*, tp 1, stage 0) stopped responding" "$TMP/err" || ok=0
  kill -CONT "$pid" 2>/dev/null
  wait
  if [ $ok = 1 ]; then
    echo "PASS: $name: /health 503, exit $rc after $took s: $(grep -m 1 'stopped responding' "$TMP/err")"
  else
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc after $took s (bound $BOUND s)"
    grep -v "^\[tessera\]" "$TMP/err" | head -c 1500
  fi
}
serve_case

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all fault cases passed"
