// The Llama-family decoder (llama, mistral, qwen2, qwen3, phi3, and the
// mixtures of experts mixtral, qwen3_moe, qwen2_moe, whose MoE layers run a
// MoeBlock (layers.h) in place of the MLP), written once over the op set.
//
//   h = embed(tokens)
//   for each layer:
//     x = rms_norm(h);  q, k, v = x·Wqᵀ(+b), x·Wkᵀ(+b), x·Wvᵀ(+b)
//     [qwen3] q, k = rms_norm_per_head(q), rms_norm_per_head(k)
//     q, k = rope(q), rope(k);  append k, v to the cache
//     h += attention(q, cache; causal, GQA, optional sliding window)·Woᵀ(+b)
//     x = rms_norm(h);  h += (silu(x·Wgateᵀ) * x·Wupᵀ)·Wdownᵀ
//       [MoE layer] h += moe(x)   (config.h MoeHParams)
//   logits = rms_norm(h)·Wlm_headᵀ   (Wlm_head = Wembed when tied)
//
// As run: q/k/v is one GEMM over their stacked rows (and gate/up another),
// the q/k norms, RoPE and the cache write one QkvRopeStore, the activation
// one GatedActivation, and every residual add is fused with the norm that
// follows it (AddRmsNorm: the post-attention norm, the next layer's input
// norm, the final norm; a stage that is not the last adds the pending MLP
// output before sending). The weight table keeps the checkpoint's separate
// tensors; Bind stacks them.
//
// LlamaModel implements Model (model.h); callers create it through the
// registry (registry.h) and hold a Model. Its weights are the tensors of
// LlamaWeightTable, bound by name from a WeightSet (weights.h).
#ifndef TESSERA_RUNTIME_MODEL_LLAMA_H_
#define TESSERA_RUNTIME_MODEL_LLAMA_H_

#include <functional>
#include <memory>
#include <optional>
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
#include "runtime/model/decoder.h"
#include "runtime/model/layers.h"
#include "runtime/model/model.h"
#include "runtime/model/rope.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// Every tensor a Llama-family shard holds, by its Hugging Face name, with its
// full shape as the config implies it and its split (see shard.h): the one
// list of this architecture's weights. Optional tensors (biases, q/k norms)
// are listed when the config has them; a tied LM head is not listed on a
// rank that holds the embedding. Parts: the embedding, each layer, the head.
// A MoE layer lists its router, its stacked experts under transformers 5's
// in-memory names (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
// [E, H, I]) with the per-expert tensors of published checkpoints as their
// parts (weights.h WeightSpec::parts: either layout loads), and qwen2_moe's
// shared expert and its gate.
WeightTable LlamaWeightTable(const ModelConfig& config, const ShardSpec& shard);

// Phi-3's table: the Llama one (without biases) where each layer's q/k/v and
// gate/up tensors are the checkpoint's fused self_attn.qkv_proj.weight
// [(H + 2 Hkv) D, hidden] and mlp.gate_up_proj.weight [2 I, hidden], split
// by row ranges (this rank's q, k, v rows; its gate, up rows), so Bind takes
// them as the stacked projections.
WeightTable Phi3WeightTable(const ModelConfig& config, const ShardSpec& shard);

class LlamaModel : public Model {
 public:
  // The model over a complete weight set of LlamaWeightTable(config, shard)
  // (in `context.ops`' memory), which it takes apart. InvalidArgument when
  // the weights, the communicators and the shard do not match. Callers use
  // CreateModel (registry.h).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      ModelConfig config, ShardSpec shard, WeightSet weights,
      const ModelContext& context);

  const ModelConfig& config() const override { return config_; }
  const ShardSpec& shard() const override { return shard_; }
  Ops* ops() const override { return ops_; }
  int64_t weight_bytes() const override;
  int64_t workspace_bytes() const override {
    return static_cast<int64_t>(workspace_.total_bytes());
  }
  int64_t max_step_tokens() const override { return max_step_tokens_; }
  int64_t max_logit_rows() const override { return max_logit_rows_; }
  PinnableBlockAllocator* allocator() const override { return allocator_; }
  absl::Status ForwardBatch(const StepBatch& batch, const KvPool& pool,
                            float* logits) override;
  const TensorView& step_logits() const override { return step_logits_; }

 private:
  LlamaModel(ModelConfig config, ShardSpec shard, Tensor inv_freq, Ops* ops,
             Communicator* tp, Communicator* pp);
  // Moves the tensors of `weights` into the layers.
  absl::Status Bind(WeightSet& weights);
  absl::Status BindScratch();
  absl::Status Layer(int local_layer, const StepBatch& batch,
                     const KvCacheLayer& cache);

  // One decoder layer: h += attention(norm(h)); h += mlp(norm(h)).
  struct DecoderLayer {
    Tensor input_norm;  // [H]
    AttentionBlock attention;
    Tensor post_attention_norm;   // [H]
    GatedMlp mlp;                 // A dense layer's.
    std::optional<MoeBlock> moe;  // A MoE layer's (then mlp is empty).
  };

  ModelConfig config_;
  ShardSpec shard_;
  EmbeddingAndHead ends_;             // This stage's embedding and head.
  std::vector<DecoderLayer> layers_;  // This stage's layers.
  Tensor inv_freq_;
  std::optional<Tensor> long_inv_freq_;  // LongRoPE's long-factor table.
  RopeOptions rope_options_;             // Every attention block's.
  float attention_scale_ = 0.0f;         // 0: 1 / sqrt(head_dim).
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
  DecoderScratch scratch_;
  MoeScratch moe_scratch_;  // When the config has experts.
  TensorView step_logits_;  // The last step's logits, in the backend.
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_LLAMA_H_
