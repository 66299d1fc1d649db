#include "runtime/kv/kv_pool.h"

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<KvPool> KvPool::Create(const KvPoolShape& shape,
                                      int64_t num_blocks, int64_t block_size,
                                      PinnableBlockAllocator* allocator) {
  if (num_blocks <= 0 || block_size <= 0 || shape.num_layers < 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool of ", num_blocks, " blocks of ", block_size,
                     " tokens, ", shape.num_layers, " layers, ",
                     shape.num_kv_heads, " KV heads of ", shape.head_dim));
  }
  if (shape.dtype != DType::kF32 && shape.dtype != DType::kI8 &&
      shape.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype ", DTypeName(shape.dtype),
                     " is not supported (float32, bfloat16 or int8)"));
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
  return pool;
}

KvPool& KvPool::operator=(KvPool&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = other.allocator_;
    shape_ = other.shape_;
    num_blocks_ = other.num_blocks_;
    block_size_ = other.block_size_;
    layers_ = std::move(other.layers_);
    other.layers_.clear();
    other.allocator_ = nullptr;
  }
  return *this;
}

void KvPool::Release() {
  if (allocator_ == nullptr) return;
  for (KvCacheLayer& L : layers_) {
    for (TensorView* t : {&L.k, &L.v, &L.k_scale, &L.v_scale}) {
      if (t->data() != nullptr) allocator_->Free(t->data()).IgnoreError();
    }
  }
  layers_.clear();
  allocator_ = nullptr;
}

}  // namespace tessera
