// The fp8 kernels (fp8_gemm.h) and GemmPlans::MatmulFp8 against host
// references computed from the same e4m3 bytes (testing/fp8_reference.h),
// on fresh random inputs (each test prints its seed; TESSERA_TEST_SEED
// replays one):
//  - the skinny product at every row count 1..8, column counts not a multiple
//    of the tile, k from 16 to 14336, per-channel and block scales (B = 16,
//    64, 128), with and without bias, within an f32-accumulation bound
//    (SkinnyTolerance, ~1e-5 of the magnitude sum); a doubled scale is
//    caught; bitwise repeatable, rows independent; the gated forms bitwise
//    equal to the product followed by the unfused activation;
//  - the quantization kernels bit-exact (bytes and scales) against the host
//    formula, including every f32 whose low 16 bits are zero (all exponents,
//    ties, subnormals, ±0, ±inf, NaN), zero rows, saturation;
//  - MatmulFp8 in both scalings with f32 and (forced) bf16 output, N and K not
//    multiples of 128, chunked bf16 output, a shape first planned inside a
//    graph capture, a wrong scale layout caught, and the refused shapes.
// Skips itself without a GPU.
#include "kernels/cuda/gemm/fp8_gemm.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fused_kernels.h"
#include "kernels/cuda/gemm/gemm_plans.h"
#include "kernels/cuda/testing/device_array.h"
#include "kernels/cuda/testing/fp8_reference.h"
#include "runtime/core/dtype.h"

namespace tessera {
namespace cuda {
namespace {

using testing_cuda::DeviceArray;
using testing_cuda::HostQuantization;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

class Fp8GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    seed_ = testing_cuda::TestSeed();
    rng_.seed(seed_);
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

// A skinny case: t rows, n outputs, k inputs, block 0 (per-channel) or B.
struct Case {
  int64_t t, n, k, block;
  bool bias;
};

// The weight's scale for a case: [n] or [ceil(n / B)][ceil(k / B)].
int64_t ScaleCount(int64_t n, int64_t k, int64_t block) {
  return block > 0 ? ((n + block - 1) / block) * ((k + block - 1) / block) : n;
}

// Counts (and reports the first few) outputs farther from the reference than
// tol * magnitude.
int64_t CountBad(const std::vector<float>& got,
                 const testing_cuda::HostProduct& want, double tol,
                 bool report = true) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = tol * want.mag[i] + 1e-30;
    if (!(std::fabs(got[i] - want.out[i]) <= bound) && ++bad <= 5 && report) {
      ADD_FAILURE() << "out[" << i << "] = " << got[i] << ", want "
                    << want.out[i] << " ± " << bound;
    }
  }
  return bad;
}

TEST_F(Fp8GemmTest, SkinnyMatchesTheHostProductOnRandomShapes) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Case> cases = {
      {1, 1, 16, 0, false},        {1, 4096, 4096, 0, true},
      {1, 4096, 4096, 128, false}, {8, 1027, 14336, 128, true},
      {4, 1027, 14336, 0, false},  {2, 28672, 4096, 0, false},
      {5, 7, 48, 16, true},        {3, 300, 1024, 64, false}};
  std::uniform_int_distribution<int64_t> n_dist(1, 3000), k16_dist(1, 400);
  for (int64_t t = 1; t <= kMaxFp8SkinnyRows; ++t) {
    const int64_t blocks[] = {0, 128, 16};
    cases.push_back(
        {t, n_dist(rng_), 16 * k16_dist(rng_), blocks[t % 3], t % 2 == 0});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "t=" << c.t << " n=" << c.n << " k=" << c.k
                 << " block=" << c.block << " bias=" << c.bias);
    std::vector<float> x(c.t * c.k), bias(c.n);
    for (float& v : x) v = normal(rng_);
    for (float& v : bias) v = normal(rng_);
    const std::vector<uint8_t> w = testing_cuda::RandomFp8(rng_, c.n * c.k);
    const std::vector<float> scale = testing_cuda::RandomScales(
        rng_, ScaleCount(c.n, c.k, c.block), 1e-3f, 4e-3f);
    DeviceArray<float> dx(x), dbias(bias), dscale(scale), dout(c.t * c.n);
    DeviceArray<uint8_t> dw(w);
    ASSERT_TRUE(Fp8SkinnyGemmApplies(c.t, c.n, c.k, c.block, dx.get(), dw.get(),
                                     dscale.get()));
    ASSERT_EQ(LaunchFp8SkinnyGemm(
                  c.t, c.n, c.k, dx.get(), dw.get(), dscale.get(), c.block,
                  c.bias ? dbias.get() : nullptr, dout.get(), nullptr),
              cudaSuccess);
    const std::vector<float> out = dout.Download();
    const std::vector<double> xr(x.begin(), x.end());
    const testing_cuda::HostProduct want = testing_cuda::Product(
        xr, testing_cuda::DequantizeWeight(w, c.n, c.k, scale, c.block), c.t,
        c.n, c.k, c.bias ? bias.data() : nullptr);
    EXPECT_EQ(CountBad(out, want, testing_cuda::SkinnyTolerance(c.k)), 0);
  }
}

