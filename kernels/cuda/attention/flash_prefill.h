// Prefill attention on the tensor cores (FlashAttention-2 style) for a bf16
// or fp8 (e4m3, per-head scales) paged KV cache. Same semantics as
// LaunchPrefillAttention (attention_kernels.h): causal varlen attention of
// sequences [first_seq, end_seq) over the cache, which already holds their new
// keys; context_lens > 0 (chunked prefill) shifts each sequence's queries to
// positions context_len .. context_len + query_len - 1; GQA (query head h reads
// kv head h / (num_heads / num_kv_heads)); sliding_window 0 = off, else a query
// at position p sees max(0, p - window + 1) .. p; `scale` multiplies q·k;
// softcap 0 = off, else each scaled score s becomes tanh(s / softcap) *
// softcap (in the kernel's base-2 units: the cap times log2(e)); q
// [num_tokens, num_heads, D] f32 and out [num_tokens, num_heads, D] f32 (only
// the chosen sequences' rows are written; out must not alias q). A sequence
// whose seq_len is 0 (a padded one, when seq_lens is given) gets zeros.
//
// How (default tiles): one block of 4 warps per (tile of 128 query rows,
// head, sequence), each warp 32 rows (two m16 tiles, so every k / v fragment
// it loads feeds two mma), the heaviest causal tiles first. q is rounded to
// bf16 when it is staged in shared memory; keys and values are gathered row
// by row through the block table (any block_size) into shared memory with
// cp.async, in tiles of 64 keys, double buffered (96 KB of shared memory, 2
// blocks an SM); S = q·kᵀ and O += P·v run on mma.sync m16n8k16 (bf16 in, f32
// accumulate) with ldmatrix; the online softmax is f32 (P is rounded to bf16
// for P·v). So the result is the exact softmax attention up to the bf16
// rounding of q and of P: within bf16 tolerance of the CPU reference, not
// bitwise equal to the older f32 kernel. Each (row, head) result depends only
// on its own sequence (batch invariant).
//
// Measured on one H200 (flash_prefill_test's timing, 8 x 4096 tokens causal,
// 32 q / 8 kv heads, block 16): D 128 5.12 ms = 215 TFLOP/s, D 64 3.0 ms =
// 183 TFLOP/s, against 15 and 13 TFLOP/s for the older kernel. ncu: tensor
// pipe 34% busy, 2 warps a scheduler (255 registers, 96 KB shared), stalls
// mostly on fixed-latency dependencies: latency-bound. Beyond this needs
// wgmma with a TMA producer warp and two consumer warpgroups (FA3 style).
//
// fp8: each K/V tile's raw bytes are staged with cp.async (double buffered)
// and, once landed, widened into the bf16 tile the rest of the kernel reads
// (exact: every e4m3 value is a bf16), in the same 96 KB of shared memory;
// the head's k scale multiplies the scores with `scale`, its v scale the
// output. So an fp8 result is the bf16 kernel's on the dequantized values,
// within the same bf16 tolerance of the CPU reference.
//
// DISPATCH RULE (CudaOps::DoPrefillAttention and DoStaticAttention): this path
// runs exactly when FlashPrefillSupports() holds — a bf16 cache, or an fp8
// cache with its scales, with head_dim == head_dim_v in {64, 128} and 16-byte
// aligned q, out, k and v. Everything else (f32 and int8 caches, other head
// dims, D != Dv) stays on
// LaunchPrefillAttention / LaunchStaticAttention in attention_kernels.h. The
// static layout is the paged one with block_size = capacity and one block per
// sequence, so the same kernel serves it. LaunchFlashPrefillAttention never
// falls back: it returns cudaErrorInvalidValue for a case it does not cover.
//
// GQA: the query heads of a group are not packed into one tile. At 128 query
// rows a tile, each K/V tile staged in shared memory already feeds 128 rows
// of mma; the group's other heads read the same K/V rows again from L2 (ncu:
// L2 18%, DRAM 5% busy), and packing would cut the rows per position 4-8x
// for short chunks.
#ifndef TESSERA_KERNELS_CUDA_ATTENTION_FLASH_PREFILL_H_
#define TESSERA_KERNELS_CUDA_ATTENTION_FLASH_PREFILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention/attention_kernels.h"

namespace tessera {
namespace cuda {

// True when LaunchFlashPrefillAttention takes this call (the dispatch rule
// above). Host-only: looks at the cache's dtype, dims and pointers.
bool FlashPrefillSupports(const DeviceKvLayer& cache, const float* q,
                          const float* out);

// Tile shapes, for tuning runs (all pass the same tests); kDefault (=
// kM128x2, the fastest measured) is what CudaOps uses. D 128 on the H200:
// kM64 143, kM128 175, kM128x2 215, kM128x2N32 198, kM256x2 211 TFLOP/s.
enum class FlashPrefillTiles : int {
  kDefault = 0,
  kM64 = 1,        // 64 query rows, 4 warps of 16 rows.
  kM128 = 2,       // 128 query rows, 8 warps of 16 rows.
  kM128x2 = 3,     // 128 query rows, 4 warps of 32 rows.
  kM128x2N32 = 4,  // The same with tiles of 32 keys (not 64).
  kM256x2 = 5,     // 256 query rows, 8 warps of 32 rows.
};

// The contract above. Checks host arguments as LaunchPrefillAttention does
// (plus FlashPrefillSupports) and returns cudaErrorInvalidValue for bad ones;
// otherwise the launch's error. m.max_query_len sizes the grid (an upper
// bound over [first_seq, end_seq) is enough); metadata contents are trusted.
cudaError_t LaunchFlashPrefillAttention(
    const float* q, int32_t num_heads, const DeviceKvLayer& cache,
    const DeviceAttentionMetadata& m, int32_t first_seq, int32_t end_seq,
    int64_t sliding_window, float scale, float softcap, float* out,
    cudaStream_t stream, FlashPrefillTiles tiles = FlashPrefillTiles::kDefault);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_ATTENTION_FLASH_PREFILL_H_
