// LaunchSkinnyGemm against a double-precision host product of the same
// values (bf16 weights widened exactly, f32 activations), on fresh random
// shapes: 1..4 rows, column counts not a multiple of the block's rows, k from
// 8 to 14336, with and without bias. The kernel accumulates in f32, so the
// bound is f32 rounding of a k-term sum: |err| <= 2^-22 * k * sum|x w| per
// output (a loose form of the standard bound, but far below one bf16 ulp).
// The gated forms (LaunchSkinnyGatedSilu, LaunchSkinnyGatedGeluTanh) are
// checked bit for bit against the unfused pairs they replace. Also: the same
// inputs give bitwise the same output twice, a row's result does not depend on
// the other rows, and the refused shapes are refused. Skips itself without a
// GPU.
#include "kernels/cuda/gemm/skinny_gemm.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fused_kernels.h"
#include "kernels/cuda/testing/device_array.h"

namespace tessera {
namespace cuda {
namespace {

using testing_cuda::DeviceArray;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

uint16_t Bf16Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);  // Truncation: any bf16 will do.
}

float Bf16Value(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Case {
  int64_t t, n, k;
  bool bias;
};

class SkinnyGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(SkinnyGemmTest, MatchesTheHostProductOnRandomShapes) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Case> cases = {{1, 1, 8, false},
                             {1, 4096, 4096, true},
                             {4, 1027, 14336, true},
                             {3, 6, 72, false},
                             {2, 28672, 4096, false}};
  std::uniform_int_distribution<int64_t> t_dist(1, kMaxSkinnyRows),
      n_dist(1, 3000), k8_dist(1, 700);
  for (int i = 0; i < 6; ++i) {
    cases.push_back({t_dist(rng), n_dist(rng), 8 * k8_dist(rng), i % 2 == 0});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "t=" << c.t << " n=" << c.n
                                      << " k=" << c.k << " bias=" << c.bias);
    std::vector<float> x(c.t * c.k), bias(c.n);
    std::vector<uint16_t> w(c.n * c.k);
    for (float& v : x) v = normal(rng);
    for (uint16_t& v : w) v = Bf16Bits(normal(rng) * 0.05f);
    for (float& v : bias) v = normal(rng);
    DeviceArray<float> dx(x), dbias(bias), dout(c.t * c.n);
    DeviceArray<uint16_t> dw(w);
    ASSERT_TRUE(SkinnyGemmApplies(c.t, c.n, c.k, dx.get(), dw.get()));
    ASSERT_EQ(
        LaunchSkinnyGemm(c.t, c.n, c.k, dx.get(), dw.get(),
                         c.bias ? dbias.get() : nullptr, dout.get(), nullptr),
        cudaSuccess);
    const std::vector<float> out = dout.Download();
    int64_t bad = 0;
    for (int64_t r = 0; r < c.t; ++r) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = c.bias ? bias[j] : 0.0, mag = std::fabs(sum);
        for (int64_t l = 0; l < c.k; ++l) {
          const double p = double{x[r * c.k + l]} * Bf16Value(w[j * c.k + l]);
          sum += p;
          mag += std::fabs(p);
        }
        const double tol = std::ldexp(1.0, -22) * (c.k + 1) * mag + 1e-30;
        if (!(std::fabs(out[r * c.n + j] - sum) <= tol) && ++bad <= 5) {
          ADD_FAILURE() << "out[" << r << ", " << j
                        << "] = " << out[r * c.n + j] << ", want " << sum
                        << " ± " << tol;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST_F(SkinnyGemmTest, RepeatableAndRowsIndependent) {
  const int64_t n = 515, k = 1032;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kMaxSkinnyRows * k);
  std::vector<uint16_t> w(n * k);
  for (float& v : x) v = normal(rng);
  for (uint16_t& v : w) v = Bf16Bits(normal(rng));
  DeviceArray<float> dx(x), all(kMaxSkinnyRows * n), again(kMaxSkinnyRows * n);
  DeviceArray<uint16_t> dw(w);
  ASSERT_EQ(LaunchSkinnyGemm(kMaxSkinnyRows, n, k, dx.get(), dw.get(), nullptr,
                             all.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchSkinnyGemm(kMaxSkinnyRows, n, k, dx.get(), dw.get(), nullptr,
                             again.get(), nullptr),
            cudaSuccess);
  const std::vector<float> a = all.Download(), b = again.Download();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  // Row 2 alone (its x row as a batch of one) gives the same bits.
  DeviceArray<float> one(n);
  ASSERT_EQ(LaunchSkinnyGemm(1, n, k, dx.get() + 2 * k, dw.get(), nullptr,
                             one.get(), nullptr),
            cudaSuccess);
  const std::vector<float> o = one.Download();
  EXPECT_EQ(std::memcmp(o.data(), a.data() + 2 * n, n * 4), 0);
}

// The fused gate/up product + SiLU (or GeGLU's tanh GELU) gives the bits of
// the product into a [t, 2n] buffer followed by LaunchGatedSilu (or
// LaunchGatedGeluTanh), on random shapes, every row count, with and without
// bias.
TEST_F(SkinnyGemmTest, GatedSiluEqualsTheUnfusedPairBitwise) {
  using Unfused =
      cudaError_t (*)(const float*, int64_t, int64_t, float*, cudaStream_t);
  using Fused =
      cudaError_t (*)(int64_t, int64_t, int64_t, const float*, const void*,
                      const float*, float*, cudaStream_t);
  const std::pair<Unfused, Fused> kinds[] = {
      {&LaunchGatedSilu, &LaunchSkinnyGatedSilu},
      {&LaunchGatedGeluTanh, &LaunchSkinnyGatedGeluTanh}};
  for (const auto& [unfused_launch, fused_launch] : kinds) {
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int64_t> n_dist(1, 2000), k8_dist(1, 400);
    std::vector<Case> cases = {{1, 14336, 4096, false}, {4, 3072, 1024, true}};
    for (int64_t t = 1; t <= kMaxSkinnyRows; ++t) {
      cases.push_back({t, n_dist(rng), 8 * k8_dist(rng), t % 2 == 0});
      cases.push_back({t, n_dist(rng), 8 * k8_dist(rng), t % 2 != 0});
    }
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << "t=" << c.t << " n=" << c.n
                                        << " k=" << c.k << " bias=" << c.bias);
      std::vector<float> x(c.t * c.k), bias(2 * c.n);
      std::vector<uint16_t> w(2 * c.n * c.k);
      for (float& v : x) v = normal(rng);
      for (uint16_t& v : w) v = Bf16Bits(normal(rng) * 0.05f);
      for (float& v : bias) v = normal(rng);
      DeviceArray<float> dx(x), dbias(bias), gate_up(c.t * 2 * c.n),
          unfused(c.t * c.n), fused(c.t * c.n);
      DeviceArray<uint16_t> dw(w);
      const float* b = c.bias ? dbias.get() : nullptr;
      ASSERT_EQ(LaunchSkinnyGemm(c.t, 2 * c.n, c.k, dx.get(), dw.get(), b,
                                 gate_up.get(), nullptr),
                cudaSuccess);
      ASSERT_EQ(unfused_launch(gate_up.get(), c.t, c.n, unfused.get(), nullptr),
                cudaSuccess);
      ASSERT_EQ(fused_launch(c.t, c.n, c.k, dx.get(), dw.get(), b, fused.get(),
                             nullptr),
                cudaSuccess);
      const std::vector<float> want = unfused.Download(),
                               got = fused.Download();
      int64_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::memcmp(&want[i], &got[i], 4) != 0 && ++bad <= 5) {
          ADD_FAILURE() << "act[" << i << "] = " << got[i] << ", unfused "
                        << want[i];
        }
      }
      EXPECT_EQ(bad, 0);
    }
    DeviceArray<float> x(64), out(64);
    DeviceArray<uint16_t> w(64 * 64);
    EXPECT_EQ(
        fused_launch(1, 4, 12, x.get(), w.get(), nullptr, out.get(), nullptr),
        cudaErrorInvalidValue);
    EXPECT_EQ(fused_launch(kMaxSkinnyRows + 1, 4, 8, x.get(), w.get(), nullptr,
                           out.get(), nullptr),
              cudaErrorInvalidValue);
  }
}