// The comparison can fail: the same product with one channel's (or one
// block's) scale doubled is flagged.
TEST_F(Fp8GemmTest, SkinnyWithAWrongScaleIsCaught) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t block : {int64_t{0}, int64_t{128}}) {
    const int64_t t = 2, n = 256, k = 1024;
    std::vector<float> x(t * k);
    for (float& v : x) v = normal(rng_);
    const std::vector<uint8_t> w = testing_cuda::RandomFp8(rng_, n * k);
    const std::vector<float> scale =
        testing_cuda::RandomScales(rng_, ScaleCount(n, k, block), 1e-3f, 4e-3f);
    std::vector<float> wrong = scale;
    wrong[0] *= 2.0f;
    DeviceArray<float> dx(x), dwrong(wrong), dout(t * n);
    DeviceArray<uint8_t> dw(w);
    ASSERT_EQ(LaunchFp8SkinnyGemm(t, n, k, dx.get(), dw.get(), dwrong.get(),
                                  block, nullptr, dout.get(), nullptr),
              cudaSuccess);
    const std::vector<double> xr(x.begin(), x.end());
    const testing_cuda::HostProduct want = testing_cuda::Product(
        xr, testing_cuda::DequantizeWeight(w, n, k, scale, block), t, n, k,
        nullptr);
    EXPECT_GT(CountBad(dout.Download(), want, testing_cuda::SkinnyTolerance(k),
                       /*report=*/false),
              0)
        << "block " << block;
  }
}

TEST_F(Fp8GemmTest, SkinnyRepeatableAndRowsIndependent) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const int64_t n = 515, k = 1040;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t block : {int64_t{0}, int64_t{128}}) {
    std::vector<float> x(kMaxFp8SkinnyRows * k);
    for (float& v : x) v = normal(rng_);
    const std::vector<uint8_t> w = testing_cuda::RandomFp8(rng_, n * k);
    const std::vector<float> scale =
        testing_cuda::RandomScales(rng_, ScaleCount(n, k, block), 1e-3f, 4e-3f);
    DeviceArray<float> dx(x), dscale(scale), all(kMaxFp8SkinnyRows * n),
        again(kMaxFp8SkinnyRows * n), one(n);
    DeviceArray<uint8_t> dw(w);
    for (DeviceArray<float>* out : {&all, &again}) {
      ASSERT_EQ(LaunchFp8SkinnyGemm(kMaxFp8SkinnyRows, n, k, dx.get(), dw.get(),
                                    dscale.get(), block, nullptr, out->get(),
                                    nullptr),
                cudaSuccess);
    }
    const std::vector<float> a = all.Download(), b = again.Download();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    // Row 2 alone gives the same value within the bound (a batch of one
    // takes another tile, so not the same bits).
    ASSERT_EQ(
        LaunchFp8SkinnyGemm(1, n, k, dx.get() + 2 * k, dw.get(), dscale.get(),
                            block, nullptr, one.get(), nullptr),
        cudaSuccess);
    const std::vector<float> o = one.Download();
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_NEAR(o[j], a[2 * n + j], 1e-4 * (std::fabs(a[2 * n + j]) + 1.0))
          << "block " << block << " column " << j;
    }
  }
}

