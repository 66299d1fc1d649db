#include "kernels/cuda/sampling/sampling_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_sampling.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/device_array.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"

namespace tessera {
namespace {

using cuda::DeviceSamplingParams;

using testing_cuda::DeviceArray;

// --- CPU references.

struct CpuLogprobs {
  int32_t argmax;
  float log_z;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob)
};

// The plain log-softmax (no NaN here).
CpuLogprobs ReferenceLogprobs(const float* logits, int64_t vocab, int top_n) {
  CpuLogprobs r;
  absl::Span<const float> span(logits, vocab);
  r.argmax = ArgMax(span);
  const float max = *std::max_element(span.begin(), span.end());
  double sum = 0.0;
  for (float l : span) sum += std::exp(static_cast<double>(l) - max);
  r.log_z = max + static_cast<float>(std::log(sum));
  std::vector<std::pair<float, int32_t>> all;
  for (int64_t i = 0; i < vocab; ++i)
    all.emplace_back(logits[i], static_cast<int32_t>(i));
  const int n = std::min<int64_t>(top_n, vocab);
  std::partial_sort(all.begin(), all.begin() + n, all.end(),
                    [](const auto& a, const auto& b) {
                      return a.first > b.first ||
                             (a.first == b.first && a.second < b.second);
                    });
  for (int i = 0; i < n; ++i)
    r.top.emplace_back(all[i].second, all[i].first - r.log_z);
  return r;
}

SamplingParams ToCpu(const DeviceSamplingParams& d) {
  SamplingParams p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.repetition_penalty = d.repetition_penalty;
  p.presence_penalty = d.presence_penalty;
  p.frequency_penalty = d.frequency_penalty;
  p.seed = d.seed;
  return p;
}

// The CPU sampler's token for the same row (penalties from `prompt` and
// `output`, then `masked`).
int32_t CpuDraw(const float* logits, int64_t vocab,
                const DeviceSamplingParams& d,
                absl::Span<const int32_t> prompt = {},
                absl::Span<const int32_t> output = {},
                absl::Span<const int32_t> masked = {},
                absl::Span<const uint32_t> allowed = {}) {
  const SamplingParams params = ToCpu(d);
  EXPECT_TRUE(params.Validate().ok());
  SampleRow row;
  row.params = &params;
  row.seed = d.seed;
  row.step = d.step;
  row.prompt = prompt;
  row.output = output;
  row.masked = masked;
  row.allowed = allowed;
  CpuSampleScratch scratch;
  return CpuSampleToken(absl::MakeConstSpan(logits, vocab), row, &scratch);
}

// The survivors' unnormalized weights exp(t - max) (0 for dropped tokens),
// the documented steps written out plainly (temperature > 0).
std::vector<double> ReferenceWeights(const float* logits, int64_t vocab,
                                     const DeviceSamplingParams& p,
                                     const int32_t* counts,
                                     const uint8_t* mask) {
  std::vector<float> l(logits, logits + vocab);
  const bool repetition = p.repetition_penalty != 1.0f;
  const bool additive =
      p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  for (int64_t i = 0; i < vocab; ++i) {
    const int32_t c = counts != nullptr ? counts[i] : 0;
    const bool in_prompt = mask != nullptr && mask[i] != 0;
    if (repetition && (in_prompt || c > 0)) {
      l[i] =
          l[i] > 0 ? l[i] / p.repetition_penalty : l[i] * p.repetition_penalty;
    }
    if (additive && c > 0) {
      l[i] -= p.frequency_penalty * c + p.presence_penalty;
    }
  }
  std::vector<std::pair<float, int32_t>> cand;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(l[i])) continue;
    cand.emplace_back(l[i] / p.temperature, static_cast<int32_t>(i));
  }
  if (p.min_p > 0.0f) {
    float best = -INFINITY;
    for (const auto& c : cand) best = std::max(best, c.first);
    const float floor = best + std::log(p.min_p);
    cand.erase(std::remove_if(cand.begin(), cand.end(),
                              [&](const auto& c) { return c.first < floor; }),
               cand.end());
  }
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size())
    cand.resize(p.top_k);
  const float max_logit = cand.front().first;
  std::vector<float> w(cand.size());
  double total = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) {
    w[i] = std::exp(cand[i].first - max_logit);
    total += w[i];
  }
  size_t n = cand.size();
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    n = 0;
    while (n < cand.size()) {
      mass += w[n] / total;
      ++n;
      if (mass >= p.top_p) break;
    }
  }
  std::vector<double> weights(vocab, 0.0);
  for (size_t i = 0; i < n; ++i) weights[cand[i].second] = w[i];
  return weights;
}

class CudaSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::vector<float> RandomLogits(size_t n, float stddev = 3.0f) {
    std::normal_distribution<float> dist(0.0f, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  // Runs LaunchSample and returns the tokens.
  std::vector<int32_t> Sample(const std::vector<float>& logits, int64_t rows,
                              int64_t vocab,
                              const std::vector<DeviceSamplingParams>& params,
                              const std::vector<int32_t>* counts = nullptr,
                              const std::vector<uint8_t>* mask = nullptr,
                              const std::vector<int32_t>* masked = nullptr,
                              const std::vector<uint32_t>* allowed = nullptr) {
    DeviceArray<float> d_logits(logits);
    DeviceArray<uint32_t> d_allowed(
        allowed != nullptr ? *allowed : std::vector<uint32_t>());
    DeviceArray<int32_t> d_masked(masked != nullptr ? *masked
                                                    : std::vector<int32_t>());
    // The host's log(min_p), as CudaOps fills it.
    std::vector<DeviceSamplingParams> filled = params;
    for (DeviceSamplingParams& p : filled) {
      p.log_min_p = p.min_p > 0.0f ? sampling::MinPLog(p.min_p) : 0.0f;
    }
    DeviceArray<DeviceSamplingParams> d_params(filled);
    DeviceArray<int32_t> d_counts(counts != nullptr ? *counts
                                                    : std::vector<int32_t>());
    DeviceArray<uint8_t> d_mask(mask != nullptr ? *mask
                                                : std::vector<uint8_t>());
    DeviceArray<float> d_scratch(static_cast<size_t>(rows * vocab));
    DeviceArray<int32_t> d_out(std::vector<int32_t>(rows, -7));
    EXPECT_EQ(cuda::LaunchSample(d_logits.get(), rows, vocab, d_params.get(),
                                 counts != nullptr ? d_counts.get() : nullptr,
                                 mask != nullptr ? d_mask.get() : nullptr,
                                 masked != nullptr ? d_masked.get() : nullptr,
                                 allowed != nullptr ? d_allowed.get() : nullptr,
                                 d_scratch.get(), d_out.get(), nullptr),
              cudaSuccess);
    return d_out.Download();
  }
  std::mt19937 rng_{20240611};
};

// --- Logprobs.

TEST_F(CudaSamplingTest, LogprobsMatchCpu) {
  // 151936: 38 chunks of 4096 (LaunchLogprobs spreads a row over them);
  // 8193: three, the last of one logit.
  for (int64_t vocab : {151936, 8193, 517, 5}) {
    for (int top_n : {0, 1, 5, 20}) {
      const int64_t rows = 4;
      std::vector<float> logits = RandomLogits(rows * vocab);
      // Row 1: the maximum appears three times (lowest id must win), and a
      // tie lower down. Row 2: some -inf.
      float* r1 = logits.data() + vocab;
      const int64_t top1 = std::max_element(r1, r1 + vocab) - r1;
      if (vocab > 10) {
        r1[(top1 + 3) % vocab] = r1[top1];
        r1[(top1 + vocab - 2) % vocab] = r1[top1];
        r1[(top1 + vocab / 2) % vocab] = r1[top1];  // Another chunk's.
        r1[1] = r1[2] = 1.25f;
      }
      float* r2 = logits.data() + 2 * vocab;
      r2[0] = -INFINITY;
      r2[vocab - 1] = -INFINITY;
      // Row 3: coarse values, many ties.
      float* r3 = logits.data() + 3 * vocab;
      for (int64_t i = 0; i < vocab; ++i) r3[i] = std::round(r3[i] * 2) / 2;

      // Each row's "sampled" token, whose own logit comes back as chosen.
      std::vector<int32_t> tokens(rows);
      for (int64_t r = 0; r < rows; ++r) tokens[r] = (r * 7919 + 3) % vocab;
      DeviceArray<float> d_logits(logits);
      DeviceArray<int32_t> d_argmax(rows), d_ids(rows * top_n + 1),
          d_tokens(tokens);
      DeviceArray<float> d_log_z(rows), d_lp(rows * top_n + 1), d_chosen(rows);
      const size_t ws = cuda::LogprobsWorkspaceBytes(rows, vocab, top_n);
      DeviceArray<double> d_ws(ws / sizeof(double) + 1);
      ASSERT_EQ(cuda::LaunchLogprobs(d_logits.get(), rows, vocab, top_n,
                                     d_tokens.get(), d_chosen.get(),
                                     d_argmax.get(), d_log_z.get(), d_ids.get(),
                                     d_lp.get(), d_ws.get(), ws, nullptr),
                cudaSuccess);
      const std::vector<float> chosen = d_chosen.Download();
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(std::memcmp(&chosen[r], &logits[r * vocab + tokens[r]], 4), 0)
            << "row " << r;
      }
      const std::vector<int32_t> argmax = d_argmax.Download();
      const std::vector<float> log_z = d_log_z.Download();
      const std::vector<int32_t> ids = d_ids.Download();
      const std::vector<float> lp = d_lp.Download();
      for (int64_t r = 0; r < rows; ++r) {
        SCOPED_TRACE(::testing::Message() << "vocab=" << vocab << " top_n="
                                          << top_n << " row=" << r);
        const CpuLogprobs want =
            ReferenceLogprobs(logits.data() + r * vocab, vocab, top_n);
        EXPECT_EQ(argmax[r], want.argmax);
        EXPECT_NEAR(log_z[r], want.log_z,
                    1e-5f * (1.0f + std::fabs(want.log_z)));
        for (int j = 0; j < top_n; ++j) {
          if (j < static_cast<int>(want.top.size())) {
            EXPECT_EQ(ids[r * top_n + j], want.top[j].first) << "j=" << j;
            if (std::isinf(want.top[j].second)) {
              EXPECT_EQ(lp[r * top_n + j], want.top[j].second) << "j=" << j;
            } else {
              EXPECT_NEAR(lp[r * top_n + j], want.top[j].second,
                          1e-5f * (1.0f + std::fabs(want.top[j].second)))
                  << "j=" << j;
            }
          } else {
            EXPECT_EQ(ids[r * top_n + j], -1) << "j=" << j;
            EXPECT_EQ(lp[r * top_n + j], -INFINITY) << "j=" << j;
          }
        }
      }
    }
  }
}

