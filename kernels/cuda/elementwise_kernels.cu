#include <cuda_bf16.h>

#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/convert.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/elementwise_kernels.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kRmsNormThreads =
    256;  // One block per row; a multiple of the warp size.
static_assert(kRmsNormThreads % 32 == 0, "RmsNorm block must be whole warps");

// Accumulates the sum of squares in f32 per thread, reduces across the block,
// then scales. Matches the CPU reference to f32 rounding.
__global__ void RmsNormKernel(const float* __restrict__ x,
                              const float* __restrict__ weight, float eps,
                              int64_t n, float* __restrict__ out) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int64_t row = blockIdx.x;
  const float* in = x + row * n;
  float* o = out + row * n;
  __shared__ float shared[kWarpSize + 1];
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum_sq += in[i] * in[i];
  const float inv_rms =
      rsqrtf(BlockSum(sum_sq, shared) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    o[i] = in[i] * inv_rms * weight[i];
}

__global__ void SiluMulKernel(const float* __restrict__ gate,
                              const float* __restrict__ up, int64_t count,
                              float* out) {
  for (int64_t i = GridStrideBegin(); i < count; i += GridStrideStep()) {
    const float g = gate[i];
    out[i] = g / (1.0f + __expf(-g)) * up[i];
  }
}

__global__ void ScaleKernel(float* __restrict__ x, int64_t count,
                            float factor) {
  for (int64_t i = GridStrideBegin(); i < count; i += GridStrideStep()) {
    x[i] = __fmul_rn(x[i], factor);
  }
}

__global__ void SoftcapKernel(float* __restrict__ x, int64_t count, float cap) {
  for (int64_t i = GridStrideBegin(); i < count; i += GridStrideStep()) {
    x[i] = Softcap(x[i], cap);
  }
}

// Fused residual add + RmsNorm, one block per row. Each thread updates and
// later normalizes the same elements, so out may alias x.
__global__ void AddRmsNormKernel(float* __restrict__ residual, const float* x,
                                 const float* __restrict__ weight, float eps,
                                 int64_t n, float* out) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int64_t row = blockIdx.x;
  float* res = residual + row * n;
  const float* in = x + row * n;
  float* o = out + row * n;
  __shared__ float shared[kWarpSize + 1];
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float r = __fadd_rn(res[i], in[i]);
    res[i] = r;
    sum_sq += r * r;
  }
  const float inv_rms =
      rsqrtf(BlockSum(sum_sq, shared) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    o[i] = res[i] * inv_rms * weight[i];
}

// The row-in-registers form of RmsNorm and AddRmsNorm, for rows of n floats
// with n % 4 == 0, 16-byte aligned, and n / 4 <= kVecs * 1024: one block a
// row, each thread holding kVecs float4s of it between the sum and the
// scaling, so the row is read once (twice for the residual form's add) with
// 16-byte loads and up to 1024 threads in flight. At decode (one to a few
// rows) the one-block-per-row loop above is bound by its serial passes; this
// is not. kAdd: residual += x first, and the sum is over the new residual.
template <int kVecs, bool kAdd>
__global__ void __launch_bounds__(1024)
    RmsNormRowKernel(float* residual, const float* x,
                     const float* __restrict__ weight, float eps, int64_t n,
                     float* out) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  __shared__ float shared[kWarpSize + 1];
  const int64_t row = blockIdx.x;
  const int64_t vecs = n / 4;
  const float4* in = reinterpret_cast<const float4*>(x + row * n);
  float4* res = kAdd ? reinterpret_cast<float4*>(residual + row * n) : nullptr;
  float4 v[kVecs];
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < vecs) {
      float4 a = in[i];
      if constexpr (kAdd) {
        const float4 r = res[i];
        a = make_float4(__fadd_rn(r.x, a.x), __fadd_rn(r.y, a.y),
                        __fadd_rn(r.z, a.z), __fadd_rn(r.w, a.w));
        res[i] = a;
      }
      v[j] = a;
    }
    sum_sq +=
        v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float inv_rms =
      rsqrtf(BlockSum(sum_sq, shared) / static_cast<float>(n) + eps);
  const float4* w = reinterpret_cast<const float4*>(weight);
  float4* o = reinterpret_cast<float4*>(out + row * n);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (i < vecs) {
      const float4 g = w[i];
      o[i] = make_float4(v[j].x * inv_rms * g.x, v[j].y * inv_rms * g.y,
                         v[j].z * inv_rms * g.z, v[j].w * inv_rms * g.w);
    }
  }
}

