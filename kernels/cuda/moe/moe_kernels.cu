#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/moe/moe_kernels.h"

namespace tessera {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------
// Routing.

// MoeRoute's order (the CPU reference's): larger probability first, NaN
// above every number, ties by the lower id. A strict total order, so a
// butterfly of it ends with the same pick on every lane.
__device__ __forceinline__ bool RanksBefore(float a, int ia, float b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

constexpr int kRouteWarps = 4;

// One warp per token: max, sum of exponentials, then k rounds of a warp
// argmax, round j over the experts that rank after round j - 1's pick.
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteKernel(const float* __restrict__ logits, int64_t tokens,
                   int experts, int k, bool renormalize,
                   int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t t =
      static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / kWarpSize;
  if (t >= tokens) return;  // The whole warp.
  const float* l = logits + t * experts;
  float max = -INFINITY;
  for (int e = lane; e < experts; e += kWarpSize) max = fmaxf(max, l[e]);
  max = WarpMax(max);
  float sum = 0.0f;
  for (int e = lane; e < experts; e += kWarpSize) sum += expf(l[e] - max);
  sum = WarpSum(sum);
  float picked[kMaxMoeRouteK];
  float prev_p = 0.0f;
  int prev = -1;
  for (int j = 0; j < k; ++j) {
    float best_p = 0.0f;
    int best = -1;
    for (int e = lane; e < experts; e += kWarpSize) {
      const float p = expf(l[e] - max) / sum;
      if (prev >= 0 && !RanksBefore(prev_p, prev, p, e)) continue;
      if (best < 0 || RanksBefore(p, e, best_p, best)) {
        best = e;
        best_p = p;
      }
    }
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
      const float other_p = __shfl_xor_sync(kFullMask, best_p, offset);
      const int other = __shfl_xor_sync(kFullMask, best, offset);
      if (other >= 0 &&
          (best < 0 || RanksBefore(other_p, other, best_p, best))) {
        best = other;
        best_p = other_p;
      }
    }
    prev = best;
    prev_p = best_p;
    picked[j] = best_p;
    if (lane == 0) ids[t * k + j] = best;
  }
  if (lane != 0) return;
  float total = 0.0f;
  if (renormalize) {
    for (int j = 0; j < k; ++j) total += picked[j];
  }
  for (int j = 0; j < k; ++j) {
    weights[t * k + j] = renormalize ? picked[j] / total : picked[j];
  }
}

// ---------------------------------------------------------------------------
// The experts.

constexpr int kSortThreads = 1024;

// Inclusive sum over the block (whole warps, <= 32 of them) of v; every
// thread gets its own prefix.
__device__ int BlockInclusiveScan(int v, int* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += other;
  }
  __syncthreads();
  if (lane == kWarpSize - 1) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarpSize;
    int w = lane < warps ? shared[lane] : 0;
    for (int offset = 1; offset < kWarpSize; offset <<= 1) {
      const int other = __shfl_up_sync(kFullMask, w, offset);
      if (lane >= offset) w += other;
    }
    shared[lane] = w;  // Inclusive over warps.
  }
  __syncthreads();
  return v + (warp > 0 ? shared[warp - 1] : 0);
}

// One block: counts[e] = rows routed to local expert e; offsets[e] = its
// first position (offsets[E] = all rows here); tile_offsets[e] = its first
// row tile of `bm` rows (tile_offsets[E] = all tiles); sorted_slot[p] = the
// routed row (t * k + j) at position p.
__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(const int32_t* __restrict__ ids, int64_t rows, int experts,
                  int64_t first_expert, int bm, int32_t* counts,
                  int32_t* cursor, int32_t* offsets, int32_t* tile_offsets,
                  int32_t* sorted_slot) {
  __shared__ int shared_rows[kWarpSize], shared_tiles[kWarpSize];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    counts[e] = 0;
    cursor[e] = 0;
  }
  __syncthreads();
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t e = static_cast<int64_t>(ids[r]) - first_expert;
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  // Each thread scans a contiguous run of experts.
  const int chunk = (experts + blockDim.x - 1) / blockDim.x;
  const int begin = min(experts, static_cast<int>(threadIdx.x) * chunk);
  const int end = min(experts, begin + chunk);
  int my_rows = 0, my_tiles = 0;
  for (int e = begin; e < end; ++e) {
    my_rows += counts[e];
    my_tiles += (counts[e] + bm - 1) / bm;
  }
  const int rows_incl = BlockInclusiveScan(my_rows, shared_rows);
  const int tiles_incl = BlockInclusiveScan(my_tiles, shared_tiles);
  int run_rows = rows_incl - my_rows, run_tiles = tiles_incl - my_tiles;
  for (int e = begin; e < end; ++e) {
    offsets[e] = run_rows;
    tile_offsets[e] = run_tiles;
    run_rows += counts[e];
    run_tiles += (counts[e] + bm - 1) / bm;
  }
  if (threadIdx.x == blockDim.x - 1) {
    offsets[experts] = rows_incl;
    tile_offsets[experts] = tiles_incl;
  }
  __syncthreads();
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t e = static_cast<int64_t>(ids[r]) - first_expert;
    if (e >= 0 && e < experts) {
      sorted_slot[offsets[e] + atomicAdd(&cursor[e], 1)] =
          static_cast<int32_t>(r);
    }
  }
}

