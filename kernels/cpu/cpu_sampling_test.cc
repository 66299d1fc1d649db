#include "kernels/cpu/cpu_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"

namespace tessera {
namespace {

// One draw of the CPU sampler.
int32_t Draw(absl::Span<const float> logits, const SamplingParams& params,
             uint64_t seed, uint64_t step,
             absl::Span<const int32_t> prompt = {},
             absl::Span<const int32_t> output = {},
             absl::Span<const int32_t> masked = {}) {
  EXPECT_TRUE(params.Validate().ok());
  CpuSampleScratch scratch;
  SampleRow row;
  row.params = &params;
  row.seed = seed;
  row.step = step;
  row.prompt = prompt;
  row.output = output;
  row.masked = masked;
  return CpuSampleToken(logits, row, &scratch);
}

SamplingParams Params(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                      float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

// --- The reference: the documented semantics written out plainly (sorted
// survivors, sequential sums), the uniform from PhiloxUniform.

struct Survivors {
  std::vector<double> weight;  // By id; 0 = dropped.
};

Survivors ReferenceSurvivors(std::vector<float> l, const SamplingParams& p,
                             absl::Span<const int32_t> prompt,
                             absl::Span<const int32_t> output,
                             absl::Span<const int32_t> masked) {
  const int64_t vocab = l.size();
  std::vector<int32_t> count(vocab, 0);
  std::vector<bool> seen(vocab, false);
  for (int32_t id : output) ++count[id], seen[id] = true;
  for (int32_t id : prompt) seen[id] = true;
  for (int64_t i = 0; i < vocab; ++i) {
    if (p.repetition_penalty != 1.0f && seen[i]) {
      l[i] =
          l[i] > 0 ? l[i] / p.repetition_penalty : l[i] * p.repetition_penalty;
    }
    if (count[i] > 0) {
      l[i] -= p.frequency_penalty * static_cast<float>(count[i]) +
              p.presence_penalty;
    }
  }
  for (int32_t id : masked) l[id] = -INFINITY;
  std::vector<std::pair<float, int32_t>> cand;
  float max = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    float t = l[i] / p.temperature;
    if (std::isnan(t) || t == -INFINITY) continue;
    if (t == 0.0f) t = 0.0f;
    max = std::max(max, t);
    cand.emplace_back(t, static_cast<int32_t>(i));
  }
  if (p.min_p > 0.0f) {
    const float floor = max + std::log(p.min_p);
    cand.erase(std::remove_if(cand.begin(), cand.end(),
                              [&](const auto& c) { return c.first < floor; }),
               cand.end());
  }
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size()) {
    cand.resize(p.top_k);
  }
  std::vector<double> w(cand.size());
  double total = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) {
    w[i] = sampling::SampleWeight(cand[i].first, max);
    total += w[i];
  }
  size_t n = cand.size();
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (n = 0; n < cand.size();) {
      mass += w[n];
      ++n;
      if (mass / total >= p.top_p) break;
    }
  }
  Survivors s;
  s.weight.assign(vocab, 0.0);
  for (size_t i = 0; i < n; ++i) s.weight[cand[i].second] = w[i];
  return s;
}

// Walks the survivors in id order against u * total.
int32_t ReferenceDraw(const Survivors& s, double u) {
  double total = 0.0;
  for (double w : s.weight) total += w;
  double r = u * total;
  int32_t last = -1;
  for (size_t i = 0; i < s.weight.size(); ++i) {
    if (s.weight[i] <= 0.0) continue;
    last = static_cast<int32_t>(i);
    r -= s.weight[i];
    if (r < 0.0) return last;
  }
  return last;
}

