#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"

namespace tessera {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr float kLog2e = 1.4426950408889634f;
// The running max starts finite, so that an update where every key so far is
// masked never computes inf - inf.
constexpr float kNegInit = -1e30f;
// Enough CTAs to fill an H200 a few times over; a CTA loops over the splits
// of its (sequence, kv head) with the grid's stride. Only the grid depends on
// it, never a result.
constexpr int64_t kTargetCtas = 1024;

struct SplitParams {
  const float* q;
  float* out;
  const void* k;
  const void* v;
  // fp8: the layer's scales [num_kv_heads]; null for f32 and bf16.
  const float* k_scale;
  const float* v_scale;
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t block_shift;  // log2(block_size) when a power of two, else -1.
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t group;
  int32_t first_seq;
  int64_t window;
  int64_t max_keys;  // The grid's bound on the keys of a sequence.
  float scale_log2;  // scale * log2(e): scores in base 2.
  // softcap * log2(e), 0 for none: cap * tanh(s / cap) in base 2 is
  // cap_log2 * tanh(s_log2 / cap_log2).
  float softcap_log2;
  int32_t max_splits;  // Workspace stride: DecodeMaxSplits(max_keys).
  float2* stats;       // [seqs, heads, max_splits]: (max, sum), base 2.
  float* parts;        // [seqs, heads, max_splits, D]: unnormalized.
};

// The keys sequence `seq` attends: [*lo, *lo + return value).
__device__ __forceinline__ int32_t KeyRange(const SplitParams& p, int32_t seq,
                                            int32_t* lo) {
  const int32_t n = p.seq_lens[seq];
  int64_t first = 0;
  if (p.window > 0 && n > p.window) first = n - p.window;
  // Trusted to hold (every seq_len <= the grid bound); clamped so that a
  // violation can never index past the workspace.
  if (n - first > p.max_keys) first = n - p.max_keys;
  *lo = static_cast<int32_t>(first);
  return n > first ? static_cast<int32_t>(n - first) : 0;
}

// One thread's chunk of a cache row: kN elements, kBytes bytes, held as a
// Chunk (what the ring slot is read as). f32 and bf16: 16 bytes. fp8: 8
// bytes, so that a row is split across the lanes as bf16's is (kN = 8: the
// same lanes, sub-warps, registers and ring layout; half the bytes).
template <typename T>
struct Vec;
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int kN = 8;
  static constexpr int kBytes = 16;
  using Chunk = uint4;
  static __device__ __forceinline__ void Widen(const uint4& r, float* x) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct Vec<float> {
  static constexpr int kN = 4;
  static constexpr int kBytes = 16;
  using Chunk = uint4;
  static __device__ __forceinline__ void Widen(const uint4& r, float* x) {
    x[0] = __uint_as_float(r.x);
    x[1] = __uint_as_float(r.y);
    x[2] = __uint_as_float(r.z);
    x[3] = __uint_as_float(r.w);
  }
};
template <>
struct Vec<__nv_fp8_e4m3> {
  static constexpr int kN = 8;
  static constexpr int kBytes = 8;
  using Chunk = uint2;
  // Eight e4m3 bytes (element i in bits 8i .. 8i + 7, little-endian) to f32,
  // two at a time through f16 (cvt.rn.f16x2.e4m3x2 on sm_89+): exact, since
  // every e4m3 value is an f16 and every f16 an f32.
  static __device__ __forceinline__ void Widen(const uint2& r, float* x) {
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i] & 0xffffu), __NV_E4M3)));
      const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i] >> 16), __NV_E4M3)));
      x[4 * i] = lo.x;
      x[4 * i + 1] = lo.y;
      x[4 * i + 2] = hi.x;
      x[4 * i + 3] = hi.y;
    }
  }
};

