#!/bin/bash
# Multi-host over TCP on one machine: two network namespaces joined by a veth pair play two
# hosts. mpirun runs in the first; Open MPI reaches the second through tests/testing/netns_rsh.sh
# (its rsh agent: `ip netns exec` in place of ssh, with a clean ssh-like environment), and the
# job is started by launch/mpirun_hosts.sh from a hostfile of the two namespace addresses.
# Checked: one rank per namespace (and two per namespace, consecutive ranks together), greedy
# tokens of --tp 2, --pp 2 and 4-rank --tp 2 --pp 2 across the "hosts" equal one process's,
# and the traffic went over the veth (its byte counters grew by at least the data MPI had to
# move). Open MPI's out-of-band channel and TCP BTL are restricted to the test's subnet.
# Needs root (ip netns add, unshare); everything it creates is removed on exit.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if [ -n "${TEST_SRCDIR:-}" ]; then
  ROOT="$TEST_SRCDIR/tessera"
  TESSERA="$ROOT/launch/tessera"
  DEMO="$TEST_SRCDIR/shared/models/stories260K"
  TMP="$TEST_TMPDIR/multihost"
else  # run by hand from a checkout: tests/multihost_test.sh (after bazel build //launch:tessera)
  ROOT="$(cd "$(dirname "$0")/.." && pwd)"
  TESSERA="${TESSERA:-$ROOT/bazel-bin/launch/tessera}"
  DEMO="${DEMO:-$ROOT/../shared/models/stories260K}"
  TMP="$(mktemp -d)/multihost"
fi
AGENT="$ROOT/tests/testing/netns_rsh.sh"
LAUNCH="$ROOT/launch/mpirun_hosts.sh"
mkdir -p "$TMP"
failures=0
cases=0

pass() { cases=$((cases + 1)); echo "PASS: $*"; }
fail() { cases=$((cases + 1)); failures=$((failures + 1)); echo "FAIL: $*"; }

# Names unique to this run (Bazel's sandbox may give every test the same small $$).
tag="$(printf '%x%04x' $$ "$RANDOM")"
NS_A="tessera-mh-$tag-a"
NS_B="tessera-mh-$tag-b"
VETH_A="v${tag}a"  # interface names: at most 15 characters
VETH_B="v${tag}b"
NET="10.213.$((RANDOM % 250 + 1))"
ADDR_A="$NET.1"
ADDR_B="$NET.2"
SUBNET="$NET.0/24"

