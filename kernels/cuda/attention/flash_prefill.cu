#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/attention/flash_prefill.h"
#include "kernels/cuda/common/activation.cuh"
#include "kernels/cuda/common/launch.cuh"

namespace tessera {
namespace cuda {
namespace {

constexpr int kMaxGrid = static_cast<int>(kMaxGridDim);

struct FlashParams {
  const float* q;
  float* out;
  // __nv_bfloat16, or fp8 (e4m3) bytes.
  const void* k;
  const void* v;
  // fp8: the layer's per-head scales [num_kv_heads]; null for bf16.
  const float* k_scale;
  const float* v_scale;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* seq_lens;  // May be null.
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t group;
  int32_t first_seq;
  int32_t window;    // 0 = off; clamped to INT32_MAX.
  float scale_log2;  // scale * log2(e): scores go through exp2.
  // softcap * log2(e), 0 for none (the cap in the same base-2 units).
  float softcap_log2;
};

// ---------------------------------------------------------------------------
// PTX wrappers.

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Eight e4m3 bytes (element i in bits 8i .. 8i + 7) as eight bf16 in 16
// bytes, element 0 lowest: exact (e4m3 -> f16 -> f32 -> bf16 loses nothing:
// every e4m3 value, subnormals included, is a bf16).
__device__ __forceinline__ uint4 Fp8x8ToBf16x8(uint2 bytes) {
  const uint32_t w[2] = {bytes.x, bytes.y};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * h)) & 0xffffu),
          __NV_E4M3)));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      out[2 * i + h] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (the
// source is then not read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src,
                                          bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   SharedAddress(dst)),
               "l"(src), "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SharedAddress(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4],
                                                const void* p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, "
      "[%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SharedAddress(p)));
}

