#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/gemm/fp8_gemm.h"

namespace tessera {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------
// The skinny product.

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kChunk = 16;  // Weights (bytes) per 16-byte load.

// What the kernel makes of its product (the template parameter kAct).
constexpr int kPlain = 0;
constexpr int kGatedSilu = 1;
constexpr int kGatedGeluTanh = 2;

// Rows of w each warp computes and chunks of each row a lane has in flight:
// 8 loads (128 bytes) per lane. Measured on an H200 (decode shapes of
// Llama-3-8B): at 1-2 rows 4 rows of 2 chunks beat 2 of 4 by ~25%; from 3
// rows on, 8 rows of 1 chunk beat 4 of 2 (a warp reads 4 T bytes of x from
// L1 per R bytes of weights, so more rows keep the x traffic down).
template <int T>
struct Tile {
  static constexpr int kRows = T <= 2 ? 4 : 8;
  static constexpr int kUnroll = T <= 2 ? 2 : 1;
};

// A 16-byte load of weights, which no kernel writes: the non-coherent path,
// and not kept in L1, which holds the x rows every warp re-reads.
__device__ __forceinline__ uint4 LoadWeights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Four e4m3 values (one 32-bit word, lowest byte first) -> f32, exactly: the
// hardware widens pairs to f16 (every e4m3 value, NaN included, is an f16
// value), then to f32.
__device__ __forceinline__ void Widen4(uint32_t word, float (&f)[4]) {
  const __half2 lo(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3));
  const __half2 hi(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int q) {
  return q == 0 ? v.x : (q == 1 ? v.y : (q == 2 ? v.z : v.w));
}

// a += x · w over four consecutive k, in k order.
__device__ __forceinline__ void Fma4(const float4& x, const float (&w)[4],
                                     float& a) {
  a = fmaf(x.x, w[0], a);
  a = fmaf(x.y, w[1], a);
  a = fmaf(x.z, w[2], a);
  a = fmaf(x.w, w[3], a);
}

// acc[r][t] += x[t, chunk c] · w[row r, chunk c] for one chunk (16 k), in k
// order. With block scales (s[r], the chunk's block's scale of row r) the
// chunk's 16-term sum is formed first and added times s[r] — except where
// those partial sums would not fit in registers beside everything else
// (more than 8 rows x columns, kScaleWeights): there each widened weight is
// multiplied by s[r] instead (one more rounding per product, 2^-24 relative).
//
// x is read with plain (coherent) loads, never the non-coherent path: under
// programmatic dependent launch the kernel before this one may still be
// writing x while this kernel runs its prologue (skinny_gemm.cu says more).
template <int T, int R, bool kBlock>
__device__ __forceinline__ void Accumulate(const float* x, int64_t k, int64_t c,
                                           const uint4 (&wv)[R],
                                           const float (&s)[R],
                                           float (&acc)[R][T]) {
  constexpr bool kScaleWeights = kBlock && R * T > 8;
  constexpr bool kPartial = kBlock && !kScaleWeights;
  float part[kPartial ? R : 1][kPartial ? T : 1];
  if constexpr (kPartial) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < T; ++t) part[r][t] = 0.0f;
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float4 xv[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      xv[t] = reinterpret_cast<const float4*>(x + t * k)[4 * c + q];
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[4];
      Widen4(Word(wv[r], q), wf);
      if constexpr (kScaleWeights) {
#pragma unroll
        for (int e = 0; e < 4; ++e) wf[e] = __fmul_rn(wf[e], s[r]);
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        if constexpr (kPartial) {
          Fma4(xv[t], wf, part[r][t]);
        } else {
          Fma4(xv[t], wf, acc[r][t]);
        }
      }
    }
  }
  if constexpr (kPartial) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = fmaf(s[r], part[r][t], acc[r][t]);
    }
  }
}

// The kernel's view of the weight's scale.
struct ScaleArg {
  const float* scale;
  uint32_t block;             // 0: per-channel.
  uint32_t chunks_per_block;  // block / 16.
  int64_t cols;               // ceil(k / block): a block-scale row's length.
};

