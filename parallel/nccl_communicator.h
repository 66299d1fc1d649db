// NcclCommunicator: the Communicator of the CUDA backend, over NCCL, for one
// TP or PP group of GPUs (one rank per GPU).
//
// Setup is collective over the group's MPI communicator: its rank 0 creates
// the NCCL unique id and broadcasts it over MPI (the control plane), then
// every member joins with ncclCommInitRank. Collectives are enqueued on the
// compute stream given at creation, so they are ordered with the kernels
// around them and nothing waits on the host.
//
// Errors: every NCCL call is checked, and after each one the communicator's
// asynchronous error (a peer that died, a network failure) is polled; any
// error aborts the communicator (ncclCommAbort) so no later call can hang,
// and is returned. Destruction aborts too rather than waiting for peers that
// may be gone.
#ifndef TESSERA_PARALLEL_NCCL_COMMUNICATOR_H_
#define TESSERA_PARALLEL_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/mpi_world.h"
#include "runtime/comm/communicator.h"

namespace tessera {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `group`. The calling thread's current CUDA device is the
  // rank's GPU; `stream` (on that device) must outlive the communicator.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const MpiComm& group, cudaStream_t stream);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // f32 sum in place.
  absl::Status AllReduceSum(const TensorView& inout) override;
  // Raw bytes of any dtype; `out` is size() times `in` along the outer
  // dimension, in rank order.
  absl::Status AllGather(const TensorView& in, const TensorView& out) override;
  absl::Status Send(const TensorView& tensor, int peer) override;
  absl::Status Recv(const TensorView& tensor, int peer) override;
  // Waits for the stream, then an all-reduce of one value.
  absl::Status Barrier() override;

 private:
  NcclCommunicator(void* comm, int rank, int size, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  // Checks an NCCL result and the communicator's async error; aborts it on
  // either.
  absl::Status Check(int result, const char* call, const char* doing);

  void* comm_;  // ncclComm_t; null once aborted.
  int rank_;
  int size_;
  cudaStream_t stream_;
  void* barrier_ = nullptr;  // One device float for Barrier.
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_NCCL_COMMUNICATOR_H_