// c += a · b: a 16x16 (row), b 16x8 (col), bf16 in, f32 accumulate.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as bf16x2 (round to nearest even), a in the low half.
__device__ __forceinline__ uint32_t PackBf16(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Shared-memory tiles are rows of kD bf16 in 16-byte chunks; chunk c of row r
// sits at chunk c ^ (r % 8), so the 8 rows an ldmatrix reads at one column
// fall in 8 different bank groups.
template <int kD>
__device__ __forceinline__ int Swizzle(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

// ---------------------------------------------------------------------------
// The kernel. kWarps warps, each owning kMTiles * 16 query rows of the tile.
// With one m tile a warp keeps its q fragments in registers; with two it
// reloads them from shared memory at each k step, and every k / v fragment
// it loads feeds two mma (half the shared-memory traffic per mma).

// kFp8: the cache holds e4m3 bytes. The same kernel then stages each K/V
// tile's raw bytes with cp.async (double buffered, [2][kBlockN][kD] bytes for
// k and v each), and once a tile has landed widens it into one bf16 tile
// ([kBlockN][kD] for k and v each, the layout the bf16 path loads into), so
// everything after is the bf16 kernel's: the same shared bytes in all. The
// head's k scale joins the score's factor, its v scale the output's.
template <int kD, int kWarps, int kMTiles, int kBlockN>
struct FlashTile {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16 * kMTiles;
  static constexpr int kChunks = kD / 8;    // 16-byte chunks a bf16 row.
  static constexpr int kChunks8 = kD / 16;  // 16-byte chunks an fp8 row.
  // q [kBlockM][kD], then k and v [2][kBlockN][kD] each (bf16); fp8: k and v
  // [kBlockN][kD] each (bf16), then their raw [2][kBlockN][kD] bytes: equal.
  static constexpr size_t kSharedBytes =
      (static_cast<size_t>(kBlockM) * kD + 4 * kBlockN * kD) * 2;
};

template <int kD, int kWarps, int kMTiles, int kBlockN, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32)
    FlashPrefillKernel(const FlashParams p) {
  using Tile = FlashTile<kD, kWarps, kMTiles, kBlockN>;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kBlockM = Tile::kBlockM;
  constexpr int kChunks = Tile::kChunks;
  constexpr int kChunks8 = Tile::kChunks8;
  constexpr int kDSteps = kD / 16;       // k16 steps of q·kᵀ.
  constexpr int kNBlocks = kBlockN / 8;  // n8 blocks of S.
  constexpr int kOBlocks = kD / 8;       // n8 blocks of O.
  constexpr bool kQInRegisters = kMTiles == 1;
  static_assert((kBlockN * kChunks) % kThreads == 0, "k/v tile split");
  static_assert(kThreads % kChunks == 0, "one chunk column per thread");
  static_assert((kBlockN * kChunks8) % kThreads == 0, "fp8 k/v tile split");
  static_assert(kThreads % kChunks8 == 0, "one fp8 chunk column per thread");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  // bf16: [2][kBlockN][kD] each; fp8: [kBlockN][kD] each (the widened tile).
  __nv_bfloat16* sk = sq + kBlockM * kD;
  __nv_bfloat16* sv = sk + (kFp8 ? 1 : 2) * kBlockN * kD;
  // fp8 only: the raw tiles, [2][kBlockN][kD] bytes each.
  uint8_t* sk8 = reinterpret_cast<uint8_t*>(sv + kBlockN * kD);
  uint8_t* sv8 = sk8 + 2 * kBlockN * kD;

  const int32_t seq = p.first_seq + static_cast<int32_t>(blockIdx.z);
  const int32_t h = blockIdx.y;
  const int32_t kvh = h / p.group;
  const int32_t row_begin = p.query_start_loc[seq];
  const int32_t query_len = p.query_start_loc[seq + 1] - row_begin;
  // Heaviest (last) query tiles first.
  const int32_t q0 = static_cast<int32_t>(gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (q0 >= query_len) return;  // Uniform over the block.
  const int32_t rows = min(kBlockM, query_len - q0);
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  if (p.seq_lens != nullptr && p.seq_lens[seq] == 0) {
    // A padded sequence: zeros, no cache read.
    for (int i = tid; i < rows * kD; i += kThreads) {
      const int64_t row = static_cast<int64_t>(row_begin) + q0 + i / kD;
      p.out[(row * p.num_heads + h) * kD + i % kD] = 0.0f;
    }
    return;
  }

  const int32_t first_pos = p.context_lens[seq] + q0;
  const int32_t key_lo = p.window > 0 ? max(0, first_pos - p.window + 1) : 0;
  const int32_t key_hi = first_pos + rows - 1;  // Inclusive.
  const int32_t num_tiles = (key_hi - key_lo) / kBlockN + 1;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int32_t bs = p.block_size;

  // K/V tile of keys [tile, tile + kBlockN) into buffer `buf` (fp8: its raw
  // bytes, widened by widen_kv once landed); keys past key_hi are zero
  // (their slots are not read).
  const int chunk = tid % kChunks;
  const int chunk8 = tid % kChunks8;
  auto load_kv = [&](int32_t tile, int buf) {
    if constexpr (kFp8) {
      uint8_t* dk = sk8 + buf * kBlockN * kD;
      uint8_t* dv = sv8 + buf * kBlockN * kD;
#pragma unroll
      for (int r = tid / kChunks8; r < kBlockN; r += kThreads / kChunks8) {
        const int32_t pos = tile + r;
        const bool valid = pos <= key_hi;
        const uint8_t* ksrc = static_cast<const uint8_t*>(p.k);
        const uint8_t* vsrc = static_cast<const uint8_t*>(p.v);
        if (valid) {
          const int64_t slot =
              static_cast<int64_t>(table[pos / bs]) * bs + pos % bs;
          const int64_t off = (slot * p.num_kv_heads + kvh) * kD + chunk8 * 16;
          ksrc += off;
          vsrc += off;
        }
        CpAsync16(dk + r * kD + chunk8 * 16, ksrc, valid);
        CpAsync16(dv + r * kD + chunk8 * 16, vsrc, valid);
      }
    } else {
      __nv_bfloat16* dk = sk + buf * kBlockN * kD;
      __nv_bfloat16* dv = sv + buf * kBlockN * kD;
#pragma unroll
      for (int r = tid / kChunks; r < kBlockN; r += kThreads / kChunks) {
        const int32_t pos = tile + r;
        const bool valid = pos <= key_hi;
        const __nv_bfloat16* ksrc = static_cast<const __nv_bfloat16*>(p.k);
        const __nv_bfloat16* vsrc = static_cast<const __nv_bfloat16*>(p.v);
        if (valid) {
          const int64_t slot =
              static_cast<int64_t>(table[pos / bs]) * bs + pos % bs;
          const int64_t off = (slot * p.num_kv_heads + kvh) * kD + chunk * 8;
          ksrc += off;
          vsrc += off;
        }
        CpAsync16(dk + Swizzle<kD>(r, chunk), ksrc, valid);
        CpAsync16(dv + Swizzle<kD>(r, chunk), vsrc, valid);
      }
    }
  };
  // fp8: raw buffer `buf` (landed for every thread) widened into the bf16
  // tile, 8 elements (one swizzled 16-byte chunk) per step.
  auto widen_kv = [&](int buf) {
    const uint8_t* rk = sk8 + buf * kBlockN * kD;
    const uint8_t* rv = sv8 + buf * kBlockN * kD;
    for (int i = tid; i < kBlockN * kChunks; i += kThreads) {
      const int r = i / kChunks;
      const int c = i % kChunks;
      *reinterpret_cast<uint4*>(sk + Swizzle<kD>(r, c)) =
          Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(rk + r * kD + c * 8));
      *reinterpret_cast<uint4*>(sv + Swizzle<kD>(r, c)) =
          Fp8x8ToBf16x8(*reinterpret_cast<const uint2*>(rv + r * kD + c * 8));
    }
  };
  // fp8: q·k sums times the head's k scale, outputs times its v scale.
  const float score_mul = kFp8 ? p.scale_log2 * p.k_scale[kvh] : p.scale_log2;
  const float out_mul = kFp8 ? p.v_scale[kvh] : 1.0f;

  load_kv(key_lo, 0);
  CpAsyncCommit();

  // The query tile as bf16, zero past `rows`.
  for (int i = tid; i < kBlockM * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      const int64_t row = static_cast<int64_t>(row_begin) + q0 + r;
      const float4* src = reinterpret_cast<const float4*>(
          p.q + (row * p.num_heads + h) * kD + c * 8);
      const float4 a = __ldg(src);
      const float4 b = __ldg(src + 1);
      packed.x = PackBf16(a.x, a.y);
      packed.y = PackBf16(a.z, a.w);
      packed.z = PackBf16(b.x, b.y);
      packed.w = PackBf16(b.z, b.w);
    }
    *reinterpret_cast<uint4*>(sq + Swizzle<kD>(r, c)) = packed;
  }
  __syncthreads();

  // This warp's rows start at warp_row0; m tile mt is rows warp_row0 +
  // 16 mt .. + 15. The q A fragment of (m tile, k step) is loaded by:
  const int warp_row0 = warp * 16 * kMTiles;
  auto load_q = [&](uint32_t(&f)[4], int mt, int kk) {
    LdMatrixX4(f, sq + Swizzle<kD>(warp_row0 + mt * 16 + (lane & 15),
                                   kk * 2 + (lane >> 4)));
  };
  uint32_t qf[kQInRegisters ? kDSteps : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kDSteps; ++kk) load_q(qf[kk], 0, kk);
  }

  // Thread state: per m tile, rows g = lane / 4 and g + 8, columns
  // 2 (lane % 4) and + 1 of every n8 block.
  const int row_in_tile0 = warp_row0 + (lane >> 2);
  float o[kMTiles][kOBlocks][4];
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];  // This thread's columns only.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int b = 0; b < kOBlocks; ++b) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][b][e] = 0.0f;
    }
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  for (int32_t t = 0; t < num_tiles; ++t) {
    const int32_t tile = key_lo + t * kBlockN;
    if (t + 1 < num_tiles) load_kv(tile + kBlockN, (t + 1) & 1);
    CpAsyncCommit();
    CpAsyncWait<1>();  // Tile t has landed (for this thread) ...
    __syncthreads();   // ... and for every thread.
    if constexpr (kFp8) {
      // The bf16 tile was released by the previous iteration's last barrier.
      widen_kv(t & 1);
      __syncthreads();
    }
    const __nv_bfloat16* ck = sk + (kFp8 ? 0 : (t & 1) * kBlockN * kD);
    const __nv_bfloat16* cv = sv + (kFp8 ? 0 : (t & 1) * kBlockN * kD);

    // S = q · kᵀ for this warp's rows and the tile's keys.
    float s[kMTiles][kNBlocks][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int b = 0; b < kNBlocks; ++b) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][b][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kDSteps; ++kk) {
      uint32_t qa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][e] = qf[kk][e];
        } else {
          load_q(qa[mt], mt, kk);
        }
      }
