#include "parallel/control_channel.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "parallel/fault_monitor.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

std::string FromRank(int rank, int tag) {
  return absl::StrCat("control message from rank ", rank, " (tag ", tag, ")");
}

std::string BroadcastFrom(int root) {
  return absl::StrCat("control message from rank ", root, " (broadcast)");
}

// Errors that concern the received bytes are DataLoss whatever the framing
// layer said, so that callers can tell "the peer sent nonsense" from "MPI
// failed".
absl::Status AsDataLoss(const absl::Status& status, absl::string_view context) {
  return absl::DataLossError(absl::StrCat(context, ": ", status.message()));
}

}  // namespace

void ControlChannel::TrimBuffer() {
  // Steady-state messages (StepPlan, StepResult) are kilobytes and reuse the
  // buffer without allocating; the tens of MiB that weight loading needed are
  // given back rather than held for the life of the job.
  if (buffer_.capacity() > kKeptBufferBytes) std::string().swap(buffer_);
}

absl::StatusOr<ControlChannel> ControlChannel::Create(
    const MpiComm& parent, ControlChannelOptions options) {
  RETURN_IF_ERROR(ValidateMaxMessageBytes(options.max_message_bytes));
  ASSIGN_OR_RETURN(
      MpiComm comm,
      MpiComm::Dup(parent, absl::StrCat("control(", parent.name(), ")")));
  return ControlChannel(std::move(comm), options);
}

absl::Status ControlChannel::CheckPeer(int peer, absl::string_view role,
                                       bool allow_any) const {
  if (allow_any && peer == kAnySource) return absl::OkStatus();
  if (peer < 0 || peer >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("control channel: ", role, " rank ", peer,
                     " is not a rank of ", comm_.Describe()));
  }
  return absl::OkStatus();
}