TEST_F(Fp8GemmTest, GatedFormsEqualTheUnfusedPairBitwise) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  using Unfused =
      cudaError_t (*)(const float*, int64_t, int64_t, float*, cudaStream_t);
  using Fused = cudaError_t (*)(int64_t, int64_t, int64_t, const float*,
                                const void*, const float*, int64_t,
                                const float*, float*, cudaStream_t);
  const std::pair<Unfused, Fused> kinds[] = {
      {&LaunchGatedSilu, &LaunchFp8SkinnyGatedSilu},
      {&LaunchGatedGeluTanh, &LaunchFp8SkinnyGatedGeluTanh}};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> n_dist(1, 2000), k16_dist(1, 200);
  for (const auto& [unfused_launch, fused_launch] : kinds) {
    std::vector<Case> cases = {{1, 14336, 4096, 0, false},
                               {8, 3072, 1024, 128, true}};
    for (int64_t t = 1; t <= kMaxFp8SkinnyRows; ++t) {
      cases.push_back({t, n_dist(rng_), 16 * k16_dist(rng_), 0, t % 2 == 0});
      cases.push_back({t, n_dist(rng_), 16 * k16_dist(rng_), 128, t % 2 != 0});
    }
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << "t=" << c.t << " n=" << c.n << " k=" << c.k
                   << " block=" << c.block << " bias=" << c.bias);
      std::vector<float> x(c.t * c.k), bias(2 * c.n);
      for (float& v : x) v = normal(rng_);
      for (float& v : bias) v = normal(rng_);
      const std::vector<uint8_t> w =
          testing_cuda::RandomFp8(rng_, 2 * c.n * c.k);
      const std::vector<float> scale = testing_cuda::RandomScales(
          rng_, ScaleCount(2 * c.n, c.k, c.block), 1e-3f, 4e-3f);
      DeviceArray<float> dx(x), dbias(bias), dscale(scale),
          gate_up(c.t * 2 * c.n), unfused(c.t * c.n), fused(c.t * c.n);
      DeviceArray<uint8_t> dw(w);
      const float* b = c.bias ? dbias.get() : nullptr;
      ASSERT_EQ(
          LaunchFp8SkinnyGemm(c.t, 2 * c.n, c.k, dx.get(), dw.get(),
                              dscale.get(), c.block, b, gate_up.get(), nullptr),
          cudaSuccess);
      ASSERT_EQ(unfused_launch(gate_up.get(), c.t, c.n, unfused.get(), nullptr),
                cudaSuccess);
      ASSERT_EQ(fused_launch(c.t, c.n, c.k, dx.get(), dw.get(), dscale.get(),
                             c.block, b, fused.get(), nullptr),
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
  }
}

