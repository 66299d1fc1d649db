#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/convert.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"

namespace tessera {
namespace cuda {
namespace {

// Every kernel here runs blocks of four warps.
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;

// ---------------------------------------------------------------------------
// Helpers.

// Reduction over the kThreads threads of a block in a fixed order: a
// butterfly in each warp (common/reduce.cuh), then the kWarps results one
// after another (not common's BlockReduce tree over the warps: this order is
// the one the kernels' results have always had). Every thread gets the
// result. `scratch` holds kWarps floats; all threads must call.
template <bool kMax>
__device__ float BlockReduceInOrder(float v, float* scratch) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  v = kMax ? WarpMax(v) : WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w)
    r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();  // scratch may be reused right away.
  return r;
}

// Whether a cache element type carries scales: int8 per (slot, head), fp8
// per head (kernels/ops.h KvCacheLayer).
template <typename T>
constexpr bool IsQuantized() {
  return false;
}
template <>
constexpr bool IsQuantized<int8_t>() {
  return true;
}
template <>
constexpr bool IsQuantized<__nv_fp8_e4m3>() {
  return true;
}

// Where the scale of cache row `cache_row` (slot * kv_heads + kv head `kvh`)
// lives: int8 per row, fp8 per head.
template <typename T>
__device__ __forceinline__ int64_t ScaleIndex(int64_t cache_row, int32_t kvh) {
  return std::is_same<T, __nv_fp8_e4m3>::value ? kvh : cache_row;
}

// The slot of position `pos` of the sequence whose block table is `table`.
template <bool kStatic>
__device__ __forceinline__ int64_t SlotOf(const int32_t* table,
                                          int32_t block_size, int64_t pos) {
  if (kStatic) return static_cast<int64_t>(table[0]) * block_size + pos;
  return static_cast<int64_t>(table[pos / block_size]) * block_size +
         pos % block_size;
}

// The first key position a query at `pos` sees.
__device__ __forceinline__ int64_t FirstVisible(int64_t pos, int64_t window) {
  return window > 0 ? max(int64_t{0}, pos - window + 1) : int64_t{0};
}

// ---------------------------------------------------------------------------
// StoreKvCache: one block per (token, kv head), k row then v row.

template <typename T>
__device__ void StoreRow(const float* __restrict__ x, int32_t n,
                         T* __restrict__ dst, float* scale_dst, float* scratch);

template <>
__device__ void StoreRow<float>(const float* __restrict__ x, int32_t n,
                                float* __restrict__ dst, float*, float*) {
  for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = x[i];
}

template <>
__device__ void StoreRow<__nv_bfloat16>(const float* __restrict__ x, int32_t n,
                                        __nv_bfloat16* __restrict__ dst, float*,
                                        float*) {
  for (int i = threadIdx.x; i < n; i += kThreads)
    dst[i] = FromFloat<__nv_bfloat16>(x[i]);
}

// Symmetric int8, exactly the CPU's QuantizeRow: scale = max|x| / 127 (0 for
// an all-zero row), q = clamp(rint(x / scale), ±127) with IEEE division.
template <>
__device__ void StoreRow<int8_t>(const float* __restrict__ x, int32_t n,
                                 int8_t* __restrict__ dst, float* scale_dst,
                                 float* scratch) {
  float amax = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads)
    amax = fmaxf(amax, fabsf(x[i]));
  amax = BlockReduceInOrder</*kMax=*/true>(amax, scratch);
  if (!(amax > 0.0f)) {
    for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = 0;
    if (threadIdx.x == 0) *scale_dst = 0.0f;
    return;
  }
  const float s = amax / 127.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float r = rintf(__fdiv_rn(x[i], s));
    dst[i] = static_cast<int8_t>(fminf(127.0f, fmaxf(-127.0f, r)));
  }
  if (threadIdx.x == 0) *scale_dst = s;
}

