// The sampler contract on both backends: for identical logits, SamplingParams
// and (seed, step), CpuOps::Sample and CudaOps::Sample pick the same token,
// exactly (kernels/cpu/cpu_sampling.h says why), and report the same top ids
// with log-probabilities within f32 rounding. Random logits (with ties, NaN,
// -inf and rows with nothing finite), random parameters, seeds, steps,
// penalties and masks, and a few decode steps in which the output grows.
// Skips itself without a GPU.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/cuda_ops_fixture.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {
namespace {

class SampleParityTest : public testing_cuda::CudaOpsFixture {
 protected:
  SamplingParams RandomParams() {
    std::uniform_int_distribution<int> pick(0, 99);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    SamplingParams p;
    const float temperatures[] = {0.0f, 0.05f, 0.5f, 1.0f, 1.7f};
    p.temperature = pick(rng_) < 80 ? temperatures[pick(rng_) % 5]
                                    : 0.1f + 2.0f * unit(rng_);
    const int32_t top_ks[] = {0, 0, 1, 2, 5, 50, 1000};
    p.top_k = pick(rng_) < 85 ? top_ks[pick(rng_) % 7] : pick(rng_) + 1;
    const float top_ps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.1f, 0.99f, 1e-6f};
    p.top_p =
        pick(rng_) < 80 ? top_ps[pick(rng_) % 7] : std::max(0.01f, unit(rng_));
    const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.5f, 1.0f};
    p.min_p = pick(rng_) < 80 ? min_ps[pick(rng_) % 5] : 0.3f * unit(rng_);
    if (pick(rng_) < 35) {
      const float reps[] = {1.0f, 1.2f, 0.8f, 2.0f};
      p.repetition_penalty = reps[pick(rng_) % 4];
      p.presence_penalty = pick(rng_) < 50 ? 0.0f : 4.0f * unit(rng_) - 2.0f;
      p.frequency_penalty = pick(rng_) < 50 ? 0.0f : 4.0f * unit(rng_) - 2.0f;
    }
    EXPECT_TRUE(p.Validate().ok()) << p.Validate();
    return p;
  }

  // Row r's logits, of one of several kinds.
  void FillRow(float* row, int64_t vocab, int kind) {
    std::normal_distribution<float> normal(0.0f, kind == 1 ? 1.0f : 3.0f);
    std::uniform_int_distribution<int64_t> any(0, vocab - 1);
    for (int64_t i = 0; i < vocab; ++i) row[i] = normal(rng_);
    switch (kind) {
      case 2:  // Coarse values: ties at every cutoff.
        for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);
        break;
      case 3:  // Some NaN and -inf.
        for (int k = 0; k < 1 + vocab / 10; ++k) row[any(rng_)] = NAN;
        for (int k = 0; k < 1 + vocab / 10; ++k) row[any(rng_)] = -INFINITY;
        break;
      case 4:  // Nothing finite.
        for (int64_t i = 0; i < vocab; ++i) row[i] = -INFINITY;
        row[any(rng_)] = NAN;
        break;
      case 5:  // One dominant token.
        row[any(rng_)] += 40.0f;
        break;
      default:
        break;
    }
  }

  static bool SameFloat(float a, float b, float tolerance) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (std::isinf(a) || std::isinf(b)) return a == b;
    return std::fabs(a - b) <= tolerance * (1.0f + std::fabs(b));
  }

  std::mt19937_64 rng_{20261201};
  CpuOps cpu_;
};

