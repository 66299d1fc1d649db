// The arithmetic that the CPU sampler (kernels/cpu/cpu_sampling.h) and the
// CUDA sampler (kernels/cuda/sampling/sampling_kernels.h) share bit for bit, so
// that both keep the same tokens and give them the same weights:
//  - every float operation is one IEEE operation rounded to nearest, spelled
//    so that no compiler fuses two of them (the __f*_rn intrinsics on the
//    device; on the host, x86-64 without FMA and -ffp-contract=off);
//  - the weight exp(t - max) comes from SampleExp below, not from a libm
//    (CUDA's expf and glibc's differ in the last bit);
//  - log(min_p) is computed once on the host (MinPLog) and handed to both;
//  - the sums of weights are in double, in the CUDA block's order, which the
//    CPU sampler replays (kSampleThreads lanes, warps of kWarpSize).
// Compiled for the host and (through nvcc) for the device.
#ifndef TESSERA_KERNELS_SAMPLING_MATH_H_
#define TESSERA_KERNELS_SAMPLING_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif

namespace tessera {
namespace sampling {

// Threads of the CUDA sampler's block per row (whole warps): the sums of
// weights follow its lanes, and the CPU sampler replays that order.
constexpr int kSampleThreads = 512;
constexpr int kWarpSize = 32;
static_assert(kSampleThreads % kWarpSize == 0 &&
                  kSampleThreads / kWarpSize <= kWarpSize,
              "the block's warps must fit one warp's second-stage reduction");

// One rounded IEEE operation each, never fused with a neighbour.
TESSERA_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TESSERA_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TESSERA_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// exp(x) in float, within 2 ulp, the same bits on host and device: x = k ln2
// + r (Cody-Waite, |r| <= ln2 / 2), a degree-7 Taylor polynomial of r, times
// 2^k built from its exponent bits. 0 below -86 (where the result would be a
// few ulp from the smallest normal float: those weights are < 1e-37 of the
// best token's and never matter), and for NaN; +inf above 88.
TESSERA_HOST_DEVICE inline float SampleExp(float x) {
  if (!(x >= -86.0f)) return 0.0f;
  if (x > 88.0f) return INFINITY;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 bits: k * kLn2Hi is exact.
  constexpr float kLn2Lo = 1.42860682030941723e-06f;
#if defined(__CUDA_ARCH__)
  const float k = floorf(Add(Mul(x, kLog2e), 0.5f));
#else
  const float k = std::floor(Add(Mul(x, kLog2e), 0.5f));
#endif
  const float r = Sub(Sub(x, Mul(k, kLn2Hi)), Mul(k, kLn2Lo));
  float p = 1.0f / 5040.0f;
  p = Add(Mul(p, r), 1.0f / 720.0f);
  p = Add(Mul(p, r), 1.0f / 120.0f);
  p = Add(Mul(p, r), 1.0f / 24.0f);
  p = Add(Mul(p, r), 1.0f / 6.0f);
  p = Add(Mul(p, r), 0.5f);
  p = Add(Mul(p, r), 1.0f);
  p = Add(Mul(p, r), 1.0f);
  // k in [-124, 127]: 2^k is a normal float.
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(k) + 127)
                        << 23;
  float scale;
#if defined(__CUDA_ARCH__)
  scale = __uint_as_float(bits);
#else
  std::memcpy(&scale, &bits, sizeof(scale));
#endif
  return Mul(p, scale);
}

// A survivor's unnormalized weight: exp(t - max), t and max tempered logits.
TESSERA_HOST_DEVICE inline float SampleWeight(float t, float max) {
  return SampleExp(Sub(t, max));
}

// The penalized logit (transformers' repetition penalty on every token seen
// in the prompt or the output, then OpenAI's frequency and presence penalties
// on the output's tokens, `count` times and once).
TESSERA_HOST_DEVICE inline float PenalizeLogit(float l, int32_t count,
                                               bool in_prompt,
                                               float repetition_penalty,
                                               float presence_penalty,
                                               float frequency_penalty) {
  if (repetition_penalty != 1.0f && (in_prompt || count > 0)) {
    l = l > 0.0f ? Div(l, repetition_penalty) : Mul(l, repetition_penalty);
  }
  if ((presence_penalty != 0.0f || frequency_penalty != 0.0f) && count > 0) {
    l = Sub(l, Add(Mul(frequency_penalty, static_cast<float>(count)),
                   presence_penalty));
  }
  return l;
}

// The tempered logit (temperature > 0): -inf for NaN (never kept), +0 for -0
// (so that equal values order by id alone).
TESSERA_HOST_DEVICE inline float TemperLogit(float l, float temperature) {
  float t = Div(l, temperature);
  if (t != t) t = -INFINITY;
  if (t == 0.0f) t = 0.0f;
  return t;
}

// min-p keeps tempered logits t >= this floor (p >= min_p * p_max), given the
// largest tempered logit and log_min_p = MinPLog(min_p).
TESSERA_HOST_DEVICE inline float MinPFloor(float max, float log_min_p) {
  float floor = Add(max, log_min_p);
  if (floor > max) floor = max;  // min_p > 1 is invalid; keep the best.
  if (floor == 0.0f) floor = 0.0f;
  return floor;
}

// log(min_p), on the host only (one libm for both samplers of a process).
inline float MinPLog(float min_p) { return std::log(min_p); }

}  // namespace sampling
}  // namespace tessera

#undef TESSERA_HOST_DEVICE

#endif  // TESSERA_KERNELS_SAMPLING_MATH_H_