// The layout is skinny_gemm.cu's with 16-weight chunks: warp g of the grid
// computes output columns [g * R, g * R + R) for all T rows (kSplit: a
// block's four warps share them and split k; gated: R / 2 columns from their
// gate and up rows). Lane l takes chunks l, l + 32, ... (split: 32 w + l,
// 32 w + l + 128, ...), so a warp reads 512 contiguous bytes of a row at a
// time, and the first U chunks of every row are loaded before PdlWait (the
// weights and their scales never depend on the kernel ahead).
template <int T, int kAct, bool kSplit, bool kBlock>
__global__ void __launch_bounds__(kThreads)
    Fp8SkinnyKernel(const float* x, const uint4* __restrict__ w, ScaleArg sa,
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
  const int64_t chunks = k / kChunk;
  const uint4* rows[R];
  const float* srow[R];  // kBlock: the row's block-scale row.
  int64_t w_row[R];
  bool valid[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t col = col0 + (kGated ? r % kCols : r);
    valid[r] = col < n;
    w_row[r] = valid[r] ? (kGated && r >= kCols ? n + col : col) : 0;
    rows[r] = w + w_row[r] * chunks;
    srow[r] = sa.scale + (kBlock ? (w_row[r] / sa.block) * sa.cols : 0);
  }
  // The block scale of chunk c of every row (zero for a row past n, whose
  // weights are zeros too).
  auto load_scales = [&](int64_t c, float(&s)[R]) {
    if constexpr (kBlock) {
      const uint32_t b = static_cast<uint32_t>(c) / sa.chunks_per_block;
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] = valid[r] ? __ldg(srow[r] + b) : 0.0f;
    }
  };
  uint4 first[U][R];
  float first_s[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = first_chunk + u * kStride;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      first[u][r] = valid[r] && c < chunks ? LoadWeights(rows[r] + c)
                                           : make_uint4(0, 0, 0, 0);
      first_s[u][r] = 0.0f;
    }
    if (c < chunks) load_scales(c, first_s[u]);
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
    if (c < chunks) {
      Accumulate<T, R, kBlock>(x, k, c, first[u], first_s[u], acc);
    }
  }
  int64_t c = first_chunk + U * kStride;
  // U chunks of every row per iteration, their loads issued together.
  for (; c + (U - 1) * kStride < chunks; c += U * kStride) {
    uint4 wv[U][R];
    float sv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = valid[r] ? LoadWeights(rows[r] + c + u * kStride)
                            : make_uint4(0, 0, 0, 0);
        sv[u][r] = 0.0f;
      }
      load_scales(c + u * kStride, sv[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      Accumulate<T, R, kBlock>(x, k, c + u * kStride, wv[u], sv[u], acc);
    }
  }
  for (; c < chunks; c += kStride) {
    uint4 wv[R];
    float sv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wv[r] = valid[r] ? LoadWeights(rows[r] + c) : make_uint4(0, 0, 0, 0);
      sv[r] = 0.0f;
    }
    load_scales(c, sv);
    Accumulate<T, R, kBlock>(x, k, c, wv, sv, acc);
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
  // The per-channel scale once per output, then the bias (separate roundings,
  // the same in every form of the kernel, so fused and unfused agree).
  float channel[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    channel[r] = !kBlock && valid[r] ? __ldg(sa.scale + w_row[r]) : 1.0f;
  }
  // Lane (j * T + t) % 32 writes output column j, row t (every lane holds
  // every sum; kCols * T is up to 64).
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    const int64_t col = col0 + j;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float s = acc[j][t];
      if constexpr (!kBlock) s = __fmul_rn(s, channel[j]);
      if (bias != nullptr && valid[j]) s = __fadd_rn(s, bias[col]);
      if constexpr (kGated) {
        float u = acc[kCols + j][t];
        if constexpr (!kBlock) u = __fmul_rn(u, channel[kCols + j]);
        if (bias != nullptr && valid[j]) u = __fadd_rn(u, bias[n + col]);
        if constexpr (kAct == kGatedSilu) {
          // GatedSiluKernel's expression (fused_kernels.cu), so fused and
          // unfused agree bitwise.
          s = s / (1.0f + __expf(-s)) * u;
        } else {
          // GatedGeluTanhKernel's, likewise.
          s = __fmul_rn(GeluTanh(s), u);
        }
      }
      if (lane == (j * T + t) % 32 && valid[j]) out[t * n + col] = s;
    }
  }
}