constexpr int64_t kRowKernelMaxVecs = 8;

bool RowKernelApplies(int64_t n, const void* a, const void* b, const void* c,
                      const void* d) {
  const auto aligned = [](const void* p) {
    return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  };
  return n > 0 && n % 4 == 0 && n / 4 <= kRowKernelMaxVecs * 1024 &&
         aligned(a) && aligned(b) && aligned(c) && aligned(d);
}

// The smallest kVecs that holds the row with at most 1024 threads, and
// threads enough for it (whole warps).
template <bool kAdd>
cudaError_t LaunchRowKernel(float* residual, const float* x,
                            const float* weight, float eps, int64_t rows,
                            int64_t n, float* out, cudaStream_t stream) {
  const int64_t vecs = n / 4;
  const dim3 grid(static_cast<unsigned>(rows));
  auto launch = [&](auto kernel, int64_t per_thread) {
    int64_t threads = (vecs + per_thread - 1) / per_thread;
    threads = (threads + kWarpSize - 1) / kWarpSize * kWarpSize;
    return LaunchPdl(kernel, grid, dim3(static_cast<unsigned>(threads)), 0,
                     stream, residual, x, weight, eps, n, out);
  };
  if (vecs <= 1024) return launch(RmsNormRowKernel<1, kAdd>, 1);
  if (vecs <= 2048) return launch(RmsNormRowKernel<2, kAdd>, 2);
  if (vecs <= 4096) return launch(RmsNormRowKernel<4, kAdd>, 4);
  return launch(RmsNormRowKernel<8, kAdd>, 8);
}

// Threads a block of the grid-stride loops below.
constexpr int kThreads = 256;
unsigned GridFor(int64_t count) { return GridStrideBlocks(count, kThreads); }

// One block per token (blockIdx.x), threads over the hidden dimension.
template <typename T>
__global__ void EmbeddingKernel(const T* __restrict__ table,
                                const int32_t* __restrict__ ids, int64_t hidden,
                                int64_t first_id, int64_t table_rows,
                                float* __restrict__ out) {
  const int64_t token = blockIdx.x;
  const int64_t local = static_cast<int64_t>(ids[token]) - first_id;
  float* o = out + token * hidden;
  if (local >= 0 && local < table_rows) {
    const T* src = table + local * hidden;
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
      o[i] = ToFloat(src[i]);
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = 0.0f;
  }
}

__global__ void AddKernel(const float* a, const float* b, int64_t n,
                          float* out) {
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    out[i] = __fadd_rn(a[i], b[i]);
  }
}

// One thread per (token, head, pair) with a grid-stride loop. The products
// and sums use explicit round-to-nearest intrinsics so nvcc cannot contract
// them into FMAs (the CPU reference computes them separately).
__global__ void RopeKernel(float* __restrict__ x,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, int64_t tokens,
                           int64_t heads, int64_t dim) {
  const int64_t half = dim / 2;
  const int64_t total = tokens * heads * half;
  for (int64_t idx = GridStrideBegin(); idx < total; idx += GridStrideStep()) {
    const int64_t i = idx % half;
    const int64_t th = idx / half;  // token * heads + head
    const int64_t t = th / heads;
    const float angle =
        __fmul_rn(static_cast<float>(positions[t]), inv_freq[i]);
    const float c = cosf(angle);
    const float s = sinf(angle);
    float* v = x + th * dim;
    const float a = v[i];
    const float b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

// One block per row.
__global__ void BiasAddKernel(float* __restrict__ x,
                              const float* __restrict__ bias, int64_t n) {
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    row[i] = __fadd_rn(row[i], bias[i]);
}

__global__ void CastF32ToBF16Kernel(const float* __restrict__ in,
                                    __nv_bfloat16* __restrict__ out,
                                    int64_t n) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    out[i] = FromFloat<__nv_bfloat16>(in[i]);
  }
}

__global__ void CastBF16ToF32Kernel(const __nv_bfloat16* __restrict__ in,
                                    float* __restrict__ out, int64_t n) {
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    out[i] = ToFloat(in[i]);
  }
}