TEST_F(Fp8GemmTest, SkinnyRefusesWhatItDoesNotTake) {
  DeviceArray<float> x(1024), out(1024), scale(64);
  DeviceArray<uint8_t> w(64 * 64);
  const float* s = scale.get();
  EXPECT_TRUE(Fp8SkinnyGemmApplies(1, 8, 16, 0, x.get(), w.get(), s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(kMaxFp8SkinnyRows + 1, 8, 16, 0, x.get(),
                                    w.get(), s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(0, 8, 16, 0, x.get(), w.get(), s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(1, 8, 24, 0, x.get(), w.get(), s));  // k.
  EXPECT_FALSE(Fp8SkinnyGemmApplies(1, 8, 16, 24, x.get(), w.get(), s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(1, 8, 16, -16, x.get(), w.get(), s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(1, 8, 16, 0, x.get() + 1, w.get(), s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(1, 8, 16, 0, x.get(), w.get() + 8, s));
  EXPECT_FALSE(Fp8SkinnyGemmApplies(1, 8, 16, 0, x.get(), w.get(), nullptr));
  EXPECT_EQ(LaunchFp8SkinnyGemm(1, 8, 24, x.get(), w.get(), s, 0, nullptr,
                                out.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchFp8SkinnyGemm(1, 8, 16, x.get(), w.get(), s, 0, nullptr,
                                nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchFp8SkinnyGatedSilu(1, 0, 16, x.get(), w.get(), s, 0, nullptr,
                                     out.get(), nullptr),
            cudaErrorInvalidValue);
}

// Compares the kernel's bytes and scales with the host formula's, bit for bit.
void ExpectQuantizedEqual(const std::vector<uint8_t>& q,
                          const std::vector<float>& scales,
                          const testing_cuda::HostQuantized& want) {
  ASSERT_EQ(q.size(), want.q.size());
  ASSERT_EQ(scales.size(), want.scales.size());
  int64_t bad = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] != want.q[i] && ++bad <= 5) {
      ADD_FAILURE() << "q[" << i << "] = 0x" << std::hex << int{q[i]}
                    << ", want 0x" << int{want.q[i]} << std::dec;
    }
  }
  for (size_t i = 0; i < scales.size(); ++i) {
    if (std::memcmp(&scales[i], &want.scales[i], 4) != 0 && ++bad <= 10) {
      ADD_FAILURE() << "scale[" << i << "] = " << scales[i] << ", want "
                    << want.scales[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

// Every f32 with its low 16 bits zero (all signs and exponents, 7-bit
// mantissas: ties at e4m3's spacing, its subnormals, ±0, ±inf, NaN) through
// a static scale of 1, where q = F32ToFp8E4M3(x): the device conversion is
// the host's, code for code.
TEST_F(Fp8GemmTest, QuantizedBytesEqualTheHostConversionForEveryBf16Value) {
  const int64_t t = 2, k = 65536 / 2;
  std::vector<float> x(t * k);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint32_t bits = i << 16;
    std::memcpy(&x[i], &bits, 4);
  }
  const std::vector<float> one = {1.0f};
  DeviceArray<float> dx(x), dscale(one), scales(t);
  DeviceArray<uint8_t> q(t * k);
  ASSERT_EQ(LaunchQuantizeFp8Activations(
                Fp8Quantization::kStatic, Fp8ScaleLayout::kPerRow, t, k,
                dx.get(), dscale.get(), q.get(), scales.get(), nullptr),
            cudaSuccess);
  ExpectQuantizedEqual(
      q.Download(), scales.Download(),
      testing_cuda::QuantizeFp8Host(HostQuantization::kStatic, false, t, k,
                                    x.data(), 1.0f));
}

TEST_F(Fp8GemmTest, QuantizedActivationsEqualTheHostFormula) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct QCase {
    Fp8Quantization kind;
    Fp8ScaleLayout layout;
    HostQuantization host;
  };
  const QCase kinds[] = {
      {Fp8Quantization::kDynamicPerToken, Fp8ScaleLayout::kPerRow,
       HostQuantization::kPerToken},
      {Fp8Quantization::kDynamicPerToken, Fp8ScaleLayout::kPerGroup,
       HostQuantization::kPerToken},
      {Fp8Quantization::kStatic, Fp8ScaleLayout::kPerRow,
       HostQuantization::kStatic},
      {Fp8Quantization::kStatic, Fp8ScaleLayout::kPerGroup,
       HostQuantization::kStatic},
      {Fp8Quantization::kDynamicPerGroup, Fp8ScaleLayout::kPerGroup,
       HostQuantization::kPerGroup}};
  for (const QCase& kind : kinds) {
    for (const auto& [t, k] : {std::pair<int64_t, int64_t>{1, 16},
                               {5, 272},
                               {17, 4096},
                               {300, 1040},
                               {3, 14336}}) {
      const bool group_layout = kind.layout == Fp8ScaleLayout::kPerGroup;
      SCOPED_TRACE(::testing::Message()
                   << "kind " << static_cast<int>(kind.kind) << " layout "
                   << group_layout << " t=" << t << " k=" << k);
      std::vector<float> x(t * k);
      // Rows of differing magnitudes, some outliers, an all-zero row (scale
      // 1), a NaN (which the max ignores), tiny values (subnormal codes).
      for (int64_t r = 0; r < t; ++r) {
        const float m = std::ldexp(1.0f, static_cast<int>(r % 13) - 6);
        for (int64_t i = 0; i < k; ++i) x[r * k + i] = normal(rng_) * m;
      }
      if (t > 2) {
        std::fill(x.begin() + k, x.begin() + 2 * k, 0.0f);
        x[2 * k + 3] = std::nanf("");
        x[2 * k + 5] = 3e4f;  // An outlier: the static scale saturates it.
        x[2 * k + 7] = -0.0f;
        x[2 * k + 9] = 1e-30f;
      }
      const float static_scale = 0.0123f;
      const std::vector<float> s = {static_scale};
      const int64_t scale_count = group_layout ? t * ((k + 127) / 128) : t;
      DeviceArray<float> dx(x), dstatic(s), scales(scale_count);
      DeviceArray<uint8_t> q(t * k);
      const bool is_static = kind.kind == Fp8Quantization::kStatic;
      ASSERT_EQ(
          LaunchQuantizeFp8Activations(kind.kind, kind.layout, t, k, dx.get(),
                                       is_static ? dstatic.get() : nullptr,
                                       q.get(), scales.get(), nullptr),
          cudaSuccess);
      ExpectQuantizedEqual(
          q.Download(), scales.Download(),
          testing_cuda::QuantizeFp8Host(kind.host, group_layout, t, k, x.data(),
                                        static_scale));
    }
  }
  // The arguments it refuses.
  DeviceArray<float> x(64), scales(64);
  DeviceArray<uint8_t> q(64);
  EXPECT_EQ(LaunchQuantizeFp8Activations(
                Fp8Quantization::kDynamicPerGroup, Fp8ScaleLayout::kPerRow, 1,
                16, x.get(), nullptr, q.get(), scales.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchQuantizeFp8Activations(
                Fp8Quantization::kStatic, Fp8ScaleLayout::kPerRow, 1, 16,
                x.get(), nullptr, q.get(), scales.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchQuantizeFp8Activations(
                Fp8Quantization::kDynamicPerToken, Fp8ScaleLayout::kPerRow, 0,
                16, x.get(), nullptr, q.get(), scales.get(), nullptr),
            cudaErrorInvalidValue);
}

TEST_F(Fp8GemmTest, QuantizedWeightsEqualTheHostFormula) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 37, k = 1000;
  std::vector<float> w(n * k);
  for (float& v : w) v = normal(rng_) * 0.02f;
  std::fill(w.begin() + 3 * k, w.begin() + 4 * k, 0.0f);  // Scale 1.
  w[5 * k] = 7.0f;                                        // An outlier.
  std::vector<uint16_t> w16(n * k);
  std::vector<float> w16_values(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    w16[i] = F32ToBf16(w[i]);
    w16_values[i] = Bf16ToF32(w16[i]);
  }
  DeviceArray<float> dw(w), scale(n);
  DeviceArray<uint16_t> dw16(w16);
  DeviceArray<uint8_t> q(n * k);
  ASSERT_EQ(LaunchQuantizeFp8Weights(false, n, k, dw.get(), q.get(),
                                     scale.get(), nullptr),
            cudaSuccess);
  ExpectQuantizedEqual(
      q.Download(), scale.Download(),
      testing_cuda::QuantizeFp8Host(HostQuantization::kPerToken, false, n, k,
                                    w.data(), 0.0f));
  ASSERT_EQ(LaunchQuantizeFp8Weights(true, n, k, dw16.get(), q.get(),
                                     scale.get(), nullptr),
            cudaSuccess);
  ExpectQuantizedEqual(
      q.Download(), scale.Download(),
      testing_cuda::QuantizeFp8Host(HostQuantization::kPerToken, false, n, k,
                                    w16_values.data(), 0.0f));
  EXPECT_EQ(scale.Download()[3], 1.0f);
}

TEST_F(Fp8GemmTest, WidenBf16RowsCopiesIntoItsColumns) {
  const int64_t rows = 3, cols = 5, src_ld = 8, dst_ld = 7;
  std::vector<uint16_t> src(rows * src_ld);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = F32ToBf16(static_cast<float>(i) - 4.5f);
  }
  DeviceArray<uint16_t> dsrc(src);
  DeviceArray<float> dst(std::vector<float>(rows * dst_ld, -1.0f));
  ASSERT_EQ(LaunchWidenBf16Rows(rows, cols, dsrc.get(), src_ld, dst.get(),
                                dst_ld, nullptr),
            cudaSuccess);
  const std::vector<float> got = dst.Download();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < dst_ld; ++c) {
      EXPECT_EQ(got[r * dst_ld + c],
                c < cols ? Bf16ToF32(src[r * src_ld + c]) : -1.0f)
          << r << ", " << c;
    }
  }
  EXPECT_EQ(LaunchWidenBf16Rows(rows, cols, dsrc.get(), cols - 1, dst.get(),
                                dst_ld, nullptr),
            cudaErrorInvalidValue);
}

// MatmulFp8's inputs: random e4m3 operands and scales in cuBLASLt's layouts.
struct Fp8Inputs {
  std::vector<uint8_t> x, w;
  std::vector<float> x_scale, w_scale;
};

Fp8Inputs RandomFp8Inputs(std::mt19937& rng, int64_t t, int64_t n, int64_t k,
                          GemmPlans::Fp8Scaling scaling) {
  const bool block = scaling == GemmPlans::Fp8Scaling::kBlock;
  Fp8Inputs in;
  in.x = testing_cuda::RandomFp8(rng, t * k);
  in.w = testing_cuda::RandomFp8(rng, n * k);
  const int64_t groups = (k + 127) / 128;
  in.x_scale =
      testing_cuda::RandomScales(rng, block ? groups * t : t, 1e-3f, 4e-3f);
  in.w_scale = testing_cuda::RandomScales(
      rng, block ? ((n + 127) / 128) * GemmPlans::Fp8BlockScaleStride(k) : n,
      1e-3f, 4e-3f);
  return in;
}

// The real product of Fp8Inputs as MatmulFp8 defines it.
testing_cuda::HostProduct Fp8Reference(const Fp8Inputs& in, int64_t t,
                                       int64_t n, int64_t k,
                                       GemmPlans::Fp8Scaling scaling) {
  const bool block = scaling == GemmPlans::Fp8Scaling::kBlock;
  const int64_t stride = GemmPlans::Fp8BlockScaleStride(k);
  std::vector<double> x(t * k), w(n * k);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const double s = block ? in.x_scale[(i / 128) * t + r] : in.x_scale[r];
      x[r * k + i] = double{Fp8E4M3ToF32(in.x[r * k + i])} * s;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      const double s =
          block ? in.w_scale[(j / 128) * stride + i / 128] : in.w_scale[j];
      w[j * k + i] = double{Fp8E4M3ToF32(in.w[j * k + i])} * s;
    }
  }
  return testing_cuda::Product(x, w, t, n, k, nullptr);
}

class MatmulFp8Test : public Fp8GemmTest {
 protected:
  void SetUp() override {
    Fp8GemmTest::SetUp();
    if (IsSkipped()) return;
    auto plans = GemmPlans::Create();
    ASSERT_TRUE(plans.ok()) << plans.status();
    plans_ = *std::move(plans);
  }

  // Runs the product on `stream` (synchronized after) and returns out.
  std::vector<float> Run(GemmPlans& plans, const Fp8Inputs& in, int64_t t,
                         int64_t n, int64_t k, GemmPlans::Fp8Scaling scaling,
                         absl::Status* status, cudaStream_t stream = nullptr) {
    DeviceArray<uint8_t> dx(in.x), dw(in.w);
    DeviceArray<float> dxs(in.x_scale), dws(in.w_scale), out(t * n);
    DeviceArray<uint8_t> workspace(GemmPlans::kWorkspaceBytes),
        scratch(GemmPlans::kFp8Bf16ScratchBytes);
    *status = plans.MatmulFp8(
        t, n, k, scaling, {dx.get(), dxs.get()}, {dw.get(), dws.get()},
        out.get(), workspace.get(),
        [&]() -> absl::StatusOr<void*> { return scratch.get(); }, stream);
    return out.Download();
  }

  std::unique_ptr<GemmPlans> plans_;
};

TEST_F(MatmulFp8Test, BothScalingsMatchTheHostProduct) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  struct MCase {
    int64_t t, n, k;
    GemmPlans::Fp8Scaling scaling;
  };
  using S = GemmPlans::Fp8Scaling;
  const MCase cases[] = {
      {1, 256, 256, S::kOuterVector},   {17, 1000, 512, S::kOuterVector},
      {64, 384, 4096, S::kOuterVector}, {300, 136, 272, S::kOuterVector},
      {4, 512, 384, S::kBlock},         {64, 384, 4096, S::kBlock},
      {300, 136, 272, S::kBlock},       {20, 1000, 640, S::kBlock}};
  for (const bool bf16 : {false, true}) {
    std::unique_ptr<GemmPlans> forced;
    GemmPlans* plans = plans_.get();
    if (bf16) {
      auto made = GemmPlans::Create();
      ASSERT_TRUE(made.ok()) << made.status();
      forced = *std::move(made);
      forced->ForceFp8Bf16OutputForTesting();
      plans = forced.get();
    }
    for (const MCase& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << "t=" << c.t << " n=" << c.n << " k=" << c.k << " "
                   << GemmPlans::Fp8ScalingName(c.scaling)
                   << (bf16 ? " bf16 output" : " f32 output"));
      const Fp8Inputs in = RandomFp8Inputs(rng_, c.t, c.n, c.k, c.scaling);
      absl::Status status;
      const std::vector<float> out =
          Run(*plans, in, c.t, c.n, c.k, c.scaling, &status);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(CountBad(out, Fp8Reference(in, c.t, c.n, c.k, c.scaling),
                         bf16 ? testing_cuda::kTensorCoreBf16Tolerance
                              : testing_cuda::kTensorCoreTolerance),
                0);
      // The plan is reused: the same call again gives the same bits.
      const std::vector<float> again =
          Run(*plans, in, c.t, c.n, c.k, c.scaling, &status);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * 4), 0);
    }
  }
}