constexpr int kGemmWarps = 4;
constexpr int kWeightRows = 4;  // Weight rows a warp streams.

__device__ __forceinline__ void Widen(uint32_t packed, float* lo_hi) {
  // bf16 is the top half of an f32: widening is a shift.
  lo_hi[0] = __uint_as_float(packed << 16);
  lo_hi[1] = __uint_as_float(packed & 0xffff0000u);
}

// 8 consecutive weights (16 bytes of bf16, 32 of f32) as f32.
__device__ __forceinline__ void LoadWeights8(const uint16_t* w, float* out) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(w));
  Widen(v.x, out + 0);
  Widen(v.y, out + 2);
  Widen(v.z, out + 4);
  Widen(v.w, out + 6);
}
__device__ __forceinline__ void LoadWeights8(const float* w, float* out) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w));
  const float4 b = __ldg(reinterpret_cast<const float4*>(w) + 1);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}
__device__ __forceinline__ float LoadWeight(const uint16_t* w) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(w)) << 16);
}
__device__ __forceinline__ float LoadWeight(const float* w) { return __ldg(w); }

// The grouped product. Block (tile, column group): tile is one of the row
// tiles of one expert (found from tile_offsets); its warps take kCols output
// columns each. Row i of the tile is position row0 + i of the sort; its input
// row is its token's (in_by_token: the gate/up product reads x) or its
// position's (the down product reads the activations), its output row its
// position's or its slot's (out_by_slot). kGated: the weights are the
// expert's [2n, K] gate/up stack and the output silu(gate) * up [., n].
template <int BM, bool kGated, bool kVec, typename W>
__global__ void __launch_bounds__(kGemmWarps * 32)
    GroupedGemmKernel(const float* in, const W* __restrict__ weights, int64_t n,
                      int64_t K, const int32_t* __restrict__ sorted_slot,
                      const int32_t* __restrict__ offsets,
                      const int32_t* __restrict__ tile_offsets, int experts,
                      int top_k, bool in_by_token, bool out_by_slot,
                      float* out) {
  constexpr int R = kWeightRows;
  constexpr int kCols = kGated ? R / 2 : R;
  const int64_t tile = blockIdx.x;
  if (tile >= tile_offsets[experts]) return;  // Beyond every expert's tiles.
  // The expert: the last whose first tile is at or before this one (an
  // expert without rows has no tiles, so the last such is the one with it).
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int e = lo;
  const int64_t row0 = offsets[e] + (tile - tile_offsets[e]) * BM;
  const int nrows =
      static_cast<int>(min(static_cast<int64_t>(BM), offsets[e + 1] - row0));
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t col0 =
      (static_cast<int64_t>(blockIdx.y) * kGemmWarps + warp) * kCols;
  if (col0 >= n) return;  // The whole warp; no block-wide sync follows.
  const int64_t weight_rows = kGated ? 2 * n : n;
  const W* expert = weights + static_cast<int64_t>(e) * weight_rows * K;
  const W* wrow[R];
  bool valid[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t col = col0 + (kGated ? r % kCols : r);
    valid[r] = col < n;
    const int64_t row = kGated && r >= kCols ? n + col : col;
    wrow[r] = expert + (valid[r] ? row : 0) * K;
  }
  const float* xrow[BM];
  int64_t orow[BM];
#pragma unroll
  for (int i = 0; i < BM; ++i) {
    // Rows past the tile's end repeat its last row (computed, not written).
    const int64_t p = row0 + min(i, nrows - 1);
    const int64_t slot = sorted_slot[p];
    xrow[i] = in + (in_by_token ? slot / top_k : p) * K;
    orow[i] = out_by_slot ? slot : p;
  }
  float acc[R][BM];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < BM; ++i) acc[r][i] = 0.0f;
  }
  if constexpr (kVec) {
    const int64_t chunks = K / 8;
    for (int64_t c = lane; c < chunks; c += kWarpSize) {
      float xv[BM][8];
#pragma unroll
      for (int i = 0; i < BM; ++i) {
        const float4* xr = reinterpret_cast<const float4*>(xrow[i]) + 2 * c;
        const float4 a = xr[0], b = xr[1];
        xv[i][0] = a.x, xv[i][1] = a.y, xv[i][2] = a.z, xv[i][3] = a.w;
        xv[i][4] = b.x, xv[i][5] = b.y, xv[i][6] = b.z, xv[i][7] = b.w;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wv[8];
        if (valid[r]) {
          LoadWeights8(wrow[r] + 8 * c, wv);
        } else {
#pragma unroll
          for (int q = 0; q < 8; ++q) wv[q] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < BM; ++i) {
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            acc[r][i] = fmaf(xv[i][q], wv[q], acc[r][i]);
          }
        }
      }
    }
  } else {
    for (int64_t kk = lane; kk < K; kk += kWarpSize) {
      float xv[BM];
#pragma unroll
      for (int i = 0; i < BM; ++i) xv[i] = xrow[i][kk];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float wv = valid[r] ? LoadWeight(wrow[r] + kk) : 0.0f;
#pragma unroll
        for (int i = 0; i < BM; ++i) acc[r][i] = fmaf(xv[i], wv, acc[r][i]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < BM; ++i) acc[r][i] = WarpSum(acc[r][i]);
  }
  // Lane j * BM + i writes column col0 + j of row i (kCols * BM <= 32).
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
#pragma unroll
    for (int i = 0; i < BM; ++i) {
      if (lane != j * BM + i || i >= nrows || !valid[j]) continue;
      float v = acc[j][i];
      if constexpr (kGated) {
        const float g = v;
        v = g / (1.0f + expf(-g)) * acc[kCols + j][i];
      }
      out[orow[i] * n + col0 + j] = v;
    }
  }
}