absl::Status ControlChannel::Send(const google::protobuf::MessageLite& msg,
                                  int dest, int tag) {
  absl::Cleanup trim = [this] { TrimBuffer(); };
  RETURN_IF_ERROR(CheckPeer(dest, "destination", /*allow_any=*/false));
  const absl::Status encoded =
      EncodeFrame(msg, options_.max_message_bytes, &buffer_);
  if (!encoded.ok()) EncodeErrorFrame(encoded.message(), &buffer_);
  const auto what = [&] {
    return absl::StrCat("sending control message ", msg.GetTypeName(), " (",
                        buffer_.size(), " bytes) to rank ", dest, " (tag ", tag,
                        ") on ", comm_.Describe());
  };
  // Nonblocking + a polled wait, so a peer that never receives cannot hold
  // this rank past its step's deadline (fault_monitor.h).
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Isend(buffer_.data(), static_cast<int>(buffer_.size()),
                           MPI_BYTE, dest, tag, comm_.get(), &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Isend", what());
  RETURN_IF_ERROR(WaitRequest(&request, nullptr, what));
  return encoded;
}

absl::Status ControlChannel::Recv(int source, int tag,
                                  google::protobuf::MessageLite* msg,
                                  int* from) {
  absl::Cleanup trim = [this] { TrimBuffer(); };
  RETURN_IF_ERROR(CheckPeer(source, "source", /*allow_any=*/true));
  const auto what = [&] {
    return absl::StrCat("receiving control message ", msg->GetTypeName(),
                        " from ",
                        source == kAnySource ? std::string("any rank")
                                             : absl::StrCat("rank ", source),
                        " (tag ", tag, ") on ", comm_.Describe());
  };
  // Matched probe: the message is ours alone from here on, and its size is
  // known before anything is allocated.
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  RETURN_IF_ERROR(WaitProbe(source, tag, comm_.get(), &message, &status, what));
  int count = 0;
  int rc = MPI_SUCCESS;
  rc = MPI_Get_count(&status, MPI_BYTE, &count);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Get_count", what());
  const int sender = status.MPI_SOURCE;
  if (from != nullptr) *from = sender;

  const size_t largest_frame =
      kFrameHeaderBytes +
      std::max(options_.max_message_bytes, kMaxErrorFrameText);
  const bool oversized =
      count < 0 || static_cast<size_t>(count) > largest_frame;
  // An oversized frame is still received in full: MPI cannot drop a matched
  // message, and a truncating receive of a large one crashes Open MPI 4.1's
  // single-copy path. The memory is freed at once.
  std::unique_ptr<char[]> discard;
  char* target = nullptr;
  if (oversized) {
    discard.reset(new char[count > 0 ? count : 1]);
    target = discard.get();
  } else {
    buffer_.resize(count);
    target = buffer_.data();
  }
  rc = MPI_Mrecv(target, count, MPI_BYTE, &message, &status);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Mrecv", what());
  if (oversized) {
    return absl::DataLossError(absl::StrCat(
        FromRank(sender, tag), ": a ", count - kFrameHeaderBytes, "-byte ",
        msg->GetTypeName(), " is above this rank's limit of ",
        options_.max_message_bytes,
        " bytes (the sender's limit is larger; every rank should use the "
        "same limit)"));
  }
  const absl::Status decoded =
      DecodeFrame(buffer_, options_.max_message_bytes, msg);
  if (!decoded.ok()) return AsDataLoss(decoded, FromRank(sender, tag));
  return absl::OkStatus();
}

absl::Status ControlChannel::Broadcast(google::protobuf::MessageLite* msg,
                                       int root) {
  absl::Cleanup trim = [this] { TrimBuffer(); };
  RETURN_IF_ERROR(CheckPeer(root, "broadcast root", /*allow_any=*/false));
  const auto what = [&](absl::string_view part) {
    return absl::StrCat("broadcasting the ", part, " of control message ",
                        msg->GetTypeName(), " from rank ", root, " on ",
                        comm_.Describe());
  };
  absl::Status encoded = absl::OkStatus();
  if (rank() == root) {
    encoded = EncodeFrame(*msg, options_.max_message_bytes, &buffer_);
    // The others are already waiting for a length: give them one that tells
    // them why no message comes.
    if (!encoded.ok()) EncodeErrorFrame(encoded.message(), &buffer_);
  } else {
    buffer_.resize(kFrameHeaderBytes);
  }
  // Nonblocking broadcasts + polled waits: a rank that never joins cannot
  // hold the others past their step's deadline (fault_monitor.h).
  const auto bcast = [&](char* data, size_t bytes,
                         absl::string_view part) -> absl::Status {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root,
                              comm_.get(), &request);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibcast", what(part));
    return WaitRequest(&request, nullptr, [&] { return what(part); });
  };
  RETURN_IF_ERROR(bcast(buffer_.data(), kFrameHeaderBytes, "length"));

  // Every rank must take part in the payload broadcast that the root is
  // about to start, even one that will reject the message (a smaller limit
  // than the root's), or the root and the next collectives would wait
  // forever. Only a length no rank could have sent is refused outright.
  size_t payload = 0;
  if (rank() == root) {
    payload = buffer_.size() - kFrameHeaderBytes;
  } else {
    absl::StatusOr<FrameHeader> header =
        DecodeFrameHeader(buffer_, kMaxControlMessageCeiling);
    if (!header.ok()) return AsDataLoss(header.status(), BroadcastFrom(root));
    payload = header->payload_bytes;
    buffer_.resize(kFrameHeaderBytes + payload);
  }
  if (payload > 0) {
    RETURN_IF_ERROR(
        bcast(buffer_.data() + kFrameHeaderBytes, payload, "payload"));
  }
  if (rank() == root) return encoded;
  const absl::Status decoded =
      DecodeFrame(buffer_, options_.max_message_bytes, msg);
  if (!decoded.ok()) return AsDataLoss(decoded, BroadcastFrom(root));
  return absl::OkStatus();
}

absl::StatusOr<bool> ControlChannel::Poll(int source, int tag) {
  RETURN_IF_ERROR(CheckPeer(source, "source", /*allow_any=*/true));
  int flag = 0;
  MPI_Status status;
  const int rc = MPI_Iprobe(source, tag, comm_.get(), &flag, &status);
  if (rc != MPI_SUCCESS) {
    return MpiError(
        rc, "MPI_Iprobe",
        absl::StrCat("polling for control messages from rank ", source,
                     " (tag ", tag, ") on ", comm_.Describe()));
  }
  return flag != 0;
}

}  // namespace tessera
