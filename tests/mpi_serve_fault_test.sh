#!/bin/bash
# Serving under mpirun when the job ends (docs/RELIABILITY.md, "Honest ends"): while streams
# decode, mpirun is sent SIGTERM, or a rank is killed (SIGKILL) or stopped (SIGSTOP), at -np 2
# (--tp 2) and -np 4 (--tp 2 --pp 2). Every client must be told how its request ended: a
# stream ends with its last chunk or an error event, then [DONE], or (refused before its first
# token) with an error status and a JSON body; a plain request gets 200 or a 5xx JSON error.
# Never a stream cut without a word, except where rank 0 itself is stopped or killed (no one
# may be left to tell the clients; then only the bound, the exit code and the line naming
# rank 0 are checked). Every process must
# be gone within the bound, and the line naming a stopped rank must be printed.
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
CHECK="$RUNFILES/tessera/tests/sse_check.py"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/mpi_serve_fault"
mkdir -p "$TMP"
STEP_TIMEOUT=2
BOUND=$((STEP_TIMEOUT + 2 + 10))  # timeout + fault-round grace + the issue's 10 s.
failures=0

# The pid of the tessera process with OMPI_COMM_WORLD_RANK=$2 among the descendants of $1.
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
    rank_pid "$p" "$2"
  done
}

# serve_case NAME NP WHAT [TARGET] -- layout flags...
#   WHAT: TERM-mpirun | KILL | STOP; TARGET: the rank to signal.
serve_case() {
  local name="$1" np="$2" what="$3" victim="${4:-}"
  shift 4
  local dir="$TMP/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')"
  mkdir -p "$dir"
  timeout -k 5 120 mpirun -np "$np" --bind-to none "$TESSERA" serve --model "$DEMO" --port 0 \
    --max-num-seqs 2 --step-timeout "$STEP_TIMEOUT" "$@" >"$dir/out" 2>"$dir/err" &
  local job=$! port="" i
  for i in $(seq 1 600); do
    port=$(grep -o 'http://127.0.0.1:[0-9]*' "$dir/err" | head -n 1 | cut -d: -f3)
    [ -n "$port" ] && break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "FAIL: $name: the server did not start"
    head -c 1500 "$dir/err"
    kill "$job" 2>/dev/null
    wait "$job"
    failures=$((failures + 1))
    return
  fi
  local base="http://127.0.0.1:$port"
  # Twenty-four streams and one plain request, two decoding at a time: some run, some wait,
  # seconds of work even on a fast machine (more than mpirun's 1 s + a 0.5 s drain finish).
  for i in $(seq 24); do
    curl -sN -m 60 -w '\n%{http_code}' "$base/v1/completions" -d '{"model": "stories260K",
      "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": true, "stream": true}' \
      >"$dir/stream$i" 2>/dev/null &
  done
  curl -s -m 60 -w '\n%{http_code}' "$base/v1/completions" -d '{"model": "stories260K",
    "prompt": "Once", "max_tokens": 480, "ignore_eos": true}' >"$dir/request.plain" 2>/dev/null &
  # Wait until some stream has tokens (which two decode first is the scheduler's choice).
  for i in $(seq 1 300); do
    cat "$dir"/stream* 2>/dev/null | grep -q '"text_completion"' && break
    sleep 0.02
  done
  local target pid t0 t1 rc
  if [ "$what" = TERM-mpirun ]; then
    target=$(pgrep -P "$job" -x mpirun | head -n 1)
    [ -z "$target" ] && target=$(pgrep -P "$job" | head -n 1)
    sig=TERM
  else
    target=$(rank_pid "$job" "$victim")
    sig=$what
  fi
  if [ -z "$target" ]; then
    echo "FAIL: $name: nothing to signal"
    kill "$job" 2>/dev/null
    wait
    failures=$((failures + 1))
    return
  fi
  t0=$(date +%s.%N)
  kill -"$sig" "$target"
  wait "$job"
  rc=$?
  t1=$(date +%s.%N)
  [ "$what" = STOP ] && kill -CONT "$target" 2>/dev/null
  wait  # The clients.
  local took ok=1
  took=$(echo "$t1 - $t0" | bc)
  python3 "$CHECK" "$dir"/stream[0-9]* "$dir/request.plain" >"$dir/ends"
  local summary
  summary=$(cut -d' ' -f1-2 "$dir/ends" | sed 's/^\(finished\|error\) [0-9]*/\1/' | sort |
    uniq -c | tr -s ' \n' ' ')
  [ "$(echo "$took < $BOUND" | bc)" = 1 ] || { ok=0; echo "  took $took s (bound $BOUND s)"; }
  if [ "$victim" = 0 ]; then
    # Rank 0 stopped or killed: a worker (stop) or Open MPI (kill) ends the job and names it;
    # the clients' connections die with rank 0 (no one is left to tell them).
    if [ "$what" = STOP ]; then
      grep -q "^tessera: rank 0 (host [^,]*, tp 0, stage 0) stopped responding" "$dir/err" ||
        { ok=0; echo "  no line naming rank 0"; }
    else
      grep -q "process rank 0 .* exited on signal 9" "$dir/err" ||
        { ok=0; echo "  no line naming rank 0"; }
    fi
    [ "$rc" -ne 0 ] || { ok=0; echo "  exit code 0"; }
  else
    # Every client was told; at least one stream saw an error event or an error status.
    if grep -q '^cut\|^bad' "$dir/ends"; then
      ok=0
      echo "  a response ended without a word: $summary"
    fi
    grep -q '^error\|^http 5' "$dir/ends" || { ok=0; echo "  no client was told of the end: $summary"; }
  fi
  if [ "$what" = STOP ] && [ "$victim" != 0 ]; then
    [ "$rc" -ne 0 ] || { ok=0; echo "  exit code 0"; }
    grep -q "^tessera: rank $victim (host [^,]*, tp [0-9]*, stage [0-9]*) stopped responding" \
      "$dir/err" || { ok=0; echo "  no line naming rank $victim"; }
    grep -q '^\(error [0-9]*\|http 500\) the engine failed: ' "$dir/ends" ||
      { ok=0; echo "  no client was told that the engine failed"; }
  fi
  if [ "$what" = TERM-mpirun ]; then
    grep -q 'drain timeout: aborted [0-9]* requests\|drained and stopped' "$dir/err" ||
      { ok=0; echo "  rank 0 did not drain"; }
  fi
  if pgrep -f "$TESSERA serve --model $DEMO --port 0" >/dev/null; then
    ok=0
    echo "  processes left behind"
    pkill -KILL -f "$TESSERA serve --model $DEMO --port 0"
  fi
  if [ $ok = 1 ]; then
    echo "PASS: $name: exit $rc after $took s; clients: $summary"
  else
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc after $took s; clients: $summary"
    cat "$dir/ends"
    grep -v "^\[tessera\] \(serving\|limits\|loaded\|grid\)" "$dir/err" | head -c 2000
  fi
}