TEST_F(CudaSamplingTest, LogprobsArgmaxNeverPicksNaN) {
  const int64_t vocab = 1000;
  std::vector<float> logits = RandomLogits(2 * vocab);
  logits[0] = NAN;
  logits[500] = NAN;
  logits[777] = 100.0f;
  for (int64_t i = 0; i < vocab; ++i) logits[vocab + i] = -INFINITY;
  logits[vocab + 3] = NAN;
  DeviceArray<float> d_logits(logits);
  DeviceArray<int32_t> d_argmax(2);
  const size_t ws = cuda::LogprobsWorkspaceBytes(2, vocab, 0);
  DeviceArray<double> d_ws(ws / sizeof(double) + 1);
  ASSERT_EQ(cuda::LaunchLogprobs(d_logits.get(), 2, vocab, 0, nullptr, nullptr,
                                 d_argmax.get(), nullptr, nullptr, nullptr,
                                 d_ws.get(), ws, nullptr),
            cudaSuccess);
  const std::vector<int32_t> got = d_argmax.Download();
  EXPECT_EQ(got[0], 777);
  EXPECT_EQ(got[1], ArgMax(absl::MakeConstSpan(logits.data() + vocab, vocab)));
  EXPECT_EQ(got[1], 0);
}

TEST_F(CudaSamplingTest, LogprobsRejectsTooManyAlternatives) {
  DeviceArray<double> d_ws(1024);
  EXPECT_EQ(cuda::LaunchLogprobs(nullptr, 1, 10, cuda::kMaxTopLogprobs + 1,
                                 nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, d_ws.get(), 8192, nullptr),
            cudaErrorInvalidValue);
  // Too small a workspace, and tokens without chosen.
  DeviceArray<float> d_logits(10);
  EXPECT_EQ(
      cuda::LaunchLogprobs(d_logits.get(), 1, 10, 0, nullptr, nullptr, nullptr,
                           nullptr, nullptr, nullptr, d_ws.get(), 1, nullptr),
      cudaErrorInvalidValue);
  DeviceArray<int32_t> d_tokens(1);
  EXPECT_EQ(cuda::LaunchLogprobs(d_logits.get(), 1, 10, 0, d_tokens.get(),
                                 nullptr, nullptr, nullptr, nullptr, nullptr,
                                 d_ws.get(), 8192, nullptr),
            cudaErrorInvalidValue);
}

