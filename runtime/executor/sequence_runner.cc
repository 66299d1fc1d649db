#include "runtime/executor/sequence_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<KvCache> SequenceRunner::NewKvCache(int64_t capacity,
                                                   DType dtype) const {
  if (capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache capacity ", capacity));
  }
  KvCache cache;
  ASSIGN_OR_RETURN(cache.pool_,
                   KvPool::Create(model_->kv_pool_shape(dtype), 1, capacity,
                                  model_->ops(), model_->allocator()));
  RETURN_IF_ERROR(ApplyCheckpointKvScales(*model_, &cache.pool_));
  return cache;
}

absl::Status SequenceRunner::Forward(absl::Span<const int32_t> tokens,
                                     KvCache* cache, float* logits) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t start = cache->length_;
  const int64_t context = model_->config().max_position_embeddings;
  if (T == 0) return absl::InvalidArgumentError("Forward: no tokens");
  if (start + T > cache->capacity() || start + T > context) {
    return absl::OutOfRangeError(
        absl::StrCat("Forward: positions ", start, "..", start + T - 1,
                     " exceed the KV cache capacity ", cache->capacity(),
                     " or the context length ", context));
  }
  // Long inputs run in chunks of at most model_->max_step_tokens() (chunked
  // prefill): each chunk appends to the cache, and only the last one produces
  // logits.
  const int64_t chunk = model_->max_step_tokens();
  if (inputs_ == nullptr) {
    StepInputsLimits limits;
    limits.max_tokens = chunk;
    limits.max_seqs = 1;
    limits.max_logit_rows = 1;
    limits.max_blocks_per_seq = 1;  // The static layout.
    limits.vocab_size = model_->config().vocab_size;
    ASSIGN_OR_RETURN(inputs_, StepInputs::Create(model_->ops(), limits));
  }
  const int32_t block_table[1] = {0};
  for (int64_t begin = 0; begin < T; begin += chunk) {
    const int64_t end = std::min(T, begin + chunk);
    SequenceSlice slice;
    slice.context_len = start + begin;
    slice.query_len = end - begin;
    slice.block_table = block_table;
    const int32_t rows[1] = {static_cast<int32_t>(end - begin - 1)};
    RETURN_IF_ERROR(inputs_->Fill(absl::MakeConstSpan(&slice, 1),
                                  static_cast<int32_t>(cache->capacity()), 1,
                                  tokens.subspan(begin, end - begin),
                                  end == T ? absl::Span<const int32_t>(rows)
                                           : absl::Span<const int32_t>()));
    StepBatch batch;
    batch.tokens = inputs_->tokens();
    batch.metadata = &inputs_->metadata();
    batch.backend = AttentionBackend::kStatic;
    batch.logit_rows = inputs_->logit_rows();
    RETURN_IF_ERROR(
        model_->ForwardBatch(batch, cache->pool_, end == T ? logits : nullptr));
    cache->length_ = end + start;
  }
  return absl::OkStatus();
}

}  // namespace tessera
