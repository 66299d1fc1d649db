#include "parallel/control_frame.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// Explicit byte order, so the format does not depend on the host's.
void PutHeader(uint64_t value, char* out) {
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

uint64_t GetHeader(const char* in) {
  uint64_t value = 0;
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i]))
             << (8 * i);
  }
  return value;
}

}  // namespace

absl::Status ValidateMaxMessageBytes(size_t max_message_bytes) {
  if (max_message_bytes < 1 || max_message_bytes > kMaxControlMessageCeiling) {
    return absl::InvalidArgumentError(
        absl::StrCat("control message limit of ", max_message_bytes,
                     " bytes is outside [1, ", kMaxControlMessageCeiling,
                     "]; protobuf messages must stay far below 2 GiB"));
  }
  return absl::OkStatus();
}

absl::Status EncodeFrame(const google::protobuf::MessageLite& msg,
                         size_t max_message_bytes, std::string* out) {
  const size_t size = msg.ByteSizeLong();
  if (size > max_message_bytes || size > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("control message ", msg.GetTypeName(), " of ", size,
                     " bytes exceeds the limit of ", max_message_bytes,
                     " bytes; split it into smaller messages"));
  }
  if (!msg.IsInitialized()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control message ", msg.GetTypeName(),
        " lacks required fields: ", msg.InitializationErrorString()));
  }
  out->resize(kFrameHeaderBytes + size);
  PutHeader(size, out->data());
  // Serializing straight into the frame avoids a second copy of the payload
  // (ShardChunks are tens of MiB).
  if (!msg.SerializeToArray(out->data() + kFrameHeaderBytes,
                            static_cast<int>(size))) {
    return absl::InternalError(absl::StrCat("serializing control message ",
                                            msg.GetTypeName(), " of ", size,
                                            " bytes failed"));
  }
  return absl::OkStatus();
}

void EncodeErrorFrame(absl::string_view reason, std::string* out) {
  reason = reason.substr(0, kMaxErrorFrameText);
  out->resize(kFrameHeaderBytes + reason.size());
  PutHeader(kErrorFrameBit | reason.size(), out->data());
  std::copy(reason.begin(), reason.end(), out->begin() + kFrameHeaderBytes);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes,
                                              size_t max_message_bytes) {
  if (bytes.size() < kFrameHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("frame of ", bytes.size(), " bytes is shorter than its ",
                     kFrameHeaderBytes, "-byte length prefix"));
  }
  const uint64_t raw = GetHeader(bytes.data());
  FrameHeader header;
  header.is_error = (raw & kErrorFrameBit) != 0;
  header.payload_bytes = raw & ~kErrorFrameBit;
  const uint64_t limit =
      header.is_error ? kMaxErrorFrameText : max_message_bytes;
  if (header.payload_bytes > limit) {
    return absl::DataLossError(
        absl::StrCat("length prefix says ", header.payload_bytes, " bytes",
                     header.is_error ? " of error text" : "",
                     ", above the limit of ", limit, " bytes"));
  }
  return header;
}

absl::Status DecodeFrame(absl::string_view bytes, size_t max_message_bytes,
                         google::protobuf::MessageLite* msg) {
  absl::StatusOr<FrameHeader> header =
      DecodeFrameHeader(bytes, max_message_bytes);
  if (!header.ok()) return header.status();
  const absl::string_view payload = bytes.substr(kFrameHeaderBytes);
  if (payload.size() != header->payload_bytes) {
    return absl::DataLossError(absl::StrCat(
        payload.size() < header->payload_bytes ? "truncated frame" : "frame",
        ": the length prefix says ", header->payload_bytes, " bytes but ",
        payload.size(), " follow"));
  }
  if (header->is_error) {
    return absl::DataLossError(
        absl::StrCat("the sender could not send it: ", payload));
  }
  if (!msg->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(absl::StrCat("the ", payload.size(),
                                            "-byte payload does not parse as ",
                                            msg->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace tessera