TEST(CpuSamplingTest, DrawsEqualTheReferenceFromPhiloxUniform) {
  std::mt19937 rng(20261201);
  std::uniform_int_distribution<uint64_t> any_u64;
  const float temperatures[] = {1.0f, 0.5f, 1.7f, 0.05f};
  const int32_t top_ks[] = {0, 1, 5, 50, 0, 1000};
  const float top_ps[] = {1.0f, 0.9f, 0.5f, 1.0f, 0.1f, 0.99f, 0.3f};
  const float min_ps[] = {0.0f, 0.05f, 0.0f, 0.5f, 0.0f};
  int compared = 0;
  for (int64_t vocab : {151936, 517, 7}) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::uniform_int_distribution<int32_t> any_id(0, vocab - 1);
    const int rows = vocab > 100000 ? 24 : 300;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> logits(vocab);
      for (float& x : logits) x = normal(rng);
      if (r % 8 == 5) {
        for (float& x : logits) x = std::round(x);  // Ties at the cutoffs.
      }
      SamplingParams p = Params(temperatures[r % 4], top_ks[r % 6],
                                top_ps[r % 7], min_ps[r % 5]);
      std::vector<int32_t> prompt, output, masked;
      if (r % 4 == 3) {
        p.repetition_penalty = 1.2f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        for (int k = 0; k < 20; ++k) prompt.push_back(any_id(rng));
        for (int k = 0; k < 20; ++k) output.push_back(any_id(rng));
      }
      if (r % 6 == 1 && vocab > 7) {
        for (int k = 0; k < 3; ++k) masked.push_back(any_id(rng));
      }
      const uint64_t seed = any_u64(rng), step = any_u64(rng) % 100000;
      const int32_t got = Draw(logits, p, seed, step, prompt, output, masked);
      const Survivors s = ReferenceSurvivors(logits, p, prompt, output, masked);
      ASSERT_EQ(got, ReferenceDraw(s, PhiloxUniform(seed, step)))
          << "vocab=" << vocab << " row=" << r << " T=" << p.temperature
          << " top_k=" << p.top_k << " top_p=" << p.top_p
          << " min_p=" << p.min_p;
      ASSERT_GT(s.weight[got], 0.0) << "drew a dropped token";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 24 + 300 + 300);
}

// --- A literal single-threaded replay of the CUDA SampleKernel
// (kernels/cuda/sampling/sampling_kernels.cu): its threads' strided sums and
// warp butterflies, its bisections over the float keys, its chunked draw. The
// CPU sampler finds the same cutoffs by sorting, so this checks, without a GPU,
// that the two searches agree exactly.

constexpr int kThreads = sampling::kSampleThreads;

double ReplayBlockSum(const double* partial) {
  auto warp = [](double* v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      double next[32];
      for (int l = 0; l < 32; ++l) next[l] = v[l] + v[l ^ offset];
      std::copy(next, next + 32, v);
    }
    return v[0];
  };
  double second[32] = {};
  for (int w = 0; w < kThreads / 32; ++w) {
    double lanes[32];
    std::copy(partial + 32 * w, partial + 32 * (w + 1), lanes);
    second[w] = warp(lanes);
  }
  return warp(second);
}

