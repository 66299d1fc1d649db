#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Weight rows per block: each lane's slice of x is reused across them, and
// their loads are in flight together.
constexpr int kRowsPerBlock = 4;

__device__ __forceinline__ void Widen(uint32_t packed, float* lo_hi) {
  // bf16 is the top half of an f32: widening is a shift.
  lo_hi[0] = __uint_as_float(packed << 16);
  lo_hi[1] = __uint_as_float(packed & 0xffff0000u);
}

// Block b computes output columns [b * R, b * R + R) for all T rows. Lane
// chunks: a chunk is 8 consecutive k (16 bytes of a weight row); thread i of
// the block takes chunks i, i + 256, ..., so a warp reads 512 contiguous bytes
// of each row at a time, and the block's partial sums meet in shared memory.
template <int T>
__global__ void __launch_bounds__(kThreads)
    SkinnyGemmKernel(const float* __restrict__ x, const uint4* __restrict__ w,
                     const float* __restrict__ bias, float* __restrict__ out,
                     int64_t n, int64_t k) {
  constexpr int R = kRowsPerBlock;
  const int64_t chunks = k / 8;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
  const uint4* rows[R];
  bool valid[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    valid[r] = row0 + r < n;
    rows[r] = w + (valid[r] ? row0 + r : row0) * chunks;
  }
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  }
#pragma unroll 2
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wv[r] = valid[r] ? __ldg(rows[r] + c) : make_uint4(0, 0, 0, 0);
    }
    float xv[T][8];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4* xr = reinterpret_cast<const float4*>(x + t * k) + 2 * c;
      const float4 a = __ldg(xr), b = __ldg(xr + 1);
      xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w;
      xv[t][4] = b.x, xv[t][5] = b.y, xv[t][6] = b.z, xv[t][7] = b.w;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[8];
      Widen(wv[r].x, wf + 0);
      Widen(wv[r].y, wf + 2);
      Widen(wv[r].z, wf + 4);
      Widen(wv[r].w, wf + 6);
#pragma unroll
      for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          acc[r][t] = fmaf(xv[t][e], wf[e], acc[r][t]);
      }
    }
  }
  __shared__ float partial[kWarps][R][T];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = WarpSum(acc[r][t]);
      if (lane == 0) partial[warp][r][t] = s;
    }
  }
  __syncthreads();
  if (threadIdx.x < R * T) {
    const int r = threadIdx.x / T, t = threadIdx.x % T;
    if (row0 + r < n) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) s += partial[i][r][t];
      if (bias != nullptr) s += bias[row0 + r];
      out[t * n + row0 + r] = s;
    }
  }
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

bool SkinnyGemmApplies(int64_t t, int64_t n, int64_t k, const void* x,
                       const void* w) {
  return t >= 1 && t <= kMaxSkinnyRows && n >= 1 && k >= 8 && k % 8 == 0 &&
         x != nullptr && w != nullptr && Aligned16(x) && Aligned16(w) &&
         (n + kRowsPerBlock - 1) / kRowsPerBlock <= INT32_MAX;
}

cudaError_t LaunchSkinnyGemm(int64_t t, int64_t n, int64_t k, const float* x,
                             const void* w, const float* bias, float* out,
                             cudaStream_t stream) {
  if (!SkinnyGemmApplies(t, n, k, x, w) || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(
      static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock));
  const uint4* wv = static_cast<const uint4*>(w);
  switch (t) {
    case 1:
      SkinnyGemmKernel<1>
          <<<grid, kThreads, 0, stream>>>(x, wv, bias, out, n, k);
      break;
    case 2:
      SkinnyGemmKernel<2>
          <<<grid, kThreads, 0, stream>>>(x, wv, bias, out, n, k);
      break;
    case 3:
      SkinnyGemmKernel<3>
          <<<grid, kThreads, 0, stream>>>(x, wv, bias, out, n, k);
      break;
    default:
      SkinnyGemmKernel<4>
          <<<grid, kThreads, 0, stream>>>(x, wv, bias, out, n, k);
      break;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