// --- Sampling.

// Greedy decoding, with and without penalties, must equal the CPU sampler
// token for token (the penalized logits are bit-identical).
TEST_F(CudaSamplingTest, GreedyWithPenaltiesEqualsCpuSampler) {
  for (int64_t vocab : {151936, 517}) {
    const int64_t rows = 24;
    std::vector<float> logits = RandomLogits(rows * vocab);
    std::vector<DeviceSamplingParams> params(rows);
    std::vector<int32_t> counts(rows * vocab, 0);
    std::vector<uint8_t> mask(rows * vocab, 0);
    std::vector<std::vector<int32_t>> prompts(rows), outputs(rows);
    std::uniform_real_distribution<float> penalty(-2.0f, 2.0f);
    std::uniform_int_distribution<int> any_id(0, vocab - 1);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.data() + r * vocab;
      if (r % 3 == 2) {
        // Coarse logits: ties that penalties must break the CPU's way.
        for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);
      }
      DeviceSamplingParams& p = params[r];
      p.temperature = 0.0f;
      const float reps[] = {1.0f, 1.3f, 0.8f, 2.0f};
      p.repetition_penalty = reps[r % 4];
      p.presence_penalty = r % 5 == 0 ? 0.0f : penalty(rng_);
      p.frequency_penalty = r % 7 == 0 ? 0.0f : penalty(rng_);
      p.seed = r;
      // Penalize the front-runners so the penalties decide the argmax.
      std::vector<int32_t> order(vocab);
      for (int64_t i = 0; i < vocab; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                        [&](int32_t a, int32_t b) {
                          return row[a] > row[b] || (row[a] == row[b] && a < b);
                        });
      for (int k = 0; k < 6; ++k) prompts[r].push_back(any_id(rng_));
      prompts[r].push_back(order[0]);
      for (int k = 0; k < 12; ++k) outputs[r].push_back(order[k % 5]);
      for (int k = 0; k < 4; ++k) outputs[r].push_back(any_id(rng_));
      for (int32_t id : prompts[r]) mask[r * vocab + id] = 1;
      for (int32_t id : outputs[r]) ++counts[r * vocab + id];
    }
    const std::vector<int32_t> got =
        Sample(logits, rows, vocab, params, &counts, &mask);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], CpuDraw(logits.data() + r * vocab, vocab, params[r],
                                prompts[r], outputs[r]))
          << "vocab=" << vocab << " row=" << r;
    }
    // Without penalty arrays: plain argmax.
    for (DeviceSamplingParams& p : params) {
      p.repetition_penalty = 1.0f;
      p.presence_penalty = p.frequency_penalty = 0.0f;
    }
    const std::vector<int32_t> plain = Sample(logits, rows, vocab, params);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(plain[r],
                ArgMax(absl::MakeConstSpan(logits.data() + r * vocab, vocab)))
          << "vocab=" << vocab << " row=" << r;
    }
  }
}