uint32_t OrderedKey(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

struct Cutoff {
  uint32_t key;
  int32_t id_limit;
};
bool Keeps(Cutoff c, uint32_t key, int64_t i) {
  return key > c.key || (key == c.key && i < c.id_limit);
}

struct Replay {
  std::vector<float> t;
  float max;

  double Metric(Cutoff a, Cutoff b, Cutoff c, bool mass) const {
    double partial[kThreads] = {};
    for (size_t i = 0; i < t.size(); ++i) {
      if (!(t[i] > -INFINITY)) continue;
      const uint32_t key = OrderedKey(t[i]);
      if (Keeps(a, key, i) && Keeps(b, key, i) && Keeps(c, key, i)) {
        partial[i % kThreads] +=
            mass ? static_cast<double>(sampling::SampleWeight(t[i], max)) : 1.0;
      }
    }
    return ReplayBlockSum(partial);
  }

  Cutoff FindCutoff(Cutoff a, Cutoff b, bool mass, double target,
                    double total) const {
    auto reaches = [&](Cutoff c) {
      const double m = Metric(a, b, c, mass);
      return mass ? m / total >= target : m >= target;
    };
    uint32_t lo = 0, hi = OrderedKey(max);
    while (lo < hi) {
      const uint32_t mid =
          lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
      if (reaches({mid, INT32_MAX})) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const Cutoff all_of_key = {lo, INT32_MAX};
    if (Metric(a, b, all_of_key, false) - Metric(a, b, {lo, 0}, false) <= 1.0) {
      return all_of_key;
    }
    int64_t id_lo = 0, id_hi = t.size();
    while (id_lo < id_hi) {
      const int64_t mid = (id_lo + id_hi) / 2;
      if (reaches({lo, static_cast<int32_t>(mid)})) {
        id_hi = mid;
      } else {
        id_lo = mid + 1;
      }
    }
    return {lo, static_cast<int32_t>(id_lo)};
  }
};

int32_t ReplayKernel(absl::Span<const float> logits, const SamplingParams& p,
                     uint64_t seed, uint64_t step,
                     absl::Span<const int32_t> prompt,
                     absl::Span<const int32_t> output,
                     absl::Span<const int32_t> masked) {
  const int64_t vocab = logits.size();
  std::vector<int32_t> counts(vocab, 0);
  std::vector<uint8_t> in_prompt(vocab, 0);
  for (int32_t id : output) ++counts[id];
  for (int32_t id : prompt) in_prompt[id] = 1;
  const bool penalties = p.has_penalties();
  Replay s;
  s.t.resize(vocab);
  float best = -INFINITY, max = -INFINITY;
  int32_t argmax = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    float v = logits[i];
    if (penalties) {
      v = sampling::PenalizeLogit(v, counts[i], in_prompt[i] != 0,
                                  p.repetition_penalty, p.presence_penalty,
                                  p.frequency_penalty);
    }
    if (std::count(masked.begin(), masked.end(), i) > 0) v = -INFINITY;
    if (v > best) best = v, argmax = static_cast<int32_t>(i);
    if (p.temperature != 0.0f) {
      s.t[i] = sampling::TemperLogit(v, p.temperature);
      max = std::fmax(max, s.t[i]);
    }
  }
  if (p.temperature == 0.0f) return argmax;
  if (!(max > -INFINITY && max < INFINITY)) return argmax;
  s.max = max;
  const Cutoff all = {0u, INT32_MAX};
  Cutoff min_p = all;
  if (p.min_p > 0.0f) {
    min_p = {OrderedKey(sampling::MinPFloor(max, sampling::MinPLog(p.min_p))),
             INT32_MAX};
  }
  Cutoff top_k = all;
  if (p.top_k > 0 && p.top_k < s.Metric(min_p, all, all, false)) {
    top_k = s.FindCutoff(min_p, all, false, p.top_k, 0.0);
  }
  Cutoff top_p = all;
  if (p.top_p < 1.0f) {
    const double total = s.Metric(min_p, top_k, all, true);
    top_p = s.FindCutoff(min_p, top_k, true, p.top_p, total);
  }
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  auto weight = [&](int64_t i) -> float {
    const float v = s.t[i];
    if (!(v > -INFINITY)) return 0.0f;
    const uint32_t key = OrderedKey(v);
    if (!Keeps(min_p, key, i) || !Keeps(top_k, key, i) ||
        !Keeps(top_p, key, i)) {
      return 0.0f;
    }
    return sampling::SampleWeight(v, max);
  };
  double prefix[kThreads + 1] = {};
  int32_t my_last[kThreads], last_kept = -1;
  for (int j = 0; j < kThreads; ++j) {
    my_last[j] = -1;
    for (int64_t i = j * chunk; i < std::min<int64_t>((j + 1) * chunk, vocab);
         ++i) {
      const float w = weight(i);
      if (w > 0.0f) {
        prefix[j + 1] += w;
        my_last[j] = static_cast<int32_t>(i);
      }
    }
    last_kept = std::max(last_kept, my_last[j]);
  }
  for (int j = 1; j <= kThreads; ++j) prefix[j] += prefix[j - 1];
  const double r = PhiloxUniform(seed, step) * prefix[kThreads];
  for (int j = 0; j < kThreads; ++j) {
    if (!(prefix[j] <= r && r < prefix[j + 1])) continue;
    const double target = r - prefix[j];
    double acc = 0.0;
    for (int64_t i = j * chunk; i < std::min<int64_t>((j + 1) * chunk, vocab);
         ++i) {
      const float w = weight(i);
      if (w > 0.0f) {
        acc += w;
        if (target < acc) return static_cast<int32_t>(i);
      }
    }
    return my_last[j];
  }
  return last_kept >= 0 ? last_kept : argmax;
}

TEST(CpuSamplingTest, EqualsAReplayOfTheCudaKernel) {
  std::mt19937 rng(77);
  std::uniform_int_distribution<uint64_t> any_u64;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float temperatures[] = {1.0f, 0.5f, 1.7f, 0.05f, 0.0f};
  const int32_t top_ks[] = {0, 1, 2, 5, 50, 0, 300};
  const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.1f, 0.99f, 0.3f, 1e-6f};
  const float min_ps[] = {0.0f, 0.05f, 0.0f, 0.5f, 1.0f};
  int sampled = 0;
  for (int64_t vocab : {151936, 4099, 517, 7}) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::uniform_int_distribution<int32_t> any_id(0, vocab - 1);
    const int rows = vocab > 100000 ? 6 : 120;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> logits(vocab);
      for (float& x : logits) x = normal(rng);
      if (r % 5 == 2) {
        for (float& x : logits) x = std::round(x);  // Ties at the cutoffs.
      }
      if (r % 9 == 4) {
        for (int k = 0; k < 1 + vocab / 8; ++k) logits[any_id(rng)] = NAN;
        for (int k = 0; k < 1 + vocab / 8; ++k) logits[any_id(rng)] = -INFINITY;
      }
      SamplingParams p = Params(
          r % 11 == 10 ? 0.1f + 2.0f * unit(rng) : temperatures[r % 5],
          top_ks[r % 7], r % 13 == 12 ? unit(rng) + 1e-3f : top_ps[r % 7],
          min_ps[r % 5]);
      p.top_p = std::min(p.top_p, 1.0f);
      std::vector<int32_t> prompt, output, masked;
      if (r % 4 == 3) {
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = -0.25f;
        for (int k = 0; k < 20; ++k) prompt.push_back(any_id(rng));
        for (int k = 0; k < 20; ++k) output.push_back(any_id(rng));
      }
      if (r % 6 == 1) masked.push_back(any_id(rng));
      const uint64_t seed = any_u64(rng), step = any_u64(rng) % 100000;
      ASSERT_EQ(Draw(logits, p, seed, step, prompt, output, masked),
                ReplayKernel(logits, p, seed, step, prompt, output, masked))
          << "vocab=" << vocab << " row=" << r << " T=" << p.temperature
          << " top_k=" << p.top_k << " top_p=" << p.top_p
          << " min_p=" << p.min_p;
      sampled += p.temperature > 0.0f;
    }
  }
  EXPECT_GT(sampled, 200);
}

