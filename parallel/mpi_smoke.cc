// Checks that the Open MPI wrapping works end to end: every rank contributes
// its rank number to an all-reduce, and rank 0 checks the sum and its grid
// position for tp = world_size.
#include <mpi.h>

#include <cstdio>

#include "parallel/process_grid.h"

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "mpi_smoke: MPI_Init failed\n");
    return 1;
  }
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  long mine = rank, sum = -1;
  const int rc =
      MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const auto grid = tessera::ProcessGrid::Create(world, world, 1);
  const bool ok = rc == MPI_SUCCESS &&
                  sum == static_cast<long>(world) * (world - 1) / 2 &&
                  grid.ok() && grid->Position(rank).tp_rank == rank;
  if (rank == 0)
    std::printf("mpi_smoke: world %d, sum %ld, %s\n", world, sum,
                ok ? "ok" : "BAD");
  MPI_Finalize();
  return ok ? 0 : 1;
}
