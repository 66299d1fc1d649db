#include "parallel/tensor_comms.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "parallel/mpi_communicator.h"
#ifdef TESSERA_WITH_CUDA
#include "parallel/nccl_communicator.h"
#endif
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<TensorComms> CreateTensorComms(GridComms* groups,
                                              const Backend& backend) {
  TensorComms comms;
  if (backend.is_cuda()) {
#ifdef TESSERA_WITH_CUDA
    if (backend.stream == nullptr) {
      return absl::InternalError("the CUDA backend has no stream");
    }
    ASSIGN_OR_RETURN(comms.tp,
                     NcclCommunicator::Create(groups->tp, backend.stream));
    ASSIGN_OR_RETURN(comms.pp,
                     NcclCommunicator::Create(groups->pp, backend.stream));
    return comms;
#else
    // Unreachable: CreateBackend gives no CUDA backend in this build.
    return CudaUnavailableError();
#endif
  }
  ASSIGN_OR_RETURN(comms.tp, MpiCommunicator::Create(std::move(groups->tp)));
  ASSIGN_OR_RETURN(comms.pp, MpiCommunicator::Create(std::move(groups->pp)));
  return comms;
}

}  // namespace tessera
