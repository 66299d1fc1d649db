// The rope tables against float64 transcriptions of transformers'
// modeling_rope_utils.py formulas, written out here independently of
// rope.cc (the tables are f32: they agree to f32 rounding).
#include "runtime/model/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

// theta^(-2i/dim), i < dim / 2.
std::vector<double> Default(double theta, int64_t dim) {
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    f[i] = 1.0 / std::pow(theta, 2.0 * i / dim);
  }
  return f;
}

void ExpectTable(const Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.data_as<float>()[i], want[i], 1e-6 * want[i]) << i;
  }
}

TEST(RopeTest, DefaultIsThetaToTheMinusTwoIOverDim) {
  auto f = ComputeRopeInvFreq(Config(RopeScaling::kNone));
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->numel(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(f->data_as<float>()[i],
                    1.0f / std::pow(10000.0f, 2.0f * i / 8.0f));
  }
  auto t = ComputeRope(Config(RopeScaling::kNone));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->options.length_scaling, RopeLengthScaling::kNone);
  EXPECT_EQ(t->options.cos_sin_scale, 1.0f);
  EXPECT_EQ(t->softmax_scale_factor, 1.0);
  EXPECT_FALSE(t->long_inv_freq.has_value());
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

// YaRN (_compute_yarn_parameters): dims below the correction range keep the
// original frequency, dims above it are divided by factor, a linear ramp
// blends the range; low = floor(dim ln(Lo / (beta_fast 2π)) / (2 ln θ)),
// high = ceil(same with beta_slow), clamped to [0, dim - 1] (truncate), or
// unrounded (truncate = false).
std::vector<double> YarnFormula(double theta, int64_t dim, double factor,
                                double original, double beta_fast,
                                double beta_slow, bool truncate) {
  auto correction = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = correction(beta_fast), high = correction(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(theta, 2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double keep = 1 - ramp;  // The extrapolation factor.
    f[i] = (1 / (factor * pos_freq)) * (1 - keep) + (1 / pos_freq) * keep;
  }
  return f;
}

TEST(RopeTest, YarnBlendsInterpolatedAndOriginalFrequencies) {
  ModelConfig c = Config(RopeScaling::kYarn);
  c.head_dim = 16;
  c.rope.attention_factor = 1.0;
  // Low = floor(-0.99) -> 0, high = ceil(2.02) = 3: a ramp over dims 0..3.
  for (const bool truncate : {true, false}) {
    SCOPED_TRACE(truncate);
    c.rope.truncate = truncate;
    auto t = ComputeRope(c);
    ASSERT_TRUE(t.ok()) << t.status();
    ExpectTable(t->inv_freq,
                YarnFormula(10000.0, 16, 4.0, 64.0, 32.0, 1.0, truncate));
    EXPECT_EQ(t->options.length_scaling, RopeLengthScaling::kNone);
  }
  // Other betas move the range: beta_fast 8, beta_slow 2.
  c.rope.truncate = true;
  c.rope.beta_fast = 8;
  c.rope.beta_slow = 2;
  c.rope.theta = 500.0;
  auto t = ComputeRope(c);
  ASSERT_TRUE(t.ok());
  ExpectTable(t->inv_freq, YarnFormula(500.0, 16, 4.0, 64.0, 8.0, 2.0, true));
  // Beyond the ramp a dim is the original frequency over factor.
  const std::vector<double> plain = Default(500.0, 16);
  EXPECT_NEAR(t->inv_freq.data_as<float>()[7], plain[7] / 4, 1e-6 * plain[7]);
}

// transformers multiplies cos and sin by the attention factor; with every
// dim rotated Tessera multiplies the softmax scale by its square instead.
TEST(RopeTest, YarnAttentionFactorScalesTheSoftmaxWhenEveryDimRotates) {
  ModelConfig c = Config(RopeScaling::kYarn);
  c.rope.attention_factor = 1.1386;
  auto t = ComputeRope(c);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->softmax_scale_factor, 1.1386 * 1.1386);
  EXPECT_EQ(t->options.cos_sin_scale, 1.0f);
}

// Dynamic NTK: the table for sequences within the original context is
// theta' = theta * (factor * L / L - (factor - 1))^(d / (d - 2)) = theta;
// the kernel gets theta, factor, factor - 1, d / (d - 2) and the original
// length in f32 to grow it per sequence.
TEST(RopeTest, DynamicNtkStartsFromThePlainTableAndDescribesTheGrowth) {
  ModelConfig c = Config(RopeScaling::kDynamic);
  c.rope.factor = 2.5;
  c.rope.original_max_position = 32;
  auto t = ComputeRope(c);
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectTable(t->inv_freq, Default(10000.0, 8));
  const RopeOptions& o = t->options;
  EXPECT_EQ(o.length_scaling, RopeLengthScaling::kDynamicNtk);
  EXPECT_EQ(o.original_max_len, 32);
  EXPECT_EQ(o.base, 10000.0f);
  EXPECT_EQ(o.factor, 2.5f);
  EXPECT_EQ(o.factor_minus_one, 1.5f);
  EXPECT_EQ(o.exponent, static_cast<float>(8.0 / 6.0));
  EXPECT_EQ(t->softmax_scale_factor, 1.0);
}

