#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// What the kernel makes of its product: the product itself, or a gated
// activation of its gate and up halves (the template parameter kAct).
constexpr int kPlain = 0;
constexpr int kGatedSilu = 1;
constexpr int kGatedGeluTanh = 2;
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
// Split (kSplit): for products too narrow to give every SM several warps of
// their own columns (n / R warps in all), the block's four warps share R
// columns and split k: warp w takes chunks 32 w + l, 32 w + l + 128, ...;
// their sums meet in shared memory, added in warp order. Four times the warps
// for the same bytes, so enough loads are in flight to reach the bandwidth.
// Which layout a shape gets depends on n alone (UseSplit), so a shape's
// results are bitwise repeatable.
//
// Gated (kAct != kPlain): w is the gate/up stack [2 * n, k] and the output is
// act(gate) * up [t, n]. Warp g then computes the R / 2 output columns
// [g * R / 2, ...) from their gate rows and their up rows (n further on), so
// both halves of an output meet in one warp and the gate/up product never
// reaches memory.
//
// Programmatic dependent launch (launch.cuh): the weights do not depend on
// the kernel before this one, so each lane loads its first U chunks of every
// row before PdlWait. The weight stream thus starts while the previous
// kernel drains, which at decode sizes is a large part of a product's time.
template <int T, int kAct, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    SkinnyGemmKernel(const float* x, const uint4* __restrict__ w,
                     const float* __restrict__ bias, float* __restrict__ out,
                     int64_t n, int64_t k) {
  constexpr bool kGated = kAct != kPlain;
  constexpr int R = Tile<T>::kRows, U = Tile<T>::kUnroll;
  constexpr int kCols = kGated ? R / 2 : R;  // Output columns per warp.
  constexpr int kStride = kSplit ? 32 * kWarpsPerBlock : 32;  // In chunks.
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t col0 =
      kSplit
          ? static_cast<int64_t>(blockIdx.x) * kCols
          : (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * kCols;
  const int64_t first_chunk = kSplit ? lane + 32 * warp : lane;
  const int64_t chunks = k / 8;
  const uint4* rows[R];
  bool valid[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t col = col0 + (kGated ? r % kCols : r);
    valid[r] = col < n;
    const int64_t w_row = kGated && r >= kCols ? n + col : col;
    rows[r] = w + (valid[r] ? w_row : 0) * chunks;
  }
  uint4 first[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = first_chunk + u * kStride;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      first[u][r] =
          valid[r] && c < chunks ? __ldg(rows[r] + c) : make_uint4(0, 0, 0, 0);
    }
  }
  PdlWait();
  PdlLaunchDependents();
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = first_chunk + u * kStride;
    if (c < chunks) Accumulate<T, R>(x, k, c, first[u], acc);
  }
  int64_t c = first_chunk + U * kStride;
  // U chunks of every row per iteration, their loads issued together.
  for (; c + (U - 1) * kStride < chunks; c += U * kStride) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = valid[r] ? __ldg(rows[r] + c + u * kStride)
                            : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      Accumulate<T, R>(x, k, c + u * kStride, wv[u], acc);
  }
  for (; c < chunks; c += kStride) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wv[r] = valid[r] ? __ldg(rows[r] + c) : make_uint4(0, 0, 0, 0);
    }
    Accumulate<T, R>(x, k, c, wv, acc);
  }
  // Every lane gets every sum (WarpSum is a butterfly).
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = WarpSum(acc[r][t]);
  }
  if constexpr (kSplit) {
    // The warps' sums, added in warp order by every lane of warp 0.
    __shared__ float partial[kWarpsPerBlock][R][T];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < T; ++t) partial[warp][r][t] = acc[r][t];
      }
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float sum = partial[0][r][t];
#pragma unroll
        for (int v = 1; v < kWarpsPerBlock; ++v) sum += partial[v][r][t];
        acc[r][t] = sum;
      }
    }
  }
  // Lane j * T + t writes output column j, row t.
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    const int64_t col = col0 + j;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float s = acc[j][t];
      if (bias != nullptr && valid[j]) s = s + bias[col];
      if constexpr (kGated) {
        float u = acc[kCols + j][t];
        if (bias != nullptr && valid[j]) u = u + bias[n + col];
        if constexpr (kAct == kGatedSilu) {
          // GatedSiluKernel's expression, so fused and unfused agree
          // bitwise.
          s = s / (1.0f + __expf(-s)) * u;
        } else {
          // GatedGeluTanhKernel's (fused_kernels.cu), likewise.
          s = __fmul_rn(GeluTanh(s), u);
        }
      }
      if (lane == j * T + t && valid[j]) out[t * n + col] = s;
    }
  }
}