// fp8 under the layer's scale of this head (read, never written):
// e4m3(x / scale), exactly the CPU's F32ToFp8E4M3 of the quotient.
template <>
__device__ void StoreRow<__nv_fp8_e4m3>(const float* __restrict__ x, int32_t n,
                                        __nv_fp8_e4m3* __restrict__ dst,
                                        float* scale, float*) {
  const float s = *scale;
  for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = ToFp8E4M3(x[i], s);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    StoreKvKernel(const float* __restrict__ k, const float* __restrict__ v,
                  const int64_t* __restrict__ slot_mapping, T* k_cache,
                  T* v_cache, float* k_scale, float* v_scale, int64_t num_slots,
                  int32_t num_kv_heads, int32_t head_dim, int32_t head_dim_v) {
  __shared__ float scratch[kWarps];
  const int64_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const int64_t src_row = t * num_kv_heads + h;
  const int64_t dst_row = slot * num_kv_heads + h;
  const int64_t scale_index = ScaleIndex<T>(dst_row, h);
  StoreRow<T>(k + src_row * head_dim, head_dim, k_cache + dst_row * head_dim,
              k_scale == nullptr ? nullptr : k_scale + scale_index, scratch);
  StoreRow<T>(v + src_row * head_dim_v, head_dim_v,
              v_cache + dst_row * head_dim_v,
              v_scale == nullptr ? nullptr : v_scale + scale_index, scratch);
}

// ---------------------------------------------------------------------------
// Prefill / static attention (flash style).
//
// One block per (tile of kBlockQ query rows, head, sequence); the query tiles
// of a sequence start at its first row, so the work and the order of every
// reduction depend on that sequence alone. Warp w owns rows w, w + 4, ... of
// the tile: it computes their scores (lane j: keys j, j + 32, ...), keeps
// their running max / sum in registers and accumulates their outputs (lane j:
// dims j, j + 32, ...). Key tiles of kBlockK keys are staged in shared memory
// as f32 (int8 and fp8 values are converted exactly; their scales are applied
// to the scores and to the probabilities as on the CPU).

constexpr int kBlockQ = 16;
constexpr int kRowsPerWarp = kBlockQ / kWarps;
static_assert(kBlockQ % kWarps == 0, "query tile must split across warps");

// kD: the head-dim capacity of an instantiation (64, 128 or 256), >= both D
// and Dv of the call.
template <int kD>
struct PrefillTile {
  static constexpr int kBlockK = kD <= 64 ? 64 : 32;
  static constexpr int kKeysPerLane = kBlockK / kWarpSize;
  static constexpr int kDimsPerLane = kD / kWarpSize;
  static constexpr int kKStride = kD + 1;  // Pads k rows: no bank conflicts.
  // Shared floats: q [kBlockQ][kD], k [kBlockK][kKStride], v [kBlockK][kD],
  // p [kBlockQ][kBlockK], k scales [kBlockK], v scales [kBlockK].
  static constexpr int kSharedFloats = kBlockQ * kD + kBlockK * kKStride +
                                       kBlockK * kD + kBlockQ * kBlockK +
                                       2 * kBlockK;
  static constexpr size_t kSharedBytes = kSharedFloats * sizeof(float);
};

struct AttentionParams {
  const float* q;
  float* out;
  const void* k;
  const void* v;
  const float* k_scale;
  const float* v_scale;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* seq_lens;  // Decode only: 0 marks a padded sequence.
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t group;  // num_heads / num_kv_heads
  int32_t head_dim;
  int32_t head_dim_v;
  int32_t first_seq;
  int64_t window;
  float scale;
  float softcap;  // 0: none.
  // Decode only.
  int32_t max_parts;   // Partitions per (sequence, head) in the workspace.
  float2* part_stats;  // [seqs, heads, max_parts]: (max, sum).
  float* part_out;     // [seqs, heads, max_parts, Dv]: unnormalized.
};

template <typename T, int kD, bool kStatic>
__global__ void __launch_bounds__(kThreads)
    PrefillKernel(const AttentionParams p) {
  using Tile = PrefillTile<kD>;
  constexpr int kBlockK = Tile::kBlockK;
  constexpr int kKeysPerLane = Tile::kKeysPerLane;
  constexpr int kDimsPerLane = Tile::kDimsPerLane;
  constexpr int kKStride = Tile::kKStride;
  constexpr bool kQuantized = IsQuantized<T>();

  extern __shared__ float smem[];
  float* sq = smem;                     // [kBlockQ][kD]
  float* sk = sq + kBlockQ * kD;        // [kBlockK][kKStride]
  float* sv = sk + kBlockK * kKStride;  // [kBlockK][kD]
  float* sp = sv + kBlockK * kD;        // [kBlockQ][kBlockK]
  float* sks = sp + kBlockQ * kBlockK;  // [kBlockK] score multipliers
  float* svs = sks + kBlockK;           // [kBlockK] value scales

  const int32_t seq = p.first_seq + static_cast<int32_t>(blockIdx.z);
  const int32_t h = blockIdx.y;
  const int32_t kvh = h / p.group;
  const int32_t row_begin = p.query_start_loc[seq];
  const int32_t query_len = p.query_start_loc[seq + 1] - row_begin;
  const int32_t q0 = static_cast<int32_t>(blockIdx.x) * kBlockQ;
  if (q0 >= query_len) return;  // Uniform over the block.
  const int32_t rows = min(kBlockQ, query_len - q0);
  const int64_t first_pos = static_cast<int64_t>(p.context_lens[seq]) + q0;
  const int64_t key_lo = FirstVisible(first_pos, p.window);
  const int64_t key_hi = first_pos + rows - 1;  // Inclusive.
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int32_t dim = p.head_dim;
  const int32_t dim_v = p.head_dim_v;
  const int32_t kv_heads = p.num_kv_heads;
  const T* k_cache = static_cast<const T*>(p.k);
  const T* v_cache = static_cast<const T*>(p.v);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  // The query tile, zero past `rows` and past D.
  for (int i = threadIdx.x; i < kBlockQ * kD; i += kThreads) {
    const int r = i / kD;
    const int d = i % kD;
    float x = 0.0f;
    if (r < rows && d < dim) {
      const int64_t row = static_cast<int64_t>(row_begin) + q0 + r;
      x = p.q[(row * p.num_heads + h) * dim + d];
    }
    sq[i] = x;
  }

  float m[kRowsPerWarp];
  float l[kRowsPerWarp];
  float acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) acc[i][c] = 0.0f;
  }

  for (int64_t tile = key_lo; tile <= key_hi; tile += kBlockK) {
    __syncthreads();  // The previous tile (and, first time, q) is consumed.
    // Stage keys tile .. tile + kBlockK - 1; positions past key_hi are zero.
    for (int j = warp; j < kBlockK; j += kWarps) {
      const int64_t pos = tile + j;
      float* krow = sk + j * kKStride;
      float* vrow = sv + j * kD;
      if (pos <= key_hi) {
        const int64_t slot = SlotOf<kStatic>(table, p.block_size, pos);
        const int64_t cache_row = slot * kv_heads + kvh;
        const T* kg = k_cache + cache_row * dim;
        const T* vg = v_cache + cache_row * dim_v;
        for (int d = lane; d < kD; d += kWarpSize) {
          krow[d] = d < dim ? ToFloat(kg[d]) : 0.0f;
          vrow[d] = d < dim_v ? ToFloat(vg[d]) : 0.0f;
        }
        if (lane == 0) {
          if (kQuantized) {
            const int64_t si = ScaleIndex<T>(cache_row, kvh);
            sks[j] = p.k_scale[si] * p.scale;
            svs[j] = p.v_scale[si];
          } else {
            sks[j] = p.scale;
            svs[j] = 1.0f;
          }
        }
      } else {
        for (int d = lane; d < kD; d += kWarpSize) {
          krow[d] = 0.0f;
          vrow[d] = 0.0f;
        }
        if (lane == 0) {
          sks[j] = 0.0f;
          svs[j] = 0.0f;
        }
      }
    }
    __syncthreads();

    // Scores of this warp's rows against this lane's keys.
    float s[kRowsPerWarp][kKeysPerLane];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c) s[i][c] = 0.0f;
    }
    for (int d = 0; d < dim; ++d) {
      float kv[kKeysPerLane];
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c)
        kv[c] = sk[(lane + c * kWarpSize) * kKStride + d];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float qv = sq[(warp + i * kWarps) * kD + d];
