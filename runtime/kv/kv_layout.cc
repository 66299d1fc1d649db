#include "runtime/kv/kv_layout.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// a * b, or InvalidArgument naming `what` when it does not fit int64.
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b,
                                   absl::string_view what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", what, " (", a, " x ", b,
                     ") overflows a 64-bit count; lower --max-model-len or "
                     "--max-num-seqs"));
  }
  return out;
}

}  // namespace

absl::StatusOr<DType> ParseKvDType(const std::string& name) {
  if (name == "auto" || name == "float32" || name == "f32") return DType::kF32;
  if (name == "int8") return DType::kI8;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV cache dtype '", name,
                   "' (expected auto, float32, bfloat16, int8 or fp8)"));
}

int64_t KvPoolShape::BytesPerSlot() const {
  // Saturates (at INT64_MAX) rather than wrapping: sizing then fails cleanly.
  int64_t per_head = 0, per_side = 0, per_layer = 0, total = 0;
  if (__builtin_mul_overflow(head_dim, static_cast<int64_t>(DTypeSize(dtype)),
                             &per_head) ||
      __builtin_add_overflow(per_head, dtype == DType::kI8 ? 4 : 0,
                             &per_head) ||
      __builtin_mul_overflow(num_kv_heads, per_head, &per_side) ||
      __builtin_mul_overflow(per_side, int64_t{2}, &per_layer) ||
      __builtin_mul_overflow(num_layers, per_layer, &total)) {
    return std::numeric_limits<int64_t>::max();
  }
  return total;
}

int64_t KvPoolShape::FixedBytes() const {
  if (dtype != DType::kF8E4M3) return 0;
  // K and V scales, f32 per KV head, per layer. Saturates like BytesPerSlot.
  int64_t per_layer = 0, total = 0;
  if (__builtin_mul_overflow(num_kv_heads, int64_t{2 * sizeof(float)},
                             &per_layer) ||
      __builtin_mul_overflow(num_layers, per_layer, &total)) {
    return std::numeric_limits<int64_t>::max();
  }
  return total;
}

absl::StatusOr<AttentionBackend> ParseAttentionBackend(
    const std::string& name) {
  if (name == "paged") return AttentionBackend::kPaged;
  if (name == "static") return AttentionBackend::kStatic;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown attention backend '", name, "' (expected paged or static)"));
}

int64_t AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

absl::StatusOr<KvLayout> ResolveKvLayout(const KvCacheOptions& o,
                                         const KvPoolShape& shape,
                                         int64_t max_model_len,
                                         int max_num_seqs, int64_t free_bytes) {
  if (o.block_size < 1 || o.num_blocks < 0 || o.memory_bytes < 0 ||
      !(o.memory_fraction > 0.0 && o.memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: block size ", o.block_size, ", ", o.num_blocks, " blocks, ",
        o.memory_bytes, " bytes, fraction ", o.memory_fraction,
        " (need block size >= 1, counts >= 0, fraction in (0, 1])"));
  }
  if (max_model_len < 1 || max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: context ", max_model_len, ", ", max_num_seqs,
                     " sequences (need both >= 1)"));
  }
  KvLayout layout;
  layout.static_layout = o.backend == AttentionBackend::kStatic;
  layout.block_size = layout.static_layout ? max_model_len : o.block_size;
  // The default pool is never larger than what the scheduler can ever hold:
  // max_num_seqs sequences of a whole context each (a tiny model with a
  // short --max-model-len takes that much, not a share of the memory).
  ASSIGN_OR_RETURN(
      const int64_t most_useful,
      CheckedMul(max_num_seqs, CeilDiv(max_model_len, layout.block_size),
                 "max_num_seqs x blocks per context"));
  if (o.num_blocks > 0) {
    layout.num_blocks = o.num_blocks;
    return layout;
  }
  ASSIGN_OR_RETURN(const int64_t block_bytes,
                   CheckedMul(layout.block_size, shape.BytesPerSlot(),
                              "the bytes of one block"));
  int64_t budget = o.memory_bytes;
  if (budget == 0) {
    if (free_bytes < 0) {
      return absl::FailedPreconditionError(
          "cannot read the free memory to size the KV cache; give "
          "--kv-cache-memory or --num-kv-blocks");
    }
    budget = static_cast<int64_t>(static_cast<double>(free_bytes) *
                                  o.memory_fraction);
  }
  // What the blocks may take: the budget less the pool's fixed part.
  const int64_t fixed = shape.FixedBytes();
  const int64_t for_blocks = budget > fixed ? budget - fixed : 0;
  layout.num_blocks = std::min(most_useful, for_blocks / block_bytes);
  if (layout.num_blocks < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV cache budget of ", budget, " bytes holds no block of ",
        layout.block_size, " tokens (", block_bytes,
        " bytes); raise --kv-cache-memory or lower --block-size"));
  }
  return layout;
}

}  // namespace tessera
