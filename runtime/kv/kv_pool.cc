#include "runtime/kv/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<KvPool> KvPool::Create(const KvPoolShape& shape,
                                      int64_t num_blocks, int64_t block_size,
                                      Device* device,
                                      PinnableBlockAllocator* allocator) {
  if (num_blocks <= 0 || block_size <= 0 || shape.num_layers < 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool of ", num_blocks, " blocks of ", block_size,
                     " tokens, ", shape.num_layers, " layers, ",
                     shape.num_kv_heads, " KV heads of ", shape.head_dim));
  }
  if (shape.dtype != DType::kF32 && shape.dtype != DType::kI8 &&
      shape.dtype != DType::kBF16 && shape.dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype ", DTypeName(shape.dtype),
                     " is not supported (float32, bfloat16, int8 or fp8)"));
  }
  if (shape.dtype == DType::kF8E4M3 && device == nullptr) {
    return absl::InvalidArgumentError(
        "an fp8 KV pool needs the device that holds its scales");
  }
  KvPool pool;
  pool.allocator_ = allocator;
  pool.shape_ = shape;
  pool.num_blocks_ = num_blocks;
  pool.block_size_ = block_size;
  const int64_t slots = num_blocks * block_size;
  const Shape values({slots, shape.num_kv_heads, shape.head_dim});
  const Shape scales({slots, shape.num_kv_heads});
  auto allocate = [&](DType dtype,
                      const Shape& s) -> absl::StatusOr<TensorView> {
    const size_t bytes = static_cast<size_t>(s.numel()) * DTypeSize(dtype);
    absl::StatusOr<void*> block = allocator->Allocate(bytes);
    if (!block.ok()) {
      return Annotate(block.status(),
                      absl::StrCat("allocating the KV cache (", num_blocks,
                                   " blocks of ", block_size, " tokens, ",
                                   pool.bytes(), " bytes in all)"));
    }
    return TensorView(*block, dtype, s);
  };
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    KvCacheLayer layer;
    // Pushed before filling so that Release frees whatever was allocated.
    pool.layers_.push_back(layer);
    KvCacheLayer& L = pool.layers_.back();
    ASSIGN_OR_RETURN(L.k, allocate(shape.dtype, values));
    ASSIGN_OR_RETURN(L.v, allocate(shape.dtype, values));
    if (shape.dtype == DType::kI8) {
      ASSIGN_OR_RETURN(L.k_scale, allocate(DType::kF32, scales));
      ASSIGN_OR_RETURN(L.v_scale, allocate(DType::kF32, scales));
    }
  }
  if (shape.dtype == DType::kF8E4M3 && shape.num_layers > 0) {
    // Every layer's K and V scales in one buffer of the device's memory
    // (FixedBytes), 1 until a checkpoint's are set: vLLM's default, under
    // which values beyond ±448 saturate.
    const int64_t heads = shape.num_kv_heads;
    pool.scales_host_.assign(static_cast<size_t>(2 * shape.num_layers * heads),
                             1.0f);
    absl::StatusOr<std::unique_ptr<UploadBuffer>> buffer =
        device->NewUploadBuffer(static_cast<size_t>(shape.FixedBytes()));
    if (!buffer.ok()) {
      return Annotate(buffer.status(), "allocating the fp8 KV cache's scales");
    }
    pool.scales_ = *std::move(buffer);
    float* base = static_cast<float*>(pool.scales_->device());
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      KvCacheLayer& L = pool.layers_[l];
      L.k_scale = TensorView(base + 2 * l * heads, DType::kF32, {heads});
      L.v_scale = TensorView(base + (2 * l + 1) * heads, DType::kF32, {heads});
    }
    RETURN_IF_ERROR(pool.UploadScales());
  }
  return pool;
}

absl::Status KvPool::UploadScales() {
  ASSIGN_OR_RETURN(void* staging, scales_->BeginWrite());
  const size_t bytes = scales_host_.size() * sizeof(float);
  std::memcpy(staging, scales_host_.data(), bytes);
  return Annotate(scales_->Upload(bytes), "copying the fp8 KV cache's scales");
}

absl::Status KvPool::SetLayerScales(int64_t l, absl::Span<const float> k_scale,
                                    absl::Span<const float> v_scale) {
  if (shape_.dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetLayerScales: a ", DTypeName(shape_.dtype),
                     " KV cache has no per-head scales (fp8 only)"));
  }
  const int64_t heads = shape_.num_kv_heads;
  if (l < 0 || l >= shape_.num_layers ||
      static_cast<int64_t>(k_scale.size()) != heads ||
      static_cast<int64_t>(v_scale.size()) != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetLayerScales: layer ", l, " of ", shape_.num_layers,
                     ", ", k_scale.size(), " K and ", v_scale.size(),
                     " V scales for ", heads, " KV heads"));
  }
  for (absl::Span<const float> side : {k_scale, v_scale}) {
    for (const float x : side) {
      // A zero, negative or non-finite scale would store NaN or infinities.
      if (!(std::isfinite(x) && x > 0.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("SetLayerScales: layer ", l, " has a KV scale of ", x,
                         " (scales must be finite and > 0)"));
      }
    }
  }
  std::copy(k_scale.begin(), k_scale.end(),
            scales_host_.begin() + 2 * l * heads);
  std::copy(v_scale.begin(), v_scale.end(),
            scales_host_.begin() + (2 * l + 1) * heads);
  return UploadScales();
}

absl::Span<const float> KvPool::k_scales(int64_t l) const {
  if (scales_host_.empty()) return {};
  return absl::MakeConstSpan(scales_host_)
      .subspan(2 * l * shape_.num_kv_heads, shape_.num_kv_heads);
}

absl::Span<const float> KvPool::v_scales(int64_t l) const {
  if (scales_host_.empty()) return {};
  return absl::MakeConstSpan(scales_host_)
      .subspan((2 * l + 1) * shape_.num_kv_heads, shape_.num_kv_heads);
}

std::vector<void*> KvPool::blocks() const {
  std::vector<void*> out;
  for (const KvCacheLayer& L : layers_) {
    out.push_back(L.k.data());
    out.push_back(L.v.data());
    if (L.per_slot_scales()) {
      out.push_back(L.k_scale.data());
      out.push_back(L.v_scale.data());
    }
  }
  if (scales_ != nullptr) out.push_back(scales_->device());
  return out;
}

KvPool& KvPool::operator=(KvPool&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = other.allocator_;
    shape_ = other.shape_;
    num_blocks_ = other.num_blocks_;
    block_size_ = other.block_size_;
    layers_ = std::move(other.layers_);
    scales_host_ = std::move(other.scales_host_);
    scales_ = std::move(other.scales_);
    other.layers_.clear();
    other.scales_host_.clear();
    other.allocator_ = nullptr;
  }
  return *this;
}

void KvPool::Release() {
  if (allocator_ == nullptr) return;
  for (KvCacheLayer& L : layers_) {
    // fp8's scale views point into scales_, freed with it.
    for (TensorView* t : {&L.k, &L.v}) {
      if (t->data() != nullptr) allocator_->Free(t->data()).IgnoreError();
    }
    if (L.per_slot_scales()) {
      for (TensorView* t : {&L.k_scale, &L.v_scale}) {
        if (t->data() != nullptr) allocator_->Free(t->data()).IgnoreError();
      }
    }
  }
  layers_.clear();
  scales_.reset();
  scales_host_.clear();
  allocator_ = nullptr;
}

}  // namespace tessera
