// KvPool: the tensor memory behind the paged KV cache of one rank — for each
// of its layers a K and a V array of num_blocks * block_size slots (plus
// per-slot scales for int8), taken from the model's allocator once at startup
// and returned when the pool is destroyed. The BlockManager decides which
// slots a sequence uses; the pool only holds them.
#ifndef TESSERA_RUNTIME_KV_KV_POOL_H_
#define TESSERA_RUNTIME_KV_KV_POOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "runtime/core/dtype.h"
#include "runtime/core/memory.h"
#include "runtime/kv/kv_layout.h"

namespace tessera {

class KvPool {
 public:
  // InvalidArgument for a non-positive size or an unsupported dtype;
  // ResourceExhausted (with the sizes) when the allocator cannot hold it.
  static absl::StatusOr<KvPool> Create(const KvPoolShape& shape,
                                       int64_t num_blocks, int64_t block_size,
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
  int64_t bytes() const { return num_slots() * shape_.BytesPerSlot(); }
  // Layer `l` (0 = this rank's first layer).
  const KvCacheLayer& layer(int64_t l) const { return layers_[l]; }

 private:
  void Release();

  PinnableBlockAllocator* allocator_ = nullptr;
  KvPoolShape shape_;
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  std::vector<KvCacheLayer> layers_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_KV_KV_POOL_H_
