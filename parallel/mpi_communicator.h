// MpiCommunicator: the Communicator of the CPU backend, over an MPI
// communicator (a TP or PP group from SplitGrid, or any MpiComm).
//
// - AllReduceSum: MPI_Allreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM); f32 only.
// - AllGather: MPI_Allgather of the raw bytes (any dtype); `in` may already
//   sit at its slot of `out` (in place).
// - Send/Recv: raw bytes with one fixed tag. Each Send is a 32-byte header
//   (byte size, dtype, chunk size) followed by the data, so a Recv whose dtype
//   or byte size disagrees with the sender's fails with a message naming both,
//   and still consumes what was sent (nothing stays behind to be matched by a
//   later Recv, and the sender is not left blocked).
// - Large tensors: MPI counts are int, so every call moves at most
//   max_chunk_bytes (1 GiB by default) at a time; bigger tensors go in pieces.
//
// Every wait is a polled wait of fault_monitor.h (MPI_Iallreduce,
// MPI_Iallgather, MPI_Isend, MPI_Improbe, MPI_Ibarrier + MPI_Test): with a
// FaultMonitor installed, a peer that stalls mid-step turns into a
// DeadlineExceeded (RankLocal) at the step's deadline, never a hang.
//
// Send waits as a blocking MPI_Send would: a large tensor returns only once the
// peer has started to receive it. Pipeline traffic (stage s sends to s+1 and
// receives from s-1) has no cycle and cannot deadlock; two ranks that both Send
// large tensors to each other first would.
//
// The communicator must be used by nothing else concurrently: its tag and
// collective order are its own. SplitGrid's groups, or an MpiComm::Dup, are
// right; a borrowed MPI_COMM_WORLD works but then no other code may use tag
// kTensorTag on it. Not thread-safe; call from the MPI thread.
#ifndef TESSERA_PARALLEL_MPI_COMMUNICATOR_H_
#define TESSERA_PARALLEL_MPI_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/mpi_world.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/tensor.h"

namespace tessera {

struct MpiCommunicatorOptions {
  // Most bytes one MPI call moves, in [16, INT_MAX]. Tests make it tiny to
  // exercise the chunked paths with small tensors.
  size_t max_chunk_bytes = size_t{1} << 30;
};

class MpiCommunicator final : public Communicator {
 public:
  // The tag of Send/Recv traffic on the communicator.
  static constexpr int kTensorTag = 1;

  // Takes ownership of `comm` (which may be a borrowed MPI_COMM_WORLD; see
  // MpiComm::Borrow). Local: no communication.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(
      MpiComm comm, MpiCommunicatorOptions options = {});

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const MpiComm& comm() const { return comm_; }

  absl::Status AllReduceSum(const TensorView& inout) override;
  absl::Status AllGather(const TensorView& in, const TensorView& out) override;
  absl::Status Send(const TensorView& tensor, int peer) override;
  absl::Status Recv(const TensorView& tensor, int peer) override;
  absl::Status Barrier() override;

 private:
  MpiCommunicator(MpiComm comm, MpiCommunicatorOptions options)
      : comm_(std::move(comm)), options_(options) {}

  absl::Status CheckPeer(absl::string_view op, int peer) const;
  // Receives and drops the `nbytes` (sent in pieces of `chunk_bytes`) of a
  // transfer this rank refused, so that nothing of it stays behind.
  absl::Status Discard(int peer, size_t nbytes, size_t chunk_bytes);

  MpiComm comm_;
  MpiCommunicatorOptions options_;
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_MPI_COMMUNICATOR_H_
