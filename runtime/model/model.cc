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

absl::StatusOr<KvCache> Model::NewKvCache(int64_t capacity, DType dtype) const {
  if (capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache capacity ", capacity));
  }
  KvCache cache;
  ASSIGN_OR_RETURN(cache.pool_, KvPool::Create(kv_pool_shape(dtype), 1,
                                               capacity, allocator()));
  return cache;
}

absl::Status Model::Forward(absl::Span<const int32_t> tokens, KvCache* cache,
                            float* logits) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t start = cache->length_;
  const int64_t context = config().max_position_embeddings;
  if (T == 0) return absl::InvalidArgumentError("Forward: no tokens");
  if (start + T > cache->capacity() || start + T > context) {
    return absl::OutOfRangeError(
        absl::StrCat("Forward: positions ", start, "..", start + T - 1,
                     " exceed the KV cache capacity ", cache->capacity(),
                     " or the context length ", context));
  }
  // Long inputs run in chunks of at most max_step_tokens() (chunked prefill):
  // each chunk appends to the cache, and only the last one produces logits.
  const int64_t chunk = max_step_tokens();
  const int32_t block_table[1] = {0};
  for (int64_t begin = 0; begin < T; begin += chunk) {
    const int64_t end = std::min(T, begin + chunk);
    SequenceSlice slice;
    slice.context_len = start + begin;
    slice.query_len = end - begin;
    slice.block_table = block_table;
    ASSIGN_OR_RETURN(
        AttentionMetadata metadata,
        BuildAttentionMetadata(absl::MakeConstSpan(&slice, 1),
                               static_cast<int32_t>(cache->capacity()), 1));
    const int32_t rows[1] = {static_cast<int32_t>(end - begin - 1)};
    StepBatch batch;
    batch.tokens = tokens.subspan(begin, end - begin);
    batch.metadata = &metadata;
    batch.backend = AttentionBackend::kStatic;
    if (end == T) batch.logit_rows = rows;
    RETURN_IF_ERROR(
        ForwardBatch(batch, cache->pool_, end == T ? logits : nullptr));
    cache->length_ = end + start;
  }
  return absl::OkStatus();
}

}  // namespace tessera
