#include "runtime/sampler/sampler.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(SamplerTest, GreedyTakesFirstMaximum) {
  Sampler s(SamplingParams{0.0f, 0, 1.0f, 1});
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(*s.Sample(logits), 1);
  EXPECT_EQ(ArgMax(std::vector<float>{NAN, -3.0f, -2.0f}), 2);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentStream) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = 0.05f * i;
  auto draw = [&](uint64_t seed) {
    Sampler s(SamplingParams{1.0f, 0, 1.0f, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(*s.Sample(logits));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, TopKKeepsOnlyTheKMostLikely) {
  std::vector<float> logits = {1.0f, 5.0f, 3.0f, 4.0f, 0.0f};
  Sampler s(SamplingParams{1.0f, 2, 1.0f, 3});
  for (int i = 0; i < 200; ++i) {
    const int32_t t = *s.Sample(logits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(SamplerTest, TopPKeepsTheTokenThatCrossesTheThreshold) {
  // Probabilities ~0.665, 0.245, 0.090: top_p 0.7 keeps the first two.
  std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  Sampler s(SamplingParams{1.0f, 0, 0.7f, 11});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) seen[*s.Sample(logits)]++;
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 0);
}

TEST(SamplerTest, TemperatureSharpensTheDistribution) {
  std::vector<float> logits = {1.0f, 0.0f};
  auto frequency_of_best = [&](float temperature) {
    Sampler s(SamplingParams{temperature, 0, 1.0f, 5});
    int best = 0;
    for (int i = 0; i < 2000; ++i) best += *s.Sample(logits) == 0;
    return best / 2000.0;
  };
  EXPECT_NEAR(frequency_of_best(1.0f), 0.731, 0.04);
  EXPECT_GT(frequency_of_best(0.2f), 0.98);
}

TEST(SamplerTest, ValidateRejectsOutOfRange) {
  EXPECT_FALSE((SamplingParams{-1.0f, 0, 1.0f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, -2, 1.0f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 0.0f, {}}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 1.5f, {}}).Validate().ok());
  EXPECT_TRUE((SamplingParams{0.0f, 40, 0.9f, 1}).Validate().ok());
}

}  // namespace
}  // namespace tessera
