// The control channel's wire format, without MPI: this test links only
// control_frame, so nothing here can initialise MPI or need mpirun.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "parallel/control_frame.h"
#include "parallel/testdata/framing_test.pb.h"

namespace tessera {
namespace {

using ::tessera::parallel::testing::NeedsField;
using ::tessera::parallel::testing::TestMessage;

constexpr size_t kLimit = 1 << 20;

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

bool Contains(const absl::Status& status, absl::string_view text) {
  return status.message().find(text) != absl::string_view::npos;
}

TEST(ControlFrameTest, RoundTrip) {
  TestMessage msg;
  msg.set_id(42);
  msg.set_text("step plan");
  msg.set_payload(std::string(70000, '\x5a'));
  for (int64_t v : {int64_t{-1}, int64_t{0}, int64_t{1} << 40})
    msg.add_values(v);

  std::string frame;
  ASSERT_TRUE(EncodeFrame(msg, kLimit, &frame).ok());
  ASSERT_EQ(frame.size(), kFrameHeaderBytes + msg.ByteSizeLong());

  TestMessage back;
  back.set_id(7);  // Must be replaced, not merged into.
  back.add_values(99);
  ASSERT_TRUE(DecodeFrame(frame, kLimit, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), msg.SerializeAsString());
}

TEST(ControlFrameTest, LengthPrefixIsLittleEndian) {
  TestMessage msg;
  msg.set_payload(std::string(300, 'x'));
  std::string frame;
  ASSERT_TRUE(EncodeFrame(msg, kLimit, &frame).ok());
  EXPECT_EQ(frame.substr(0, 8), LittleEndian64(msg.ByteSizeLong()));
}

TEST(ControlFrameTest, EmptyMessage) {
  TestMessage empty;
  std::string frame;
  ASSERT_TRUE(EncodeFrame(empty, kLimit, &frame).ok());
  EXPECT_EQ(frame, LittleEndian64(0));

  TestMessage back;
  back.set_id(3);
  ASSERT_TRUE(DecodeFrame(frame, kLimit, &back).ok());
  EXPECT_FALSE(back.has_id());
}

TEST(ControlFrameTest, TruncatedPayload) {
  // The length says 100, only 10 bytes follow.
  const std::string frame = LittleEndian64(100) + std::string(10, 'a');
  TestMessage back;
  const absl::Status status = DecodeFrame(frame, kLimit, &back);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(status, "truncated")) << status;
  EXPECT_TRUE(Contains(status, "says 100 bytes but 10 follow")) << status;
}

TEST(ControlFrameTest, TruncatedHeader) {
  TestMessage back;
  const absl::Status status = DecodeFrame(std::string(5, '\0'), kLimit, &back);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(status, "shorter than its 8-byte length prefix"))
      << status;
  EXPECT_EQ(DecodeFrameHeader("", kLimit).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ControlFrameTest, TrailingBytes) {
  TestMessage msg;
  msg.set_id(1);
  std::string frame;
  ASSERT_TRUE(EncodeFrame(msg, kLimit, &frame).ok());
  frame += "junk";
  TestMessage back;
  const absl::Status status = DecodeFrame(frame, kLimit, &back);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(status, "follow")) << status;
}

TEST(ControlFrameTest, OversizedMessageRejectedOnEncode) {
  TestMessage msg;
  msg.set_payload(std::string(5000, 'p'));
  std::string frame = "untouched?";
  const absl::Status status = EncodeFrame(msg, 1024, &frame);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, absl::StrCat(msg.ByteSizeLong(), " bytes")))
      << status;
  EXPECT_TRUE(Contains(status, "limit of 1024 bytes")) << status;
  EXPECT_TRUE(Contains(status, "tessera.parallel.testing.TestMessage"))
      << status;
}

TEST(ControlFrameTest, MessageExactlyAtTheLimitPasses) {
  TestMessage msg;
  msg.set_payload(std::string(1000, 'p'));
  const size_t size = msg.ByteSizeLong();
  std::string frame;
  ASSERT_TRUE(EncodeFrame(msg, size, &frame).ok());
  TestMessage back;
  EXPECT_TRUE(DecodeFrame(frame, size, &back).ok());
  EXPECT_EQ(DecodeFrame(frame, size - 1, &back).code(),
            absl::StatusCode::kDataLoss);
}

TEST(ControlFrameTest, OversizedLengthPrefixRejectedBeforeAnyPayload) {
  // A corrupt or hostile length must be refused from the header alone, before
  // anyone allocates for it.
  const std::string header = LittleEndian64(uint64_t{3} << 40);
  const absl::StatusOr<FrameHeader> parsed = DecodeFrameHeader(header, kLimit);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(parsed.status(), "above the limit of 1048576 bytes"))
      << parsed.status();
  TestMessage back;
  EXPECT_EQ(DecodeFrame(header, kLimit, &back).code(),
            absl::StatusCode::kDataLoss);
}

TEST(ControlFrameTest, GarbagePayload) {
  // Field 1 with wire type 7 (there is no such wire type), then a varint that
  // never ends: no protobuf parser accepts either.
  const std::string payload = "\x0f\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";
  const std::string frame = LittleEndian64(payload.size()) + payload;
  TestMessage back;
  const absl::Status status = DecodeFrame(frame, kLimit, &back);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(status,
                       "does not parse as "
                       "tessera.parallel.testing.TestMessage"))
      << status;
}

TEST(ControlFrameTest, MissingRequiredFieldRejectedOnEncode) {
  NeedsField msg;
  std::string frame;
  const absl::Status status = EncodeFrame(msg, kLimit, &frame);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status, "must")) << status;
}

TEST(ControlFrameTest, ErrorFrameCarriesTheSendersReason) {
  std::string frame;
  EncodeErrorFrame("control message X of 5000 bytes exceeds the limit", &frame);
  const absl::StatusOr<FrameHeader> header = DecodeFrameHeader(frame, 1);
  ASSERT_TRUE(header.ok()) << header.status();  // Whatever the limit.
  EXPECT_TRUE(header->is_error);

  TestMessage back;
  const absl::Status status = DecodeFrame(frame, 1, &back);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(status,
                       "the sender could not send it: control "
                       "message X of 5000 bytes"))
      << status;
}

TEST(ControlFrameTest, ErrorFrameTextIsBounded) {
  std::string frame;
  EncodeErrorFrame(std::string(100000, 'e'), &frame);
  EXPECT_EQ(frame.size(), kFrameHeaderBytes + kMaxErrorFrameText);
  // An error frame that claims more text than allowed is itself corrupt.
  const std::string header =
      LittleEndian64(kErrorFrameBit | (kMaxErrorFrameText + 1));
  EXPECT_EQ(DecodeFrameHeader(header, kLimit).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ControlFrameTest, LimitMustBeSane) {
  EXPECT_TRUE(ValidateMaxMessageBytes(kDefaultMaxControlMessageBytes).ok());
  EXPECT_TRUE(ValidateMaxMessageBytes(kMaxControlMessageCeiling).ok());
  EXPECT_FALSE(ValidateMaxMessageBytes(0).ok());
  EXPECT_FALSE(ValidateMaxMessageBytes(kMaxControlMessageCeiling + 1).ok());
  EXPECT_FALSE(ValidateMaxMessageBytes(size_t{2} << 30).ok());
}

}  // namespace
}  // namespace tessera