// --- Semantics (moved from runtime/sampler/sampler_test.cc).

TEST(CpuSamplingTest, GreedyTakesFirstMaximum) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(Draw(logits, Params(0.0f), 1, 0), 1);
  EXPECT_EQ(ArgMax(std::vector<float>{NAN, -3.0f, -2.0f}), 2);
  EXPECT_EQ(ArgMax(std::vector<float>{-INFINITY, NAN}), 0);
}

TEST(CpuSamplingTest, SameSeedAndStepSameTokenOtherwiseAnotherStream) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = 0.05f * i;
  auto draws = [&](uint64_t seed) {
    std::vector<int32_t> out;
    for (uint64_t step = 0; step < 64; ++step) {
      out.push_back(Draw(logits, Params(1.0f), seed, step));
    }
    return out;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));
  // A draw depends on (seed, step) only, not on earlier draws.
  EXPECT_EQ(Draw(logits, Params(1.0f), 7, 40), draws(7)[40]);
}

// min_tokens: masked ids are never picked, greedy or sampled, penalties or
// not; ids outside the vocabulary are ignored; with everything masked the
// argmax comes back rather than an error (as on the device).
TEST(CpuSamplingTest, MaskedIdsAreNeverPicked) {
  const std::vector<float> logits = {1.0f, 9.0f, 3.0f, 8.5f, 0.0f};
  const std::vector<int32_t> masked = {1, 3, 99, -4};
  EXPECT_EQ(Draw(logits, Params(0.0f), 1, 0), 1);
  EXPECT_EQ(Draw(logits, Params(0.0f), 1, 0, {}, {}, masked), 2);
  SamplingParams penalized = Params(0.0f);
  penalized.repetition_penalty = 2.0f;
  // 2 is penalized to 1.5: 0 (1.0) still loses, 2 wins.
  EXPECT_EQ(Draw(logits, penalized, 1, 0, std::vector<int32_t>{2}, {}, masked),
            2);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (uint64_t step = 0; step < 50; ++step) {
      const int32_t t = Draw(logits, Params(2.0f), seed, step, {}, {}, masked);
      EXPECT_TRUE(t != 1 && t != 3) << t;
    }
  }
  EXPECT_EQ(Draw(logits, Params(1.0f), 5, 0, {}, {},
                 std::vector<int32_t>{0, 1, 2, 3, 4}),
            0);
}

