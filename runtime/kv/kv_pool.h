// KvPool: the tensor memory behind the paged KV cache of one rank — for each
// of its layers a K and a V array of num_blocks * block_size slots (plus
// per-slot scales for int8, per-head scales for fp8), taken from the model's
// allocator once at startup and returned when the pool is destroyed. The
// BlockManager decides which slots a sequence uses; the pool only holds them.
#ifndef TESSERA_RUNTIME_KV_KV_POOL_H_
#define TESSERA_RUNTIME_KV_KV_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/upload_buffer.h"
#include "runtime/core/dtype.h"
#include "runtime/core/memory.h"
#include "runtime/kv/kv_layout.h"

namespace tessera {

// One layer's fp8 KV cache scales as a checkpoint gives them (the same for
// every head): stored k = e4m3(k / k_scale), read back times k_scale.
struct LayerKvScales {
  float k = 1.0f;
  float v = 1.0f;
};

class KvPool {
 public:
  // InvalidArgument for a non-positive size or an unsupported dtype;
  // ResourceExhausted (with the sizes) when the allocator cannot hold it.
  // `device` is the backend whose memory `allocator` hands out; an fp8 pool
  // keeps its scales in one UploadBuffer of it (a fixed address a captured
  // graph may read), every scale 1 until SetLayerScales.
  static absl::StatusOr<KvPool> Create(const KvPoolShape& shape,
                                       int64_t num_blocks, int64_t block_size,
                                       Device* device,
                                       PinnableBlockAllocator* allocator);

  KvPool() = default;
  KvPool(KvPool&& other) noexcept { *this = std::move(other); }
  KvPool& operator=(KvPool&& other) noexcept;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool() { Release(); }

  const KvPoolShape& shape() const { return shape_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  int64_t bytes() const {
    return num_slots() * shape_.BytesPerSlot() + shape_.FixedBytes();
  }
  // Layer `l` (0 = this rank's first layer).
  const KvCacheLayer& layer(int64_t l) const { return layers_[l]; }

  // The allocator blocks behind every layer's views (K, V, scales): what a
  // captured graph that reads the cache must pin. fp8's scale views all lie
  // in one block, listed once.
  std::vector<void*> blocks() const;

  // fp8 only: layer `l`'s K and V scales, f32 [num_kv_heads] each (the
  // checkpoint's k_scale / v_scale, split for this rank's heads), every one
  // finite and > 0. The seam for checkpoint-provided scales: call it before
  // any token is written to the layer (values already stored were quantized
  // with the old scales and would be misread), and before graphs are
  // captured or between their replays (it enqueues one copy on the device's
  // stream, ordered before later ops; the views' addresses never change).
  // InvalidArgument for another dtype, a bad layer, size or value.
  absl::Status SetLayerScales(int64_t l, absl::Span<const float> k_scale,
                              absl::Span<const float> v_scale);
  // fp8: the scales SetLayerScales last set (1 at first), [num_kv_heads]
  // each; empty spans for another dtype.
  absl::Span<const float> k_scales(int64_t l) const;
  absl::Span<const float> v_scales(int64_t l) const;

 private:
  // Copies scales_host_ to the device buffer (one copy of every layer's).
  absl::Status UploadScales();
  void Release();

  PinnableBlockAllocator* allocator_ = nullptr;
  KvPoolShape shape_;
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  std::vector<KvCacheLayer> layers_;
  // fp8: layer l's K scales at [2 l * H, (2 l + 1) * H), its V scales next
  // (H = num_kv_heads), on the host and in `scales_`.
  std::vector<float> scales_host_;
  std::unique_ptr<UploadBuffer> scales_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_KV_KV_POOL_H_
