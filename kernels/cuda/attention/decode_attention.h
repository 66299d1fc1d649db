// Decode attention at memory bandwidth: split-K ("flash-decoding"), GQA-aware,
// graph-safe. Plain C++ types only (nvcc compiles the .cu side).
//
// What it computes is LaunchDecodeAttention's contract (attention_kernels.h):
// every sequence in [first_seq, end_seq) has query_len 1 (trusted); its query
// (row query_start_loc[s]) sits at position seq_lens[s] - 1 and sees the keys
// at positions max(0, seq_lens[s] - window) .. seq_lens[s] - 1 of its own
// sequence. q [num_tokens, num_heads, D] f32, out [num_tokens, num_heads, D]
// f32, accumulation f32. softcap 0 = off, else each scaled score s becomes
// tanh(s / softcap) * softcap before the softmax (computed in the kernel's
// base-2 units: the same cap times log2(e)). A sequence with seq_lens[s] == 0
// (a padded sequence of a graph bucket: attention_metadata.h, graph-safe steps
// 2) gets zeros in its output row and reads no block of the cache.
//
// Which kernel takes which case (CudaOps::DoDecodeAttention dispatches on
// DecodeAttentionSupported, and the rule is tested):
//  - this kernel: an f32, bf16 or fp8 cache, head_dim == head_dim_v in
//    {64, 128}, num_heads / num_kv_heads (the GQA group) <= 8;
//  - everything else (int8 caches, other head dims, D != Dv, groups > 8) stays
//    on the old LaunchDecodeAttention (attention_kernels.h), which takes fp8
//    too.
// fp8 (e4m3, per-head scales): each thread copies 8 bytes (8 elements) of a
// key row and of the value row, so the lanes, sub-warps, registers and ring
// are bf16's with half the bytes; the bytes are widened in registers
// (cvt.rn.f16x2.e4m3x2, exact), the head's k scale joins q's prescale and its
// v scale multiplies the merged output.
//
// How: one CTA per (split slot, kv head, sequence) computes all the group's
// query heads, so each K/V element is read from memory once. Each thread
// copies 16 bytes of a key row and of the value row (cp.async, a row read by
// D*sizeof(T)/16 neighbouring lanes: coalesced) into its own 4-stage ring in
// shared memory, so three stages are in flight while one is computed. Online
// softmax in f32 (base 2); the sub-warps' partial results are merged in
// shared memory in a fixed order.
//
// Measured on one H200 (decode_attention_bench, 2026-12-02; copy 4277.5
// GB/s read + write in the same run): batch 64 x 4096, 32/8 heads, D 128,
// bf16, block 16: 345.9 us = 3104 GB/s of KV, 72.6% of copy (the old kernel
// in the same run: 993.6 us, 25.3%); the same with a grid bound of 32768:
// 345.3 us. f32 cache 87.7%; D 64 (16/8 heads, block 32) 76.8%; group 8 (64/8
// heads) 39.2%, bound by instructions (it spills and does twice the math per
// byte).
//
// Graph safety (attention_metadata.h, graph-safe steps 1): the launch
// configuration depends only on host values fixed for a batch bucket: the
// number of sequences, the head counts and dims, and the key bound max_keys =
// m.grid_max_seq_len (or m.max_seq_len when it is 0), min'd with the window.
// The actual lengths are read on the device. The key range of a sequence is cut
// into splits whose size depends on that sequence's key count alone
// (DecodeSplitKeys), so the result of a sequence is bitwise the same whatever
// the batch, the padding or the grid bound: a graph captured with a large
// grid_max_seq_len replays the eager result exactly. A CTA loops over the
// splits of its sequence with the grid's stride, so a large bound costs few
// idle CTAs.
//
// Workspace: splits' (max, sum, unnormalized output) for sequences with more
// than one split; a combine kernel merges them. Its size depends only on host
// values (DecodeSplitWorkspaceBytes), reserved once by
// CudaOps::ReserveStepScratch for the rank's most sequences at its full
// context, so no step allocates.
#ifndef TESSERA_KERNELS_CUDA_ATTENTION_DECODE_ATTENTION_H_
#define TESSERA_KERNELS_CUDA_ATTENTION_DECODE_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention/attention_kernels.h"

