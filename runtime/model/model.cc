#include "runtime/model/model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

KvPoolShape Model::kv_pool_shape(DType dtype) const {
  KvPoolShape shape;
  shape.num_layers = shard().end_layer - shard().first_layer;
  shape.num_kv_heads = shard().local_kv_heads;
  shape.head_dim = config().head_dim;
  shape.dtype = dtype;
  return shape;
}

absl::Status ApplyCheckpointKvScales(const Model& model, KvPool* pool) {
  const std::vector<LayerKvScales>& scales = model.checkpoint_kv_scales();
  if (scales.empty() || pool->shape().dtype != DType::kF8E4M3) {
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(scales.size()) != pool->shape().num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's KV scales cover ", scales.size(),
                     " layers, the pool has ", pool->shape().num_layers));
  }
  const size_t heads = static_cast<size_t>(pool->shape().num_kv_heads);
  for (size_t l = 0; l < scales.size(); ++l) {
    const std::vector<float> k(heads, scales[l].k), v(heads, scales[l].v);
    RETURN_IF_ERROR(pool->SetLayerScales(static_cast<int64_t>(l), k, v));
  }
  return absl::OkStatus();
}

}  // namespace tessera
