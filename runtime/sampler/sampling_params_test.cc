#include "runtime/sampler/sampling_params.h"

#include <cmath>

#include "gtest/gtest.h"
#include "runtime/sampler/sampling_params_proto.h"

namespace tessera {
namespace {

TEST(SamplingParamsTest, ValidateRejectsOutOfRange) {
  EXPECT_FALSE((SamplingParams{-1.0f, 0, 1.0f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, -2, 1.0f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 0.0f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 1.5f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{NAN, 0, 1.0f, {}}).Validate().ok());
  EXPECT_TRUE((SamplingParams{0.0f, 40, 0.9f, 1}).Validate().ok());
}

TEST(SamplingParamsTest, ValidateChecksPenaltyRanges) {
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams();
  p.repetition_penalty = 0.0f;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams();
  p.presence_penalty = 3.0f;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams();
  p.frequency_penalty = -2.5f;
  EXPECT_FALSE(p.Validate().ok());
}

TEST(SamplingParamsTest, WireFormRoundTrips) {
  SamplingParams s{0.7f, 40, 0.9f, 1234};
  s.min_p = 0.05f;
  s.repetition_penalty = 1.2f;
  s.presence_penalty = 0.5f;
  s.frequency_penalty = -0.25f;
  proto::SamplingParams wire;
  SamplingToProto(s, &wire);
  const SamplingParams back = SamplingFromProto(wire);
  EXPECT_EQ(back.temperature, s.temperature);
  EXPECT_EQ(back.top_k, s.top_k);
  EXPECT_EQ(back.top_p, s.top_p);
  EXPECT_EQ(back.seed, s.seed);
  EXPECT_EQ(back.min_p, s.min_p);
  EXPECT_EQ(back.repetition_penalty, s.repetition_penalty);
  EXPECT_EQ(back.presence_penalty, s.presence_penalty);
  EXPECT_EQ(back.frequency_penalty, s.frequency_penalty);
  // An unset repetition_penalty (0 on the wire) is 1; an unset seed stays
  // unset.
  EXPECT_EQ(SamplingFromProto(proto::SamplingParams()).repetition_penalty,
            1.0f);
  EXPECT_FALSE(SamplingFromProto(proto::SamplingParams()).seed.has_value());
}

}  // namespace
}  // namespace tessera