// bf16 output at 8192 rows takes 1024-column chunks: 1160 columns are two,
// the second 136 wide.
TEST_F(MatmulFp8Test, Bf16OutputInColumnChunks) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  auto made = GemmPlans::Create();
  ASSERT_TRUE(made.ok()) << made.status();
  GemmPlans& plans = **made;
  plans.ForceFp8Bf16OutputForTesting();
  const int64_t t = 8192, n = 1160, k = 64;
  for (const auto scaling :
       {GemmPlans::Fp8Scaling::kOuterVector, GemmPlans::Fp8Scaling::kBlock}) {
    SCOPED_TRACE(GemmPlans::Fp8ScalingName(scaling));
    const Fp8Inputs in = RandomFp8Inputs(rng_, t, n, k, scaling);
    absl::Status status;
    const std::vector<float> out = Run(plans, in, t, n, k, scaling, &status);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(CountBad(out, Fp8Reference(in, t, n, k, scaling),
                       testing_cuda::kTensorCoreBf16Tolerance),
              0);
  }
}

// The comparison can fail: block activation scales given row-major ([t][g],
// not cuBLASLt's [g][t]) are caught.
TEST_F(MatmulFp8Test, AWrongScaleLayoutIsCaught) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const int64_t t = 64, n = 256, k = 1024, groups = k / 128;
  const Fp8Inputs in =
      RandomFp8Inputs(rng_, t, n, k, GemmPlans::Fp8Scaling::kBlock);
  Fp8Inputs transposed = in;
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      transposed.x_scale[r * groups + g] = in.x_scale[g * t + r];
    }
  }
  absl::Status status;
  const std::vector<float> out =
      Run(*plans_, transposed, t, n, k, GemmPlans::Fp8Scaling::kBlock, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_GT(
      CountBad(out, Fp8Reference(in, t, n, k, GemmPlans::Fp8Scaling::kBlock),
               testing_cuda::kTensorCoreTolerance, /*report=*/false),
      0);
}

