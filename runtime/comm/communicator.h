// Communicator: how the runtime moves tensors between the ranks of one parallel
// group.
//
// The runtime defines this interface and never sees what implements it:
// parallel/ provides an MPI implementation for the CPU backend
// (MpiCommunicator) and, with the CUDA backend, an NCCL one. A model holds one
// communicator for its tensor-parallel group and one for its pipeline
// neighbours; a group of size 1 is valid and makes every collective a no-op
// copy.
//
// Contract (every implementation):
//  - Collectives are called by every rank of the group, in the same order, with
//  tensors of the
//    same dtype and shape; they block until this rank's part is done.
//  - Tensors live in the backend's memory (host for MPI, device for NCCL) and
//  are contiguous.
//  - Errors are Status values that name the operation, the peer or group, and
//  the library's
//    own message; a failed collective leaves the group unusable (the caller
//    aborts the job).
#ifndef TESSERA_RUNTIME_COMM_COMMUNICATOR_H_
#define TESSERA_RUNTIME_COMM_COMMUNICATOR_H_

#include "absl/status/status.h"
#include "runtime/core/tensor.h"

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Element-wise sum across the group, in place (f32).
  virtual absl::Status AllReduceSum(const TensorView& inout) = 0;

  // Gathers every rank's `in` into `out` in rank order: out's outermost
  // dimension is size() times in's, the rest equal.
  virtual absl::Status AllGather(const TensorView& in,
                                 const TensorView& out) = 0;

  // Point-to-point within the group: `peer` is a rank of this group. A Send
  // must be matched by a Recv of the same dtype and byte size on the peer.
  virtual absl::Status Send(const TensorView& tensor, int peer) = 0;
  virtual absl::Status Recv(const TensorView& tensor, int peer) = 0;

  virtual absl::Status Barrier() = 0;
};

// The trivial group of one rank: AllReduceSum is the identity, AllGather a
// copy; Send/Recv are errors (there is no peer).
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(const TensorView& inout) override;
  absl::Status AllGather(const TensorView& in, const TensorView& out) override;
  absl::Status Send(const TensorView& tensor, int peer) override;
  absl::Status Recv(const TensorView& tensor, int peer) override;
  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_COMM_COMMUNICATOR_H_
