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

// min_tokens: masked ids are never picked, greedy or sampled, penalties or
// not; ids outside the vocabulary are ignored; with everything masked the
// argmax comes back rather than an error (as on the device).
TEST(SamplerTest, MaskedIdsAreNeverPicked) {
  const std::vector<float> logits = {1.0f, 9.0f, 3.0f, 8.5f, 0.0f};
  const std::vector<int32_t> masked = {1, 3, 99, -4};
  Sampler greedy(SamplingParams{0.0f, 0, 1.0f, 1});
  EXPECT_EQ(*greedy.Sample(logits), 1);
  EXPECT_EQ(*greedy.Sample(logits, {}, {}, masked), 2);
  SamplingParams penalized{0.0f, 0, 1.0f, 1};
  penalized.repetition_penalty = 2.0f;
  Sampler with_penalty(penalized);
  // 2 is penalized to 1.5: 0 (1.0) still loses, 2 wins.
  EXPECT_EQ(*with_penalty.Sample(logits, {2}, {}, masked), 2);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Sampler hot(SamplingParams{2.0f, 0, 1.0f, seed});
    for (int i = 0; i < 50; ++i) {
      const int32_t t = *hot.Sample(logits, {}, {}, masked);
      EXPECT_TRUE(t != 1 && t != 3) << t;
    }
  }
  Sampler all(SamplingParams{1.0f, 0, 1.0f, 5});
  const absl::StatusOr<int32_t> none =
      all.Sample(logits, {}, {}, std::vector<int32_t>{0, 1, 2, 3, 4});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0);
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

namespace tessera {
namespace {

TEST(SamplerPenaltiesTest, RepetitionPenaltyFollowsTransformers) {
  // Logits 2.0 (seen, positive) / -1.0 (seen, negative) / 1.5 (unseen): with
  // penalty 2 they become 1.0, -2.0, 1.5, so greedy now picks the unseen token.
  SamplingParams p{0.0f, 0, 1.0f, 1};
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  const std::vector<float> logits = {2.0f, -1.0f, 1.5f};
  const std::vector<int32_t> prompt = {0, 1};
  EXPECT_EQ(*s.Sample(logits, prompt, {}), 2);
  EXPECT_EQ(
      *Sampler(SamplingParams{0.0f, 0, 1.0f, 1}).Sample(logits, prompt, {}), 0);
}

TEST(SamplerPenaltiesTest, PresenceAndFrequencyCountOnlyTheOutput) {
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  SamplingParams p{0.0f, 0, 1.0f, 1};
  p.presence_penalty =
      0.4f;  // Token 0 appears in the output: 3.0 - 0.4 = 2.6 > 2.5.
  EXPECT_EQ(*Sampler(p).Sample(logits, {}, std::vector<int32_t>{0}), 0);
  p.frequency_penalty = 0.2f;  // Twice: 3.0 - 0.4 - 2 * 0.2 = 2.2 < 2.5.
  EXPECT_EQ(*Sampler(p).Sample(logits, {}, std::vector<int32_t>{0, 0}), 1);
  // The prompt does not count for presence/frequency.
  EXPECT_EQ(*Sampler(p).Sample(logits, std::vector<int32_t>{0, 0, 0}, {}), 0);
}

TEST(SamplerPenaltiesTest, MinPDropsUnlikelyTokens) {
  // Probabilities ~0.70, 0.26, 0.04: min_p 0.1 keeps tokens with p >= 0.07.
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f};
  SamplingParams p{1.0f, 0, 1.0f, 9};
  p.min_p = 0.1f;
  Sampler s(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 600; ++i) seen[*s.Sample(logits)]++;
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[1], 0);
}

TEST(SamplerPenaltiesTest, ValidateChecksRanges) {
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

}  // namespace
}  // namespace tessera