// out[t] = sum over the token's local picks in ascending expert id (ties by
// j) of w * y[slot], each product rounded before its add.
__global__ void MoeCombineKernel(const float* __restrict__ y,
                                 const int32_t* __restrict__ ids,
                                 const float* __restrict__ weights,
                                 int64_t hidden, int k, int experts,
                                 int64_t first_expert,
                                 float* __restrict__ out) {
  __shared__ int order[kMaxMoeRouteK];
  __shared__ int count;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < k; ++j) {
      const int64_t e = static_cast<int64_t>(ids[t * k + j]) - first_expert;
      if (e < 0 || e >= experts) continue;
      // Insertion by id, after equal ids (stable).
      int at = n;
      while (at > 0 && ids[t * k + order[at - 1]] > ids[t * k + j]) {
        order[at] = order[at - 1];
        --at;
      }
      order[at] = j;
      ++n;
    }
    count = n;
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < count; ++i) {
      const int64_t slot = t * k + order[i];
      acc = __fadd_rn(acc, __fmul_rn(weights[slot], y[slot * hidden + h]));
    }
    out[t * hidden + h] = acc;
  }
}

__global__ void SigmoidGatedAddKernel(const float* __restrict__ gate,
                                      const float* __restrict__ x,
                                      int64_t tokens, int64_t n,
                                      float* __restrict__ out) {
  const int64_t total = tokens * n;
  for (int64_t i = GridStrideBegin(); i < total; i += GridStrideStep()) {
    const float s = 1.0f / (1.0f + expf(-gate[i / n]));
    out[i] = __fadd_rn(out[i], __fmul_rn(s, x[i]));
  }
}

// The scratch's pieces (MoeExpertsScratchBytes).
int64_t Align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

