// What every decoder model file (llama.h, gemma.h) is assembled from besides
// its blocks (layers.h): the weight-table entries and the binding of the
// tensors the families share (embedding, attention, gated MLP, head), the
// step scratch, the checks of a step, the stage input (the embedding or the
// previous pipeline stage) and the vocabulary-parallel LM head. A model file
// keeps its own table order, its layer loop and its norms; these parts hold
// no architecture choice of their own.
#ifndef TESSERA_RUNTIME_MODEL_DECODER_H_
#define TESSERA_RUNTIME_MODEL_DECODER_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"
#include "runtime/core/workspace.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/layers.h"
#include "runtime/model/model.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// ---- The weight table ------------------------------------------------------

// Which optional tensors an attention block's table lists.
struct AttentionTensors {
  bool qkv_bias = false;  // self_attn.{q,k,v}_proj.bias (row-parallel).
  bool o_bias = false;    // self_attn.o_proj.bias (whole on every rank).
  bool qk_norm = false;   // self_attn.{q,k}_norm.weight [head_dim].
};

// The embedding (first stage; vocabulary-parallel): model.embed_tokens.weight.
void AddEmbeddingSpec(const ModelConfig& config, const ShardSpec& shard,
                      int part, WeightTable* table);
// `prefix` ("model.layers.N.") + self_attn.{q,k,v,o}_proj.weight (q/k/v split
// by this rank's heads, o by the matching columns), then the optional tensors
// of `tensors`, in that order.
void AddAttentionSpecs(const ModelConfig& config, const ShardSpec& shard,
                       const std::string& prefix,
                       const AttentionTensors& tensors, int part,
                       WeightTable* table);
// `prefix` + mlp.{gate,up,down}_proj.weight (gate/up split by rows of the
// intermediate dimension, down by its columns), and their biases when `bias`.
void AddGatedMlpSpecs(const ModelConfig& config, const ShardSpec& shard,
                      const std::string& prefix, bool bias, int part,
                      WeightTable* table);
// The last stage's final norm (model.norm.weight) and LM head: lm_head.weight,
// or, tied, nothing on a rank that holds the embedding and the embedding's
// name on one that does not (a pipeline's last stage).
void AddHeadSpecs(const ModelConfig& config, const ShardSpec& shard, int part,
                  WeightTable* table);

// ---- Binding ---------------------------------------------------------------

// Takes a complete WeightSet apart by name into a model's tensors, stacking
// the checkpoint's separate projections of one block into the one matrix (or
// bias) a fused GEMM reads (ConcatRows). The parts are freed as soon as their
// stack exists, so loading holds one layer's parts twice at most.
class WeightBinder {
 public:
  // `ops` stores the stacks (and quantizes for --quantization fp8); `set`
  // must outlive the binder. `quant` says which linear weights are fp8
  // (quantized_weights.h).
  WeightBinder(Ops* ops, WeightSet* set, QuantConfig quant = {})
      : ops_(ops), set_(set), quant_(std::move(quant)) {}

  // InvalidArgument naming the first absent tensor unless the set is complete.
  absl::Status CheckComplete() const;
  bool Has(const std::string& name) const { return set_->Has(name); }
  absl::StatusOr<Tensor> Take(const std::string& name);
  // The tensor when the table lists it, nullopt when it does not.
  absl::StatusOr<std::optional<Tensor>> Optional(const std::string& name);
  // The named tensors' rows, stacked in order.
  absl::StatusOr<Tensor> Stack(std::initializer_list<std::string> names);
  // A linear module's weight (its fp8 scale with it), in the form the model
  // computes with (FinishLinearWeight), and the stack of several.
  absl::StatusOr<Weight> TakeLinear(const std::string& name);
  // A one-value f32 tensor, read back to the host.
  absl::StatusOr<float> TakeScalar(const std::string& name);
  absl::StatusOr<Weight> StackLinear(std::initializer_list<std::string> names);
  // Stack when the table lists all of the names, nullopt when it lists none;
  // InvalidArgument for some but not all (the tables list them together).
  absl::StatusOr<std::optional<Tensor>> StackOptional(
      std::initializer_list<std::string> names);

 private:
  Ops* ops_;
  WeightSet* set_;
  QuantConfig quant_;
  HostStaging staging_;  // One host buffer for every stack (non-host memory).
};

// The tensors AddAttentionSpecs / AddGatedMlpSpecs list under `prefix`, into
// a block's weights (q/k/v and gate/up stacked; the optional tensors when
// listed). A table that lists a fused self_attn.qkv_proj.weight or
// mlp.gate_up_proj.weight instead (Phi3WeightTable) has it taken as the
// stack.
absl::Status BindAttentionWeights(WeightBinder& binder,
                                  const std::string& prefix,
                                  AttentionWeights* weights);
