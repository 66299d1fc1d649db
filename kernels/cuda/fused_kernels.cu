#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/convert.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/fused_kernels.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kThreads = 128;  // Whole warps (BlockSum / BlockMax).
constexpr int kMaxGridY = 65535;

// Writes the staged row (n floats in shared memory) to a cache row.
template <typename T>
__device__ void WriteCacheRow(const float* row, int32_t n, T* dst,
                              float* scale_dst, float* scratch);

template <>
__device__ void WriteCacheRow<float>(const float* row, int32_t n, float* dst,
                                     float*, float*) {
  for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = row[i];
}

template <>
__device__ void WriteCacheRow<__nv_bfloat16>(const float* row, int32_t n,
                                             __nv_bfloat16* dst, float*,
                                             float*) {
  for (int i = threadIdx.x; i < n; i += kThreads)
    dst[i] = FromFloat<__nv_bfloat16>(row[i]);
}

// Symmetric int8 as StoreKvCache (and the CPU's QuantizeRow): scale =
// max|x| / 127 (0 for an all-zero row), q = clamp(rint(x / scale), +-127),
// IEEE division.
template <>
__device__ void WriteCacheRow<int8_t>(const float* row, int32_t n, int8_t* dst,
                                      float* scale_dst, float* scratch) {
  float amax = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads)
    amax = fmaxf(amax, fabsf(row[i]));
  amax = BlockReduce(amax, scratch, MaxOp(), 0.0f);
  if (!(amax > 0.0f)) {
    for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = 0;
    if (threadIdx.x == 0) *scale_dst = 0.0f;
    return;
  }
  const float s = __fdiv_rn(amax, 127.0f);
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float r = rintf(__fdiv_rn(row[i], s));
    dst[i] = static_cast<int8_t>(fminf(127.0f, fmaxf(-127.0f, r)));
  }
  if (threadIdx.x == 0) *scale_dst = s;
}

// fp8 as StoreKvCache: e4m3(x / scale) under the head's fixed scale (read).
template <>
__device__ void WriteCacheRow<__nv_fp8_e4m3>(const float* row, int32_t n,
                                             __nv_fp8_e4m3* dst, float* scale,
                                             float*) {
  const float s = *scale;
  for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = ToFp8E4M3(row[i], s);
}