// cp.async of one chunk, global -> shared. 16 bytes bypass L1 (read-once
// data); 8 bytes (an fp8 chunk) must go through it (.cg takes 16 only).
template <int kBytes>
__device__ __forceinline__ void CopyAsync(void* smem, const void* gmem);
template <>
__device__ __forceinline__ void CopyAsync<16>(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem)
               : "memory");
}
template <>
__device__ __forceinline__ void CopyAsync<8>(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void CommitAsync() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  // The clobber keeps the compiler from moving the ring's plain loads
  // above the wait (no barrier follows it).
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Pipeline shape: kStages stages of kU keys per sub-warp (K and V chunks of
// 16 bytes per thread per key), in a per-thread ring in shared memory: each
// thread copies exactly the chunks it later reads, so the ring needs no
// barrier, only cp.async.wait_group. kStages - 1 stages are in flight while
// one is computed.
#ifndef TESSERA_DECODE_STAGES  // Tuning builds only (the bench's variants).
#define TESSERA_DECODE_STAGES 4
#endif
#ifndef TESSERA_DECODE_KEYS_PER_STAGE
#define TESSERA_DECODE_KEYS_PER_STAGE 2
#endif
constexpr int kStages = TESSERA_DECODE_STAGES;
constexpr int kU = TESSERA_DECODE_KEYS_PER_STAGE;  // Keys per sub-warp.
static_assert(kStages >= 2, "a pipeline needs two stages");
// Instructions bound the bf16 D 128 case, so the loop keeps them few: the
// exponentials flush denormals (ex2.approx.ftz; a probability below 2^-126
// of the row's largest is 0 either way after the sum), and the running max's
// rescale is skipped when the max did not grow (alpha would be 2^0 = 1).
// Together 72.6% of copy bandwidth at batch 64 x 4096 on an H200; an
// earlier run of the plain form (exp2f, a rescale every step) measured
// 69.1%, not side by side.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr int kStageBytes = 2 * kU * 16 * kThreads;
constexpr int kRingBytes = kStages * kStageBytes;  // 32 KB: no opt-in.

// The splits of one CTA, in order, cut into steps of kStep keys.
struct StepIter {
  int32_t split, base, end;
};

// One CTA per (split slot, kv head, sequence); it runs splits blockIdx.x,
// blockIdx.x + gridDim.x, ... of its sequence, as one pipelined stream of
// steps. The CTA's threads form kSub sub-warps of kLanes lanes; a sub-warp
// reads one key row per chunk (lane c holds dims [c * kN, c * kN + kN)),
// keeps its own online-softmax state for the kG query heads of the group,
// and at the end of each split the sub-warps' states are merged in shared
// memory (through the ring stage just consumed), in sub-warp order.
template <typename T, int kD, int kG>
__global__ void __launch_bounds__(kThreads, kG <= 4 ? 4 : 3)
    SplitDecodeKernel(const SplitParams p) {
  using Chunk = typename Vec<T>::Chunk;
  constexpr int kN = Vec<T>::kN;
  constexpr bool kFp8 = std::is_same<T, __nv_fp8_e4m3>::value;
  constexpr int kLanes = kD / kN;
  static_assert(kLanes <= kWarpSize && kWarpSize % kLanes == 0,
                "a key row must fit one warp");
  constexpr int kSub = kWarps * (kWarpSize / kLanes);
  constexpr int kStep = kSub * kU;  // Keys per CTA per step.
  // Heads merged per pass through one ring stage.
  constexpr int kHeadBytes = kSub * kD * static_cast<int>(sizeof(float));
  constexpr int kHP =
      kStageBytes / kHeadBytes < kG ? kStageBytes / kHeadBytes : kG;
  static_assert(kHP >= 1 && kG % kHP == 0, "merge passes");
  __shared__ __align__(16) uint4 ring[kRingBytes / 16];
  __shared__ float s_m[kSub][kG];
  __shared__ float s_l[kSub][kG];
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();

  const int32_t lseq = blockIdx.z;
  const int32_t seq = p.first_seq + lseq;
  const int32_t kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int sub = tid / kLanes;
  const int c = lane % kLanes;
  const int32_t group = p.group;
  const int32_t num_heads = p.num_heads;
  int32_t lo;
  const int32_t num_keys = KeyRange(p, seq, &lo);
  const int32_t splits = DecodeNumSplits(num_keys);
  const int64_t row = p.query_start_loc[seq];
  if (splits == 0) {  // A padded sequence: zeros, no cache read.
    if (blockIdx.x == 0) {
      float* o = p.out + (row * num_heads + kvh * group) * kD;
      for (int i = tid; i < group * kD; i += kThreads) o[i] = 0.0f;
    }
    return;
  }
  if (static_cast<int32_t>(blockIdx.x) >= splits) return;
  const int32_t chunk = static_cast<int32_t>(DecodeSplitKeys(num_keys));
  const int32_t end_all = lo + num_keys;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const char* kc = static_cast<const char*>(p.k);
  const char* vc = static_cast<const char*>(p.v);
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * kD;
  const int64_t head_off = static_cast<int64_t>(kvh) * kD + c * kN;

  auto first_step = [&](int32_t split) {
    const int32_t b = lo + split * chunk;
    return StepIter{split, b, min(end_all, b + chunk)};
  };
  auto advance = [&](StepIter* it) {
    it->base += kStep;
    if (it->base >= it->end) *it = first_step(it->split + gridDim.x);
  };
  // This thread's chunk j of stage `st`: K for j < kU, V for j >= kU.
  auto chunk_ptr = [&](int st, int j) {
    return &ring[(st * 2 * kU + j) * kThreads + tid];
  };
  auto produce = [&](const StepIter& it, int st) {
    if (it.split < splits) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int32_t pos = it.base + u * kSub + sub;
        if (pos < it.end) {
          int32_t bi, bo;
          if (p.block_shift >= 0) {
            bi = pos >> p.block_shift;
            bo = pos & (p.block_size - 1);
          } else {
            bi = pos / p.block_size;
            bo = pos - bi * p.block_size;
          }
          const int64_t slot =
              static_cast<int64_t>(__ldg(table + bi)) * p.block_size + bo;
          const int64_t off = (slot * slot_stride + head_off) * sizeof(T);
          CopyAsync<Vec<T>::kBytes>(chunk_ptr(st, u), kc + off);
          CopyAsync<Vec<T>::kBytes>(chunk_ptr(st, kU + u), vc + off);
        }
      }
    }
    CommitAsync();  // One group per step, empty or not.
  };

  StepIter pit = first_step(blockIdx.x);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    produce(pit, st);
    advance(&pit);
  }

  // fp8: the head's k scale multiplies every q·k sum, so it joins the
  // score's factor once here; its v scale multiplies the output (below).
  const float q_mul = kFp8 ? p.scale_log2 * p.k_scale[kvh] : p.scale_log2;
  const float v_mul = kFp8 ? p.v_scale[kvh] : 1.0f;
  float q[kG][kN];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g < group) {
      const float4* qg = reinterpret_cast<const float4*>(
          p.q + (row * num_heads + kvh * group + g) * kD + c * kN);
#pragma unroll
      for (int i = 0; i < kN / 4; ++i) {
        const float4 x = qg[i];
        q[g][4 * i] = x.x * q_mul;
        q[g][4 * i + 1] = x.y * q_mul;
        q[g][4 * i + 2] = x.z * q_mul;
        q[g][4 * i + 3] = x.w * q_mul;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) q[g][i] = 0.0f;
    }
  }

  float m[kG], l[kG], acc[kG][kN];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = kNegInit;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[g][i] = 0.0f;
  }

  int st = 0;
  for (StepIter it = first_step(blockIdx.x); it.split < splits;) {
    WaitAsync<kStages - 2>();  // This thread's copies of stage st are done.
    produce(pit, (st + kStages - 1) % kStages);
    advance(&pit);

    bool valid[kU];
    float s[kU][kG];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      valid[u] = it.base + u * kSub + sub < it.end;
      const Chunk kr = valid[u]
                           ? *reinterpret_cast<const Chunk*>(chunk_ptr(st, u))
                           : Chunk{};
      float kf[kN];
      Vec<T>::Widen(kr, kf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kN; ++i) dot = fmaf(q[g][i], kf[i], dot);
        s[u][g] = dot;
      }
    }
    // The sub-warp's butterfly: every lane of it gets the same sums.
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int g = 0; g < kG; ++g)
          s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], o);
      }
    }
    if (p.softcap_log2 > 0.0f) {  // Uniform over the grid.
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int g = 0; g < kG; ++g) s[u][g] = Softcap(s[u][g], p.softcap_log2);
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (!valid[u]) s[u][g] = -INFINITY;
        mx = fmaxf(mx, s[u][g]);
      }
      if (mx > m[g]) {  // Uniform over the sub-warp.
        const float alpha = Exp2(m[g] - mx);
        m[g] = mx;
        l[g] *= alpha;
#pragma unroll
        for (int i = 0; i < kN; ++i) acc[g][i] *= alpha;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const Chunk vr =
          valid[u] ? *reinterpret_cast<const Chunk*>(chunk_ptr(st, kU + u))
                   : Chunk{};
      float vf[kN];
      Vec<T>::Widen(vr, vf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float pr = Exp2(s[u][g] - m[g]);  // 0 for a masked key.
        l[g] += pr;
#pragma unroll
        for (int i = 0; i < kN; ++i) acc[g][i] = fmaf(pr, vf[i], acc[g][i]);
      }
    }

    const int32_t split = it.split;
    const bool last = it.base + kStep >= it.end;
    advance(&it);
    if (last) {
      // Merge the sub-warps of this split through stage st (consumed by
      // every thread once all pass the first barrier; refilled only after
      // the last one).
      float* buf = reinterpret_cast<float*>(chunk_ptr(st, 0) - tid);
      __syncthreads();  // Every thread has read its chunks of stage st.
      if (c == 0) {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          s_m[sub][g] = m[g];
          s_l[sub][g] = l[g];
        }
      }
