// Model: the seam between a decoder architecture and everything that runs it
// (the executor's step runner, the rank assembly, tests and tools).
//
// A Model owns one rank's weights (in the backend's memory) and scratch sized
// at creation, so a step allocates nothing. It does not own sequences:
// ForwardBatch runs one step of many sequences over a KvPool (paged or static
// layout, described by the step's AttentionMetadata; the executor fills the
// step's arrays: runtime/executor/step_runner for the engine,
// runtime/executor/sequence_runner for one sequence at a time in tests and
// tools). Callers never name an architecture: they create models through
// registry.h and hold a Model.
#ifndef TESSERA_RUNTIME_MODEL_MODEL_H_
#define TESSERA_RUNTIME_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_metadata.h"
#include "kernels/ops.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"
#include "runtime/kv/kv_layout.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"

namespace tessera {

// One forward step over a batch of sequences. Its arrays are step arrays in
// the backend's memory (kernels/ops.h), checked where they were filled
// (runtime/executor/step_inputs.h).
struct StepBatch {
  TensorView tokens;  // kI32 [num_tokens], metadata order.
  const AttentionMetadata* metadata = nullptr;
  AttentionBackend backend = AttentionBackend::kPaged;
  // kI32 [n]: rows of `tokens` whose next-token logits are wanted (each
  // sampled sequence's last token), in the order the logits are written.
  TensorView logit_rows;
};

// Where a model loaded from a folder lives when not in host memory.
struct ModelPlacement {
  // The backend's memory for scratch and KV (null: host memory owned by
  // the model).
  PinnableBlockAllocator* allocator = nullptr;
  // The dtype of matrices (projections, embedding, head) in the backend:
  // kF32, or kBF16 on a backend that computes with it. Norms and biases are
  // f32.
  DType matrix_dtype = DType::kF32;
  // Called after each part of the weights is stored (the embedding, each
  // layer, the head), for a progress bar.
  std::function<void()> on_weight_part;
  // > 0: serve this context instead of max_position_embeddings (LimitContext
  // in config.h; config() then reports it).
  int64_t max_model_len = 0;
};

// What a model is built over besides its config, shard and weights.
struct ModelContext {
  Ops* ops = nullptr;  // Required; must outlive the model.
  // The tensor-parallel group (size shard.tp_size) and the pipeline group
  // (size shard.pp_size, ranks in stage order); null in one process. Both
  // must outlive the model.
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  // > 0 overrides the default chunk size, min(2048, context) (see
  // Model::max_step_tokens).
  int64_t max_step_tokens = 0;
  // The most sequences one step samples (the logits scratch is sized for
  // it); >= 1.
  int64_t max_logit_rows = 1;
  // The backend's memory for scratch and KV (null: host memory owned by the
  // model).
  PinnableBlockAllocator* allocator = nullptr;
};

class Model {
 public:
  using Placement = ModelPlacement;

  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  // Which part of the model this rank holds.
  virtual const ShardSpec& shard() const = 0;
  virtual Ops* ops() const = 0;

  // Bytes of weights this rank holds.
  virtual int64_t weight_bytes() const = 0;
  // Bytes of the activation scratch the model took from its allocator when
  // it was built (its Workspace), for the memory breakdown.
  virtual int64_t workspace_bytes() const = 0;

  // The most tokens one forward step computes at once: longer inputs
  // (prompts) are run in chunks of this size; the scratch is sized for it.
  virtual int64_t max_step_tokens() const = 0;
  // The most sequences one step takes logits of.
  virtual int64_t max_logit_rows() const = 0;

  // The allocator behind the model's working memory (the KV pool comes from
  // it too), and its statistics.
  virtual PinnableBlockAllocator* allocator() const = 0;
  AllocatorStats memory_stats() const { return allocator()->stats(); }

  // The shape of this rank's KV cache: its layers, KV heads and head size.
  virtual KvPoolShape kv_pool_shape(DType dtype) const;

  // Runs one step: every sequence of `batch.metadata` at its positions,
  // writing their keys and values to their slots of `pool` (which must have
  // this rank's kv_pool_shape). On the last pipeline stage it writes the
  // logits of batch.logit_rows to `logits` [logit_rows.size(), V]; other
  // stages pass their hidden states on and may give logits = nullptr. Every
  // rank of the job calls it with the same batch. InvalidArgument when the
  // step has more than max_step_tokens() tokens or max_logit_rows() logit
  // rows, or a position beyond the context. The arrays' values (token ids,
  // slots, rows) are not read here: StepInputs::Fill checked them.
  // `logits` may be null: the logits then stay in the backend's memory as
  // step_logits() (a GPU samples them there).
  virtual absl::Status ForwardBatch(const StepBatch& batch, const KvPool& pool,
                                    float* logits) = 0;
  // The last step's logits [logit_rows, V] in the backend's memory (last
  // stage), valid until the next step.
  virtual const TensorView& step_logits() const = 0;

  // An fp8 checkpoint's KV cache scales (QuantConfig::kv_cache_scales), one
  // per layer of this rank in order; empty when the checkpoint has none.
  const std::vector<LayerKvScales>& checkpoint_kv_scales() const {
    return checkpoint_kv_scales_;
  }

 protected:
  std::vector<LayerKvScales> checkpoint_kv_scales_;
};

// Gives an fp8 `pool` (of `model`'s kv_pool_shape) the checkpoint's KV
// scales, every head of a layer its layer's; nothing for another dtype or a
// checkpoint without scales. Call it before any token is stored.
absl::Status ApplyCheckpointKvScales(const Model& model, KvPool* pool);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_MODEL_H_
