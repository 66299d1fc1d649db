#!/bin/bash
# Runs the MPI smoke binary under mpirun with 2 and 4 ranks (oversubscribed on small machines).
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
bin="$TEST_SRCDIR/tessera/parallel/mpi_smoke"
for np in 2 4; do
  out=$(timeout 60 mpirun -np "$np" --oversubscribe --bind-to none "$bin")
  echo "$out"
  grep -q "world $np, sum $((np * (np - 1) / 2)), ok" <<<"$out"
done
