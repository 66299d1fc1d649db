// The Llama-family decoder (llama, mistral, qwen2, qwen3), written once over
// the op set.
//
//   h = embed(tokens)
//   for each layer:
//     x = rms_norm(h);  q, k, v = x·Wqᵀ(+b), x·Wkᵀ(+b), x·Wvᵀ(+b)
//     [qwen3] q, k = rms_norm_per_head(q), rms_norm_per_head(k)
//     q, k = rope(q), rope(k);  append k, v to the cache
//     h += attention(q, cache; causal, GQA, optional sliding window)·Woᵀ(+b)
//     x = rms_norm(h);  h += (silu(x·Wgateᵀ) * x·Wupᵀ)·Wdownᵀ
//   logits = rms_norm(h)·Wlm_headᵀ   (Wlm_head = Wembed when tied)
//
// LlamaModel implements Model (model.h); callers create it through the
// registry (registry.h) and hold a Model. Its weights are the tensors of
// LlamaWeightTable, bound by name from a WeightSet (weights.h).
#ifndef TESSERA_RUNTIME_MODEL_LLAMA_H_
#define TESSERA_RUNTIME_MODEL_LLAMA_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_metadata.h"
#include "kernels/ops.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"
#include "runtime/core/workspace.h"
#include "runtime/kv/kv_layout.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// Weights of one decoder layer; optional tensors are std::nullopt when the
// architecture or the config has none.
struct LlamaLayerWeights {
  Tensor input_norm;  // [H]
  Tensor q_proj;      // [num_heads * D, H]
  Tensor k_proj;      // [num_kv_heads * D, H]
  Tensor v_proj;      // [num_kv_heads * D, H]
  Tensor o_proj;      // [H, num_heads * D]
  std::optional<Tensor> q_bias, k_bias, v_bias, o_bias;
  std::optional<Tensor> q_norm, k_norm;  // [D] (qwen3)
  Tensor post_attention_norm;            // [H]
  Tensor gate_proj;                      // [I, H]
  Tensor up_proj;                        // [I, H]
  Tensor down_proj;                      // [H, I]
  std::optional<Tensor> gate_bias, up_bias, down_bias;
};

// One rank's weights. Shapes below are for the whole model; under tensor
// parallelism each holds its shard (see shard.h): q/k/v/gate/up keep their
// local rows, o/down their local columns, embedding and LM head their
// vocabulary rows [Vp, H].
struct LlamaWeights {
  std::optional<Tensor> embed_tokens;     // [V, H]; first pipeline stage only.
  std::vector<LlamaLayerWeights> layers;  // This stage's layers, in order.
  std::optional<Tensor> final_norm;       // [H]; last stage only.
  // [V, H]; last stage only, and nullopt when tied to embed_tokens on a rank
  // that holds both.
  std::optional<Tensor> lm_head;
};

// Reads every tensor the config implies for `shard`, by its Hugging Face name,
// checking each full shape against the config
// ("model.layers.3.self_attn.k_proj.weight: expected shape [64, 256], found
// [128, 256]") and converting only this rank's slice. A missing tensor is
// NotFound naming it. Tensors the config does not use are ignored.
// `on_part` (optional) is called after each part is read: the embedding, each
// layer, and the head (LlamaWeightParts of them), for a progress bar.
absl::StatusOr<LlamaWeights> LoadLlamaWeights(
    const Checkpoint& checkpoint, const ModelConfig& config,
    const ShardSpec& shard, const std::function<void()>& on_part = {});

// How many times LoadLlamaWeights calls `on_part` for `shard`.
int64_t LlamaWeightParts(const ShardSpec& shard);

// Replaces every host f32 tensor of `weights` by its copy in `ops`' memory:
// matrices as `matrix_dtype` (f32 or bf16), norms and biases as f32. Each host
// tensor is freed as soon as its copy exists.
absl::Status UploadLlamaWeights(LlamaWeights* weights, Ops* ops,
                                DType matrix_dtype);

// The same shapes, zero-filled: for a rank that receives its shard from rank 0.
absl::StatusOr<LlamaWeights> AllocateLlamaWeights(const ModelConfig& config,
                                                  const ShardSpec& shard);

// Visits every tensor a shard holds, in one canonical order (the order rank 0
// sends them in), with a short name for messages.
void ForEachWeight(LlamaWeights* weights,
                   const std::function<void(const std::string&, Tensor*)>& fn);