#pragma unroll
      for (int g0 = 0; g0 < kG; g0 += kHP) {
#pragma unroll
        for (int gg = 0; gg < kHP; ++gg) {
          float4* dst =
              reinterpret_cast<float4*>(buf + (sub * kHP + gg) * kD + c * kN);
#pragma unroll
          for (int i = 0; i < kN / 4; ++i) {
            dst[i] =
                make_float4(acc[g0 + gg][4 * i], acc[g0 + gg][4 * i + 1],
                            acc[g0 + gg][4 * i + 2], acc[g0 + gg][4 * i + 3]);
          }
        }
        __syncthreads();
        for (int idx = tid; idx < kHP * kD; idx += kThreads) {
          const int gg = idx / kD;
          const int d = idx % kD;
          const int g = g0 + gg;
          if (g >= group) continue;
          float mx = s_m[0][g];
          for (int w = 1; w < kSub; ++w) mx = fmaxf(mx, s_m[w][g]);
          float o = 0.0f, sum = 0.0f;
          for (int w = 0; w < kSub; ++w) {
            const float wt = exp2f(s_m[w][g] - mx);
            sum = fmaf(wt, s_l[w][g], sum);
            o = fmaf(wt, buf[(w * kHP + gg) * kD + d], o);
          }
          if (kFp8) o *= v_mul;  // Σ p v_q times the head's v scale.
          const int32_t h = kvh * group + g;
          if (splits == 1) {
            p.out[(row * num_heads + h) * kD + d] = sum > 0.0f ? o / sum : 0.0f;
          } else {
            const int64_t e =
                (static_cast<int64_t>(lseq) * num_heads + h) * p.max_splits +
                split;
            p.parts[e * kD + d] = o;
            if (d == 0) p.stats[e] = make_float2(mx, sum);
          }
        }
        __syncthreads();
      }
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        m[g] = kNegInit;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < kN; ++i) acc[g][i] = 0.0f;
      }
    }
    st = (st + 1) % kStages;
  }
  WaitAsync<0>();  // Nothing in flight when the CTA exits.
}