// The length after this step of the sequence that holds token t (the
// largest s with query_start_loc[s] <= t); 0 for a row beyond every
// sequence.
__device__ int32_t SeqLenOfToken(const DeviceRope& r, int64_t t) {
  if (r.num_seqs <= 0 || t >= r.query_start_loc[r.num_seqs]) return 0;
  int32_t lo = 0, hi = r.num_seqs - 1;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (r.query_start_loc[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return r.seq_lens[lo];
}

// grid (num_tokens, num_heads + 2 * kv_heads): head j < num_heads is q head
// j, then the k heads, then the v heads.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    QkvRopeStoreKernel(const float* __restrict__ qkv, int32_t num_heads,
                       int32_t kv_heads, int32_t dim,
                       const float* __restrict__ q_norm,
                       const float* __restrict__ k_norm, float eps,
                       const int32_t* __restrict__ positions,
                       const float* __restrict__ inv_freq, DeviceRope rope,
                       const int64_t* __restrict__ slot_mapping,
                       int64_t num_slots, T* k_cache, T* v_cache,
                       float* k_scale, float* v_scale,
                       float* __restrict__ q_out) {
  extern __shared__ float row[];  // dim floats
  __shared__ float scratch[kWarpSize + 1];
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int64_t t = blockIdx.x;
  const int32_t j = blockIdx.y;
  const bool is_q = j < num_heads;
  const bool is_k = !is_q && j < num_heads + kv_heads;
  int64_t slot = -1;
  if (!is_q) {
    slot = slot_mapping[t];
    // The same for the whole block: no thread reaches a barrier.
    if (slot < 0 || slot >= num_slots) return;
  }
  const int64_t row_elems =
      static_cast<int64_t>(num_heads + 2 * kv_heads) * dim;
  const float* src = qkv + t * row_elems + static_cast<int64_t>(j) * dim;
  const float* norm = is_q ? q_norm : (is_k ? k_norm : nullptr);
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float x = src[i];
    row[i] = x;
    sum_sq = __fadd_rn(sum_sq, __fmul_rn(x, x));
  }
  if (norm != nullptr) {
    const float total = BlockSum(sum_sq, scratch);
    const float inv_rms = __fdiv_rn(
        1.0f,
        __fsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(dim)), eps)));
    for (int i = threadIdx.x; i < dim; i += kThreads)
      row[i] = __fmul_rn(__fmul_rn(row[i], inv_rms), norm[i]);
  }
  __syncthreads();
  if (is_q || is_k) {
    // Rope, "rotate half" over the first 2 * half dims: each thread owns
    // whole pairs (i, i + half); the dims beyond pass through.
    const int32_t half = rope.rotary_half;
    const float* freq = inv_freq;
    bool dynamic = false;
    float dynamic_base = 0.0f;
    if (rope.length_scaling != DeviceRopeLengthScaling::kNone) {
      const int32_t length = SeqLenOfToken(rope, t);
      if (length > rope.original_max_len) {
        if (rope.length_scaling == DeviceRopeLengthScaling::kLongRope) {
          freq = rope.long_inv_freq;
        } else {
          // RopeOptions' dynamic NTK base, operation by operation in f32.
          float x = __fmul_rn(rope.factor, static_cast<float>(length));
          x = __fdiv_rn(x, static_cast<float>(rope.original_max_len));
          x = __fsub_rn(x, rope.factor_minus_one);
          dynamic_base = __fmul_rn(rope.base, powf(x, rope.exponent));
          dynamic = true;
        }
      }
    }
    const float rotary = static_cast<float>(2 * half);
    const float pos = static_cast<float>(positions[t]);
    for (int i = threadIdx.x; i < half; i += kThreads) {
      const float f =
          dynamic
              ? __fdiv_rn(1.0f,
                          powf(dynamic_base,
                               __fdiv_rn(static_cast<float>(2 * i), rotary)))
              : freq[i];
      const float angle = __fmul_rn(pos, f);
      float c = cosf(angle);
      float s = sinf(angle);
      if (rope.cos_sin_scale != 1.0f) {
        c = __fmul_rn(c, rope.cos_sin_scale);
        s = __fmul_rn(s, rope.cos_sin_scale);
      }
      const float a = row[i];
      const float b = row[i + half];
      row[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      row[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    __syncthreads();
  }
  if (is_q) {
    float* dst = q_out + (t * num_heads + j) * static_cast<int64_t>(dim);
    for (int i = threadIdx.x; i < dim; i += kThreads) dst[i] = row[i];
    return;
  }
  const int32_t h = is_k ? j - num_heads : j - num_heads - kv_heads;
  const int64_t dst_row = slot * kv_heads + h;
  T* cache = is_k ? k_cache : v_cache;
  float* scales = is_k ? k_scale : v_scale;
  // int8 writes a scale per (slot, head); fp8 reads its head's.
  const int64_t scale_index =
      std::is_same<T, __nv_fp8_e4m3>::value ? h : dst_row;
  WriteCacheRow<T>(row, dim, cache + dst_row * dim,
                   scales == nullptr ? nullptr : scales + scale_index, scratch);
}

template <typename T>
cudaError_t RunQkvRopeStore(const float* qkv, int32_t num_heads,
                            const float* q_norm, const float* k_norm, float eps,
                            const int32_t* positions, const float* inv_freq,
                            const DeviceRope& rope, const int64_t* slot_mapping,
                            int64_t num_tokens, const DeviceKvLayer& c,
                            float* q_out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>(num_heads + 2 * c.num_kv_heads));
  const size_t shared = static_cast<size_t>(c.head_dim) * sizeof(float);
  const bool quantized = KvHasScales(c.dtype);
  const cudaError_t e = LaunchPdl(
      QkvRopeStoreKernel<T>, grid, dim3(kThreads), shared, stream, qkv,
      num_heads, c.num_kv_heads, c.head_dim, q_norm, k_norm, eps, positions,
      inv_freq, rope, slot_mapping, c.num_slots, static_cast<T*>(c.k),
      static_cast<T*>(c.v), quantized ? c.k_scale : nullptr,
      quantized ? c.v_scale : nullptr, q_out);
  return e != cudaSuccess ? e : cudaGetLastError();
}

__global__ void GatedSiluKernel(const float* __restrict__ gate_up,
                                int64_t inter, int64_t count,
                                float* __restrict__ out) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  for (int64_t idx = GridStrideBegin(); idx < count; idx += GridStrideStep()) {
    const int64_t r = idx / inter;
    const int64_t i = idx - r * inter;
    const float g = gate_up[r * 2 * inter + i];
    const float u = gate_up[r * 2 * inter + inter + i];
    out[idx] = g / (1.0f + __expf(-g)) * u;  // LaunchSiluMul's expression.
  }
}