struct Layout {
  int64_t counts, cursor, offsets, tile_offsets, sorted_slot;  // int32 index.
  int64_t act_byte, y_byte, total;
};

Layout LayoutOf(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden,
                int64_t intermediate) {
  const int64_t rows = tokens * top_k;
  Layout l;
  l.counts = 0;
  l.cursor = experts;
  l.offsets = 2 * experts;
  l.tile_offsets = 3 * experts + 1;
  l.sorted_slot = 4 * experts + 2;
  l.act_byte = Align16(4 * (4 * experts + 2 + rows));
  l.y_byte = l.act_byte + Align16(4 * rows * intermediate);
  l.total = l.y_byte + 4 * rows * hidden;
  return l;
}

// The tile height for `rows` routed rows over `experts` experts: about the
// rows an expert gets, at most 8.
int TileRows(int64_t rows, int64_t experts) {
  const int64_t busy = experts < rows ? experts : rows;
  const int64_t per = busy > 0 ? (rows + busy - 1) / busy : 1;
  return per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 8;
}

template <int BM, bool kGated, bool kVec, typename W>
cudaError_t LaunchGemm(int64_t tiles, const float* in, const void* weights,
                       int64_t n, int64_t K, const int32_t* sorted_slot,
                       const int32_t* offsets, const int32_t* tile_offsets,
                       int experts, int top_k, bool in_by_token,
                       bool out_by_slot, float* out, cudaStream_t stream) {
  constexpr int kCols = kGated ? kWeightRows / 2 : kWeightRows;
  const int64_t groups = (n + kGemmWarps * kCols - 1) / (kGemmWarps * kCols);
  if (groups > kMaxGridDim || tiles > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(groups));
  GroupedGemmKernel<BM, kGated, kVec, W><<<grid, kGemmWarps * 32, 0, stream>>>(
      in, static_cast<const W*>(weights), n, K, sorted_slot, offsets,
      tile_offsets, experts, top_k, in_by_token, out_by_slot, out);
  return cudaGetLastError();
}