#pragma unroll
      for (int nb = 0; nb < kNBlocks / 2; ++nb) {
        // Matrices: keys nb*16 + 0..7 at dims kk*16 + 0..7 / 8..15, then
        // keys nb*16 + 8..15 likewise: the b0, b1 of n blocks 2nb, 2nb + 1.
        uint32_t b[4];
        LdMatrixX4(b,
                   ck + Swizzle<kD>(nb * 16 + (lane & 7) + ((lane >> 4) << 3),
                                    kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(s[mt][2 * nb], qa[mt], b[0], b[1]);
          Mma(s[mt][2 * nb + 1], qa[mt], b[2], b[3]);
        }
      }
    }

    // Scale to log2 units; mask where some key of the tile is not visible
    // to some row of the block (uniform over the block).
    const bool need_mask =
        tile + kBlockN - 1 > first_pos ||
        (p.window > 0 && tile <= first_pos + kBlockM - 1 - p.window);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int b = 0; b < kNBlocks; ++b) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][b][e] * score_mul;
          if (p.softcap_log2 > 0.0f) x = Softcap(x, p.softcap_log2);
          if (need_mask) {
            const int32_t key = tile + b * 8 + 2 * (lane & 3) + (e & 1);
            const int32_t qp =
                first_pos + row_in_tile0 + mt * 16 + (e >> 1) * 8;
            const bool visible = key <= qp && key <= key_hi &&
                                 (p.window <= 0 || key > qp - p.window);
            if (!visible) x = -INFINITY;
          }
          s[mt][b][e] = x;
        }
      }
    }

    // Online softmax (rows are shared by the 4 lanes of a quad).
    float alphas[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = row_max[mt][i];
#pragma unroll
        for (int b = 0; b < kNBlocks; ++b)
          mx = fmaxf(mx, fmaxf(s[mt][b][2 * i], s[mt][b][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.0f : mx;
        const float alpha = Exp2(row_max[mt][i] - base);  // 0 if it was -inf.
        row_max[mt][i] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int b = 0; b < kNBlocks; ++b) {
          const float p0 = Exp2(s[mt][b][2 * i] - base);
          const float p1 = Exp2(s[mt][b][2 * i + 1] - base);
          s[mt][b][2 * i] = p0;
          s[mt][b][2 * i + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[mt][i] = row_sum[mt][i] * alpha + sum;
        alphas[mt][i] = alpha;
      }
    }
    // Rescale O unless no row's max moved (skipping x1 is exact).
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      moved |= alphas[mt][0] != 1.0f || alphas[mt][1] != 1.0f;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int b = 0; b < kOBlocks; ++b) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][b][e] *= alphas[mt][e >> 1];
        }
      }
    }

    // O += P · v: the S accumulators of n blocks 2kk, 2kk + 1 are the A
    // fragment of keys kk*16 .. kk*16 + 15.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = PackBf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = PackBf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = PackBf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = PackBf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int db = 0; db < kD / 16; ++db) {
        // Transposed matrices: keys kk*16 + 0..7 / 8..15 at dims db*16 +
        // 0..7, then at dims db*16 + 8..15: b0, b1 of n blocks 2db, 2db + 1.
        uint32_t b[4];
        LdMatrixX4Trans(
            b, cv + Swizzle<kD>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                db * 2 + (lane >> 4)));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(o[mt][2 * db], a[mt], b[0], b[1]);
          Mma(o[mt][2 * db + 1], a[mt], b[2], b[3]);
        }
      }
    }
    // Buffer t & 1 is free for tile t + 2 (fp8: and the bf16 tile for the
    // next widening).
    __syncthreads();
  }

  // Normalize and write this thread's rows.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = row_sum[mt][i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int r = row_in_tile0 + mt * 16 + 8 * i;
      if (r >= rows) continue;
      const float inv = (sum > 0.0f ? 1.0f / sum : 0.0f) * out_mul;
      const int64_t row = static_cast<int64_t>(row_begin) + q0 + r;
      float* dst = p.out + (row * p.num_heads + h) * kD + 2 * (lane & 3);