// One block per gathered row.
__global__ void GatherRowsKernel(const float* __restrict__ src,
                                 const int32_t* __restrict__ rows,
                                 int64_t row_elems, float* __restrict__ dst) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int64_t r = blockIdx.x;
  const float* s = src + static_cast<int64_t>(rows[r]) * row_elems;
  float* d = dst + r * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) d[i] = s[i];
}

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps,
                          int64_t rows, int64_t n, float* out,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (RowKernelApplies(n, x, weight, out, nullptr)) {
    const cudaError_t e =
        LaunchRowKernel<false>(nullptr, x, weight, eps, rows, n, out, stream);
    return e != cudaSuccess ? e : cudaGetLastError();
  }
  const cudaError_t e =
      LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(rows)),
                dim3(kRmsNormThreads), 0, stream, x, weight, eps, n, out);
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count,
                          float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  SiluMulKernel<<<GridFor(count), kThreads, 0, stream>>>(gate, up, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, int64_t count, float factor,
                        cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (x == nullptr) return cudaErrorInvalidValue;
  ScaleKernel<<<GridFor(count), kThreads, 0, stream>>>(x, count, factor);
  return cudaGetLastError();
}

cudaError_t LaunchSoftcap(float* x, int64_t count, float cap,
                          cudaStream_t stream) {
  if (count < 0 || !(cap > 0.0f)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (x == nullptr) return cudaErrorInvalidValue;
  SoftcapKernel<<<GridFor(count), kThreads, 0, stream>>>(x, count, cap);
  return cudaGetLastError();
}

cudaError_t LaunchEmbedding(const void* table, bool table_bf16,
                            const int32_t* ids, int64_t num_tokens,
                            int64_t hidden, int64_t first_id,
                            int64_t table_rows, float* out,
                            cudaStream_t stream) {
  if (num_tokens == 0 || hidden == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(num_tokens);
  if (table_bf16) {
    EmbeddingKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(table), ids, hidden, first_id,
        table_rows, out);
  } else {
    EmbeddingKernel<float>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(table), ids,
                                          hidden, first_id, table_rows, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* out,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchAddRmsNorm(float* residual, const float* x,
                             const float* weight, float eps, int64_t rows,
                             int64_t n, float* out, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  if (RowKernelApplies(n, x, weight, out, residual)) {
    const cudaError_t e =
        LaunchRowKernel<true>(residual, x, weight, eps, rows, n, out, stream);
    return e != cudaSuccess ? e : cudaGetLastError();
  }
  const cudaError_t e = LaunchPdl(
      AddRmsNormKernel, dim3(static_cast<unsigned>(rows)),
      dim3(kRmsNormThreads), 0, stream, residual, x, weight, eps, n, out);
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t LaunchRope(float* x, const int32_t* positions,
                       const float* inv_freq, int64_t tokens, int64_t heads,
                       int64_t dim, cudaStream_t stream) {
  const int64_t total = tokens * heads * (dim / 2);
  if (total == 0) return cudaSuccess;
  RopeKernel<<<GridFor(total), kThreads, 0, stream>>>(x, positions, inv_freq,
                                                      tokens, heads, dim);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAdd(float* x, const float* bias, int64_t rows, int64_t n,
                          cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  BiasAddKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, bias,
                                                                      n);
  return cudaGetLastError();
}

cudaError_t LaunchCastF32ToBF16(const float* in, void* out_bf16, int64_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const cudaError_t e =
      LaunchPdl(CastF32ToBF16Kernel, dim3(GridFor(n)), dim3(kThreads), 0,
                stream, in, static_cast<__nv_bfloat16*>(out_bf16), n);
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t LaunchCastBF16ToF32(const void* in_bf16, float* out, int64_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastBF16ToF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(in_bf16), out, n);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* src, const int32_t* rows,
                             int64_t num_rows, int64_t row_elems, float* dst,
                             cudaStream_t stream) {
  if (num_rows == 0 || row_elems == 0) return cudaSuccess;
  const cudaError_t e =
      LaunchPdl(GatherRowsKernel, dim3(static_cast<unsigned>(num_rows)),
                dim3(kThreads), 0, stream, src, rows, row_elems, dst);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