TEST(CpuSamplingTest, TopKKeepsOnlyTheKMostLikely) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 4.0f, 0.0f};
  std::map<int32_t, int> seen;
  for (uint64_t step = 0; step < 400; ++step) {
    seen[Draw(logits, Params(1.0f, 2), 3, step)]++;
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], seen[3]);
  EXPECT_GT(seen[3], 0);
}

TEST(CpuSamplingTest, TopPKeepsTheTokenThatCrossesTheThreshold) {
  // Probabilities ~0.665, 0.245, 0.090: top_p 0.7 keeps the first two.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  std::map<int32_t, int> seen;
  for (uint64_t step = 0; step < 400; ++step) {
    seen[Draw(logits, Params(1.0f, 0, 0.7f), 11, step)]++;
  }
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 0);
}

TEST(CpuSamplingTest, TemperatureSharpensTheDistribution) {
  const std::vector<float> logits = {1.0f, 0.0f};
  auto frequency_of_best = [&](float temperature) {
    int best = 0;
    for (uint64_t step = 0; step < 2000; ++step) {
      best += Draw(logits, Params(temperature), 5, step) == 0;
    }
    return best / 2000.0;
  };
  EXPECT_NEAR(frequency_of_best(1.0f), 0.731, 0.04);
  EXPECT_GT(frequency_of_best(0.2f), 0.98);
}

TEST(CpuSamplingTest, RepetitionPenaltyFollowsTransformers) {
  // Logits 2.0 (seen, positive) / -1.0 (seen, negative) / 1.5 (unseen): with
  // penalty 2 they become 1.0, -2.0, 1.5, so greedy now picks the unseen token.
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 2.0f;
  const std::vector<float> logits = {2.0f, -1.0f, 1.5f};
  const std::vector<int32_t> prompt = {0, 1};
  EXPECT_EQ(Draw(logits, p, 1, 0, prompt), 2);
  EXPECT_EQ(Draw(logits, Params(0.0f), 1, 0, prompt), 0);
}

TEST(CpuSamplingTest, PresenceAndFrequencyCountOnlyTheOutput) {
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  SamplingParams p = Params(0.0f);
  p.presence_penalty = 0.4f;  // Token 0 in the output: 3.0 - 0.4 = 2.6 > 2.5.
  EXPECT_EQ(Draw(logits, p, 1, 0, {}, std::vector<int32_t>{0}), 0);
  p.frequency_penalty = 0.2f;  // Twice: 3.0 - 0.4 - 2 * 0.2 = 2.2 < 2.5.
  EXPECT_EQ(Draw(logits, p, 1, 0, {}, std::vector<int32_t>{0, 0}), 1);
  // The prompt does not count for presence/frequency.
  EXPECT_EQ(Draw(logits, p, 1, 0, std::vector<int32_t>{0, 0, 0}), 0);
}