// The token must be the CPU sampler's, exactly (same survivors, weights and
// sums: kernels/cpu/cpu_sampling.h), and one the plain reference keeps.
TEST_F(CudaSamplingTest, SampleMatchesReferenceForTheSameUniform) {
  for (int64_t vocab : {151936, 517}) {
    const int64_t rows = 48;
    std::vector<float> logits = RandomLogits(rows * vocab);
    std::vector<DeviceSamplingParams> params(rows);
    std::vector<int32_t> counts(rows * vocab, 0);
    std::vector<uint8_t> mask(rows * vocab, 0);
    std::uniform_int_distribution<int> any_id(0, vocab - 1);
    std::uniform_int_distribution<uint64_t> any_u64;
    const float temperatures[] = {1.0f, 0.5f, 1.7f};
    const int32_t top_ks[] = {0, 1, 5, 50, 0, 1000};
    const float top_ps[] = {1.0f, 0.9f, 0.5f, 1.0f, 0.1f, 0.99f, 0.3f};
    const float min_ps[] = {0.0f, 0.05f, 0.0f, 0.5f, 0.0f};
    std::vector<std::vector<int32_t>> prompts(rows), outputs(rows);
    for (int64_t r = 0; r < rows; ++r) {
      DeviceSamplingParams& p = params[r];
      p.temperature = temperatures[r % 3];
      p.top_k = top_ks[r % 6];
      p.top_p = top_ps[r % 7];
      p.min_p = min_ps[r % 5];
      if (r % 4 == 3) {
        p.repetition_penalty = 1.2f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        for (int k = 0; k < 20; ++k) outputs[r].push_back(any_id(rng_));
        for (int k = 0; k < 20; ++k) prompts[r].push_back(any_id(rng_));
        for (int32_t id : outputs[r]) ++counts[r * vocab + id];
        for (int32_t id : prompts[r]) mask[r * vocab + id] = 1;
      }
      if (r % 8 == 5) {
        // Ties around the top-k / top-p boundaries.
        float* row = logits.data() + r * vocab;
        for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);
      }
      p.seed = any_u64(rng_);
      p.step = any_u64(rng_) % 100000;
    }
    const std::vector<int32_t> got =
        Sample(logits, rows, vocab, params, &counts, &mask);
    for (int64_t r = 0; r < rows; ++r) {
      const DeviceSamplingParams& p = params[r];
      const std::vector<double> w =
          ReferenceWeights(logits.data() + r * vocab, vocab, p,
                           counts.data() + r * vocab, mask.data() + r * vocab);
      const int32_t want =
          CpuDraw(logits.data() + r * vocab, vocab, p, prompts[r], outputs[r]);
      EXPECT_EQ(got[r], want) << "vocab=" << vocab << " row=" << r
                              << " T=" << p.temperature << " top_k=" << p.top_k
                              << " top_p=" << p.top_p << " min_p=" << p.min_p;
      ASSERT_GE(got[r], 0);
      ASSERT_LT(got[r], vocab);
      EXPECT_GT(w[got[r]], 0.0) << "drew a dropped token, row " << r;
    }
  }
}