// out = Σ w_i o_i / Σ w_i l_i over the splits of one (sequence, head), with
// w_i = 2^(m_i - max m), in split order.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    SplitCombineKernel(const SplitParams p) {
  __shared__ float s_w[kDecodeMaxSplits];
  __shared__ float s_inv;
  PdlWait();  // Launched with LaunchPdl (launch.cuh).
  PdlLaunchDependents();
  const int32_t lseq = blockIdx.y;
  const int32_t seq = p.first_seq + lseq;
  const int32_t h = blockIdx.x;
  int32_t lo;
  const int32_t splits = DecodeNumSplits(KeyRange(p, seq, &lo));
  if (splits <= 1) return;  // Written by SplitDecodeKernel.
  const int64_t base =
      (static_cast<int64_t>(lseq) * p.num_heads + h) * p.max_splits;
  if (threadIdx.x == 0) {
    float mx = p.stats[base].x;
    for (int i = 1; i < splits; ++i) mx = fmaxf(mx, p.stats[base + i].x);
    float sum = 0.0f;
    for (int i = 0; i < splits; ++i) {
      const float2 st = p.stats[base + i];
      const float w = exp2f(st.x - mx);
      s_w[i] = w;
      sum = fmaf(w, st.y, sum);
    }
    s_inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  __syncthreads();
  const int64_t row = p.query_start_loc[seq];
  float* o = p.out + (row * p.num_heads + h) * kD;
  const float* parts = p.parts + base * kD;
  for (int d = threadIdx.x; d < kD; d += kThreads) {
    float v = 0.0f;
    for (int i = 0; i < splits; ++i)
      v = fmaf(s_w[i], parts[static_cast<int64_t>(i) * kD + d], v);
    o[d] = v * s_inv;
  }
}

