#!/bin/bash
# Runs mpi_layer_test_bin under mpirun with 2 and 4 ranks, then checks that
# MpiWorld::Abort on one rank ends the whole job (rank 0 waits in a barrier
# that can never complete). Every mpirun has a timeout, so nothing can hang CI.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI names its session directory and the vader BTL's /dev/shm segments after mpirun's pid,
# and Bazel's sandboxes give concurrent tests the same small pids: a short directory of this
# test's own for both (unix socket paths must stay under 108 bytes; TEST_TMPDIR is longer).
MPI_TMP=$(mktemp -d /tmp/tessera-mpi.XXXXXX)
export TMPDIR="$MPI_TMP" OMPI_MCA_btl_vader_backing_directory="$MPI_TMP"
trap 'rm -rf "$MPI_TMP"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1
bin="$TEST_SRCDIR/tessera/parallel/mpi_layer_test_bin"
# More checks mean a larger number here: a check that silently stops running
# must not pass as "no FAIL lines".
expected_min_checks=25
status=0

for np in 2 4; do
  echo "=== mpirun -np $np"
  out=$(timeout -k 10 60 mpirun -np "$np" --oversubscribe --bind-to none "$bin" 2>&1)
  rc=$?
  echo "$out"
  passes=$(grep -c '^PASS ' <<<"$out")
  if [[ $rc -eq 124 ]]; then
    echo "FAILED: -np $np timed out after 60 s (the last RUN line shows where)"
    status=1
  elif [[ $rc -ne 0 ]] || grep -q '^FAIL ' <<<"$out"; then
    echo "FAILED: -np $np exited $rc"
    status=1
  elif ((passes < expected_min_checks)); then
    echo "FAILED: -np $np ran only $passes checks, expected >= $expected_min_checks"
    status=1
  fi
done

echo "=== mpirun -np 2 --abort"
start=$SECONDS
out=$(timeout -k 10 60 mpirun -np 2 --oversubscribe --bind-to none "$bin" --abort 2>&1)
rc=$?
echo "$out" | head -20
if [[ $rc -eq 124 ]]; then
  echo "FAILED: the aborted job hung until the timeout"
  status=1
elif [[ $rc -eq 0 ]]; then
  echo "FAILED: the aborted job exited 0"
  status=1
elif ! grep -q '^tessera: rank 1: deliberate abort from mpi_layer_test$' <<<"$out"; then
  echo "FAILED: no 'tessera: rank 1: ...' line from the aborting rank"
  status=1
else
  echo "PASS abort_ends_the_job (exit $rc after $((SECONDS - start)) s)"
fi
exit $status
