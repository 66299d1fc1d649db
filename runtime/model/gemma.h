// The Gemma decoders (gemma, gemma2, gemma3_text), written once over the op
// set, as transformers runs GemmaForCausalLM, Gemma2ForCausalLM and
// Gemma3ForCausalLM.
//
//   h = embed(tokens) * normalizer        (sqrt(hidden_size) in the
//                                          embedding's dtype)
//   for each layer:
//     x = norm(h);  q, k, v = x·Wqᵀ, x·Wkᵀ, x·Wvᵀ
//     [gemma3] q, k = norm_per_head(q), norm_per_head(k)
//     q, k = rope(q), rope(k)   (gemma3: the local RoPE on sliding layers,
//                                the global one, with its scaling, elsewhere)
//     a = attention(q, cache; causal, GQA, scale query_pre_attn_scalar^-0.5,
//                   [gemma2/3] a sliding window on sliding layers,
//                   [gemma2] scores soft-capped: cap * tanh(s / cap))·Woᵀ
//     gemma:    h += a;            x = norm(h) (post_attention_layernorm)
//     gemma2/3: h += norm(a);      x = norm(h)          (post_attention_, then
//                                                        pre_feedforward_layernorm)
//     m = (gelu_tanh(x·Wgateᵀ) * x·Wupᵀ)·Wdownᵀ
//     gemma:    h += m
//     gemma2/3: h += norm(m) (post_feedforward_layernorm)
//   logits = norm(h)·Wembedᵀ      (tied by default; lm_head.weight otherwise)
//   [gemma2] logits = cap * tanh(logits / cap)
//
// Every norm is Gemma's RMSNorm, x / rms(x) * (1 + w): the 1 is added to the
// (f32) weights once, when they are bound, and the op set's RmsNorm runs.
//
// As run: as the Llama family (llama.h): q/k/v is one GEMM over their stacked
// rows (and gate/up another), the q/k norms, RoPE and the cache write one
// QkvRopeStore, the activation one GatedLinear, and every residual add is
// fused with the norm that follows it (AddRmsNorm); a sandwich norm of a
// block's output runs in place before the add.
//
// GemmaModel implements Model (model.h); callers create it through the
// registry (registry.h). Its weights are the tensors of GemmaWeightTable.
#ifndef TESSERA_RUNTIME_MODEL_GEMMA_H_
#define TESSERA_RUNTIME_MODEL_GEMMA_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"
#include "runtime/core/workspace.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/decoder.h"
#include "runtime/model/layers.h"
#include "runtime/model/model.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// Every tensor a Gemma shard holds, by its Hugging Face name (the Llama
// family's names, plus gemma2/3's pre_feedforward_layernorm and
// post_feedforward_layernorm and gemma3's q/k norms), split as the Llama
// family's (shard.h). Parts: the embedding, each layer, the head.
WeightTable GemmaWeightTable(const ModelConfig& config, const ShardSpec& shard);

// The embedding normalizer transformers multiplies by: sqrt(hidden_size)
// rounded to f32 (torch.tensor), then to the embedding's dtype (`table`:
// kBF16 rounds to nearest even, anything else stays f32).
float GemmaEmbeddingScale(int64_t hidden_size, DType table);

class GemmaModel : public Model {
 public:
  // The model over a complete weight set of GemmaWeightTable(config, shard)
  // (in `context.ops`' memory), which it takes apart. InvalidArgument when
  // the weights, the communicators and the shard do not match;
  // Unimplemented for a RoPE type this model does not apply.
  static absl::StatusOr<std::unique_ptr<GemmaModel>> Create(
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
  GemmaModel(ModelConfig config, ShardSpec shard, Ops* ops, Communicator* tp,
             Communicator* pp);
  absl::Status Bind(WeightSet& weights);
  absl::Status Layer(int local_layer, const StepBatch& batch,
                     const KvCacheLayer& cache);

  // One decoder layer. Norm weights hold 1 + w.
  struct DecoderLayer {
    Tensor input_norm;  // [H]
    AttentionBlock attention;
    bool local_rope = false;     // gemma3's sliding layers.
    Tensor post_attention_norm;  // [H]
    // gemma2/3 (sandwich norms); absent for gemma.
    std::optional<Tensor> pre_feedforward_norm, post_feedforward_norm;
    GatedMlp mlp;
  };

  ModelConfig config_;
  ShardSpec shard_;
  EmbeddingAndHead ends_;                 // Norm weight: 1 + w.
  std::vector<DecoderLayer> layers_;      // This stage's layers.
  Tensor inv_freq_;                       // The (global) layers' RoPE.
  std::optional<Tensor> local_inv_freq_;  // gemma3's sliding layers'.
  float embed_scale_ = 1.0f;
  float final_softcap_ = 0.0f;  // 0: none.
  Ops* ops_;
  Communicator* tp_;
  Communicator* pp_;
  SingleRankCommunicator single_;  // Stands in for tp_/pp_ in one process.

  std::unique_ptr<HostMemorySource> own_source_;
  std::unique_ptr<PinnableBlockAllocator> own_allocator_;
  PinnableBlockAllocator* allocator_ = nullptr;
  Workspace workspace_;
  int64_t max_step_tokens_ = 0;
  int64_t max_logit_rows_ = 1;
  DecoderScratch scratch_;
  TensorView step_logits_;  // The last step's logits, in the backend.
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_GEMMA_H_
