// The system protoc and libprotobuf are wired through Bazel's native proto
// rules: a message survives serialization unchanged, and truncated bytes are
// rejected rather than misread.
#include <string>

#include "gtest/gtest.h"
#include "proto/tessera.pb.h"

namespace tessera {
namespace {

TEST(TesseraProtoTest, PlanRoundTripsAndTruncationIsDetected) {
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::FORWARD);
  proto::SequenceStep* seq = plan.add_seqs();
  seq->set_sequence_id(7);
  seq->set_start(true);
  for (int t : {1, 403, 407}) seq->add_tokens(t);
  seq->mutable_sampling()->set_temperature(0.5f);
  const std::string bytes = plan.SerializeAsString();
  proto::StepPlan back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  ASSERT_EQ(back.seqs_size(), 1);
  EXPECT_EQ(back.seqs(0).tokens_size(), 3);
  EXPECT_EQ(back.seqs(0).tokens(1), 403);
  EXPECT_EQ(back.seqs(0).sampling().temperature(), 0.5f);
  EXPECT_FALSE(back.ParseFromString(bytes.substr(0, bytes.size() - 2)));
}

}  // namespace
}  // namespace tessera