template <typename T, int kD, int kG>
cudaError_t RunSplit(const SplitParams& p, dim3 grid, int32_t num_seqs,
                     cudaStream_t stream) {
  // Both kernels start while the one ahead drains (launch.cuh); the combine
  // kernel's blocks wait for the splits.
  cudaError_t e = LaunchPdl(SplitDecodeKernel<T, kD, kG>, grid, dim3(kThreads),
                            0, stream, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess || p.max_splits <= 1) return e;
  e = LaunchPdl(SplitCombineKernel<kD>, dim3(p.num_heads, num_seqs),
                dim3(kThreads), 0, stream, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T, int kD>
cudaError_t DispatchGroup(const SplitParams& p, dim3 grid, int32_t num_seqs,
                          cudaStream_t stream) {
  if (p.group <= 1) return RunSplit<T, kD, 1>(p, grid, num_seqs, stream);
  if (p.group <= 2) return RunSplit<T, kD, 2>(p, grid, num_seqs, stream);
  if (p.group <= 4) return RunSplit<T, kD, 4>(p, grid, num_seqs, stream);
  return RunSplit<T, kD, 8>(p, grid, num_seqs, stream);
}

template <typename T>
cudaError_t DispatchDim(const SplitParams& p, int32_t dim, dim3 grid,
                        int32_t num_seqs, cudaStream_t stream) {
  if (dim == 64) return DispatchGroup<T, 64>(p, grid, num_seqs, stream);
  return DispatchGroup<T, 128>(p, grid, num_seqs, stream);
}

}  // namespace

bool DecodeAttentionSupported(const DeviceKvLayer& c, int32_t num_heads) {
  if (c.dtype != KvDType::kF32 && c.dtype != KvDType::kBF16 &&
      c.dtype != KvDType::kF8E4M3) {
    return false;
  }
  if (c.dtype == KvDType::kF8E4M3 &&
      (c.k_scale == nullptr || c.v_scale == nullptr)) {
    return false;
  }
  if (c.head_dim != c.head_dim_v) return false;
  if (c.head_dim != 64 && c.head_dim != 128) return false;
  if (c.num_kv_heads <= 0 || num_heads <= 0 ||
      num_heads % c.num_kv_heads != 0) {
    return false;
  }
  return num_heads / c.num_kv_heads <= kDecodeMaxGroup;
}

size_t DecodeSplitWorkspaceBytes(int32_t num_seqs, int32_t num_heads,
                                 int32_t head_dim_v, int64_t max_keys) {
  const int32_t stride = DecodeMaxSplits(max_keys);
  if (stride <= 1 || num_seqs <= 0 || num_heads <= 0 || head_dim_v <= 0) {
    return 0;
  }
  const size_t entries = static_cast<size_t>(num_seqs) *
                         static_cast<size_t>(num_heads) *
                         static_cast<size_t>(stride);
  return entries *
         (sizeof(float2) + static_cast<size_t>(head_dim_v) * sizeof(float));
}

cudaError_t LaunchSplitDecodeAttention(
    const float* q, int32_t num_heads, const DeviceKvLayer& cache,
    const DeviceAttentionMetadata& m, int32_t first_seq, int32_t end_seq,
    int64_t sliding_window, float scale, float softcap, float* out,
    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!DecodeAttentionSupported(cache, num_heads) || q == nullptr ||
      out == nullptr || cache.k == nullptr || cache.v == nullptr ||
      cache.num_slots <= 0 || cache.num_kv_heads > kMaxGridDim ||
      sliding_window < 0 || !(softcap >= 0.0f && softcap < INFINITY) ||
      first_seq < 0 || end_seq < first_seq || end_seq > m.num_seqs ||
      end_seq - first_seq > kMaxGridDim || m.block_size <= 0 ||
      m.max_blocks_per_seq <= 0 || m.max_seq_len < 0 ||
      m.grid_max_seq_len < 0) {
    return cudaErrorInvalidValue;
  }
  // q and out are read and written as float4s.
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int32_t num_seqs = end_seq - first_seq;
  if (num_seqs == 0) return cudaSuccess;
  if (m.query_start_loc == nullptr || m.seq_lens == nullptr ||
      m.block_tables == nullptr) {
    return cudaErrorInvalidValue;
  }
  // The grid bound (graph-safe steps 1, attention_metadata.h), and what a
  // window leaves of it.
  int64_t max_keys =
      m.grid_max_seq_len > 0 ? m.grid_max_seq_len : m.max_seq_len;
  if (sliding_window > 0 && sliding_window < max_keys)
    max_keys = sliding_window;
  const int32_t stride = DecodeMaxSplits(max_keys);
  const size_t need = DecodeSplitWorkspaceBytes(num_seqs, num_heads,
                                                cache.head_dim_v, max_keys);
  if (workspace_bytes < need ||
      (need > 0 &&
       (workspace == nullptr ||
        reinterpret_cast<uintptr_t>(workspace) % alignof(float2) != 0))) {
    return cudaErrorInvalidValue;
  }
  SplitParams p{};
  p.q = q;
  p.out = out;
  p.k = cache.k;
  p.v = cache.v;
  p.k_scale = cache.dtype == KvDType::kF8E4M3 ? cache.k_scale : nullptr;
  p.v_scale = cache.dtype == KvDType::kF8E4M3 ? cache.v_scale : nullptr;
  p.query_start_loc = m.query_start_loc;
  p.seq_lens = m.seq_lens;
  p.block_tables = m.block_tables;
  p.max_blocks_per_seq = m.max_blocks_per_seq;
  p.block_size = m.block_size;
  p.block_shift = -1;
  if ((m.block_size & (m.block_size - 1)) == 0) {
    p.block_shift = 0;
    while ((1 << p.block_shift) < m.block_size) ++p.block_shift;
  }
  p.num_heads = num_heads;
  p.num_kv_heads = cache.num_kv_heads;
  p.group = num_heads / cache.num_kv_heads;
  p.first_seq = first_seq;
  p.window = sliding_window;
  p.max_keys = max_keys;
  p.scale_log2 = scale * kLog2e;
  p.softcap_log2 = softcap * kLog2e;
  p.max_splits = stride;
  if (need > 0) {
    const size_t entries =
        static_cast<size_t>(num_seqs) * num_heads * static_cast<size_t>(stride);
    p.stats = static_cast<float2*>(workspace);
    p.parts = reinterpret_cast<float*>(p.stats + entries);
  }
  // Split slots per (sequence, kv head): enough CTAs to fill the GPU, never
  // more than a sequence can have splits.
  const int64_t ctas = static_cast<int64_t>(num_seqs) * cache.num_kv_heads;
  int64_t gx = (kTargetCtas + ctas - 1) / ctas;
  if (gx > stride) gx = stride;
  if (gx < 1) gx = 1;
  const dim3 grid(static_cast<unsigned>(gx),
                  static_cast<unsigned>(cache.num_kv_heads),
                  static_cast<unsigned>(num_seqs));
  if (cache.dtype == KvDType::kBF16) {
    return DispatchDim<__nv_bfloat16>(p, cache.head_dim, grid, num_seqs,
                                      stream);
  }
  if (cache.dtype == KvDType::kF8E4M3) {
    return DispatchDim<__nv_fp8_e4m3>(p, cache.head_dim, grid, num_seqs,
                                      stream);
  }
  return DispatchDim<float>(p, cache.head_dim, grid, num_seqs, stream);
}

}  // namespace cuda
}  // namespace tessera