serve_case "mpirun SIGTERM while streaming, --tp 2" 2 TERM-mpirun "" --tp 2
serve_case "SIGKILL rank 1 while streaming, --tp 2" 2 KILL 1 --tp 2
serve_case "SIGSTOP rank 1 while streaming, --tp 2" 2 STOP 1 --tp 2
serve_case "SIGSTOP rank 0 while streaming, --pp 2" 2 STOP 0 --pp 2
serve_case "SIGKILL rank 0 while streaming, --tp 2" 2 KILL 0 --tp 2
serve_case "mpirun SIGTERM while streaming, --tp 2 --pp 2" 4 TERM-mpirun "" --tp 2 --pp 2
serve_case "SIGKILL rank 3 while streaming, --tp 2 --pp 2" 4 KILL 3 --tp 2 --pp 2
serve_case "SIGSTOP rank 3 while streaming, --tp 2 --pp 2" 4 STOP 3 --tp 2 --pp 2

# serve while it loads (the server is not listening yet): a stopped worker is named at the
# startup limit (--startup-timeout 3; TESSERA_TEST_LOAD_DELAY_MS slows each weight part, test
# only), and the job ends within that + the round + 10 s.
serve_load_case() {
  local name="serve: SIGSTOP rank 1 while loading, --tp 2"
  local dir="$TMP/serve_load"
  mkdir -p "$dir"
  TESSERA_TEST_LOAD_DELAY_MS=400 timeout -k 5 120 mpirun -np 2 --bind-to none \
    -x TESSERA_TEST_LOAD_DELAY_MS "$TESSERA" serve --model "$DEMO" --port 0 --tp 2 \
    --step-timeout "$STEP_TIMEOUT" --startup-timeout 3 >"$dir/out" 2>"$dir/err" &
  local job=$! i pid=""
  for i in $(seq 1 600); do
    grep -q "^tessera: test hook: rank" "$dir/err" 2>/dev/null && break
    sleep 0.05
  done
  pid=$(rank_pid "$job" 1)
  if [ -z "$pid" ] || grep -q "serving .* on http" "$dir/err"; then
    echo "FAIL: $name: not caught while loading"
    head -c 1500 "$dir/err"
    kill "$job" 2>/dev/null
    wait "$job"
    failures=$((failures + 1))
    return
  fi
  local t0 t1 rc took ok=1
  t0=$(date +%s.%N)
  kill -STOP "$pid"
  wait "$job"
  rc=$?
  t1=$(date +%s.%N)
  kill -CONT "$pid" 2>/dev/null
  took=$(echo "$t1 - $t0" | bc)
  [ "$rc" -ne 0 ] || ok=0
  [ "$(echo "$took < 3 + 2 + 10" | bc)" = 1 ] || ok=0
  grep -q "^tessera: rank 1 (host [^,]*, tp 1, stage 0) stopped responding" "$dir/err" || ok=0
  grep -q "serving .* on http" "$dir/err" && ok=0
  if [ $ok = 1 ]; then
    echo "PASS: $name: exit $rc after $took s: $(grep -m 1 'stopped responding' "$dir/err" | cut -c1-160)"
  else
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc after $took s"
    grep -v "^\[tessera\]" "$dir/err" | head -c 1500
  fi
}
serve_load_case

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all serve fault cases passed"