#pragma unroll
        for (int c = 0; c < kKeysPerLane; ++c)
          s[i][c] = fmaf(qv, kv[c], s[i][c]);
      }
    }

    // Mask, then the online softmax update of each row (warp-wide).
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + i * kWarps;
      const int64_t qpos = first_pos + r;
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c) {
        const int j = lane + c * kWarpSize;
        const int64_t key = tile + j;
        const bool visible =
            r < rows && key <= qpos && (p.window <= 0 || key > qpos - p.window);
        float x = s[i][c] * sks[j];
        if (p.softcap > 0.0f) x = Softcap(x, p.softcap);
        s[i][c] = visible ? x : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][c]);
      }
      tile_max = WarpMax(tile_max);
      const float m_new = fmaxf(m[i], tile_max);
      float psum = 0.0f;
#pragma unroll
      for (int c = 0; c < kKeysPerLane; ++c) {
        const int j = lane + c * kWarpSize;
        const float pr = m_new == -INFINITY ? 0.0f : expf(s[i][c] - m_new);
        psum += pr;
        sp[r * kBlockK + j] = pr * svs[j];
      }
      psum = WarpSum(psum);
      const float alpha = m[i] == -INFINITY ? 0.0f : expf(m[i] - m_new);
      l[i] = l[i] * alpha + psum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c) acc[i][c] *= alpha;
    }
    __syncwarp();  // sp rows of this warp are written by its own lanes.

    // out += p · v for this warp's rows.
    for (int j = 0; j < kBlockK; ++j) {
      float vv[kDimsPerLane];
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c)
        vv[c] = sv[j * kD + lane + c * kWarpSize];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float pr = sp[(warp + i * kWarps) * kBlockK + j];