// min_tokens: the masked ids (here the rows' front-runners, so the mask
// decides) are never drawn, and the token equals the CPU sampler's given the
// same `masked` (the plain reference with those logits at -inf keeps it).
TEST_F(CudaSamplingTest, MaskedIdsAreNeverDrawnAndGreedyEqualsCpuSampler) {
  for (int64_t vocab : {151936, 517}) {
    const int64_t rows = 32;
    std::vector<float> logits = RandomLogits(rows * vocab);
    std::vector<DeviceSamplingParams> params(rows);
    std::vector<int32_t> counts(rows * vocab, 0);
    std::vector<uint8_t> mask(rows * vocab, 0);
    std::vector<int32_t> masked_ids;
    std::vector<std::vector<int32_t>> masked(rows), outputs(rows);
    std::uniform_int_distribution<uint64_t> any_u64;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.data() + r * vocab;
      std::vector<int32_t> order(vocab);
      for (int64_t i = 0; i < vocab; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + 4, order.end(),
                        [&](int32_t a, int32_t b) {
                          return row[a] > row[b] || (row[a] == row[b] && a < b);
                        });
      // Rows 0 mod 4 mask nothing; the others their 1..3 best tokens, made
      // far more likely than anything else.
      for (int k = 0; k < static_cast<int>(r % 4); ++k) {
        masked[r].push_back(order[k]);
        row[order[k]] += 30.0f;
      }
      std::sort(masked[r].begin(), masked[r].end());
      DeviceSamplingParams& p = params[r];
      p.temperature = r % 2 == 0 ? 0.0f : 0.8f;
      p.top_k = r % 3 == 0 ? 0 : 3;
      p.top_p = r % 5 == 0 ? 0.9f : 1.0f;
      if (r % 6 == 5) {
        // Penalties first, then the mask (a masked token also in the output).
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        if (!masked[r].empty()) outputs[r].push_back(masked[r][0]);
        outputs[r].push_back(order[3]);
        for (int32_t id : outputs[r]) ++counts[r * vocab + id];
      }
      p.seed = any_u64(rng_);
      p.step = any_u64(rng_) % 1000;
      p.masked_begin = static_cast<int32_t>(masked_ids.size());
      masked_ids.insert(masked_ids.end(), masked[r].begin(), masked[r].end());
      p.masked_end = static_cast<int32_t>(masked_ids.size());
    }
    const std::vector<int32_t> got =
        Sample(logits, rows, vocab, params, &counts, &mask, &masked_ids);
    for (int64_t r = 0; r < rows; ++r) {
      const DeviceSamplingParams& p = params[r];
      const absl::Span<const float> row(logits.data() + r * vocab, vocab);
      ASSERT_GE(got[r], 0);
      ASSERT_LT(got[r], vocab);
      EXPECT_EQ(std::count(masked[r].begin(), masked[r].end(), got[r]), 0)
          << "drew masked token " << got[r] << ", row " << r;
      EXPECT_EQ(got[r],
                CpuDraw(row.data(), vocab, p, {}, outputs[r], masked[r]))
          << "vocab=" << vocab << " row=" << r;
      if (p.temperature != 0.0f) {
        // The reference's penalties, then the mask.
        std::vector<float> l(row.begin(), row.end());
        std::vector<int32_t> c(counts.begin() + r * vocab,
                               counts.begin() + (r + 1) * vocab);
        DeviceSamplingParams unpenalized = p;
        const bool repetition = p.repetition_penalty != 1.0f;
        for (int64_t i = 0; i < vocab; ++i) {
          if (repetition && c[i] > 0) {
            l[i] = l[i] > 0 ? l[i] / p.repetition_penalty
                            : l[i] * p.repetition_penalty;
          }
          if (c[i] > 0) l[i] -= p.frequency_penalty * c[i] + p.presence_penalty;
        }
        for (int32_t id : masked[r]) l[id] = -INFINITY;
        unpenalized.repetition_penalty = 1.0f;
        unpenalized.presence_penalty = unpenalized.frequency_penalty = 0.0f;
        const std::vector<double> w =
            ReferenceWeights(l.data(), vocab, unpenalized, nullptr, nullptr);
        EXPECT_GT(w[got[r]], 0.0) << "vocab=" << vocab << " row=" << r;
      }
    }
  }
}