TEST_F(SampleParityTest, SameTokensAndLogprobsOnBothBackends) {
  int64_t compared = 0, sampled = 0;
  for (int64_t vocab : {151936, 32000, 517, 7}) {
    const int64_t rows = 64;
    const int batches = vocab > 100000 ? 3 : 12;
    std::uniform_int_distribution<int64_t> any_id(-2, vocab + 2);
    std::uniform_int_distribution<int> pick(0, 99);
    for (int batch = 0; batch < batches; ++batch) {
      Tensor logits = *Tensor::Empty(DType::kF32, {rows, vocab});
      std::vector<SamplingParams> params(rows);
      std::vector<std::vector<int32_t>> prompts(rows), outputs(rows),
          masked(rows);
      std::vector<uint64_t> seeds(rows);
      std::vector<int32_t> top_n(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const int kind = pick(rng_) < 70 ? 0 : pick(rng_) % 6;
        FillRow(logits.data_as<float>() + r * vocab, vocab, kind);
        params[r] = RandomParams();
        seeds[r] = rng_();
        top_n[r] = pick(rng_) % 21;
        const int prompt_len = pick(rng_) % 30, output_len = pick(rng_) % 30;
        for (int k = 0; k < prompt_len; ++k) prompts[r].push_back(any_id(rng_));
        for (int k = 0; k < output_len; ++k) outputs[r].push_back(any_id(rng_));
        if (pick(rng_) < 25) {
          for (int k = 0; k < 1 + pick(rng_) % 4; ++k) {
            masked[r].push_back(any_id(rng_));
          }
        }
      }
      auto device_logits = gpu_->Upload(logits.view(), DType::kF32);
      ASSERT_TRUE(device_logits.ok()) << device_logits.status();
      // A few decode steps: the draw number is the output's length, and the
      // output grows by the token drawn.
      for (int decode = 0; decode < 3; ++decode) {
        std::vector<SampleRow> sample_rows(rows);
        for (int64_t r = 0; r < rows; ++r) {
          SampleRow& row = sample_rows[r];
          row.params = &params[r];
          row.seed = seeds[r];
          row.step = outputs[r].size() + (decode == 0 ? rng_() % 100000 : 0);
          row.prompt = prompts[r];
          row.output = outputs[r];
          row.masked = masked[r];
          row.top_logprobs = top_n[r];
        }
        std::vector<SampleResult> want, got;
        ASSERT_TRUE(cpu_.Sample(logits.view(), sample_rows, &want).ok());
        const absl::Status status =
            gpu_->Sample(device_logits->view(), sample_rows, &got);
        ASSERT_TRUE(status.ok()) << status;
        ASSERT_EQ(got.size(), want.size());
        for (int64_t r = 0; r < rows; ++r) {
          const SamplingParams& p = params[r];
          SCOPED_TRACE(
              ::testing::Message()
              << "vocab=" << vocab << " batch=" << batch << " decode=" << decode
              << " row=" << r << " T=" << p.temperature << " top_k=" << p.top_k
              << " top_p=" << p.top_p << " min_p=" << p.min_p << " rep="
              << p.repetition_penalty << " pres=" << p.presence_penalty
              << " freq=" << p.frequency_penalty << " seed=" << seeds[r]
              << " step=" << sample_rows[r].step);
          ASSERT_EQ(got[r].token, want[r].token);
          EXPECT_TRUE(SameFloat(got[r].logprob, want[r].logprob, 1e-5f))
              << got[r].logprob << " vs " << want[r].logprob;
          ASSERT_EQ(got[r].top.size(), want[r].top.size());
          for (size_t k = 0; k < want[r].top.size(); ++k) {
            EXPECT_EQ(got[r].top[k].first, want[r].top[k].first) << "k=" << k;
            EXPECT_TRUE(
                SameFloat(got[r].top[k].second, want[r].top[k].second, 1e-5f))
                << "k=" << k;
          }
          ++compared;
          sampled += p.temperature > 0.0f;
        }
        for (int64_t r = 0; r < rows; ++r) {
          outputs[r].push_back(want[r].token);
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 64 * (3 + 12 * 3));
  EXPECT_GT(sampled, compared / 2);
}

// The same (seed, step) and logits give the same token wherever the row sits
// in the batch, on both backends.
TEST_F(SampleParityTest, ABatchDoesNotChangeARowsToken) {
  const int64_t vocab = 4099, rows = 16;
  Tensor logits = *Tensor::Empty(DType::kF32, {rows, vocab});
  for (int64_t r = 0; r < rows; ++r) {
    FillRow(logits.data_as<float>() + r * vocab, vocab, 0);
  }
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  std::vector<SampleRow> sample_rows(rows);
  for (int64_t r = 0; r < rows; ++r) {
    sample_rows[r].params = &p;
    sample_rows[r].seed = 1000 + r;
    sample_rows[r].step = r;
  }
  auto device_logits = gpu_->Upload(logits.view(), DType::kF32);
  ASSERT_TRUE(device_logits.ok());
  std::vector<SampleResult> all, one;
  ASSERT_TRUE(gpu_->Sample(device_logits->view(), sample_rows, &all).ok());
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_TRUE(cpu_.Sample(logits.view().Rows(r, r + 1),
                            absl::MakeConstSpan(&sample_rows[r], 1), &one)
                    .ok());
    EXPECT_EQ(one[0].token, all[r].token) << r;
  }
}

}  // namespace
}  // namespace tessera