TEST(CpuSamplingTest, MinPDropsUnlikelyTokens) {
  // Probabilities ~0.70, 0.26, 0.04: min_p 0.1 keeps tokens with p >= 0.07.
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f};
  std::map<int32_t, int> seen;
  for (uint64_t step = 0; step < 600; ++step) {
    seen[Draw(logits, Params(1.0f, 0, 1.0f, 0.1f), 9, step)]++;
  }
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[1], 0);
}

// Truncations that leave one token: the draw is the argmax.
TEST(CpuSamplingTest, NarrowTruncationsPickTheArgmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(517);
  for (int r = 0; r < 30; ++r) {
    for (float& x : logits) x = normal(rng);
    const int32_t best = ArgMax(logits);
    EXPECT_EQ(Draw(logits, Params(1.0f, 1), r, r), best);
    EXPECT_EQ(Draw(logits, Params(1.5f, 0, 1e-6f), r, r), best);
    EXPECT_EQ(Draw(logits, Params(1.25f, 0, 1.0f, 1.0f), r, r), best);
  }
}

TEST(CpuSamplingTest, NaNAndInfiniteRows) {
  // NaN is never drawn.
  std::vector<float> logits(300, 0.0f);
  for (size_t i = 0; i < logits.size(); i += 2) logits[i] = NAN;
  for (uint64_t step = 0; step < 200; ++step) {
    EXPECT_EQ(Draw(logits, Params(1.0f), 3, step) % 2, 1) << step;
  }
  // Nothing finite: the argmax (0 when everything is NaN or -inf).
  std::vector<float> none(10, -INFINITY);
  none[4] = NAN;
  EXPECT_EQ(Draw(none, Params(1.0f), 1, 0), 0);
  EXPECT_EQ(Draw(none, Params(0.0f), 1, 0), 0);
  // +inf: the (first) +inf token, sampled or not.
  std::vector<float> inf(10, 1.0f);
  inf[6] = INFINITY;
  inf[8] = INFINITY;
  EXPECT_EQ(Draw(inf, Params(0.7f, 3, 0.9f), 1, 0), 6);
  EXPECT_EQ(Draw(inf, Params(0.0f), 1, 0), 6);
}

// Pearson's chi-square of draws over (seed, steps) against the survivors'
// probabilities.
TEST(CpuSamplingTest, DrawsFollowTheDistribution) {
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f,  -1.0f,
                                     2.0f, 0.3f, -0.5f, 1.5f};
  const int draws = 20000;
  const SamplingParams settings[] = {
      Params(1.0f), Params(0.7f, 4), Params(1.3f, 0, 0.8f),
      Params(1.0f, 0, 1.0f, 0.3f), Params(2.0f, 6, 0.9f, 0.05f)};
  // Chi-square bounds at p ~ 1e-4 by degrees of freedom.
  const double bound_by_dof[] = {0, 15.1, 18.4, 21.1, 23.5, 25.7, 27.9, 29.9};
  for (const SamplingParams& p : settings) {
    std::vector<int> hist(logits.size(), 0);
    for (int step = 0; step < draws; ++step) ++hist[Draw(logits, p, 777, step)];
    const Survivors s = ReferenceSurvivors(logits, p, {}, {}, {});
    double total = 0.0;
    int kept = 0;
    for (double w : s.weight) total += w, kept += w > 0.0;
    ASSERT_GE(kept, 2);
    double chi2 = 0.0;
    for (size_t i = 0; i < hist.size(); ++i) {
      if (s.weight[i] == 0.0) {
        EXPECT_EQ(hist[i], 0) << "token " << i << " should never be drawn";
        continue;
      }
      const double expected = s.weight[i] / total * draws;
      chi2 += (hist[i] - expected) * (hist[i] - expected) / expected;
    }
    EXPECT_LT(chi2, bound_by_dof[kept - 1])
        << "T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p
        << " min_p=" << p.min_p;
  }
}