#pragma unroll
        for (int c = 0; c < kDimsPerLane; ++c)
          acc[i][c] = fmaf(pr, vv[c], acc[i][c]);
      }
    }
    // sp is rewritten by the same warp only after the next __syncthreads.
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kWarps;
    if (r >= rows) continue;
    const float inv = 1.0f / l[i];
    const int64_t row = static_cast<int64_t>(row_begin) + q0 + r;
    float* o = p.out + (row * p.num_heads + h) * dim_v;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < dim_v) o[d] = acc[i][c] * inv;
    }
  }
}

// ---------------------------------------------------------------------------
// Decode attention (split-K).
//
// One block per (partition, head, sequence). The keys a decode query sees,
// [lo, pos], are cut into partitions of kDecodePartitionSize starting at lo,
// so partitioning depends on the sequence alone. A block scores its keys (one
// warp per key, lanes over D), takes the softmax of the partition, then
// accumulates p · v (warps over keys, lanes over Dv) and sums the warps in a
// fixed order. One partition: the output is written directly; more: (max,
// sum, unnormalized output) go to the workspace and DecodeReduceKernel
// combines them. The grid covers the partitions of grid_max_seq_len keys
// (graph-safe: host values only); blocks beyond their sequence's partitions
// exit, and a sequence with seq_len 0 (padding) gets zeros from block 0.

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const AttentionParams p) {
  constexpr int kDimsPerLane = kD / kWarpSize;
  constexpr bool kQuantized = IsQuantized<T>();
  constexpr int kPart = kDecodePartitionSize;
  __shared__ float logits[kPart];
  __shared__ int64_t slots[kPart];
  __shared__ float partial[kWarps][kD];
  __shared__ float scratch[kWarps];

  const int32_t local_seq = blockIdx.z;
  const int32_t seq = p.first_seq + local_seq;
  const int32_t h = blockIdx.y;
  const int32_t part = blockIdx.x;
  const int32_t kvh = h / p.group;
  if (p.seq_lens[seq] == 0) {  // Padding: no keys, a zero output.
    if (part == 0) {
      float* o =
          p.out +
          (static_cast<int64_t>(p.query_start_loc[seq]) * p.num_heads + h) *
              p.head_dim_v;
      for (int d = threadIdx.x; d < p.head_dim_v; d += kThreads) o[d] = 0.0f;
    }
    return;
  }
  const int64_t pos = p.context_lens[seq];
  const int64_t lo = FirstVisible(pos, p.window);
  const int64_t num_keys = pos - lo + 1;
  const int32_t num_parts =
      static_cast<int32_t>((num_keys + kPart - 1) / kPart);
  if (part >= num_parts) return;  // Uniform over the block.
  const int64_t start = lo + static_cast<int64_t>(part) * kPart;
  const int32_t n = static_cast<int32_t>(min(int64_t{kPart}, pos + 1 - start));
  const int64_t row = p.query_start_loc[seq];
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int32_t dim = p.head_dim;
  const int32_t dim_v = p.head_dim_v;
  const int32_t kv_heads = p.num_kv_heads;
  const T* k_cache = static_cast<const T*>(p.k);
  const T* v_cache = static_cast<const T*>(p.v);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  float qr[kDimsPerLane];
  const float* qg = p.q + (row * p.num_heads + h) * dim;
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c) {
    const int d = lane + c * kWarpSize;
    qr[c] = d < dim ? qg[d] : 0.0f;
  }
  for (int j = threadIdx.x; j < n; j += kThreads)
    slots[j] =
        SlotOf</*kStatic=*/false>(table, p.block_size, start + j) * kv_heads +
        kvh;  // The cache row of key j.
  __syncthreads();

  // Scores.
  for (int j = warp; j < n; j += kWarps) {
    const int64_t cache_row = slots[j];
    const T* kg = k_cache + cache_row * dim;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < dim) dot = fmaf(qr[c], ToFloat(kg[d]), dot);
    }
    dot = WarpSum(dot);
    if (lane == 0) {
      float x =
          dot * (kQuantized ? p.k_scale[ScaleIndex<T>(cache_row, kvh)] * p.scale
                            : p.scale);
      if (p.softcap > 0.0f) x = Softcap(x, p.softcap);
      logits[j] = x;
    }
  }
  __syncthreads();

  // Softmax of the partition.
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += kThreads) mx = fmaxf(mx, logits[j]);
  mx = BlockReduceInOrder</*kMax=*/true>(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const float e = expf(logits[j] - mx);
    sum += e;
    logits[j] = kQuantized ? e * p.v_scale[ScaleIndex<T>(slots[j], kvh)] : e;
  }
  // Syncs: logits ready.
  sum = BlockReduceInOrder</*kMax=*/false>(sum, scratch);

  // p · v.
  float acc[kDimsPerLane];
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c) acc[c] = 0.0f;
  for (int j = warp; j < n; j += kWarps) {
    const T* vg = v_cache + slots[j] * dim_v;
    const float pj = logits[j];
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < dim_v) acc[c] = fmaf(pj, ToFloat(vg[d]), acc[c]);
    }
  }
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c)
    partial[warp][lane + c * kWarpSize] = acc[c];
  __syncthreads();

  if (num_parts == 1) {
    const float inv = 1.0f / sum;
    float* o = p.out + (row * p.num_heads + h) * dim_v;
    for (int d = threadIdx.x; d < dim_v; d += kThreads) {
      float v = partial[0][d];
      for (int w = 1; w < kWarps; ++w) v += partial[w][d];
      o[d] = v * inv;
    }
    return;
  }
  const int64_t entry =
      (static_cast<int64_t>(local_seq) * p.num_heads + h) * p.max_parts + part;
  float* o = p.part_out + entry * dim_v;
  for (int d = threadIdx.x; d < dim_v; d += kThreads) {
    float v = partial[0][d];
    for (int w = 1; w < kWarps; ++w) v += partial[w][d];
    o[d] = v;
  }
  if (threadIdx.x == 0) p.part_stats[entry] = make_float2(mx, sum);
}