// LongRoPE: 1 / (short[i] theta^(2i/d)) within the original context, the
// long factors beyond; the attention factor on the softmax (every dim
// rotated) or on cos and sin (partial rotary).
TEST(RopeTest, LongRopeDividesByShortAndLongFactors) {
  ModelConfig c = Config(RopeScaling::kLongRope);
  c.rope.short_factor = {1.0, 1.25, 1.5, 2.0};
  c.rope.long_factor = {1.0, 3.0, 7.5, 20.0};
  c.rope.attention_factor = 1.19;
  auto t = ComputeRope(c);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<double> plain = Default(10000.0, 8);
  std::vector<double> short_want(4), long_want(4);
  for (int i = 0; i < 4; ++i) {
    short_want[i] = plain[i] / c.rope.short_factor[i];
    long_want[i] = plain[i] / c.rope.long_factor[i];
  }
  ExpectTable(t->inv_freq, short_want);
  ASSERT_TRUE(t->long_inv_freq.has_value());
  ExpectTable(*t->long_inv_freq, long_want);
  EXPECT_EQ(t->options.length_scaling, RopeLengthScaling::kLongRope);
  EXPECT_EQ(t->options.original_max_len, 64);
  EXPECT_DOUBLE_EQ(t->softmax_scale_factor, 1.19 * 1.19);
  EXPECT_EQ(t->options.cos_sin_scale, 1.0f);

  c.rope.short_factor.pop_back();
  EXPECT_EQ(ComputeRope(c).status().code(), absl::StatusCode::kInvalidArgument);
}

// Partial rotary (Phi-4-mini: 0.75): the table covers the rotated dims,
// theta^(-2i/R) with R the rotated dims, and an attention factor goes onto
// cos and sin (the pass-through dims carry none).
TEST(RopeTest, PartialRotaryTablesCoverTheRotatedDims) {
  ModelConfig c = Config(RopeScaling::kLongRope);
  c.head_dim = 16;
  c.rope.rotary_dim = 12;
  c.rope.short_factor.assign(6, 1.0);
  c.rope.long_factor = {1, 2, 3, 4, 5, 6};
  c.rope.attention_factor = 1.2;
  auto t = ComputeRope(c);
  ASSERT_TRUE(t.ok()) << t.status();
  ExpectTable(t->inv_freq, Default(10000.0, 12));
  EXPECT_EQ(t->softmax_scale_factor, 1.0);
  EXPECT_EQ(t->options.cos_sin_scale, 1.2f);

  c.rope.rotary_dim = 18;  // Wider than the head.
  EXPECT_EQ(ComputeRope(c).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RopeTest, OddHeadDimIsRejected) {
  ModelConfig c = Config(RopeScaling::kNone);
  c.head_dim = 7;
  EXPECT_EQ(ComputeRopeInvFreq(c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --max-model-len lowers max_position_embeddings; the rope keeps the
// checkpoint's values (resolved when config.json was parsed).
TEST(RopeTest, MaxModelLenDoesNotChangeTheRope) {
  for (const char* scaling :
       {R"({"rope_type": "dynamic", "factor": 2.0})",
        R"({"rope_type": "yarn", "factor": 4.0})",
        R"({"rope_type": "yarn", "factor": null,
            "original_max_position_embeddings": 16})",
        R"({"rope_type": "longrope", "short_factor": [1, 1, 1, 1],
            "long_factor": [1, 2, 3, 4],
            "original_max_position_embeddings": 16})"}) {
    SCOPED_TRACE(scaling);
    nlohmann::json j = {{"model_type", "llama"},
                        {"vocab_size", 32},
                        {"hidden_size", 16},
                        {"intermediate_size", 32},
                        {"num_hidden_layers", 1},
                        {"num_attention_heads", 2},
                        {"max_position_embeddings", 64},
                        {"rope_parameters", nlohmann::json::parse(scaling)}};
    j["rope_parameters"]["rope_theta"] = 10000.0;
    auto config = ParseModelConfig(j.dump());
    ASSERT_TRUE(config.ok()) << config.status();
    ModelConfig limited = *config;
    ASSERT_TRUE(LimitContext(8, &limited).ok());
    EXPECT_EQ(limited.max_position_embeddings, 8);
    auto a = ComputeRope(*config);
    auto b = ComputeRope(limited);
    ASSERT_TRUE(a.ok() && b.ok());
    for (int64_t i = 0; i < a->inv_freq.numel(); ++i) {
      EXPECT_EQ(a->inv_freq.data_as<float>()[i],
                b->inv_freq.data_as<float>()[i]);
    }
    EXPECT_EQ(a->options.original_max_len, b->options.original_max_len);
    EXPECT_EQ(a->softmax_scale_factor, b->softmax_scale_factor);
  }
}

}  // namespace
}  // namespace tessera