child=""  # the timeout(1) of the job now running, if any
cleanup() {
  local ns pid
  if [ -n "$child" ]; then  # interrupted: let timeout stop mpirun (it ends its job), briefly
    kill -TERM "$child" 2>/dev/null
    for _ in $(seq 50); do
      kill -0 "$child" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$child" 2>/dev/null
  fi
  for ns in "$NS_A" "$NS_B"; do
    if [ -e "/run/netns/$ns" ]; then
      # Whatever this test started there (an orted or rank left by a failed job).
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null
      done
      ip netns del "$ns" 2>/dev/null || echo "warning: could not delete namespace $ns"
    fi
  done
  # Only there if the setup failed before moving it into a namespace.
  ip link del "$VETH_A" 2>/dev/null
  [ -z "${TEST_TMPDIR:-}" ] && rm -rf "$(dirname "$TMP")"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Two hosts: $NS_A ($ADDR_A) and $NS_B ($ADDR_B), each with lo and one end of the veth.
if ! { ip netns add "$NS_A" && ip netns add "$NS_B" &&
  ip link add "$VETH_A" type veth peer name "$VETH_B" &&
  ip link set "$VETH_A" netns "$NS_A" && ip link set "$VETH_B" netns "$NS_B" &&
  ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A" &&
  ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B" &&
  ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up &&
  ip -n "$NS_A" link set "$VETH_A" up && ip -n "$NS_B" link set "$VETH_B" up; } 2>"$TMP/err"; then
  fail "creating network namespaces (needs root: CAP_SYS_ADMIN, CAP_NET_ADMIN, writable /run/netns): $(head -c 400 "$TMP/err")"
  exit 1
fi
pass "namespaces $NS_A ($ADDR_A) and $NS_B ($ADDR_B) joined by $VETH_A-$VETH_B"

NETNS_A="$(ip netns exec "$NS_A" readlink /proc/self/ns/net)"
NETNS_B="$(ip netns exec "$NS_B" readlink /proc/self/ns/net)"
printf '%s slots=1\n%s slots=1\n' "$ADDR_A" "$ADDR_B" >"$TMP/hosts1"
printf '%s slots=2\n%s slots=2\n' "$ADDR_A" "$ADDR_B" >"$TMP/hosts2"
export NETNS_RSH_MAP="$ADDR_A=$NS_A $ADDR_B=$NS_B"
export TESSERA_MPI_IF="$SUBNET"
export TESSERA_MPIRUN_ARGS="--mca plm_rsh_agent $AGENT --mca btl tcp,self"

# Runs COMMAND... under a timeout, in the background and waited for, so that a signal to this
# script (Bazel's own timeout, ^C) runs the traps at once instead of after the command.
run_timed() {
  timeout -k 10 120 "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  return "$rc"
}

# Runs launch/mpirun_hosts.sh ARGS... as host A (its namespace, and hostname $NS_A). The chain
# execs down to mpirun, so the timeout's signal reaches mpirun itself.
launch() {
  # shellcheck disable=SC2016
  run_timed ip netns exec "$NS_A" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "$NS_A" "$LAUNCH" "$@"
}
# shellcheck disable=SC2209
echo "in $NS_A: mpirun $(MPIRUN=echo "$LAUNCH" "$TMP/hosts1" 2 tessera generate ...)"

veth_bytes() {  # rx + tx of host A's end of the veth
  ip netns exec "$NS_A" sh -c \
    "echo \$((\$(cat /sys/class/net/$VETH_A/statistics/rx_bytes) + \$(cat /sys/class/net/$VETH_A/statistics/tx_bytes)))"
}

# Where the ranks run: "RANK NETNS HOSTNAME ADDRESSES OMP_NUM_THREADS OPENBLAS_NUM_THREADS".
# The agent gives remote ranks a clean environment, so the thread counts there show that the
# launcher's -x reached them.
placement() {  # hostfile, np, expected namespace of each rank (A or B) in rank order...
  local hostfile="$1" np="$2"
  shift 2
  # shellcheck disable=SC2016
  launch "$hostfile" "$np" sh -c 'echo "$OMPI_COMM_WORLD_RANK $(readlink /proc/self/ns/net)" \
    "$(hostname) $(ip -o -4 addr show scope global | awk "{print \$4}" | tr "\n" ,)" \
    "${OMP_NUM_THREADS:-unset} ${OPENBLAS_NUM_THREADS:-unset}"' >"$TMP/out" 2>"$TMP/err"
  local rc=$? rank=0 want line
  sort -n "$TMP/out" >"$TMP/sorted"
  : >"$TMP/want"
  for host in "$@"; do
    if [ "$host" = A ]; then
      want="$rank $NETNS_A $NS_A $ADDR_A/24, 1 1"
    else
      want="$rank $NETNS_B $NS_B $ADDR_B/24, 1 1"
    fi
    echo "$want" >>"$TMP/want"
    rank=$((rank + 1))
  done
  if [ "$rc" -ne 0 ] || ! cmp -s "$TMP/sorted" "$TMP/want"; then
    fail "placement np=$np ($hostfile): exit $rc; want / got:"
    cat "$TMP/want" "$TMP/sorted"
    head -c 1000 "$TMP/err"
  else
    while read -r line; do echo "  rank $line"; done <"$TMP/sorted"
    pass "placement np=$np: ranks on hosts $* (root namespace is $(readlink /proc/self/ns/net))"
  fi
}

placement "$TMP/hosts1" 2 A B
placement "$TMP/hosts2" 4 A A B B
before=$(veth_bytes)
launch "$TMP/hosts1" 2 true >/dev/null 2>&1
control_bytes=$(($(veth_bytes) - before))
echo "an empty 2-rank job moves $control_bytes bytes over the veth (Open MPI's own traffic)"

# The reference: one process, outside mpirun and the namespaces.
printf '%s\n' '{"prompt": "Once upon a time"}' '{"prompt": "Lily and Ben"}' '{"prompt": "One day"}' \
  '{"prompt": "The little dog"}' >"$TMP/prompts.jsonl"
GEN=(generate --model "$DEMO" --prompts-file "$TMP/prompts.jsonl" --max-tokens 32
  --temperature 0 --output json)
run_timed "$TESSERA" "${GEN[@]}" >"$TMP/ref" 2>"$TMP/err"
grep -o '"output_ids":\[[0-9,]*\]' "$TMP/ref" >"$TMP/want"
if [ "$(wc -l <"$TMP/want")" -ne 4 ] || [ "$(grep -c '\[[0-9]' "$TMP/want")" -ne 4 ]; then
  fail "single-process reference: $(head -c 400 "$TMP/err")"
  exit 1
fi
pass "single-process reference: 4 prompts, 32 tokens each"

run_case() {  # name, hostfile, np, minimum bytes over the veth, tessera flags...
  local name="$1" hostfile="$2" np="$3" min_bytes="$4"
  shift 4
  local before start
  before=$(veth_bytes)
  start=$(date +%s%N)
  launch "$hostfile" "$np" "$TESSERA" "${GEN[@]}" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local bytes=$(($(veth_bytes) - before))
  local ms=$((($(date +%s%N) - start) / 1000000))
  grep -o '"output_ids":\[[0-9,]*\]' "$TMP/out" >"$TMP/got"
  if [ "$rc" -ne 0 ] || ! cmp -s "$TMP/got" "$TMP/want"; then
    fail "$name: exit $rc, output_ids differ from one process's"
    head -c 1500 "$TMP/err"
    diff "$TMP/want" "$TMP/got" | head -5
  else
    pass "$name: the same output_ids as one process (${ms} ms)"
  fi
  if [ "$bytes" -lt "$min_bytes" ] || [ "$bytes" -lt $((control_bytes * 4)) ]; then
    fail "$name: only $bytes bytes went over the veth (want >= $min_bytes and 4x an empty job's)"
  else
    pass "$name: $bytes bytes over the veth (>= $min_bytes)"
  fi
}

# With --weights rank0 (the default) rank 0 sends rank 1's shard (~0.5 MiB for stories260K),
# so at least 256 KiB must cross; with --weights local only activations (~70 KB here) do.
# The startup log says where every rank runs, and warns when a TP group spans hosts.
expect_warning() {  # name, "yes"|"no"
  if [ "$2" = yes ] && grep -q "^\[tessera\] warning: the tensor-parallel group of pipeline stage 0 (ranks 0-1) spans 2 nodes: $NS_A (node 0), $NS_B (node 1);" "$TMP/err"; then
    pass "$1: the TP group across hosts is warned about"
  elif [ "$2" = no ] && ! grep -q "warning" "$TMP/err"; then
    pass "$1: no placement warning"
  else
    fail "$1: placement warning expected: $2"
    grep '^\[tessera\]' "$TMP/err" | head -12
  fi
}
run_case "tp2 across hosts" "$TMP/hosts1" 2 262144 --tp 2
expect_warning "tp2 across hosts" yes
grep -q "^\[tessera\] grid: tp 2 x pp 1 = 2 ranks on 2 nodes, cpu;" "$TMP/err" &&
  pass "tp2 across hosts: the grid line counts 2 nodes" ||
  fail "tp2 across hosts: grid line: $(grep grid "$TMP/err")"
run_case "pp2 across hosts" "$TMP/hosts1" 2 262144 --pp 2
expect_warning "pp2 across hosts" no
run_case "pp2 across hosts, local weights" "$TMP/hosts1" 2 32768 --pp 2 --weights local
# Two ranks per host: each TP group inside one host, the pipeline across the two.
run_case "tp2 x pp2, 2 ranks per host" "$TMP/hosts2" 4 131072 --tp 2 --pp 2
expect_warning "tp2 x pp2, 2 ranks per host" no
# tessera's own layout: rank = stage × 2 + tp index, so TP groups {0,1}, {2,3} are each on one
# host (placement np=4 above) and only stage 0 → 1 crosses the veth. Its rank lines read
# "rank R on HOST (...): tp T, stage S, ...".
sed -nE 's/^\[tessera\] +rank ([0-9]+) on ([^ ]+) [^:]*: tp ([0-9]+), stage ([0-9]+).*/\1 \3 \4 \2/p' \
  "$TMP/err" >"$TMP/layout"
printf '%s\n' "0 0 0 $NS_A" "1 1 0 $NS_A" "2 0 1 $NS_B" "3 1 1 $NS_B" >"$TMP/layout_want"
if cmp -s "$TMP/layout" "$TMP/layout_want"; then
  pass "tp2 x pp2: TP groups are ranks {0,1} on $NS_A and {2,3} on $NS_B"
else
  fail "tp2 x pp2: rank layout (rank, tp, stage, host) is not the expected:"
  cat "$TMP/layout"
  grep -E 'rank [0-9]' "$TMP/err"
fi

echo "$((cases - failures)) of $cases checks passed"
[ "$failures" -eq 0 ]
