// SequenceRunner: one sequence at a time over a Model, each with its own
// static-layout KV cache — for tests and tools that want a model's logits
// without an engine, a scheduler or a block manager. It fills its own
// StepInputs (one sequence, max_step_tokens() tokens per step) and runs the
// model's ForwardBatch, so it exercises the same step path as StepRunner.
//
// It lives in runtime/executor, not on Model, because the step inputs are the
// executor's: the model only reads the step arrays it is given.
#ifndef TESSERA_RUNTIME_EXECUTOR_SEQUENCE_RUNNER_H_
#define TESSERA_RUNTIME_EXECUTOR_SEQUENCE_RUNNER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/core/dtype.h"
#include "runtime/executor/step_inputs.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/model.h"

namespace tessera {

// The KV cache of one sequence in the static layout: a KvPool of one block
// whose size is the capacity. Move-only; must not outlive the model's
// allocator.
class KvCache {
 public:
  int64_t capacity() const { return pool_.block_size(); }
  // Number of positions already written (the next token's position).
  int64_t length() const { return length_; }
  void Reset() { length_ = 0; }

 private:
  friend class SequenceRunner;
  KvPool pool_;
  int64_t length_ = 0;
};

class SequenceRunner {
 public:
  // `model` must outlive the runner.
  explicit SequenceRunner(Model* model) : model_(model) {}

  // A static-layout KV cache of `capacity` positions for this rank's part of
  // the model, from the model's allocator.
  absl::StatusOr<KvCache> NewKvCache(int64_t capacity,
                                     DType dtype = DType::kF32) const;

  // Runs `tokens` at positions cache->length() .. + T - 1 (in chunks of the
  // model's max_step_tokens(): chunked prefill) and appends their keys and
  // values to `cache`. On the last pipeline stage it writes the next-token
  // logits of the last position to `logits` [V] (other stages may pass
  // null). InvalidArgument without tokens; OutOfRange if the tokens do not
  // fit the cache or the context. Every rank of a parallel model calls it
  // with the same tokens.
  absl::Status Forward(absl::Span<const int32_t> tokens, KvCache* cache,
                       float* logits);

 private:
  Model* model_;
  std::unique_ptr<StepInputs> inputs_;  // Made on the first Forward.
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_SEQUENCE_RUNNER_H_