// Whether a product of n output columns (kCols per warp) takes the split
// layout: when its own-columns layout would give fewer than kSplitBelowWarps
// warps (about 8 per SM of an H200), too few loads in flight.
constexpr int64_t kSplitBelowWarps = 1024;
bool UseSplit(int64_t n, int cols_per_warp) {
  return (n + cols_per_warp - 1) / cols_per_warp < kSplitBelowWarps;
}

template <int T, int kAct>
cudaError_t Launch(int64_t n, int64_t k, const float* x, const uint4* w,
                   const float* bias, float* out, cudaStream_t stream) {
  constexpr int kCols = kAct != kPlain ? Tile<T>::kRows / 2 : Tile<T>::kRows;
  if (UseSplit(n, kCols)) {
    const dim3 grid(static_cast<unsigned>((n + kCols - 1) / kCols));
    return LaunchPdl(SkinnyGemmKernel<T, kAct, true>, grid, dim3(kThreads), 0,
                     stream, x, w, bias, out, n, k);
  }
  constexpr int64_t kColumnsPerBlock = kWarpsPerBlock * kCols;
  const dim3 grid(
      static_cast<unsigned>((n + kColumnsPerBlock - 1) / kColumnsPerBlock));
  return LaunchPdl(SkinnyGemmKernel<T, kAct, false>, grid, dim3(kThreads), 0,
                   stream, x, w, bias, out, n, k);
}

template <int kAct>
cudaError_t LaunchRows(int64_t t, int64_t n, int64_t k, const float* x,
                       const uint4* w, const float* bias, float* out,
                       cudaStream_t stream) {
  switch (t) {
    case 1:
      return Launch<1, kAct>(n, k, x, w, bias, out, stream);
    case 2:
      return Launch<2, kAct>(n, k, x, w, bias, out, stream);
    case 3:
      return Launch<3, kAct>(n, k, x, w, bias, out, stream);
    default:
      return Launch<4, kAct>(n, k, x, w, bias, out, stream);
  }
}

template <int kAct>
cudaError_t LaunchGated(int64_t t, int64_t n, int64_t k, const float* x,
                        const void* gate_up, const float* bias, float* out,
                        cudaStream_t stream) {
  if (n > INT64_MAX / 2 || !SkinnyGemmApplies(t, 2 * n, k, x, gate_up) ||
      out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t error = LaunchRows<kAct>(
      t, n, k, x, static_cast<const uint4*>(gate_up), bias, out, stream);
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
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
  const cudaError_t error = LaunchRows<kPlain>(
      t, n, k, x, static_cast<const uint4*>(w), bias, out, stream);
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

cudaError_t LaunchSkinnyGatedSilu(int64_t t, int64_t n, int64_t k,
                                  const float* x, const void* gate_up,
                                  const float* bias, float* out,
                                  cudaStream_t stream) {
  return LaunchGated<kGatedSilu>(t, n, k, x, gate_up, bias, out, stream);
}

cudaError_t LaunchSkinnyGatedGeluTanh(int64_t t, int64_t n, int64_t k,
                                      const float* x, const void* gate_up,
                                      const float* bias, float* out,
                                      cudaStream_t stream) {
  return LaunchGated<kGatedGeluTanh>(t, n, k, x, gate_up, bias, out, stream);
}

}  // namespace cuda
}  // namespace tessera
