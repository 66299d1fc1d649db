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

}  // namespace tessera
