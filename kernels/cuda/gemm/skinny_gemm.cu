#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;

// Rows of w each warp computes (each lane's slice of x is reused across
// them) and chunks of each row a lane has in flight at once. More rows for
// more x rows keep the x traffic (from L1) near the weights'.
template <int T>
struct Tile {
  static constexpr int kRows = T <= 2 ? 2 : 4;
  static constexpr int kUnroll = T <= 2 ? 4 : 2;
};

__device__ __forceinline__ void Widen(uint32_t packed, float* lo_hi) {
  // bf16 is the top half of an f32: widening is a shift.
  lo_hi[0] = __uint_as_float(packed << 16);
  lo_hi[1] = __uint_as_float(packed & 0xffff0000u);
}

// acc[r][t] += x[t, chunk c] · w[row r, chunk c] for one chunk (8 k).
//
// x is read with plain (coherent) loads, not __ldg or a __restrict__ const
// pointer that would let the compiler use the non-coherent path: under
// programmatic dependent launch the kernel before this one writes x while
// this kernel is already running (before its griddepcontrol.wait), and the
// non-coherent path is only defined for data that is read-only for the
// whole kernel, as the weights are.
template <int T, int R>
__device__ __forceinline__ void Accumulate(const float* x, int64_t k, int64_t c,
                                           const uint4 (&wv)[R],
                                           float (&acc)[R][T]) {
  float xv[T][8];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float4* xr = reinterpret_cast<const float4*>(x + t * k) + 2 * c;
    const float4 a = xr[0], b = xr[1];
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
      for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(xv[t][e], wf[e], acc[r][t]);
    }
  }
}

// Warp g of the grid computes output columns [g * R, g * R + R) for all T
// rows. A chunk is 8 consecutive k (16 bytes of a weight row); lane l takes
// chunks l, l + 32, ..., so the warp reads 512 contiguous bytes of each row
// at a time, U chunks of every row in flight, and its sums meet in shuffles.
//
// Programmatic dependent launch: the weights do not depend on the kernel
// before this one, so each lane loads its first U chunks of every row before
// waiting for that kernel (griddepcontrol.wait; a no-op when the launch had
// no programmatic dependency). The weight stream thus starts while the
// previous kernel drains, which at decode sizes is a large part of a
// product's time.
template <int T>
__global__ void __launch_bounds__(kThreads)
    SkinnyGemmKernel(const float* x, const uint4* __restrict__ w,
                     const float* __restrict__ bias, float* __restrict__ out,
                     int64_t n, int64_t k) {
  constexpr int R = Tile<T>::kRows, U = Tile<T>::kUnroll;
  const int lane = threadIdx.x % 32;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) *
      R;
  const int64_t chunks = k / 8;
  const uint4* rows[R];
  bool valid[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    valid[r] = row0 + r < n;
    rows[r] = w + (valid[r] ? row0 + r : 0) * chunks;
  }
  uint4 first[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = lane + u * 32;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      first[u][r] =
          valid[r] && c < chunks ? __ldg(rows[r] + c) : make_uint4(0, 0, 0, 0);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = lane + u * 32;
    if (c < chunks) Accumulate<T, R>(x, k, c, first[u], acc);
  }
  int64_t c = lane + U * 32;
  // U chunks of every row per iteration, their loads issued together.
  for (; c + (U - 1) * 32 < chunks; c += U * 32) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] =
            valid[r] ? __ldg(rows[r] + c + u * 32) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) Accumulate<T, R>(x, k, c + u * 32, wv[u], acc);
  }
  for (; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wv[r] = valid[r] ? __ldg(rows[r] + c) : make_uint4(0, 0, 0, 0);
    }
    Accumulate<T, R>(x, k, c, wv, acc);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = WarpSum(acc[r][t]);
      if (lane == r * T + t && valid[r]) {
        out[t * n + row0 + r] = bias != nullptr ? s + bias[row0 + r] : s;
      }
    }
  }
}

template <int T>
cudaError_t Launch(int64_t n, int64_t k, const float* x, const uint4* w,
                   const float* bias, float* out, cudaStream_t stream) {
  constexpr int64_t kColumnsPerBlock = kWarpsPerBlock * Tile<T>::kRows;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(
      static_cast<unsigned>((n + kColumnsPerBlock - 1) / kColumnsPerBlock));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, SkinnyGemmKernel<T>, x, w, bias, out, n,
                            k);
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

bool SkinnyGemmApplies(int64_t t, int64_t n, int64_t k, const void* x,
                       const void* w) {
  return t >= 1 && t <= kMaxSkinnyRows && n >= 1 && k >= 8 && k % 8 == 0 &&
         x != nullptr && w != nullptr && Aligned16(x) && Aligned16(w) &&
         n / 8 <= INT32_MAX;
}

cudaError_t LaunchSkinnyGemm(int64_t t, int64_t n, int64_t k, const float* x,
                             const void* w, const float* bias, float* out,
                             cudaStream_t stream) {
  if (!SkinnyGemmApplies(t, n, k, x, w) || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const uint4* wv = static_cast<const uint4*>(w);
  cudaError_t error;
  switch (t) {
    case 1:
      error = Launch<1>(n, k, x, wv, bias, out, stream);
      break;
    case 2:
      error = Launch<2>(n, k, x, wv, bias, out, stream);
      break;
    case 3:
      error = Launch<3>(n, k, x, wv, bias, out, stream);
      break;
    default:
      error = Launch<4>(n, k, x, wv, bias, out, stream);
      break;
  }
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