// Host and device (nvcc) both compute the split sizes.
#if defined(__CUDACC__)
#define TESSERA_DECODE_HD __host__ __device__
#else
#define TESSERA_DECODE_HD
#endif

namespace tessera {
namespace cuda {

// Split sizes: a sequence of n keys runs in splits of
// DecodeSplitKeys(n) = max(kDecodeMinSplitKeys, ceil(n / kDecodeMaxSplits)
// rounded up to kDecodeMinSplitKeys) keys, so at most kDecodeMaxSplits.
inline constexpr int32_t kDecodeMinSplitKeys = 256;
inline constexpr int32_t kDecodeMaxSplits = 32;
// The largest GQA group the kernel takes.
inline constexpr int32_t kDecodeMaxGroup = 8;

// Keys per split of a sequence with `num_keys` keys (host and device agree).
TESSERA_DECODE_HD inline int64_t DecodeSplitKeys(int64_t num_keys) {
  const int64_t per = (num_keys + kDecodeMaxSplits - 1) / kDecodeMaxSplits;
  const int64_t rounded = (per + kDecodeMinSplitKeys - 1) /
                          kDecodeMinSplitKeys * kDecodeMinSplitKeys;
  return rounded > kDecodeMinSplitKeys ? rounded : kDecodeMinSplitKeys;
}
// Splits of a sequence with `num_keys` keys (0 for none).
TESSERA_DECODE_HD inline int32_t DecodeNumSplits(int64_t num_keys) {
  if (num_keys <= 0) return 0;
  const int64_t c = DecodeSplitKeys(num_keys);
  return static_cast<int32_t>((num_keys + c - 1) / c);
}

// The most splits any sequence of at most `max_keys` keys has: the
// workspace's stride (DecodeNumSplits is not monotone past
// kDecodeMaxSplits * kDecodeMinSplitKeys keys; this bounds it).
TESSERA_DECODE_HD inline int32_t DecodeMaxSplits(int64_t max_keys) {
  if (max_keys <= 0) return 0;
  const int64_t s = (max_keys + kDecodeMinSplitKeys - 1) / kDecodeMinSplitKeys;
  return static_cast<int32_t>(s < kDecodeMaxSplits ? s : kDecodeMaxSplits);
}

// Whether this kernel takes the case (the dispatch rule above).
bool DecodeAttentionSupported(const DeviceKvLayer& cache, int32_t num_heads);

// Bytes of workspace LaunchSplitDecodeAttention needs for up to num_seqs
// sequences of num_heads heads of head_dim_v, with at most max_keys keys each
// (the grid bound, min'd with the window). 0 when no sequence can need more
// than one split.
size_t DecodeSplitWorkspaceBytes(int32_t num_seqs, int32_t num_heads,
                                 int32_t head_dim_v, int64_t max_keys);

// Decode attention of sequences [first_seq, end_seq) (the contract above).
// cudaErrorInvalidValue for an unsupported case (DecodeAttentionSupported),
// bad host arguments (null pointers, head counts, grid limits), a workspace
// smaller than DecodeSplitWorkspaceBytes(end_seq - first_seq, num_heads, D,
// max_keys) or not 8-byte aligned, and q or out not 16-byte aligned.
// m.seq_lens, m.query_start_loc and m.block_tables are read on the device;
// every seq_len must be <= the grid bound (trusted: keys past it are not read,
// never out of bounds).
cudaError_t LaunchSplitDecodeAttention(
    const float* q, int32_t num_heads, const DeviceKvLayer& cache,
    const DeviceAttentionMetadata& m, int32_t first_seq, int32_t end_seq,
    int64_t sliding_window, float scale, float softcap, float* out,
    void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#undef TESSERA_DECODE_HD

#endif  // TESSERA_KERNELS_CUDA_ATTENTION_DECODE_ATTENTION_H_