// Whether a product of n output columns (cols_per_warp a warp) splits k: when
// its own-columns layout would give fewer than 1024 warps (about 8 per SM of
// an H200), too few loads in flight, or fewer than 4096 with rows of 8192 or
// more weights (a warp's work then runs long: measured on an H200, Llama's
// down projection, 4096 x 14336, went from 2.3 to 3.2 TB/s at 1 row, while
// 4096-long rows lost ~5%). It depends on n and k alone, so a shape's results
// are bitwise repeatable, and the gated form (n / 2 outputs of 2 rows each)
// makes the same choice as the plain product of its 2n rows.
bool UseSplit(int64_t n, int cols_per_warp, int64_t k) {
  const int64_t warps = (n + cols_per_warp - 1) / cols_per_warp;
  return warps < 1024 || (warps < 4096 && k >= 8192);
}

template <int T, int kAct, bool kBlock>
cudaError_t Launch(int64_t n, int64_t k, const float* x, const uint4* w,
                   const ScaleArg& sa, const float* bias, float* out,
                   cudaStream_t stream) {
  constexpr int kCols = kAct != kPlain ? Tile<T>::kRows / 2 : Tile<T>::kRows;
  if (UseSplit(n, kCols, k)) {
    const dim3 grid(static_cast<unsigned>((n + kCols - 1) / kCols));
    return LaunchPdl(Fp8SkinnyKernel<T, kAct, true, kBlock>, grid,
                     dim3(kThreads), 0, stream, x, w, sa, bias, out, n, k);
  }
  constexpr int64_t kColumnsPerBlock = kWarpsPerBlock * kCols;
  const dim3 grid(
      static_cast<unsigned>((n + kColumnsPerBlock - 1) / kColumnsPerBlock));
  return LaunchPdl(Fp8SkinnyKernel<T, kAct, false, kBlock>, grid,
                   dim3(kThreads), 0, stream, x, w, sa, bias, out, n, k);
}

template <int kAct, bool kBlock>
cudaError_t LaunchRows(int64_t t, int64_t n, int64_t k, const float* x,
                       const uint4* w, const ScaleArg& sa, const float* bias,
                       float* out, cudaStream_t stream) {
  switch (t) {
    case 1:
      return Launch<1, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    case 2:
      return Launch<2, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    case 3:
      return Launch<3, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    case 4:
      return Launch<4, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    case 5:
      return Launch<5, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    case 6:
      return Launch<6, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    case 7:
      return Launch<7, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
    default:
      return Launch<8, kAct, kBlock>(n, k, x, w, sa, bias, out, stream);
  }
}

// rows: the weight's rows (n, or 2n for the gated forms).
template <int kAct>
cudaError_t LaunchChecked(int64_t t, int64_t n, int64_t rows, int64_t k,
                          const float* x, const void* w, const float* scale,
                          int64_t block, const float* bias, float* out,
                          cudaStream_t stream) {
  if (!Fp8SkinnyGemmApplies(t, rows, k, block, x, w, scale) || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  ScaleArg sa;
  sa.scale = scale;
  sa.block = static_cast<uint32_t>(block);
  sa.chunks_per_block = static_cast<uint32_t>(block / kChunk);
  sa.cols = block > 0 ? (k + block - 1) / block : 0;
  const uint4* w4 = static_cast<const uint4*>(w);
  const cudaError_t error =
      block > 0
          ? LaunchRows<kAct, true>(t, n, k, x, w4, sa, bias, out, stream)
          : LaunchRows<kAct, false>(t, n, k, x, w4, sa, bias, out, stream);
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// ---------------------------------------------------------------------------
// Quantization.

// F32ToFp8E4M3 (runtime/core/dtype.cc) on the device, operation for
// operation: round to nearest even at the value's e4m3 spacing, ±448 beyond,
// NaN 0x7f. Written out rather than the hardware's cvt so that the bits are
// the host function's by construction (the subnormals, the sign of zero, NaN)
// and a test can compare them exactly.
__device__ __forceinline__ uint8_t F32ToE4M3(float v) {
  if (isnan(v)) return 0x7f;
  const uint32_t sign = signbit(v) ? 0x80u : 0x00u;
  const float a = fabsf(v);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);
  if (a < 0x1p-6f) {
    // The subnormals' spacing 2^-9; q in [0, 8] (8: the smallest normal,
    // whose code is 8 too). The product by 2^9 is exact.
    const uint32_t q = static_cast<uint32_t>(rintf(a * 512.0f));
    return static_cast<uint8_t>(sign | q);
  }
  // a in [2^e, 2^(e+1)), -6 <= e <= 8: 8 steps of 2^(e-3). q in [8, 16]; 16
  // (rounded up into the next binade) gives the next binade's first code by
  // the same formula.
  const int e = static_cast<int>((__float_as_uint(a) >> 23) & 0xffu) - 127;
  const float step = __uint_as_float(static_cast<uint32_t>(127 + 3 - e) << 23);
  const int q = static_cast<int>(rintf(a * step));  // Exact product.
  int code = ((e + 7) << 3) + q - 8;
  if (code > 0x7e) code = 0x7e;
  return static_cast<uint8_t>(sign | static_cast<uint32_t>(code));
}

// The dynamic scale of a group whose max |x| is m.
__device__ __forceinline__ float ScaleFor(float m) {
  const float s = __fdiv_rn(m, 448.0f);
  return s > 0.0f && s <= FLT_MAX ? s : 1.0f;
}

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

constexpr int kRowThreads = 256;

// One block per row: the row's scale (its max |x|, or the static scale),
// then its values. `groups` > 0: the scale goes to scales[g * rows + r] for
// every group g (kPerGroup's layout); 0: to scales[r].
template <typename In>
__global__ void __launch_bounds__(kRowThreads)
    QuantizeRowsKernel(const In* x, int64_t rows, int64_t k,
                       const float* static_scale, int64_t groups,
                       uint8_t* __restrict__ q, float* __restrict__ scales) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  __shared__ float shared[kWarpSize + 1];
  const int64_t r = blockIdx.x;
  const In* row = x + r * k;
  float s;
  if (static_scale != nullptr) {
    s = *static_scale;
  } else {
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      m = fmaxf(m, fabsf(Load(row + i)));
    }
    s = ScaleFor(BlockReduce(m, shared, MaxOp(), 0.0f));
  }
  if (groups == 0) {
    if (threadIdx.x == 0) scales[r] = s;
  } else {
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      scales[g * rows + r] = s;
    }
  }
  uint8_t* out = q + r * k;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    out[i] = F32ToE4M3(__fdiv_rn(Load(row + i), s));
  }
}