// Rotary inverse frequencies [head_dim / 2] for the config's rope type,
// computed as transformers does (f32).
absl::StatusOr<Tensor> ComputeRopeInvFreq(const ModelConfig& config);

// Every tensor a Llama-family shard holds, by its Hugging Face name, with its
// full shape as the config implies it and its split (see shard.h): the one
// list of this architecture's weights. Optional tensors (biases, q/k norms)
// are listed when the config has them; a tied LM head is not listed on a
// rank that holds the embedding. Parts: the embedding, each layer, the head.
WeightTable LlamaWeightTable(const ModelConfig& config, const ShardSpec& shard);

class LlamaModel : public Model {
 public:
  // The model over a complete weight set of LlamaWeightTable(config, shard)
  // (in `context.ops`' memory). InvalidArgument when the weights, the
  // communicators and the shard do not match.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      ModelConfig config, ShardSpec shard, WeightSet weights,
      const ModelContext& context);

  // A single-process model. `ops` must outlive the model.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      ModelConfig config, LlamaWeights weights, Ops* ops);

  // One rank's part of a parallel model. `tp` is the tensor-parallel group
  // (size shard.tp_size), `pp` the pipeline group (size shard.pp_size, ranks
  // in stage order); both, like `ops`, must outlive the model.
  // `max_step_tokens` > 0 overrides the default chunk size (see
  // max_step_tokens()); `max_logit_rows` is the most sequences one step
  // samples (the scratch for logits is sized for it).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      ModelConfig config, ShardSpec shard, LlamaWeights weights, Ops* ops,
      Communicator* tp, Communicator* pp, int64_t max_step_tokens = 0,
      int64_t max_logit_rows = 1, PinnableBlockAllocator* allocator = nullptr);

  // Loads config.json and the safetensors of `model_dir` (whole model);
  // max_step_tokens and max_logit_rows as for Create.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(
      const std::string& model_dir, Ops* ops, int64_t max_step_tokens = 0,
      int64_t max_logit_rows = 1, const Placement& placement = {});

  const ModelConfig& config() const override { return config_; }
  const ShardSpec& shard() const override { return shard_; }
  Ops* ops() const override { return ops_; }
  int64_t weight_bytes() const override;
  int64_t max_step_tokens() const override { return max_step_tokens_; }
  int64_t max_logit_rows() const override { return max_logit_rows_; }
  PinnableBlockAllocator* allocator() const override { return allocator_; }
  absl::Status ForwardBatch(const StepBatch& batch, const KvPool& pool,
                            float* logits) override;
  const TensorView& step_logits() const override { return step_logits_; }

 private:
  LlamaModel(ModelConfig config, ShardSpec shard, LlamaWeights weights,
             Tensor inv_freq, Ops* ops, Communicator* tp, Communicator* pp);
  absl::Status BindScratch();
  absl::Status Layer(int local_layer, const StepBatch& batch,
                     const KvCacheLayer& cache);
  absl::Status Head(const TensorView& rows, float* logits);
  // Adds `bias` (if any) to every row of `x` [T, N].
  absl::Status AddBias(const std::optional<Tensor>& bias, const TensorView& x);

  ModelConfig config_;
  ShardSpec shard_;
  LlamaWeights weights_;
  Tensor inv_freq_;
  Ops* ops_;
  Communicator* tp_;
  Communicator* pp_;
  SingleRankCommunicator single_;  // Stands in for tp_/pp_ in one process.

  // Scratch: views into one workspace block, sized for max_step_tokens_ and
  // bound at creation, so a forward pass allocates nothing.
  std::unique_ptr<HostMemorySource> own_source_;
  std::unique_ptr<PinnableBlockAllocator> own_allocator_;
  PinnableBlockAllocator* allocator_ = nullptr;
  Workspace workspace_;
  int64_t max_step_tokens_ = 0;
  int64_t max_logit_rows_ = 1;
  TensorView hidden_, normed_, q_, k_, v_, attn_, proj_, gate_, up_,
      last_hidden_, local_logits_, gathered_logits_, full_logits_;
  int64_t meta_tokens_ = 0;  // Tokens of the step in Head.
  TensorView step_logits_;   // The last step's logits, in the backend.
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_LLAMA_H_
