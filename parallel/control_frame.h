// The wire format of control messages (protobuf over MPI), in one place.
//
// A frame is an 8-byte little-endian header followed by a payload:
//
//   header = payload length in bytes (bits 0..62) | kErrorFrameBit (bit 63)
//
// A normal frame carries a serialized protobuf message. An error frame
// (bit 63 set) carries a short UTF-8 text instead: a sender that cannot send
// its message (too large, missing required fields) sends an error frame so
// that the matching Recv or Broadcast on the other ranks fails at once with the
// sender's reason instead of waiting forever for a message that never comes.
//
// The size limit guards every allocation a peer's header can cause: a sender
// refuses to encode a message above it, and a receiver refuses a header above
// it. Protobuf itself cannot serialize 2 GiB or more, and the largest message
// the design sends (a ShardChunk) is bounded at 64 MiB, so the default limit
// is 256 MiB and the limit may never exceed kMaxControlMessageCeiling (1 GiB),
// which keeps every frame's size within an MPI int count.
//
// These functions need no MPI, so the format is unit-tested on its own;
// ControlChannel (control_channel.h) moves frames between ranks.
#ifndef TESSERA_PARALLEL_CONTROL_FRAME_H_
#define TESSERA_PARALLEL_CONTROL_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace tessera {

inline constexpr size_t kFrameHeaderBytes = 8;
inline constexpr uint64_t kErrorFrameBit = uint64_t{1} << 63;
inline constexpr size_t kDefaultMaxControlMessageBytes = size_t{256} << 20;
inline constexpr size_t kMaxControlMessageCeiling = size_t{1} << 30;
// An error frame's text is cut to this many bytes, and a receiver accepts an
// error frame up to this size whatever its message limit.
inline constexpr size_t kMaxErrorFrameText = 1024;

// What a header says.
struct FrameHeader {
  uint64_t payload_bytes = 0;
  bool is_error = false;
};

// InvalidArgument unless 1 <= max_message_bytes <= kMaxControlMessageCeiling.
absl::Status ValidateMaxMessageBytes(size_t max_message_bytes);

// Replaces *out with the frame of `msg`. InvalidArgument (naming the
// message type, its size and the limit) when the serialized message is larger
// than max_message_bytes, or when it lacks required (proto2) fields.
absl::Status EncodeFrame(const google::protobuf::MessageLite& msg,
                         size_t max_message_bytes, std::string* out);

// Replaces *out with an error frame carrying `reason` (cut to
// kMaxErrorFrameText bytes).
void EncodeErrorFrame(absl::string_view reason, std::string* out);

// Reads the first kFrameHeaderBytes of `bytes`. DataLoss when fewer bytes are
// given, or the length is above max_message_bytes (kMaxErrorFrameText for an
// error frame). The payload that follows is not looked at.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes,
                                              size_t max_message_bytes);

// Parses one whole frame (header and exactly its payload) into *msg. DataLoss
// when the header is bad (see DecodeFrameHeader), the payload is shorter or
// longer than the header says, the payload does not parse as msg's type, or it
// is an error frame (the message then carries the sender's reason). Messages
// do not name the sending rank: ControlChannel adds "control message from
// rank R".
absl::Status DecodeFrame(absl::string_view bytes, size_t max_message_bytes,
                         google::protobuf::MessageLite* msg);

}  // namespace tessera

#endif  // TESSERA_PARALLEL_CONTROL_FRAME_H_