#pragma unroll
      for (int b = 0; b < kOBlocks; ++b) {
        *reinterpret_cast<float2*>(dst + b * 8) =
            make_float2(o[mt][b][2 * i] * inv, o[mt][b][2 * i + 1] * inv);
      }
    }
  }
}

template <int kD, int kWarps, int kMTiles, int kBlockN>
cudaError_t Run(const FlashParams& p, bool fp8, int32_t num_seqs,
                int32_t max_query_len, cudaStream_t stream) {
  using Tile = FlashTile<kD, kWarps, kMTiles, kBlockN>;
  auto* kernel = fp8 ? &FlashPrefillKernel<kD, kWarps, kMTiles, kBlockN, true>
                     : &FlashPrefillKernel<kD, kWarps, kMTiles, kBlockN, false>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Tile::kSharedBytes));
  if (e != cudaSuccess) return e;
  const int64_t tiles =
      (static_cast<int64_t>(max_query_len) + Tile::kBlockM - 1) / Tile::kBlockM;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), p.num_heads, num_seqs);
  kernel<<<grid, Tile::kThreads, Tile::kSharedBytes, stream>>>(p);
  return cudaGetLastError();
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool FlashPrefillSupports(const DeviceKvLayer& cache, const float* q,
                          const float* out) {
  const bool dtype_ok = cache.dtype == KvDType::kBF16 ||
                        (cache.dtype == KvDType::kF8E4M3 &&
                         cache.k_scale != nullptr && cache.v_scale != nullptr);
  return dtype_ok && cache.head_dim == cache.head_dim_v &&
         (cache.head_dim == 64 || cache.head_dim == 128) && Aligned16(q) &&
         Aligned16(out) && Aligned16(cache.k) && Aligned16(cache.v);
}