absl::Status BindGatedMlpWeights(WeightBinder& binder,
                                 const std::string& prefix,
                                 GatedMlpWeights* weights);

// The embedding, final norm and LM head of AddEmbeddingSpec / AddHeadSpecs
// as this rank holds them (lm_head stays empty where the tied head is the
// embedding), checked against the shard's stages: InvalidArgument "weights do
// not match the shard's pipeline stage" otherwise.
struct EmbeddingAndHead {
  std::optional<Tensor> embed_tokens;  // First stage.
  std::optional<Tensor> final_norm;    // Last stage.
  std::optional<Tensor> lm_head;       // Last stage; empty when tied here.

  // The LM head's matrix (the embedding when tied on this rank).
  const Tensor& head() const {
    return lm_head.has_value() ? *lm_head : *embed_tokens;
  }
  int64_t bytes() const;
};
absl::StatusOr<std::optional<Tensor>> BindEmbedding(WeightBinder& binder,
                                                    const ShardSpec& shard);
absl::Status BindHead(WeightBinder& binder, const ModelConfig& config,
                      const ShardSpec& shard, EmbeddingAndHead* out);

// ---- Creation and steps ----------------------------------------------------

// Create's checks of the context against the shard: a backend, communicator
// groups of the shard's sizes, max_logit_rows >= 1. InvalidArgument naming
// `model` otherwise.
absl::Status CheckModelContext(const ModelContext& context,
                               const ShardSpec& shard, absl::string_view model);

// The chunk size a model's scratch is sized for without an override:
// min(2048, context).
int64_t DefaultMaxStepTokens(const ModelConfig& config);

// The scratch of a decoder step: views into one workspace block, sized once
// for max_tokens rows (and max_rows sampled rows), so a forward pass
// allocates nothing. f32 throughout.
struct DecoderScratch {
  TensorView hidden;  // [T, H]: the residual stream.
  TensorView normed;  // [T, H]: the next block's input (a norm's output).
  TensorView proj;    // [T, H]: a block's output, its residual add pending.
  AttentionScratch attention;
  GatedMlpScratch mlp;
  TensorView last_hidden;      // [rows, H]: the sampled rows of normed.
  TensorView local_logits;     // [rows, V / tp]: this rank's vocabulary.
  TensorView gathered_logits;  // [tp * rows, V / tp].
  TensorView full_logits;      // [rows, V] (tp > 1; else [1, V], unused).
};

// Named buffers of one workspace, bound together: a model lists its scratch
// (PlanDecoderScratch, plus any of its own), then Bind allocates one block
// and points every view into it.
class ScratchPlan {
 public:
  // Every element is 4 bytes (f32 or int32).
  void Add(std::string name, TensorView* view, Shape shape,
           DType dtype = DType::kF32);
  absl::Status Bind(Workspace* workspace, PinnableBlockAllocator* allocator);

 private:
  struct Buffer {
    std::string name;
    TensorView* view;
    Shape shape;
    DType dtype;
  };
  std::vector<Buffer> buffers_;
};
void PlanDecoderScratch(const ModelConfig& config, const ShardSpec& shard,
                        int64_t max_tokens, int64_t max_rows,
                        DecoderScratch* scratch, ScratchPlan* plan);

// ForwardBatch's checks (model.h): tokens matching the metadata, within
// max_tokens and max_rows, no position beyond the context (OutOfRange), and
// a pool of `expected`'s heads and dims with `local_layers` layers.
absl::Status CheckStepBatch(const StepBatch& batch, const KvPool& pool,
                            const ModelConfig& config, int64_t local_layers,
                            const KvPoolShape& expected, int64_t max_tokens,
                            int64_t max_rows);

// The stage's input rows `hidden` [T, H]: the first stage's embedding of
// `tokens` (vocabulary-parallel at TP: each rank looks up the ids it holds,
// the all-reduce completes every row), or the previous stage's output.
absl::Status EmbedOrReceive(Ops* ops, Communicator* tp, Communicator* pp,
                            const ShardSpec& shard,
                            const std::optional<Tensor>& embed_tokens,
                            const TensorView& tokens, const TensorView& hidden);

// The logits [n, V] of rows `rows` (kI32 [n]) of `normed` [T, H] (the final
// norm's output) through `lm_head` [V / tp, H]: this rank's vocabulary, then
// at TP the gather of every rank's and their concatenation without the
// padding. A view into scratch (local_logits or full_logits), in the
// backend's memory.
absl::StatusOr<TensorView> VocabParallelLogits(Ops* ops, Communicator* tp,
                                               const ShardSpec& shard,
                                               const DecoderScratch& scratch,
                                               const TensorView& normed,
                                               const TensorView& rows,
                                               const Tensor& lm_head);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_DECODER_H_