constexpr int kGroupWarps = 8;  // Groups per block of QuantizeGroupsKernel.

// One warp per 1x128 group (blockIdx.x the row, blockIdx.y * kGroupWarps +
// warp the group): lane l holds elements l, l + 32, l + 64, l + 96.
__global__ void __launch_bounds__(kGroupWarps * 32)
    QuantizeGroupsKernel(const float* x, int64_t rows, int64_t k,
                         int64_t groups, uint8_t* __restrict__ q,
                         float* __restrict__ scales) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int lane = threadIdx.x % 32;
  const int64_t g =
      static_cast<int64_t>(blockIdx.y) * kGroupWarps + threadIdx.x / 32;
  if (g >= groups) return;
  const int64_t r = blockIdx.x;
  const float* row = x + r * k;
  const int64_t base = g * kFp8ActivationGroup + lane;
  float v[4];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = base + 32 * j;
    v[j] = i < k ? row[i] : 0.0f;
    m = fmaxf(m, fabsf(v[j]));
  }
  const float s = ScaleFor(WarpMax(m));
  if (lane == 0) scales[g * rows + r] = s;
  uint8_t* out = q + r * k;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = base + 32 * j;
    if (i < k) out[i] = F32ToE4M3(__fdiv_rn(v[j], s));
  }
}

__global__ void WidenBf16RowsKernel(const __nv_bfloat16* __restrict__ src,
                                    int64_t src_ld, int64_t rows, int64_t cols,
                                    float* __restrict__ dst, int64_t dst_ld) {
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int64_t count = rows * cols;
  for (int64_t i = GridStrideBegin(); i < count; i += GridStrideStep()) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_ld + c] = __bfloat162float(src[r * src_ld + c]);
  }
}

}  // namespace

bool Fp8SkinnyGemmApplies(int64_t t, int64_t n, int64_t k, int64_t block,
                          const void* x, const void* w, const float* scale) {
  return t >= 1 && t <= kMaxFp8SkinnyRows && n >= 1 && k >= kChunk &&
         k % kChunk == 0 && block >= 0 && block % kChunk == 0 &&
         block <= INT32_MAX && x != nullptr && w != nullptr &&
         scale != nullptr && Aligned16(x) && Aligned16(w) && n / 8 <= INT32_MAX;
}

cudaError_t LaunchFp8SkinnyGemm(int64_t t, int64_t n, int64_t k, const float* x,
                                const void* w, const float* scale,
                                int64_t block, const float* bias, float* out,
                                cudaStream_t stream) {
  return LaunchChecked<kPlain>(t, n, n, k, x, w, scale, block, bias, out,
                               stream);
}

