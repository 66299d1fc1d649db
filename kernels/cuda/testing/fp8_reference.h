// Host references for the fp8 products' tests (gemm/fp8_gemm_test.cc,
// cuda_ops_test.cc): the quantization formula of gemm/fp8_gemm.h emulated
// operation for operation (so its bytes and scales are bit-exact with the
// kernels'), the real values of e4m3 data times its scale, a double-precision
// product of those values, and the error bounds the tests allow.
#ifndef TESSERA_KERNELS_CUDA_TESTING_FP8_REFERENCE_H_
#define TESSERA_KERNELS_CUDA_TESTING_FP8_REFERENCE_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "runtime/core/dtype.h"

namespace tessera {
namespace testing_cuda {

// A test's seed: $TESSERA_TEST_SEED if set, else a fresh one; the test prints
// it (SCOPED_TRACE) so that a failure can be replayed.
inline uint32_t TestSeed() {
  if (const char* env = std::getenv("TESSERA_TEST_SEED")) {
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  return std::random_device{}();
}

// gemm/fp8_gemm.h's dynamic scale of a group whose max |x| is m.
inline float Fp8ScaleFor(float m) {
  const float s = m / kFp8E4M3Max;
  return s > 0.0f && s <= FLT_MAX ? s : 1.0f;
}

// How the host quantizes (LaunchQuantizeFp8Activations' kinds and layouts).
enum class HostQuantization { kPerToken, kStatic, kPerGroup };

struct HostQuantized {
  std::vector<uint8_t> q;     // [t, k].
  std::vector<float> scales;  // [t] or, group_layout, [groups][t].
};

inline int64_t Fp8Groups(int64_t k) { return (k + 127) / 128; }

// x [t, k] quantized as the kernel does: per row (or per 1x128 group) s from
// max |x| taken with fmax (a NaN does not count), q = F32ToFp8E4M3(x / s),
// each operation one f32 operation.
inline HostQuantized QuantizeFp8Host(HostQuantization kind, bool group_layout,
                                     int64_t t, int64_t k, const float* x,
                                     float static_scale) {
  const int64_t groups = Fp8Groups(k);
  HostQuantized h;
  h.q.resize(static_cast<size_t>(t * k));
  h.scales.resize(static_cast<size_t>(group_layout ? groups * t : t));
  for (int64_t r = 0; r < t; ++r) {
    const float* row = x + r * k;
    float row_scale = static_scale;
    if (kind == HostQuantization::kPerToken) {
      float m = 0.0f;
      for (int64_t i = 0; i < k; ++i) m = std::fmax(m, std::fabs(row[i]));
      row_scale = Fp8ScaleFor(m);
    }
    for (int64_t g = 0; g < groups; ++g) {
      float s = row_scale;
      const int64_t begin = g * 128, end = std::min<int64_t>(k, begin + 128);
      if (kind == HostQuantization::kPerGroup) {
        float m = 0.0f;
        for (int64_t i = begin; i < end; ++i) {
          m = std::fmax(m, std::fabs(row[i]));
        }
        s = Fp8ScaleFor(m);
      }
      for (int64_t i = begin; i < end; ++i) {
        h.q[r * k + i] = F32ToFp8E4M3(row[i] / s);
      }
      if (group_layout) h.scales[g * t + r] = s;
    }
    if (!group_layout) h.scales[r] = row_scale;
  }
  return h;
}

// The real values of quantized activations: q * its scale, in double.
inline std::vector<double> DequantizeActivations(const HostQuantized& h,
                                                 bool group_layout, int64_t t,
                                                 int64_t k) {
  std::vector<double> out(static_cast<size_t>(t * k));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const double s = group_layout ? h.scales[(i / 128) * t + r] : h.scales[r];
      out[r * k + i] = double{Fp8E4M3ToF32(h.q[r * k + i])} * s;
    }
  }
  return out;
}

// The real weight w[n, k] * scale: block 0 per-channel (scale [n]), else
// scale [ceil(n / block)][ceil(k / block)] (the checkpoint's layout).
inline std::vector<double> DequantizeWeight(const std::vector<uint8_t>& w,
                                            int64_t n, int64_t k,
                                            const std::vector<float>& scale,
                                            int64_t block) {
  std::vector<double> out(static_cast<size_t>(n * k));
  const int64_t cols = block > 0 ? (k + block - 1) / block : 0;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      const double s =
          block > 0 ? scale[(j / block) * cols + i / block] : scale[j];
      out[j * k + i] = double{Fp8E4M3ToF32(w[j * k + i])} * s;
    }
  }
  return out;
}

// out[r, j] = sum_i x[r, i] w[j, i] (+ bias[j]) in double, and the sum of the
// terms' magnitudes (|bias| included), which the error bounds scale with.
struct HostProduct {
  std::vector<double> out, mag;
};
inline HostProduct Product(const std::vector<double>& x,
                           const std::vector<double>& w, int64_t t, int64_t n,
                           int64_t k, const float* bias) {
  HostProduct p;
  p.out.resize(static_cast<size_t>(t * n));
  p.mag.resize(static_cast<size_t>(t * n));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias != nullptr ? bias[j] : 0.0, mag = std::fabs(sum);
      const double* xr = x.data() + r * k;
      const double* wr = w.data() + j * k;
      for (int64_t i = 0; i < k; ++i) {
        const double term = xr[i] * wr[i];
        sum += term;
        mag += std::fabs(term);
      }
      p.out[r * n + j] = sum;
      p.mag[r * n + j] = mag;
    }
  }
  return p;
}

// The skinny kernel's bound, relative to the magnitude sum: an f32 chain of
// at most 16 ceil(k / 512) fused multiply-adds per lane, 5 butterfly adds, 3
// split adds, the scale and the bias (each at most 2^-24 of the magnitude
// sum), doubled for margin.
inline double SkinnyTolerance(int64_t k) {
  return std::ldexp(16.0 * static_cast<double>((k + 511) / 512) + 12.0, -23);
}

// cuBLASLt's fp8 tensor cores on Hopper keep about 14 bits in the sums of an
// MMA's k-group before cuBLASLt adds them in f32 (DeepSeek-V3 report, §3.3.2:
// "limited accumulation precision"), so the error is a few 2^-13 of the
// magnitude sum: measured up to 2.7e-4 on an H200 (cuBLASLt 13.1, k 256 ..
// 4096), allowed 2^-10 (~1e-3). bf16 output adds its rounding, 2^-9 of
// |out| <= the magnitude sum: allowed 2^-8. A wrong scale or layout moves an
// output by a sizeable fraction of it, far above either.
inline constexpr double kTensorCoreTolerance = 0x1p-10;
inline constexpr double kTensorCoreBf16Tolerance = 0x1p-8;

// Random e4m3 weights: normal values quantized at a scale that uses the
// format's range (a few saturate to ±448); never NaN.
inline std::vector<uint8_t> RandomFp8(std::mt19937& rng, int64_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> w(static_cast<size_t>(count));
  for (uint8_t& v : w) v = F32ToFp8E4M3(normal(rng) * 64.0f);
  return w;
}

// Random positive scales in [lo, hi).
inline std::vector<float> RandomScales(std::mt19937& rng, int64_t count,
                                       float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> s(static_cast<size_t>(count));
  for (float& v : s) v = u(rng);
  return s;
}

}  // namespace testing_cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_TESTING_FP8_REFERENCE_H_