// Combines the partitions of one (sequence, head): out = Σ w_i o_i / Σ w_i l_i
// with w_i = exp(m_i - max m). Every thread recomputes the weights in the same
// order (a few exps per partition; no shared memory, no limit on partitions).
__global__ void __launch_bounds__(kThreads)
    DecodeReduceKernel(const AttentionParams p) {
  constexpr int kPart = kDecodePartitionSize;
  const int32_t local_seq = blockIdx.y;
  const int32_t seq = p.first_seq + local_seq;
  const int32_t h = blockIdx.x;
  if (p.seq_lens[seq] == 0) return;  // Padding: zeros from DecodeKernel.
  const int64_t pos = p.context_lens[seq];
  const int64_t num_keys = pos - FirstVisible(pos, p.window) + 1;
  const int32_t num_parts =
      static_cast<int32_t>((num_keys + kPart - 1) / kPart);
  if (num_parts <= 1) return;  // Written by DecodeKernel.
  const int64_t base =
      (static_cast<int64_t>(local_seq) * p.num_heads + h) * p.max_parts;
  const float2* stats = p.part_stats + base;
  float mx = -INFINITY;
  for (int i = 0; i < num_parts; ++i) mx = fmaxf(mx, stats[i].x);
  float total = 0.0f;
  for (int i = 0; i < num_parts; ++i)
    total += expf(stats[i].x - mx) * stats[i].y;
  const float inv = 1.0f / total;
  const int32_t dim_v = p.head_dim_v;
  const float* parts = p.part_out + base * dim_v;
  const int64_t row = p.query_start_loc[seq];
  float* o = p.out + (row * p.num_heads + h) * dim_v;
  for (int d = threadIdx.x; d < dim_v; d += kThreads) {
    float v = 0.0f;
    for (int i = 0; i < num_parts; ++i) {
      v = fmaf(expf(stats[i].x - mx),
               parts[static_cast<int64_t>(i) * dim_v + d], v);
    }
    o[d] = v * inv;
  }
}

