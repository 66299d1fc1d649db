// The KV cache's layout as every layer above the pool sees it (no tensor
// memory, no op set: rank 0's engine includes this, never kv_pool.h): the
// cache's element type and per-slot shape (KvPoolShape), which
// attention backend a step uses, how many blocks of what size a rank's pool
// holds (KvLayout), what the user asked for (KvCacheOptions, from flags), and
// how the two meet against the memory a rank has (ResolveKvLayout).
#ifndef TESSERA_RUNTIME_KV_KV_LAYOUT_H_
#define TESSERA_RUNTIME_KV_KV_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/core/dtype.h"

namespace tessera {

// The cache's element type: "float32"/"auto" (the CPU computes in f32),
// "bfloat16" (CUDA), "int8" (per-slot, per-head scales) or "fp8" /
// "fp8_e4m3" (kF8E4M3 with per-layer, per-head scales: kernels/ops.h
// KvCacheLayer). "auto" means f32 here; callers that know the device resolve
// it first.
absl::StatusOr<DType> ParseKvDType(const std::string& name);

struct KvPoolShape {
  int64_t num_layers = 0;    // This rank's layers.
  int64_t num_kv_heads = 0;  // This rank's KV heads.
  int64_t head_dim = 0;
  DType dtype = DType::kF32;  // kF32, kBF16, kI8 or kF8E4M3.

  // Bytes one slot (one token) takes across every layer, K and V, per-slot
  // scales (int8) included. fp8: head_dim bytes per head and side, half of
  // bf16's, so a budget holds twice the tokens.
  int64_t BytesPerSlot() const;
  // Bytes the pool holds whatever its slot count: fp8's per-layer scales (K
  // and V, f32 per KV head); 0 for the other dtypes.
  int64_t FixedBytes() const;
};

// Which attention kernels a step uses (see kernels/ops.h): "paged" runs
// decodes through the paged decode kernel and the other sequences through the
// varlen prefill kernel; "static" expects the static layout (one block per
// sequence) and runs every sequence through the static kernel.
enum class AttentionBackend { kPaged, kStatic };
absl::StatusOr<AttentionBackend> ParseAttentionBackend(const std::string& name);

// The KV cache every rank holds, as the engine must know it.
struct KvLayout {
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  // Static layout: one block per sequence (block_size = the context), no
  // prefix caching.
  bool static_layout = false;
};

// What the user asks for (flags); see ResolveKvLayout.
struct KvCacheOptions {
  int64_t block_size = 16;
  int64_t num_blocks = 0;        // > 0: exactly this many.
  int64_t memory_bytes = 0;      // > 0: this budget.
  double memory_fraction = 0.5;  // Otherwise: this share of free memory.
  DType dtype = DType::kF32;
  AttentionBackend backend = AttentionBackend::kPaged;
};

// How many blocks (and of what size) one rank's pool gets: --num-kv-blocks as
// given; else the budget (memory_bytes, or memory_fraction of
// `free_bytes`), less the pool's fixed bytes (KvPoolShape::FixedBytes),
// divided by the block's bytes, capped at what max_num_seqs full contexts
// could use. In the static layout a block is a whole context
// and num_blocks is the number of sequences. InvalidArgument for bad values;
// ResourceExhausted (with the figures) when the budget holds no block.
absl::StatusOr<KvLayout> ResolveKvLayout(const KvCacheOptions& options,
                                         const KvPoolShape& shape,
                                         int64_t max_model_len,
                                         int max_num_seqs, int64_t free_bytes);

// MemAvailable of this host in bytes (-1 when unknown).
int64_t AvailableHostMemory();

}  // namespace tessera

#endif  // TESSERA_RUNTIME_KV_KV_LAYOUT_H_