// Structured output: a constrained row draws only ids its bitmask allows
// (here a random tenth of the vocabulary, never the row's best token), and
// the token equals the CPU sampler's with the same mask; unconstrained rows
// beside it are untouched.
TEST_F(CudaSamplingTest, AllowedBitmaskRowsDrawOnlyAllowedIdsAsTheCpu) {
  for (int64_t vocab : {151936, 517, 33}) {
    const int64_t rows = 24;
    const int64_t words = (vocab + 31) / 32;
    std::vector<float> logits = RandomLogits(rows * vocab);
    std::vector<DeviceSamplingParams> params(rows);
    std::vector<uint32_t> allowed(rows * words, 0u);
    std::uniform_int_distribution<uint64_t> any_u64;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * vocab;
      const int32_t best =
          static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      DeviceSamplingParams& p = params[r];
      p.temperature = r % 2 == 0 ? 0.0f : 0.9f;
      p.top_k = r % 3 == 0 ? 0 : 5;
      p.top_p = r % 5 == 0 ? 0.8f : 1.0f;
      p.seed = any_u64(rng_);
      p.step = any_u64(rng_) % 1000;
      p.constrained = r % 4 != 3;
      if (!p.constrained) continue;
      uint32_t* bits = allowed.data() + r * words;
      for (int64_t i = 0; i < vocab; ++i) {
        if (i != best && rng_() % 10 == 0) bits[i >> 5] |= 1u << (i & 31);
      }
      if (r % 8 == 1) {
        // One allowed id only.
        std::fill(bits, bits + words, 0u);
        const int64_t only = (best + 1) % vocab;
        bits[only >> 5] |= 1u << (only & 31);
      }
    }
    const std::vector<int32_t> got = Sample(
        logits, rows, vocab, params, nullptr, nullptr, nullptr, &allowed);
    for (int64_t r = 0; r < rows; ++r) {
      const DeviceSamplingParams& p = params[r];
      const float* row = logits.data() + r * vocab;
      const absl::Span<const uint32_t> bits =
          p.constrained ? absl::MakeConstSpan(allowed.data() + r * words, words)
                        : absl::Span<const uint32_t>();
      ASSERT_GE(got[r], 0);
      ASSERT_LT(got[r], vocab);
      if (p.constrained) {
        EXPECT_TRUE((bits[got[r] >> 5] >> (got[r] & 31)) & 1u)
            << "drew disallowed token " << got[r] << ", row " << r;
      }
      EXPECT_EQ(got[r], CpuDraw(row, vocab, p, {}, {}, {}, bits))
          << "vocab=" << vocab << " row=" << r;
    }
  }
}

TEST_F(CudaSamplingTest, SameSeedAndStepDrawTheSameToken) {
  const int64_t vocab = 4096, rows = 32;
  const std::vector<float> one = RandomLogits(vocab, 1.0f);
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r)
    logits.insert(logits.end(), one.begin(), one.end());
  std::vector<DeviceSamplingParams> params(rows);
  for (DeviceSamplingParams& p : params) {
    p.seed = 1234;
    p.step = 99;
  }
  const std::vector<int32_t> a = Sample(logits, rows, vocab, params);
  const std::vector<int32_t> b = Sample(logits, rows, vocab, params);
  EXPECT_EQ(a, b);
  for (int64_t r = 1; r < rows; ++r) EXPECT_EQ(a[r], a[0]) << r;
}

TEST_F(CudaSamplingTest, DifferentStepsDrawDifferentTokens) {
  const int64_t vocab = 64, rows = 2000;
  std::vector<float> logits(rows * vocab, 0.0f);  // Uniform distribution.
  std::vector<DeviceSamplingParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].seed = 5;
    params[r].step = r;
  }
  const std::vector<int32_t> got = Sample(logits, rows, vocab, params);
  std::vector<int> hist(vocab, 0);
  for (int32_t t : got) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, vocab);
    ++hist[t];
  }
  for (int64_t i = 0; i < vocab; ++i) EXPECT_GT(hist[i], 0) << i;
  // Another seed gives another sequence.
  for (DeviceSamplingParams& p : params) p.seed = 6;
  const std::vector<int32_t> other = Sample(logits, rows, vocab, params);
  int same = 0;
  for (int64_t r = 0; r < rows; ++r) same += got[r] == other[r];
  EXPECT_LT(same, rows / 10);
}

// Pearson's chi-square of `hist` against probabilities `p` (cells with p = 0
// must be empty).
double ChiSquare(const std::vector<int>& hist, const std::vector<double>& p,
                 int draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < hist.size(); ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(hist[i], 0) << "token " << i << " should never be drawn";
      continue;
    }
    const double expected = p[i] * draws;
    chi2 += (hist[i] - expected) * (hist[i] - expected) / expected;
  }
  return chi2;
}