template <bool kGated, typename W>
cudaError_t DispatchGemm(int bm, bool vec, int64_t tiles, const float* in,
                         const void* weights, int64_t n, int64_t K,
                         const int32_t* sorted_slot, const int32_t* offsets,
                         const int32_t* tile_offsets, int experts, int top_k,
                         bool in_by_token, bool out_by_slot, float* out,
                         cudaStream_t stream) {
#define TESSERA_MOE_GEMM(BM, VEC)                                              \
  return LaunchGemm<BM, kGated, VEC, W>(tiles, in, weights, n, K, sorted_slot, \
                                        offsets, tile_offsets, experts, top_k, \
                                        in_by_token, out_by_slot, out, stream)
  if (vec) {
    switch (bm) {
      case 1:
        TESSERA_MOE_GEMM(1, true);
      case 2:
        TESSERA_MOE_GEMM(2, true);
      case 4:
        TESSERA_MOE_GEMM(4, true);
      default:
        TESSERA_MOE_GEMM(8, true);
    }
  }
  switch (bm) {
    case 1:
      TESSERA_MOE_GEMM(1, false);
    case 2:
      TESSERA_MOE_GEMM(2, false);
    case 4:
      TESSERA_MOE_GEMM(4, false);
    default:
      TESSERA_MOE_GEMM(8, false);
  }
#undef TESSERA_MOE_GEMM
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

template <typename W>
cudaError_t LaunchExperts(const MoeExpertsLaunch& a, cudaStream_t stream) {
  const int64_t rows = a.tokens * a.top_k;
  const Layout l =
      LayoutOf(a.tokens, a.top_k, a.experts, a.hidden, a.intermediate);
  int32_t* ints = static_cast<int32_t*>(a.scratch);
  char* bytes = static_cast<char*>(a.scratch);
  float* act = reinterpret_cast<float*>(bytes + l.act_byte);
  float* y = reinterpret_cast<float*>(bytes + l.y_byte);
  const int bm = TileRows(rows, a.experts);
  // Every tile of every expert: rows / bm full ones, one partial per expert
  // with rows (at most min(experts, rows) of them).
  const int64_t tiles =
      (rows + bm - 1) / bm + (a.experts < rows ? a.experts : rows);
  const int experts = static_cast<int>(a.experts);
  const int top_k = static_cast<int>(a.top_k);
  // As many threads as the larger of rows and experts (whole warps, at most
  // kSortThreads): a decode step's sort is one small block.
  const int64_t work = rows > a.experts ? rows : a.experts;
  const int sort_threads = static_cast<int>(
      work >= kSortThreads ? kSortThreads : (work + 31) / 32 * 32);
  MoeSortKernel<<<1, sort_threads, 0, stream>>>(
      a.topk_ids, rows, experts, a.first_expert, bm, ints + l.counts,
      ints + l.cursor, ints + l.offsets, ints + l.tile_offsets,
      ints + l.sorted_slot);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const int32_t* slots = ints + l.sorted_slot;
  const int32_t* offsets = ints + l.offsets;
  const int32_t* tile_offsets = ints + l.tile_offsets;
  // Vector loads need 8-element rows on 16-byte boundaries (the weights'
  // rows then are too: every row is a multiple of 16 bytes from the base).
  const bool vec_up =
      a.hidden % 8 == 0 && Aligned16(a.x) && Aligned16(a.gate_up);
  error = DispatchGemm<true, W>(
      bm, vec_up, tiles, a.x, a.gate_up, a.intermediate, a.hidden, slots,
      offsets, tile_offsets, experts, top_k,
      /*in_by_token=*/true, /*out_by_slot=*/false, act, stream);
  if (error != cudaSuccess) return error;
  const bool vec_down = a.intermediate % 8 == 0 && Aligned16(a.down);
  error = DispatchGemm<false, W>(bm, vec_down, tiles, act, a.down, a.hidden,
                                 a.intermediate, slots, offsets, tile_offsets,
                                 experts, top_k, /*in_by_token=*/false,
                                 /*out_by_slot=*/true, y, stream);
  if (error != cudaSuccess) return error;
  MoeCombineKernel<<<static_cast<unsigned>(a.tokens), 256, 0, stream>>>(
      y, a.topk_ids, a.topk_weights, a.hidden, top_k, experts, a.first_expert,
      a.out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMoeRoute(const float* logits, int64_t tokens, int64_t experts,
                           int64_t k, bool renormalize, int32_t* ids,
                           float* weights, cudaStream_t stream) {
  if (tokens < 0 || experts < 1 || experts > INT32_MAX || k < 1 ||
      k > experts || k > kMaxMoeRouteK || logits == nullptr || ids == nullptr ||
      weights == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const int64_t blocks = (tokens + kRouteWarps - 1) / kRouteWarps;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  MoeRouteKernel<<<static_cast<unsigned>(blocks), kRouteWarps * 32, 0,
                   stream>>>(logits, tokens, static_cast<int>(experts),
                             static_cast<int>(k), renormalize, ids, weights);
  return cudaGetLastError();
}

int64_t MoeExpertsScratchBytes(int64_t tokens, int64_t top_k, int64_t experts,
                               int64_t hidden, int64_t intermediate) {
  return LayoutOf(tokens, top_k, experts, hidden, intermediate).total;
}

cudaError_t LaunchMoeExperts(const MoeExpertsLaunch& a, cudaStream_t stream) {
  if (a.tokens < 0 || a.top_k < 1 || a.top_k > kMaxMoeRouteK || a.experts < 1 ||
      a.experts > (int64_t{1} << 24) || a.hidden < 1 || a.intermediate < 1 ||
      a.first_expert < 0 || a.tokens * a.top_k > INT32_MAX ||
      a.tokens > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (a.tokens == 0) return cudaSuccess;
  if (a.x == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr ||
      a.gate_up == nullptr || a.down == nullptr || a.out == nullptr ||
      a.scratch == nullptr || !Aligned16(a.scratch)) {
    return cudaErrorInvalidValue;
  }
  return a.weight_type == MoeWeightType::kBF16
             ? LaunchExperts<uint16_t>(a, stream)
             : LaunchExperts<float>(a, stream);
}

cudaError_t LaunchSigmoidGatedAdd(const float* gate, const float* x,
                                  int64_t tokens, int64_t n, float* out,
                                  cudaStream_t stream) {
  if (tokens < 0 || n < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  SigmoidGatedAddKernel<<<GridStrideBlocks(tokens * n, kThreads), kThreads, 0,
                          stream>>>(gate, x, tokens, n, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
