// TensorComms: the Communicators (runtime/comm/communicator.h) a rank's model
// uses for tensor traffic, one per group of the grid — its TP group and its
// PP group — chosen by the rank's backend: NCCL ordered on the CUDA backend's
// stream, MPI collectives on the CPU. The one place that picks them, so a
// further choice (a one-shot all-reduce over NVLink for small messages) is
// one more branch here.
#ifndef TESSERA_PARALLEL_TENSOR_COMMS_H_
#define TESSERA_PARALLEL_TENSOR_COMMS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "parallel/mpi_world.h"
#include "runtime/comm/communicator.h"

namespace tessera {

struct TensorComms {
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
};

// Collective over each group of `groups` (every rank of the job calls it).
// The MPI communicators take the groups over (`groups` is left moved-from);
// NCCL only uses them to agree on its unique ids. A failure is this rank's
// and leaves the others waiting in the collective: the caller ends the job.
absl::StatusOr<TensorComms> CreateTensorComms(GridComms* groups,
                                              const Backend& backend);

}  // namespace tessera

#endif  // TESSERA_PARALLEL_TENSOR_COMMS_H_
