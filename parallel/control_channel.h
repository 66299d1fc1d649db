// ControlChannel: protobuf messages between ranks over MPI — the control plane
// (ModelManifest, ShardChunk, StepPlan, StepResult, NCCL ids).
//
// Wire format: the frames of control_frame.h. Send puts the whole frame
// (length prefix + payload) in one MPI message; Recv probes it (MPI_Mprobe),
// so it learns the size before allocating and needs no second message.
// Broadcast cannot probe, so it broadcasts the 8-byte length prefix first and
// then the payload.
//
// Failures never leave a peer waiting when this side can prevent it: a Send
// or Broadcast whose message cannot be encoded (too large, missing required
// fields) still delivers an error frame, so the matching Recv / the other
// ranks' Broadcast return DataLoss "control message from rank R: the sender
// could not send it: ..." while the sender returns InvalidArgument. Treat
// either as fatal (MpiWorld::Abort), as for any control-plane error.
//
// Every wait (Send, Recv, Broadcast) is a polled wait of fault_monitor.h:
// with a FaultMonitor installed, a wait still open at the armed step's
// deadline, or during a fault round, returns that fault (RankLocal) instead
// of blocking forever on a stalled peer.
//
// The channel works on its own duplicate of the communicator it is given, so
// its tags can never match tensor traffic (MpiCommunicator) or anything else
// on the parent. Not thread-safe, and MPI_THREAD_FUNNELED: use it from the
// thread that called MpiWorld::Init.
#ifndef TESSERA_PARALLEL_CONTROL_CHANNEL_H_
#define TESSERA_PARALLEL_CONTROL_CHANNEL_H_

#include <mpi.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"
#include "parallel/control_frame.h"
#include "parallel/mpi_world.h"

namespace tessera {

struct ControlChannelOptions {
  // Largest serialized message this rank sends or accepts; see
  // control_frame.h. Every rank should use the same value: a receiver with a
  // smaller limit than its sender rejects the message (DataLoss), though it
  // still consumes it so the channel stays in step.
  size_t max_message_bytes = kDefaultMaxControlMessageBytes;
};

class ControlChannel {
 public:
  // Matches a message from any rank in Recv / Poll.
  static constexpr int kAnySource = MPI_ANY_SOURCE;

  // Duplicates `parent` (MPI_Comm_dup: collective over parent, so every rank
  // of it calls Create at the same point). InvalidArgument for a limit outside
  // [1, kMaxControlMessageCeiling].
  static absl::StatusOr<ControlChannel> Create(
      const MpiComm& parent, ControlChannelOptions options = {});

  ControlChannel(ControlChannel&&) = default;
  ControlChannel& operator=(ControlChannel&&) = default;

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  size_t max_message_bytes() const { return options_.max_message_bytes; }
  // The channel's own communicator (for tests that inject raw bytes).
  MPI_Comm comm() const { return comm_.get(); }

  // Sends `msg` to rank `dest` with `tag` (>= 0). Blocks until MPI may reuse
  // the buffer: for large messages, until `dest` has started to receive.
  // InvalidArgument for a bad dest or an oversized message (an error frame is
  // then sent in its place); Internal when MPI fails.
  absl::Status Send(const google::protobuf::MessageLite& msg, int dest,
                    int tag);

  // Receives the next message from `source` (or kAnySource) with `tag` into
  // *msg (replacing its contents). If `from` is given, it receives the
  // sender's rank. DataLoss "control message from rank R (tag T): ..." when
  // the frame is above this rank's limit, truncated, an error frame, or does
  // not parse; Internal when MPI fails.
  absl::Status Recv(int source, int tag, google::protobuf::MessageLite* msg,
                    int* from = nullptr);

  // Collective: `root` serializes *msg, every other rank's *msg is replaced by
  // the parsed copy (root's is left as is). Every rank calls it with the same
  // root. Root: InvalidArgument when its message cannot be encoded (the
  // others then get DataLoss). Others: DataLoss as for Recv.
  absl::Status Broadcast(google::protobuf::MessageLite* msg, int root);

  // Whether a message from `source` (or kAnySource) with `tag` is waiting
  // (MPI_Iprobe); never blocks. Lets rank 0 look for StepResults between
  // other work.
  absl::StatusOr<bool> Poll(int source, int tag);

 private:
  ControlChannel(MpiComm comm, ControlChannelOptions options)
      : comm_(std::move(comm)), options_(options) {}

  absl::Status CheckPeer(int peer, absl::string_view role,
                         bool allow_any) const;
  void TrimBuffer();

  // The buffer keeps at most this much capacity between calls.
  static constexpr size_t kKeptBufferBytes = size_t{1} << 20;

  MpiComm comm_;
  ControlChannelOptions options_;
  // Reused between calls: a StepPlan goes out every step, and reusing the
  // buffer keeps the steady state free of allocations.
  std::string buffer_;
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_CONTROL_CHANNEL_H_