cudaError_t LaunchFlashPrefillAttention(
    const float* q, int32_t num_heads, const DeviceKvLayer& cache,
    const DeviceAttentionMetadata& m, int32_t first_seq, int32_t end_seq,
    int64_t sliding_window, float scale, float softcap, float* out,
    cudaStream_t stream, FlashPrefillTiles tiles) {
  if (q == nullptr || out == nullptr || cache.k == nullptr ||
      cache.v == nullptr || cache.num_slots <= 0 || cache.num_kv_heads <= 0 ||
      !FlashPrefillSupports(cache, q, out) || num_heads <= 0 ||
      num_heads % cache.num_kv_heads != 0 || num_heads > kMaxGrid ||
      sliding_window < 0 || !(softcap >= 0.0f && softcap < INFINITY) ||
      first_seq < 0 || end_seq < first_seq || end_seq > m.num_seqs ||
      end_seq - first_seq > kMaxGrid || m.block_size <= 0 ||
      m.max_blocks_per_seq <= 0) {
    return cudaErrorInvalidValue;
  }
  const int32_t num_seqs = end_seq - first_seq;
  if (num_seqs == 0) return cudaSuccess;
  if (m.query_start_loc == nullptr || m.context_lens == nullptr ||
      m.block_tables == nullptr || m.max_query_len <= 0) {
    return cudaErrorInvalidValue;
  }
  FlashParams p;
  p.q = q;
  p.out = out;
  p.k = cache.k;
  p.v = cache.v;
  const bool fp8 = cache.dtype == KvDType::kF8E4M3;
  p.k_scale = fp8 ? cache.k_scale : nullptr;
  p.v_scale = fp8 ? cache.v_scale : nullptr;
  p.query_start_loc = m.query_start_loc;
  p.context_lens = m.context_lens;
  p.seq_lens = m.seq_lens;
  p.block_tables = m.block_tables;
  p.max_blocks_per_seq = m.max_blocks_per_seq;
  p.block_size = m.block_size;
  p.num_heads = num_heads;
  p.num_kv_heads = cache.num_kv_heads;
  p.group = num_heads / cache.num_kv_heads;
  p.first_seq = first_seq;
  // A window at least as long as any position is no window at all.
  p.window =
      sliding_window > INT32_MAX / 2 ? 0 : static_cast<int32_t>(sliding_window);
  p.scale_log2 = scale * 1.4426950408889634f;
  p.softcap_log2 = softcap * 1.4426950408889634f;
  const int32_t n = num_seqs, len = m.max_query_len;
  const bool d64 = cache.head_dim == 64;
  switch (tiles) {
    case FlashPrefillTiles::kM64:
      return d64 ? Run<64, 4, 1, 64>(p, fp8, n, len, stream)
                 : Run<128, 4, 1, 64>(p, fp8, n, len, stream);
    case FlashPrefillTiles::kM128:
      return d64 ? Run<64, 8, 1, 64>(p, fp8, n, len, stream)
                 : Run<128, 8, 1, 64>(p, fp8, n, len, stream);
    case FlashPrefillTiles::kM128x2N32:
      return d64 ? Run<64, 4, 2, 32>(p, fp8, n, len, stream)
                 : Run<128, 4, 2, 32>(p, fp8, n, len, stream);
    case FlashPrefillTiles::kM256x2:
      return d64 ? Run<64, 8, 2, 64>(p, fp8, n, len, stream)
                 : Run<128, 8, 2, 64>(p, fp8, n, len, stream);
    case FlashPrefillTiles::kDefault:
    case FlashPrefillTiles::kM128x2:
      break;
  }
  return d64 ? Run<64, 4, 2, 64>(p, fp8, n, len, stream)
             : Run<128, 4, 2, 64>(p, fp8, n, len, stream);
}

}  // namespace cuda
}  // namespace tessera
