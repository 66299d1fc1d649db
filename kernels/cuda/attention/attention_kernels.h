// Raw CUDA launchers for the KV-cache part of the op set: StoreKvCache and the
// paged (prefill, decode) and static attention kernels. Plain C++ types only:
// nvcc compiles the .cu side, and the abseil-facing wrappers turn the returned
// cudaError_t into a Status.
//
// Semantics match kernels/ops.h and the CPU reference (kernels/cpu):
//  - Layouts are row-major; every pointer is a device pointer, including the
//    metadata arrays (the step inputs, runtime/executor/step_inputs.h: fixed
//    buffers filled by one copy per step). No kernel reads host memory and no
//    launcher allocates.
//  - Each (query row, head) result depends only on its own sequence (its
//    metadata, queries and cache): the same sequence gives bitwise the same
//    output whatever batch it runs in.
//  - Accumulation is f32. A bf16 cache is widened to f32 on load; an int8
//    cache is read as int8 and its per-(slot, head) scales are applied to the
//    dot products (k) and to the probabilities (v), as on the CPU; an fp8
//    (e4m3) cache is widened exactly in registers and its per-head scales
//    applied the same way (kernels/ops.h KvCacheLayer).
//  - Launchers check cheap host-side arguments (null pointers, head counts,
//    head dims, grid limits) and return cudaErrorInvalidValue for bad ones;
//    otherwise they return the launch's error (cudaGetLastError). Metadata
//    contents (lengths, block tables, slots) are trusted: they live on the
//    device and are validated where they are built.
#ifndef TESSERA_KERNELS_CUDA_ATTENTION_ATTENTION_KERNELS_H_
#define TESSERA_KERNELS_CUDA_ATTENTION_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tessera {
namespace cuda {

// Largest head_dim / head_dim_v the attention kernels take.
inline constexpr int32_t kMaxAttentionHeadDim = 256;
// Keys per split-K partition of the decode kernel.
inline constexpr int32_t kDecodePartitionSize = 512;

enum class KvDType : int { kF32 = 0, kBF16 = 1, kI8 = 2, kF8E4M3 = 3 };

// Whether a cache of `dtype` carries scales (int8: per slot and head; fp8:
// per head for the layer).
inline constexpr bool KvHasScales(KvDType dtype) {
  return dtype == KvDType::kI8 || dtype == KvDType::kF8E4M3;
}

// One layer's cache on the device: slots [num_slots, num_kv_heads, head_dim]
// for k and [num_slots, num_kv_heads, head_dim_v] for v.
struct DeviceKvLayer {
  void* k = nullptr;  // float, __nv_bfloat16, int8_t or __nv_fp8_e4m3.
  void* v = nullptr;
  // int8: [num_slots, num_kv_heads] (written with the values); fp8:
  // [num_kv_heads] (read only); nullptr for f32 and bf16.
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  KvDType dtype = KvDType::kF32;
  int64_t num_slots = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;
};

// A step's AttentionMetadata (kernels/attention_metadata.h) with its arrays on
// the device; the scalars are host values (they size the grids).
struct DeviceAttentionMetadata {
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  const int32_t* context_lens = nullptr;     // [num_seqs]
  const int32_t* seq_lens = nullptr;         // [num_seqs] (decode reads it)
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  int32_t block_size = 0;
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  int32_t max_query_len = 0;  // Exact maxima over the batch (an upper bound
  int32_t max_seq_len = 0;    // over [first_seq, end_seq) is enough).
  // AttentionMetadata::grid_max_seq_len: the bound the decode grid is sized
  // for (>= every seq_len; the rank's context under a CUDA graph); 0 = use
  // max_seq_len.
  int32_t grid_max_seq_len = 0;
};

// Writes the keys and values of num_tokens tokens to their slots: k [T,
// kv_heads, D] and v [T, kv_heads, Dv] f32, slot_mapping [T] (device) with
// every slot in [0, num_slots) (tokens with a slot outside are skipped). bf16
// rounds to nearest even; int8 quantizes each (token, head) row with scale
// max|x| / 127 (0 and all-zero values for an all-zero row), x / scale rounded
// to nearest (even) and clamped to ±127, bit-exact with the CPU; fp8 stores
// e4m3(x / k_scale[head]) (common/convert.cuh ToFp8E4M3), bit-exact with the
// CPU's F32ToFp8E4M3, and leaves the scales as they are.
cudaError_t LaunchStoreKvCache(const float* k, const float* v,
                               int64_t num_tokens, const int64_t* slot_mapping,
                               const DeviceKvLayer& cache, cudaStream_t stream);

// Causal varlen attention of sequences [first_seq, end_seq) over the cache
// (which already holds their new keys): q [num_tokens, num_heads, D] f32, out
// [num_tokens, num_heads, Dv] f32 (only the chosen sequences' rows are
// written; out must not alias q). GQA: query head h reads kv head
// h / (num_heads / num_kv_heads). sliding_window 0 = off, else a query at
// position p sees positions max(0, p - window + 1) .. p. `scale` multiplies
// q·k; softcap 0 = off, else (> 0) each scaled score s becomes
// tanh(s / softcap) * softcap (common/activation.cuh Softcap) before the
// softmax. Flash-style: tiles of queries and keys, online softmax; D, Dv <=
// 256.
cudaError_t LaunchPrefillAttention(const float* q, int32_t num_heads,
                                   const DeviceKvLayer& cache,
                                   const DeviceAttentionMetadata& m,
                                   int32_t first_seq, int32_t end_seq,
                                   int64_t sliding_window, float scale,
                                   float softcap, float* out,
                                   cudaStream_t stream);

// Bytes of workspace LaunchDecodeAttention needs for up to num_seqs sequences
// of up to max_seq_len positions (0 when no sequence needs more than one
// partition of kDecodePartitionSize keys). CudaOps reserves it once, for the
// rank's most sequences at the full context (ReserveStepScratch), so decode
// never grows it.
size_t DecodeAttentionWorkspaceBytes(int32_t num_seqs, int32_t num_heads,
                                     int32_t head_dim_v, int32_t max_seq_len);

// Decode: every sequence in [first_seq, end_seq) has query_len 1 (trusted).
// Same contract as prefill otherwise. Split-K: each (sequence, head) runs its
// keys in partitions of kDecodePartitionSize, each writing (max, sum, partial
// output) to `workspace`; a second kernel combines them. A sequence with one
// partition is written directly.
//
// Graph-safe: the grid is sized from host values only — the sequence count,
// the heads and G = m.grid_max_seq_len (m.max_seq_len when 0), which must be
// >= every seq_len — so one captured launch serves every step whose lengths
// stay within G. Each block reads its sequence's seq_len and context_len on
// the device and exits when its partition lies beyond them; the combine
// kernel does the same, and partitioning depends on the sequence alone, so
// the output is bitwise the same for any G >= the sequence's length. A
// sequence with seq_len 0 (a padded row of a graph batch) gets zeros and
// reads no block. cudaErrorInvalidValue when workspace_bytes <
// DecodeAttentionWorkspaceBytes(end_seq - first_seq, num_heads, Dv, G)
// (computed with min(G, sliding_window) keys: a window needs less) and more
// than one partition may be needed; the workspace must be 8-byte aligned
// (cudaMalloc's is).
cudaError_t LaunchDecodeAttention(const float* q, int32_t num_heads,
                                  const DeviceKvLayer& cache,
                                  const DeviceAttentionMetadata& m,
                                  int32_t first_seq, int32_t end_seq,
                                  int64_t sliding_window, float scale,
                                  float softcap, float* out, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream);

// Static layout (block_size = capacity, one block per sequence; position p of
// sequence s is slot block_tables[s * max_blocks_per_seq] * block_size + p):
// any query lengths, otherwise the prefill contract.
cudaError_t LaunchStaticAttention(const float* q, int32_t num_heads,
                                  const DeviceKvLayer& cache,
                                  const DeviceAttentionMetadata& m,
                                  int32_t first_seq, int32_t end_seq,
                                  int64_t sliding_window, float scale,
                                  float softcap, float* out,
                                  cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_ATTENTION_ATTENTION_KERNELS_H_
