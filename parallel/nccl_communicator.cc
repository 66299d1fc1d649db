#include "parallel/nccl_communicator.h"

#include <mpi.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "parallel/fault_monitor.h"
#include "runtime/core/device_wait.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

absl::Status CudaCheck(cudaError_t error, const char* call, const char* doing) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed while ", doing, ": ",
                                          cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const MpiComm& group, cudaStream_t stream) {
  ncclUniqueId id;
  if (group.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::InternalError(
          absl::StrCat("ncclGetUniqueId failed while setting up ",
                       group.Describe(), ": ", ncclGetErrorString(r)));
    }
  }
  // Polled waits (fault_monitor.h): ncclCommInitRank blocks until every
  // rank of the group joins, so every rank must be known to have arrived
  // first (a stalled one is then found by the fault round, not inside NCCL).
  const auto what = [&] {
    return absl::StrCat("broadcasting the NCCL id of ", group.Describe());
  };
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc =
      MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, group.get(), &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibcast", what());
  RETURN_IF_ERROR(WaitRequest(&request, nullptr, what));
  RETURN_IF_ERROR(PolledBarrier(group.get(), [&] {
    return absl::StrCat("the barrier before ncclCommInitRank over ",
                        group.Describe());
  }));
  ncclComm_t comm;
  const ncclResult_t r =
      ncclCommInitRank(&comm, group.size(), id, group.rank());
  if (r != ncclSuccess) {
    return absl::InternalError(
        absl::StrCat("ncclCommInitRank failed while joining ", group.Describe(),
                     ": ", ncclGetErrorString(r)));
  }
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(comm, group.rank(), group.size(), stream));
  RETURN_IF_ERROR(CudaCheck(cudaMalloc(&c->barrier_, sizeof(float)),
                            "cudaMalloc", "allocating the barrier value"));
  RETURN_IF_ERROR(CudaCheck(cudaMemset(c->barrier_, 0, sizeof(float)),
                            "cudaMemset", "clearing the barrier value"));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) ncclCommAbort(static_cast<ncclComm_t>(comm_));
  if (barrier_ != nullptr) cudaFree(barrier_);
}

absl::Status NcclCommunicator::Check(int result, const char* call,
                                     const char* doing) {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": the NCCL communicator was aborted earlier"));
  }
  ncclResult_t async = ncclSuccess;
  if (result == ncclSuccess) {
    ncclCommGetAsyncError(static_cast<ncclComm_t>(comm_), &async);
  }
  if (result == ncclSuccess &&
      (async == ncclSuccess || async == ncclInProgress)) {
    return absl::OkStatus();
  }
  const ncclResult_t bad =
      result != ncclSuccess ? static_cast<ncclResult_t>(result) : async;
  const std::string last = ncclGetLastError(static_cast<ncclComm_t>(comm_));
  ncclCommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
  return absl::InternalError(
      absl::StrCat(call, " failed while ", doing, ": ", ncclGetErrorString(bad),
                   last.empty() ? "" : " (", last, last.empty() ? "" : ")"));
}

absl::Status NcclCommunicator::AllReduceSum(const TensorView& inout) {
  if (inout.dtype() != DType::kF32) {
    return absl::InvalidArgumentError("NCCL all-reduce: f32 only");
  }
  if (inout.numel() == 0) return absl::OkStatus();
  return Check(
      ncclAllReduce(inout.data(), inout.data(), inout.numel(), ncclFloat32,
                    ncclSum, static_cast<ncclComm_t>(comm_), stream_),
      "ncclAllReduce", "summing partial results across the TP group");
}

absl::Status NcclCommunicator::AllGather(const TensorView& in,
                                         const TensorView& out) {
  if (in.dtype() != out.dtype() ||
      out.nbytes() != in.nbytes() * static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL all-gather: out ", out.shape().ToString(), " must be ", size_,
        " times in ", in.shape().ToString(), " of the same dtype"));
  }
  if (in.nbytes() == 0) return absl::OkStatus();
  return Check(ncclAllGather(in.data(), out.data(), in.nbytes(), ncclUint8,
                             static_cast<ncclComm_t>(comm_), stream_),
               "ncclAllGather", "gathering the TP group's pieces");
}

absl::Status NcclCommunicator::Send(const TensorView& tensor, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL send to peer ", peer, " of ", size_));
  }
  if (tensor.nbytes() == 0) return absl::OkStatus();
  return Check(ncclSend(tensor.data(), tensor.nbytes(), ncclUint8, peer,
                        static_cast<ncclComm_t>(comm_), stream_),
               "ncclSend", "passing activations to the next stage");
}

absl::Status NcclCommunicator::Recv(const TensorView& tensor, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL recv from peer ", peer, " of ", size_));
  }
  if (tensor.nbytes() == 0) return absl::OkStatus();
  return Check(ncclRecv(tensor.data(), tensor.nbytes(), ncclUint8, peer,
                        static_cast<ncclComm_t>(comm_), stream_),
               "ncclRecv", "receiving activations from the previous stage");
}

absl::Status NcclCommunicator::Barrier() {
  RETURN_IF_ERROR(
      Check(ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum,
                          static_cast<ncclComm_t>(comm_), stream_),
            "ncclAllReduce", "a barrier"));
  // Polled in a job (runtime/core/device_wait.h): a peer that never joins
  // the barrier must not keep this rank out of the fault round.
  return WaitForDevice(
      [&]() -> absl::StatusOr<bool> {
        const cudaError_t query = cudaStreamQuery(stream_);
        if (query == cudaErrorNotReady) return false;
        RETURN_IF_ERROR(
            CudaCheck(query, "cudaStreamQuery", "waiting at a barrier"));
        return true;
      },
      [&] {
        return CudaCheck(cudaStreamSynchronize(stream_),
                         "cudaStreamSynchronize", "waiting at a barrier");
      },
      [] { return std::string("waiting at an NCCL barrier"); });
}

}  // namespace tessera
