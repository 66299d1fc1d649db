#include "runtime/model/rope.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tessera {
namespace {

ModelConfig Config(RopeScaling scaling) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope.theta = 10000.0;
  c.rope.scaling = scaling;
  c.rope.factor = 4.0;
  c.rope.original_max_position = 64;
  return c;
}

TEST(RopeTest, DefaultIsThetaToTheMinusTwoIOverDim) {
  auto f = ComputeRopeInvFreq(Config(RopeScaling::kNone));
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->numel(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(f->data_as<float>()[i],
                    1.0f / std::pow(10000.0f, 2.0f * i / 8.0f));
  }
}

TEST(RopeTest, LinearDividesByTheFactor) {
  auto base = ComputeRopeInvFreq(Config(RopeScaling::kNone));
  auto linear = ComputeRopeInvFreq(Config(RopeScaling::kLinear));
  ASSERT_TRUE(base.ok() && linear.ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(linear->data_as<float>()[i],
                    base->data_as<float>()[i] / 4.0f);
  }
}

TEST(RopeTest, Llama3KeepsHighFrequenciesAndSlowsLowOnes) {
  auto base = ComputeRopeInvFreq(Config(RopeScaling::kNone));
  auto llama3 = ComputeRopeInvFreq(Config(RopeScaling::kLlama3));
  ASSERT_TRUE(base.ok() && llama3.ok());
  // i = 0: wavelength 2π < 64 / 4: kept. i = 3: wavelength ≈ 6.3e3 > 64: / 4.
  EXPECT_FLOAT_EQ(llama3->data_as<float>()[0], base->data_as<float>()[0]);
  EXPECT_FLOAT_EQ(llama3->data_as<float>()[3],
                  base->data_as<float>()[3] / 4.0f);
}

TEST(RopeTest, OddHeadDimIsRejected) {
  ModelConfig c = Config(RopeScaling::kNone);
  c.head_dim = 7;
  EXPECT_EQ(ComputeRopeInvFreq(c).status().message(),
            "head_dim 7 must be even for RoPE");
}

}  // namespace
}  // namespace tessera
