// GemmPlans against a host reference: out = x · wᵀ in f32 (no TF32: within
// f32 rounding) and in bf16 (inputs exactly representable in bf16, so the f32
// accumulation is exact), for several shapes in turn, each twice (the second
// product reuses the cached plan). Skips itself without a GPU.
#include "kernels/cuda/gemm/gemm_plans.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/device_array.h"

namespace tessera {
namespace cuda {
namespace {

using testing_cuda::DeviceArray;

// Multiples of 1/4 in [-2, 2]: exact in bf16, so products and sums of a few
// hundred of them are exact in f32.
std::vector<float> Values(size_t count, uint32_t seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<float>(static_cast<int>((seed >> 24) % 17) - 8) * 0.25f;
  }
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    out[i] = static_cast<uint16_t>(bits >> 16);  // Exact for these values.
  }
  return out;
}

std::vector<float> Reference(const std::vector<float>& x,
                             const std::vector<float>& w, int64_t t, int64_t n,
                             int64_t k) {
  std::vector<float> out(static_cast<size_t>(t * n));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t l = 0; l < k; ++l)
        sum += double{x[i * k + l]} * w[j * k + l];
      out[i * n + j] = static_cast<float>(sum);
    }
  }
  return out;
}

TEST(GemmPlansTest, MatchesTheHostProductInF32AndBf16) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(CudaStatus(cudaSetDevice(0), "cudaSetDevice", "test").ok());
  auto plans = GemmPlans::Create();
  ASSERT_TRUE(plans.ok()) << plans.status();
  DeviceArray<uint8_t> workspace(GemmPlans::kWorkspaceBytes);
  struct Shape {
    int64_t t, n, k;
  };
  for (const Shape& s : {Shape{1, 96, 64}, Shape{7, 33, 130}, Shape{1, 96, 64},
                         Shape{64, 256, 128}}) {
    const std::vector<float> x = Values(s.t * s.k, 1 + s.t);
    const std::vector<float> w = Values(s.n * s.k, 2 + s.n);
    const std::vector<float> want = Reference(x, w, s.t, s.n, s.k);
    for (int repeat = 0; repeat < 2; ++repeat) {
      SCOPED_TRACE(testing::Message()
                   << "[" << s.t << ", " << s.k << "] x [" << s.n << ", " << s.k
                   << "], repeat " << repeat);
      DeviceArray<float> x32(x), w32(w), out32(want.size());
      ASSERT_TRUE((*plans)
                      ->Matmul(s.t, s.n, s.k, DType::kF32, x32.get(), w32.get(),
                               out32.get(), workspace.get(), 0)
                      .ok());
      const std::vector<float> got32 = out32.Download();
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got32[i], want[i], 1e-5f * (1 + std::fabs(want[i])))
            << "f32 element " << i;
      }
      DeviceArray<uint16_t> x16(ToBf16(x)), w16(ToBf16(w));
      DeviceArray<float> out16(want.size());
      ASSERT_TRUE((*plans)
                      ->Matmul(s.t, s.n, s.k, DType::kBF16, x16.get(),
                               w16.get(), out16.get(), workspace.get(), 0)
                      .ok());
      const std::vector<float> got16 = out16.Download();
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got16[i], want[i]) << "bf16 element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace tessera