TEST_F(SkinnyGemmTest, RefusesWhatItDoesNotTake) {
  DeviceArray<float> x(64), out(64);
  DeviceArray<uint16_t> w(64 * 64);
  EXPECT_FALSE(SkinnyGemmApplies(kMaxSkinnyRows + 1, 8, 8, x.get(), w.get()));
  EXPECT_FALSE(SkinnyGemmApplies(0, 8, 8, x.get(), w.get()));
  EXPECT_FALSE(SkinnyGemmApplies(1, 8, 12, x.get(), w.get()));     // k % 8.
  EXPECT_FALSE(SkinnyGemmApplies(1, 8, 8, x.get() + 1, w.get()));  // Align.
  EXPECT_FALSE(SkinnyGemmApplies(1, 8, 8, x.get(), w.get() + 4));
  EXPECT_FALSE(SkinnyGemmApplies(1, 8, 8, nullptr, w.get()));
  EXPECT_EQ(
      LaunchSkinnyGemm(1, 8, 12, x.get(), w.get(), nullptr, out.get(), nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(
      LaunchSkinnyGemm(1, 8, 8, x.get(), w.get(), nullptr, nullptr, nullptr),
      cudaErrorInvalidValue);
}

}  // namespace
}  // namespace cuda
}  // namespace tessera