__global__ void GatedGeluTanhKernel(const float* __restrict__ gate_up,
                                    int64_t inter, int64_t count,
                                    float* __restrict__ out) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  for (int64_t idx = GridStrideBegin(); idx < count; idx += GridStrideStep()) {
    const int64_t r = idx / inter;
    const int64_t i = idx - r * inter;
    const float g = gate_up[r * 2 * inter + i];
    const float u = gate_up[r * 2 * inter + inter + i];
    out[idx] = __fmul_rn(GeluTanh(g), u);
  }
}

}  // namespace

cudaError_t LaunchQkvRopeStore(const float* qkv, int32_t num_heads,
                               const float* q_norm, const float* k_norm,
                               float eps, const int32_t* positions,
                               const float* inv_freq,
                               const int64_t* slot_mapping, int64_t num_tokens,
                               const DeviceKvLayer& cache, float* q_out,
                               cudaStream_t stream) {
  DeviceRope rope;
  rope.rotary_half = cache.head_dim / 2;
  return LaunchQkvRopeStore(qkv, num_heads, q_norm, k_norm, eps, positions,
                            inv_freq, rope, slot_mapping, num_tokens, cache,
                            q_out, stream);
}

cudaError_t LaunchQkvRopeStore(const float* qkv, int32_t num_heads,
                               const float* q_norm, const float* k_norm,
                               float eps, const int32_t* positions,
                               const float* inv_freq, const DeviceRope& rope,
                               const int64_t* slot_mapping, int64_t num_tokens,
                               const DeviceKvLayer& cache, float* q_out,
                               cudaStream_t stream) {
  const int32_t dim = cache.head_dim;
  if (num_tokens < 0 || num_tokens > INT32_MAX || num_heads <= 0 ||
      cache.num_kv_heads <= 0 || dim <= 0 || dim % 2 != 0 ||
      dim > kMaxFusedHeadDim || cache.head_dim_v != dim ||
      int64_t{num_heads} + 2 * int64_t{cache.num_kv_heads} > kMaxGridY ||
      cache.k == nullptr || cache.v == nullptr ||
      (KvHasScales(cache.dtype) &&
       (cache.k_scale == nullptr || cache.v_scale == nullptr)) ||
      rope.rotary_half < 1 || rope.rotary_half > dim / 2) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  if (qkv == nullptr || positions == nullptr || inv_freq == nullptr ||
      slot_mapping == nullptr || q_out == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rope.length_scaling != DeviceRopeLengthScaling::kNone &&
      (rope.query_start_loc == nullptr ||
       (rope.num_seqs > 0 && rope.seq_lens == nullptr) || rope.num_seqs < 0 ||
       rope.original_max_len <= 0 ||
       (rope.length_scaling == DeviceRopeLengthScaling::kLongRope &&
        rope.long_inv_freq == nullptr))) {
    return cudaErrorInvalidValue;
  }
  switch (cache.dtype) {
    case KvDType::kF32:
      return RunQkvRopeStore<float>(qkv, num_heads, q_norm, k_norm, eps,
                                    positions, inv_freq, rope, slot_mapping,
                                    num_tokens, cache, q_out, stream);
    case KvDType::kBF16:
      return RunQkvRopeStore<__nv_bfloat16>(
          qkv, num_heads, q_norm, k_norm, eps, positions, inv_freq, rope,
          slot_mapping, num_tokens, cache, q_out, stream);
    case KvDType::kI8:
      return RunQkvRopeStore<int8_t>(qkv, num_heads, q_norm, k_norm, eps,
                                     positions, inv_freq, rope, slot_mapping,
                                     num_tokens, cache, q_out, stream);
    case KvDType::kF8E4M3:
      return RunQkvRopeStore<__nv_fp8_e4m3>(
          qkv, num_heads, q_norm, k_norm, eps, positions, inv_freq, rope,
          slot_mapping, num_tokens, cache, q_out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchGatedSilu(const float* gate_up, int64_t rows, int64_t inter,
                            float* out, cudaStream_t stream) {
  if (rows < 0 || inter < 0) return cudaErrorInvalidValue;
  const int64_t count = rows * inter;
  if (count == 0) return cudaSuccess;
  if (gate_up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const cudaError_t e =
      LaunchPdl(GatedSiluKernel, dim3(GridStrideBlocks(count, 256)), dim3(256),
                0, stream, gate_up, inter, count, out);
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t LaunchGatedGeluTanh(const float* gate_up, int64_t rows,
                                int64_t inter, float* out,
                                cudaStream_t stream) {
  if (rows < 0 || inter < 0) return cudaErrorInvalidValue;
  const int64_t count = rows * inter;
  if (count == 0) return cudaSuccess;
  if (gate_up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const cudaError_t e =
      LaunchPdl(GatedGeluTanhKernel, dim3(GridStrideBlocks(count, 256)),
                dim3(256), 0, stream, gate_up, inter, count, out);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