// --- CpuOps::Sample: the checks, and logprobs under the unmodified logits.

TEST(CpuOpsSampleTest, LogprobsAndTopAlternativesUnderTheRawLogits) {
  CpuOps ops;
  std::vector<float> host = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f,  // row 0
                             0.0f, NAN,  5.0f, 1.0f, 2.0f};  // row 1
  const TensorView logits(host.data(), DType::kF32, {2, 5});
  SamplingParams greedy = Params(0.0f);
  greedy.presence_penalty = 1.5f;  // Decides the token, not the logprobs.
  std::vector<SampleRow> rows(2);
  const std::vector<int32_t> output = {1};
  rows[0].params = &greedy;
  rows[0].output = output;
  rows[0].top_logprobs = 7;  // More than the vocabulary: 5 come back.
  rows[1].params = &greedy;
  rows[1].top_logprobs = 5;
  std::vector<SampleResult> out;
  ASSERT_TRUE(ops.Sample(logits, rows, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].token, 3);  // 1 is penalized to 1.5.
  const double z0 = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0) +
                             std::exp(-1.0));
  EXPECT_NEAR(out[0].logprob, 3.0 - z0, 1e-5);
  ASSERT_EQ(out[0].top.size(), 5u);
  const int32_t want_ids[] = {1, 3, 2, 0, 4};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(out[0].top[k].first, want_ids[k]);
    EXPECT_NEAR(out[0].top[k].second, host[want_ids[k]] - z0, 1e-5);
  }
  // NaN is ignored by the log-sum-exp and ranks last.
  EXPECT_EQ(out[1].token, 2);
  const double z1 =
      std::log(std::exp(0.0) + std::exp(5.0) + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(out[1].logprob, 5.0 - z1, 1e-5);
  ASSERT_EQ(out[1].top.size(), 5u);
  EXPECT_EQ(out[1].top[4].first, 1);
  EXPECT_TRUE(std::isnan(out[1].top[4].second));
}

TEST(CpuOpsSampleTest, RefusesBadArguments) {
  CpuOps ops;
  std::vector<float> host(10, 0.0f);
  const TensorView logits(host.data(), DType::kF32, {2, 5});
  SamplingParams ok = Params(1.0f);
  SamplingParams bad = Params(1.0f, 0, 0.0f);  // top_p must be > 0.
  std::vector<SampleRow> rows(2);
  rows[0].params = &ok;
  rows[1].params = &ok;
  std::vector<SampleResult> out;
  EXPECT_TRUE(ops.Sample(logits, rows, &out).ok());
  EXPECT_FALSE(ops.Sample(logits, absl::MakeConstSpan(rows).subspan(1), &out)
                   .ok());  // 2 rows of logits, 1 row.
  EXPECT_FALSE(ops.Sample(logits, rows, nullptr).ok());
  rows[1].params = &bad;
  EXPECT_EQ(ops.Sample(logits, rows, &out).code(),
            absl::StatusCode::kInvalidArgument);
  rows[1].params = nullptr;
  EXPECT_FALSE(ops.Sample(logits, rows, &out).ok());
  rows[1].params = &ok;
  rows[1].top_logprobs = -1;
  EXPECT_FALSE(ops.Sample(logits, rows, &out).ok());
  rows[1].top_logprobs = 0;
  const TensorView ints(host.data(), DType::kI32, {2, 5});
  EXPECT_FALSE(ops.Sample(ints, rows, &out).ok());
  // No rows: nothing to do.
  const TensorView empty(host.data(), DType::kF32, {0, 5});
  EXPECT_TRUE(ops.Sample(empty, {}, &out).ok());
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace tessera