cudaError_t LaunchFp8SkinnyGatedSilu(int64_t t, int64_t n, int64_t k,
                                     const float* x, const void* gate_up,
                                     const float* scale, int64_t block,
                                     const float* bias, float* out,
                                     cudaStream_t stream) {
  if (n < 1 || n > INT64_MAX / 2) return cudaErrorInvalidValue;
  return LaunchChecked<kGatedSilu>(t, n, 2 * n, k, x, gate_up, scale, block,
                                   bias, out, stream);
}

cudaError_t LaunchFp8SkinnyGatedGeluTanh(int64_t t, int64_t n, int64_t k,
                                         const float* x, const void* gate_up,
                                         const float* scale, int64_t block,
                                         const float* bias, float* out,
                                         cudaStream_t stream) {
  if (n < 1 || n > INT64_MAX / 2) return cudaErrorInvalidValue;
  return LaunchChecked<kGatedGeluTanh>(t, n, 2 * n, k, x, gate_up, scale, block,
                                       bias, out, stream);
}

cudaError_t LaunchQuantizeFp8Activations(Fp8Quantization quantization,
                                         Fp8ScaleLayout layout, int64_t t,
                                         int64_t k, const float* x,
                                         const float* static_scale, void* q,
                                         float* scales, cudaStream_t stream) {
  const bool is_static = quantization == Fp8Quantization::kStatic;
  const bool per_group = layout == Fp8ScaleLayout::kPerGroup;
  if (t < 1 || t > INT32_MAX || k < 1 || x == nullptr || q == nullptr ||
      scales == nullptr || is_static != (static_scale != nullptr) ||
      (quantization == Fp8Quantization::kDynamicPerGroup && !per_group)) {
    return cudaErrorInvalidValue;
  }
  const int64_t groups = (k + kFp8ActivationGroup - 1) / kFp8ActivationGroup;
  uint8_t* q8 = static_cast<uint8_t*>(q);
  cudaError_t error;
  if (quantization == Fp8Quantization::kDynamicPerGroup) {
    const int64_t group_blocks = (groups + kGroupWarps - 1) / kGroupWarps;
    if (group_blocks > kMaxGridDim) return cudaErrorInvalidValue;
    error = LaunchPdl(
        QuantizeGroupsKernel,
        dim3(static_cast<unsigned>(t), static_cast<unsigned>(group_blocks)),
        dim3(kGroupWarps * 32), 0, stream, x, t, k, groups, q8, scales);
  } else {
    error = LaunchPdl(QuantizeRowsKernel<float>, dim3(static_cast<unsigned>(t)),
                      dim3(kRowThreads), 0, stream, x, t, k,
                      is_static ? static_scale : nullptr,
                      per_group ? groups : int64_t{0}, q8, scales);
  }
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

cudaError_t LaunchQuantizeFp8Weights(bool w_bf16, int64_t n, int64_t k,
                                     const void* w, void* q, float* scale,
                                     cudaStream_t stream) {
  if (n < 1 || n > INT32_MAX || k < 1 || w == nullptr || q == nullptr ||
      scale == nullptr) {
    return cudaErrorInvalidValue;
  }
  uint8_t* q8 = static_cast<uint8_t*>(q);
  const dim3 grid(static_cast<unsigned>(n));
  const cudaError_t error =
      w_bf16 ? LaunchPdl(
                   QuantizeRowsKernel<__nv_bfloat16>, grid, dim3(kRowThreads),
                   0, stream, static_cast<const __nv_bfloat16*>(w), n, k,
                   static_cast<const float*>(nullptr), int64_t{0}, q8, scale)
             : LaunchPdl(QuantizeRowsKernel<float>, grid, dim3(kRowThreads), 0,
                         stream, static_cast<const float*>(w), n, k,
                         static_cast<const float*>(nullptr), int64_t{0}, q8,
                         scale);
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

cudaError_t LaunchWidenBf16Rows(int64_t rows, int64_t cols, const void* src,
                                int64_t src_ld, float* dst, int64_t dst_ld,
                                cudaStream_t stream) {
  if (rows < 1 || cols < 1 || src_ld < cols || dst_ld < cols ||
      src == nullptr || dst == nullptr || rows > INT64_MAX / cols) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t error =
      LaunchPdl(WidenBf16RowsKernel, dim3(GridStrideBlocks(rows * cols, 256)),
                dim3(256), 0, stream, static_cast<const __nv_bfloat16*>(src),
                src_ld, rows, cols, dst, dst_ld);
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