TEST_F(CudaSamplingTest, DrawsFollowTheDistribution) {
  const std::vector<float> one = {0.0f, 0.5f, 1.0f,  -1.0f,
                                  2.0f, 0.3f, -0.5f, 1.5f};
  const int64_t vocab = one.size();
  const int draws = 20000;
  std::vector<float> logits;
  for (int r = 0; r < draws; ++r)
    logits.insert(logits.end(), one.begin(), one.end());
  struct Setting {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  // Chi-square bounds at p ~ 1e-4 for the degrees of freedom.
  const Setting settings[] = {
      {1.0f, 0, 1.0f, 0.0f},   // 7 dof: 29.9
      {0.7f, 4, 1.0f, 0.0f},   // 3 dof: 21.1
      {1.3f, 0, 0.8f, 0.0f},   // top-p
      {1.0f, 0, 1.0f, 0.3f},   // min-p
      {2.0f, 6, 0.9f, 0.05f},  // all of them
  };
  const double bound_by_dof[] = {0, 15.1, 18.4, 21.1, 23.5, 25.7, 27.9, 29.9};
  for (const Setting& s : settings) {
    std::vector<DeviceSamplingParams> params(draws);
    for (int r = 0; r < draws; ++r) {
      params[r].temperature = s.temperature;
      params[r].top_k = s.top_k;
      params[r].top_p = s.top_p;
      params[r].min_p = s.min_p;
      params[r].seed = 777;
      params[r].step = r;
    }
    const std::vector<int32_t> got = Sample(logits, draws, vocab, params);
    std::vector<int> hist(vocab, 0);
    for (int32_t t : got) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      ++hist[t];
    }
    std::vector<double> p =
        ReferenceWeights(one.data(), vocab, params[0], nullptr, nullptr);
    double total = 0.0;
    int kept = 0;
    for (double w : p) {
      total += w;
      kept += w > 0.0;
    }
    for (double& w : p) w /= total;
    ASSERT_GE(kept, 2);
    const double chi2 = ChiSquare(hist, p, draws);
    EXPECT_LT(chi2, bound_by_dof[kept - 1])
        << "T=" << s.temperature << " top_k=" << s.top_k << " top_p=" << s.top_p
        << " min_p=" << s.min_p << " kept=" << kept;
  }
}

// Truncations that leave one token: the draw is the argmax.
TEST_F(CudaSamplingTest, NarrowTruncationsPickTheArgmax) {
  for (int64_t vocab : {151936, 517}) {
    const int64_t rows = 16;
    const std::vector<float> logits = RandomLogits(rows * vocab);
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<DeviceSamplingParams> params(rows);
      for (int64_t r = 0; r < rows; ++r) {
        params[r].temperature = 1.0f + 0.25f * (r % 3);
        params[r].seed = 100 + r;
        params[r].step = r;
        if (mode == 0) params[r].top_k = 1;
        if (mode == 1) params[r].top_p = 1e-6f;
        if (mode == 2) params[r].min_p = 1.0f;
      }
      const std::vector<int32_t> got = Sample(logits, rows, vocab, params);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(got[r],
                  ArgMax(absl::MakeConstSpan(logits.data() + r * vocab, vocab)))
            << "vocab=" << vocab << " mode=" << mode << " row=" << r;
      }
    }
  }
}

TEST_F(CudaSamplingTest, NaNLogitsAreNeverDrawn) {
  const int64_t vocab = 300, rows = 200;
  std::vector<float> logits(rows * vocab, 0.0f);
  std::vector<DeviceSamplingParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < vocab; i += 2) logits[r * vocab + i] = NAN;
    params[r].seed = 3;
    params[r].step = r;
  }
  const std::vector<int32_t> got = Sample(logits, rows, vocab, params);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[r] % 2, 1) << r;
}

}  // namespace
}  // namespace tessera