// ---------------------------------------------------------------------------
// Host side.

constexpr int32_t kMaxGridYZ = kMaxGridDim;
constexpr size_t kDefaultSharedBytes = 48 * 1024;

bool ValidCache(const DeviceKvLayer& c) {
  if (c.k == nullptr || c.v == nullptr || c.num_slots <= 0 ||
      c.num_kv_heads <= 0 || c.head_dim <= 0 || c.head_dim_v <= 0) {
    return false;
  }
  switch (c.dtype) {
    case KvDType::kF32:
    case KvDType::kBF16:
      return true;
    case KvDType::kI8:
    case KvDType::kF8E4M3:
      return c.k_scale != nullptr && c.v_scale != nullptr;
  }
  return false;
}

// Head-dim capacity of the kernel instantiation for D and Dv: 64, 128 or 256.
int HeadDimTile(const DeviceKvLayer& c) {
  const int32_t d = c.head_dim > c.head_dim_v ? c.head_dim : c.head_dim_v;
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

// Checks shared by the three attention launchers; fills the common params.
cudaError_t PrepareAttention(const float* q, int32_t num_heads,
                             const DeviceKvLayer& cache,
                             const DeviceAttentionMetadata& m,
                             int32_t first_seq, int32_t end_seq,
                             int64_t sliding_window, float scale, float softcap,
                             float* out, AttentionParams* p) {
  if (q == nullptr || out == nullptr || !ValidCache(cache) ||
      cache.head_dim > kMaxAttentionHeadDim ||
      cache.head_dim_v > kMaxAttentionHeadDim || num_heads <= 0 ||
      num_heads % cache.num_kv_heads != 0 || num_heads > kMaxGridYZ ||
      sliding_window < 0 || !(softcap >= 0.0f && softcap < INFINITY) ||
      first_seq < 0 || end_seq < first_seq || end_seq > m.num_seqs ||
      end_seq - first_seq > kMaxGridYZ || m.block_size <= 0 ||
      m.max_blocks_per_seq <= 0) {
    return cudaErrorInvalidValue;
  }
  if (end_seq > first_seq &&
      (m.query_start_loc == nullptr || m.context_lens == nullptr ||
       m.block_tables == nullptr)) {
    return cudaErrorInvalidValue;
  }
  *p = AttentionParams{};
  p->q = q;
  p->out = out;
  p->k = cache.k;
  p->v = cache.v;
  p->k_scale = KvHasScales(cache.dtype) ? cache.k_scale : nullptr;
  p->v_scale = KvHasScales(cache.dtype) ? cache.v_scale : nullptr;
  p->query_start_loc = m.query_start_loc;
  p->context_lens = m.context_lens;
  p->seq_lens = m.seq_lens;
  p->block_tables = m.block_tables;
  p->max_blocks_per_seq = m.max_blocks_per_seq;
  p->block_size = m.block_size;
  p->num_heads = num_heads;
  p->num_kv_heads = cache.num_kv_heads;
  p->group = num_heads / cache.num_kv_heads;
  p->head_dim = cache.head_dim;
  p->head_dim_v = cache.head_dim_v;
  p->first_seq = first_seq;
  p->window = sliding_window;
  p->scale = scale;
  p->softcap = softcap;
  return cudaSuccess;
}

template <typename T, int kD, bool kStatic>
cudaError_t RunPrefill(const AttentionParams& p, int32_t num_seqs,
                       int32_t max_query_len, cudaStream_t stream) {
  constexpr size_t kShared = PrefillTile<kD>::kSharedBytes;
  auto* kernel = &PrefillKernel<T, kD, kStatic>;
  if (kShared > kDefaultSharedBytes) {
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kShared));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid((max_query_len + kBlockQ - 1) / kBlockQ, p.num_heads,
                  num_seqs);
  kernel<<<grid, kThreads, kShared, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, bool kStatic>
cudaError_t DispatchPrefillDim(const AttentionParams& p, int tile,
                               int32_t num_seqs, int32_t max_query_len,
                               cudaStream_t stream) {
  switch (tile) {
    case 64:
      return RunPrefill<T, 64, kStatic>(p, num_seqs, max_query_len, stream);
    case 128:
      return RunPrefill<T, 128, kStatic>(p, num_seqs, max_query_len, stream);
    default:
      return RunPrefill<T, 256, kStatic>(p, num_seqs, max_query_len, stream);
  }
}

template <bool kStatic>
cudaError_t LaunchVarlenAttention(const float* q, int32_t num_heads,
                                  const DeviceKvLayer& cache,
                                  const DeviceAttentionMetadata& m,
                                  int32_t first_seq, int32_t end_seq,
                                  int64_t sliding_window, float scale,
                                  float softcap, float* out,
                                  cudaStream_t stream) {
  AttentionParams p;
  const cudaError_t e =
      PrepareAttention(q, num_heads, cache, m, first_seq, end_seq,
                       sliding_window, scale, softcap, out, &p);
  if (e != cudaSuccess) return e;
  const int32_t num_seqs = end_seq - first_seq;
  if (num_seqs == 0) return cudaSuccess;
  if (m.max_query_len <= 0) return cudaErrorInvalidValue;
  const int tile = HeadDimTile(cache);
  switch (cache.dtype) {
    case KvDType::kF32:
      return DispatchPrefillDim<float, kStatic>(p, tile, num_seqs,
                                                m.max_query_len, stream);
    case KvDType::kBF16:
      return DispatchPrefillDim<__nv_bfloat16, kStatic>(
          p, tile, num_seqs, m.max_query_len, stream);
    case KvDType::kI8:
      return DispatchPrefillDim<int8_t, kStatic>(p, tile, num_seqs,
                                                 m.max_query_len, stream);
    case KvDType::kF8E4M3:
      return DispatchPrefillDim<__nv_fp8_e4m3, kStatic>(
          p, tile, num_seqs, m.max_query_len, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t RunDecode(const AttentionParams& p, int tile, dim3 grid,
                      cudaStream_t stream) {
  switch (tile) {
    case 64:
      DecodeKernel<T, 64><<<grid, kThreads, 0, stream>>>(p);
      break;
    case 128:
      DecodeKernel<T, 128><<<grid, kThreads, 0, stream>>>(p);
      break;
    default:
      DecodeKernel<T, 256><<<grid, kThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

int64_t DecodePartitions(int64_t max_keys) {
  return (max_keys + kDecodePartitionSize - 1) / kDecodePartitionSize;
}

size_t DecodeWorkspaceBytesForParts(int64_t num_seqs, int64_t num_heads,
                                    int64_t head_dim_v, int64_t parts) {
  if (parts <= 1 || num_seqs <= 0 || num_heads <= 0) return 0;
  const int64_t entries = num_seqs * num_heads * parts;
  return static_cast<size_t>(entries) *
         (sizeof(float2) + static_cast<size_t>(head_dim_v) * sizeof(float));
}

// StoreKvCache's typed launch.
template <typename T>
cudaError_t RunStore(const float* k, const float* v, int64_t num_tokens,
                     const int64_t* slot_mapping, const DeviceKvLayer& c,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_tokens), c.num_kv_heads);
  StoreKvKernel<T><<<grid, kThreads, 0, stream>>>(
      k, v, slot_mapping, static_cast<T*>(c.k), static_cast<T*>(c.v),
      KvHasScales(c.dtype) ? c.k_scale : nullptr,
      KvHasScales(c.dtype) ? c.v_scale : nullptr, c.num_slots, c.num_kv_heads,
      c.head_dim, c.head_dim_v);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchStoreKvCache(const float* k, const float* v,
                               int64_t num_tokens, const int64_t* slot_mapping,
                               const DeviceKvLayer& cache,
                               cudaStream_t stream) {
  if (num_tokens < 0 || !ValidCache(cache) || cache.num_kv_heads > kMaxGridYZ ||
      num_tokens > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  if (k == nullptr || v == nullptr || slot_mapping == nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (cache.dtype) {
    case KvDType::kF32:
      return RunStore<float>(k, v, num_tokens, slot_mapping, cache, stream);
    case KvDType::kBF16:
      return RunStore<__nv_bfloat16>(k, v, num_tokens, slot_mapping, cache,
                                     stream);
    case KvDType::kI8:
      return RunStore<int8_t>(k, v, num_tokens, slot_mapping, cache, stream);
    case KvDType::kF8E4M3:
      return RunStore<__nv_fp8_e4m3>(k, v, num_tokens, slot_mapping, cache,
                                     stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchPrefillAttention(const float* q, int32_t num_heads,
                                   const DeviceKvLayer& cache,
                                   const DeviceAttentionMetadata& m,
                                   int32_t first_seq, int32_t end_seq,
                                   int64_t sliding_window, float scale,
                                   float softcap, float* out,
                                   cudaStream_t stream) {
  return LaunchVarlenAttention</*kStatic=*/false>(
      q, num_heads, cache, m, first_seq, end_seq, sliding_window, scale,
      softcap, out, stream);
}

cudaError_t LaunchStaticAttention(const float* q, int32_t num_heads,
                                  const DeviceKvLayer& cache,
                                  const DeviceAttentionMetadata& m,
                                  int32_t first_seq, int32_t end_seq,
                                  int64_t sliding_window, float scale,
                                  float softcap, float* out,
                                  cudaStream_t stream) {
  return LaunchVarlenAttention</*kStatic=*/true>(
      q, num_heads, cache, m, first_seq, end_seq, sliding_window, scale,
      softcap, out, stream);
}

size_t DecodeAttentionWorkspaceBytes(int32_t num_seqs, int32_t num_heads,
                                     int32_t head_dim_v, int32_t max_seq_len) {
  return DecodeWorkspaceBytesForParts(num_seqs, num_heads, head_dim_v,
                                      DecodePartitions(max_seq_len));
}

cudaError_t LaunchDecodeAttention(const float* q, int32_t num_heads,
                                  const DeviceKvLayer& cache,
                                  const DeviceAttentionMetadata& m,
                                  int32_t first_seq, int32_t end_seq,
                                  int64_t sliding_window, float scale,
                                  float softcap, float* out, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream) {
  AttentionParams p;
  cudaError_t e = PrepareAttention(q, num_heads, cache, m, first_seq, end_seq,
                                   sliding_window, scale, softcap, out, &p);
  if (e != cudaSuccess) return e;
  const int32_t num_seqs = end_seq - first_seq;
  if (num_seqs == 0) return cudaSuccess;
  // The grid's bound (contract: >= every seq_len of the step), not the
  // step's exact maximum: under a graph it is the rank's context.
  const int64_t grid_len =
      m.grid_max_seq_len > 0 ? m.grid_max_seq_len : m.max_seq_len;
  if (grid_len <= 0 || grid_len < m.max_seq_len || m.seq_lens == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t max_keys = sliding_window > 0 && sliding_window < grid_len
                               ? sliding_window
                               : grid_len;
  const int64_t parts = DecodePartitions(max_keys);
  const size_t need = DecodeWorkspaceBytesForParts(num_seqs, num_heads,
                                                   cache.head_dim_v, parts);
  if (workspace_bytes < need ||
      (need > 0 &&
       (workspace == nullptr ||
        reinterpret_cast<uintptr_t>(workspace) % alignof(float2) != 0))) {
    return cudaErrorInvalidValue;
  }
  p.max_parts = static_cast<int32_t>(parts);
  if (parts > 1) {
    const int64_t entries = static_cast<int64_t>(num_seqs) * num_heads * parts;
    p.part_stats = static_cast<float2*>(workspace);
    p.part_out = reinterpret_cast<float*>(p.part_stats + entries);
  }
  const dim3 grid(static_cast<unsigned>(parts), num_heads, num_seqs);
  const int tile = HeadDimTile(cache);
  switch (cache.dtype) {
    case KvDType::kF32:
      e = RunDecode<float>(p, tile, grid, stream);
      break;
    case KvDType::kBF16:
      e = RunDecode<__nv_bfloat16>(p, tile, grid, stream);
      break;
    case KvDType::kI8:
      e = RunDecode<int8_t>(p, tile, grid, stream);
      break;
    case KvDType::kF8E4M3:
      e = RunDecode<__nv_fp8_e4m3>(p, tile, grid, stream);
      break;
  }
  if (e != cudaSuccess || parts <= 1) return e;
  DecodeReduceKernel<<<dim3(num_heads, num_seqs), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