// A shape first seen while a graph is captured is planned then (host work),
// not tuned, and the replayed graph computes the product.
TEST_F(MatmulFp8Test, AShapeFirstSeenWhileCapturingWorks) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const int64_t t = 32, n = 640, k = 512;
  const auto scaling = GemmPlans::Fp8Scaling::kOuterVector;
  const Fp8Inputs in = RandomFp8Inputs(rng_, t, n, k, scaling);
  DeviceArray<uint8_t> dx(in.x), dw(in.w);
  DeviceArray<float> dxs(in.x_scale), dws(in.w_scale), out(t * n);
  DeviceArray<uint8_t> workspace(GemmPlans::kWorkspaceBytes);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
            cudaSuccess);
  const absl::Status status = plans_->MatmulFp8(
      t, n, k, scaling, {dx.get(), dxs.get()}, {dw.get(), dws.get()}, out.get(),
      workspace.get(),
      []() -> absl::StatusOr<void*> {
        return absl::InternalError("no scratch while capturing");
      },
      stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(status.ok()) << status;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(CountBad(out.Download(), Fp8Reference(in, t, n, k, scaling),
                     testing_cuda::kTensorCoreTolerance),
            0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(MatmulFp8Test, RefusesShapesCublasLtCannotTake) {
  using S = GemmPlans::Fp8Scaling;
  DeviceArray<uint8_t> x(4096), w(4096), workspace(GemmPlans::kWorkspaceBytes);
  DeviceArray<float> xs(64), ws(64), out(4096);
  auto none = []() -> absl::StatusOr<void*> { return nullptr; };
  const auto run = [&](int64_t t, int64_t n, int64_t k, S s) {
    return plans_->MatmulFp8(t, n, k, s, {x.get(), xs.get()},
                             {w.get(), ws.get()}, out.get(), workspace.get(),
                             none, nullptr);
  };
  EXPECT_EQ(run(4, 16, 24, S::kOuterVector).code(),
            absl::StatusCode::kInvalidArgument);  // k % 16.
  EXPECT_EQ(run(4, 18, 32, S::kOuterVector).code(),
            absl::StatusCode::kInvalidArgument);  // n % 4.
  EXPECT_EQ(run(3, 16, 32, S::kBlock).code(),
            absl::StatusCode::kInvalidArgument);  // t % 4 (block).
  EXPECT_EQ(plans_
                ->MatmulFp8(4, 16, 32, S::kOuterVector, {x.get() + 1, xs.get()},
                            {w.get(), ws.get()}, out.get(), workspace.get(),
                            none, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);  // Alignment.
}

}  // namespace
}  // namespace cuda
}  // namespace tessera
