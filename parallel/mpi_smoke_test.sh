#!/bin/bash
# Runs the MPI smoke binary under mpirun with 2 and 4 ranks (oversubscribed on small machines).
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI names its session directory and the vader BTL's /dev/shm segments after mpirun's pid,
# and Bazel's sandboxes give concurrent tests the same small pids: a short directory of this
# test's own for both (unix socket paths must stay under 108 bytes; TEST_TMPDIR is longer).
MPI_TMP=$(mktemp -d /tmp/tessera-mpi.XXXXXX)
export TMPDIR="$MPI_TMP" OMPI_MCA_btl_vader_backing_directory="$MPI_TMP"
trap 'rm -rf "$MPI_TMP"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1
bin="$TEST_SRCDIR/tessera/parallel/mpi_smoke"
for np in 2 4; do
  out=$(timeout 60 mpirun -np "$np" --oversubscribe --bind-to none "$bin")
  echo "$out"
  grep -q "world $np, sum $((np * (np - 1) / 2)), ok" <<<"$out"
done
