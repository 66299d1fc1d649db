#include "runtime/model/llama.h"

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

WeightTable LlamaWeightTable(const ModelConfig& c, const ShardSpec& s) {
  WeightTable t;
  int part = 0;
  if (s.first_stage()) AddEmbeddingSpec(c, s, part++, &t);
  AttentionTensors attention;
  attention.qkv_bias = c.llama.attention_bias;
  attention.o_bias = c.llama.attention_out_bias;
  attention.qk_norm = c.llama.qk_norm;
  for (int64_t l = s.first_layer; l < s.end_layer; ++l, ++part) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back(
        Replicated(p + "input_layernorm.weight", {c.hidden_size}, part));
    AddAttentionSpecs(c, s, p, attention, part, &t);
    t.push_back(Replicated(p + "post_attention_layernorm.weight",
                           {c.hidden_size}, part));
    AddGatedMlpSpecs(c, s, p, c.llama.mlp_bias, part, &t);
  }
  if (s.last_stage()) AddHeadSpecs(c, s, part, &t);
  return t;
}

LlamaModel::LlamaModel(ModelConfig config, ShardSpec shard, Tensor inv_freq,
                       Ops* ops, Communicator* tp, Communicator* pp)
    : config_(std::move(config)),
      shard_(shard),
      inv_freq_(std::move(inv_freq)),
      ops_(ops),
      tp_(tp != nullptr ? tp : &single_),
      pp_(pp != nullptr ? pp : &single_),
      own_source_(std::make_unique<HostMemorySource>()),
      own_allocator_(
          std::make_unique<PinnableBlockAllocator>(own_source_.get())),
      allocator_(own_allocator_.get()),
      max_step_tokens_(DefaultMaxStepTokens(config_)) {}

absl::Status LlamaModel::Bind(WeightSet& set) {
  WeightBinder w(ops_, &set);
  RETURN_IF_ERROR(w.CheckComplete());
  ASSIGN_OR_RETURN(ends_.embed_tokens, BindEmbedding(w, shard_));
  for (int64_t l = shard_.first_layer; l < shard_.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    DecoderLayer layer;
    ASSIGN_OR_RETURN(layer.input_norm, w.Take(p + "input_layernorm.weight"));
    ASSIGN_OR_RETURN(layer.post_attention_norm,
                     w.Take(p + "post_attention_layernorm.weight"));
    AttentionBlock& a = layer.attention;
    RETURN_IF_ERROR(BindAttentionWeights(w, p, &a.weights));
    a.local_heads = shard_.local_heads;
    a.local_kv_heads = shard_.local_kv_heads;
    a.head_dim = config_.head_dim;
    a.rms_norm_eps = static_cast<float>(config_.rms_norm_eps);
    a.sliding_window = config_.sliding_window_per_layer.empty()
                           ? 0
                           : config_.sliding_window_per_layer[l];
    RETURN_IF_ERROR(BindGatedMlpWeights(w, p, &layer.mlp.weights));
    layers_.push_back(std::move(layer));
  }
  return BindHead(w, config_, shard_, &ends_);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  RETURN_IF_ERROR(CheckModelContext(context, shard, "LlamaModel"));
  Ops* ops = context.ops;
  ASSIGN_OR_RETURN(Tensor host_inv_freq, ComputeRopeInvFreq(config));
  ASSIGN_OR_RETURN(Tensor inv_freq,
                   ops->Upload(host_inv_freq.view(), DType::kF32));
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(config), shard,
                                                   std::move(inv_freq), ops,
                                                   context.tp, context.pp));
  RETURN_IF_ERROR(model->Bind(weights));
  // Binding freed the separate q/k/v and gate/up parts; give their blocks
  // back, so the KV cache, sized from the free memory, can have them.
  if (context.allocator != nullptr) context.allocator->Trim();
  if (context.max_step_tokens > 0) {
    model->max_step_tokens_ = context.max_step_tokens;
  }
  model->max_logit_rows_ = context.max_logit_rows;
  if (context.allocator != nullptr) model->allocator_ = context.allocator;
  RETURN_IF_ERROR(model->BindScratch());
  return model;
}

int64_t LlamaModel::weight_bytes() const {
  int64_t bytes = ends_.bytes();
  for (const DecoderLayer& layer : layers_) {
    bytes += static_cast<int64_t>(layer.input_norm.nbytes() +
                                  layer.post_attention_norm.nbytes()) +
             layer.attention.weights.bytes() + layer.mlp.weights.bytes();
  }
  return bytes;
}

absl::Status LlamaModel::BindScratch() {
  ScratchPlan plan;
  PlanDecoderScratch(config_, shard_, max_step_tokens_, max_logit_rows_,
                     &scratch_, &plan);
  return plan.Bind(&workspace_, allocator_);
}

absl::Status LlamaModel::ForwardBatch(const StepBatch& batch,
                                      const KvPool& pool, float* logits) {
  const ModelConfig& c = config_;
  const int64_t local_layers = shard_.end_layer - shard_.first_layer;
  RETURN_IF_ERROR(CheckStepBatch(batch, pool, c, local_layers,
                                 kv_pool_shape(pool.shape().dtype),
                                 max_step_tokens_, max_logit_rows_));
  const int64_t T = batch.tokens.numel();
  TensorView hidden = scratch_.hidden.Rows(0, T);
  RETURN_IF_ERROR(EmbedOrReceive(ops_, tp_, pp_, shard_, ends_.embed_tokens,
                                 batch.tokens, hidden));
  // Each layer leaves its MLP output in proj with the residual add pending:
  // it fuses with the next norm (the next layer's input norm, or the final
  // norm), so every layer boundary is one AddRmsNorm.
  for (int64_t l = 0; l < local_layers; ++l) {
    RETURN_IF_ERROR(Layer(static_cast<int>(l), batch, pool.layer(l)));
  }
  TensorView proj = scratch_.proj.Rows(0, T);
  if (!shard_.last_stage()) {
    if (local_layers > 0) RETURN_IF_ERROR(ops_->Add(hidden, proj, hidden));
    return pp_->Send(hidden, shard_.pp_stage + 1);
  }
  if (batch.logit_rows.numel() == 0) {  // An earlier prefill chunk.
    step_logits_ = TensorView();
    return absl::OkStatus();
  }
  // The final norm over every row (fused with the last residual add), then
  // the sampled rows' logits.
  TensorView normed = scratch_.normed.Rows(0, T);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const TensorView final_norm = ends_.final_norm->view();
  if (local_layers > 0) {
    RETURN_IF_ERROR(ops_->AddRmsNorm(hidden, proj, final_norm, eps, normed));
  } else {
    RETURN_IF_ERROR(ops_->RmsNorm(hidden, final_norm, eps, normed));
  }
  ASSIGN_OR_RETURN(step_logits_,
                   VocabParallelLogits(ops_, tp_, shard_, scratch_, normed,
                                       batch.logit_rows, ends_.head()));
  if (logits == nullptr) return absl::OkStatus();  // They stay on the device.
  return ops_->CopyToHost(step_logits_, logits);
}

absl::Status LlamaModel::Layer(int l, const StepBatch& batch,
                               const KvCacheLayer& cache) {
  const DecoderLayer& layer = layers_[l];
  const AttentionMetadata& meta = *batch.metadata;
  const int64_t T = meta.num_tokens;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  TensorView hidden = scratch_.hidden.Rows(0, T);
  TensorView normed = scratch_.normed.Rows(0, T);
  TensorView proj = scratch_.proj.Rows(0, T);
  if (l == 0) {
    RETURN_IF_ERROR(
        ops_->RmsNorm(hidden, layer.input_norm.view(), eps, normed));
  } else {
    // hidden += the previous layer's MLP output; normed = this input norm.
    RETURN_IF_ERROR(
        ops_->AddRmsNorm(hidden, proj, layer.input_norm.view(), eps, normed));
  }
  RETURN_IF_ERROR(
      layer.attention.Forward(ops_, tp_, normed, meta, batch.backend, cache,
                              inv_freq_.view(), scratch_.attention, proj));
  // hidden += attention output; normed = the MLP's input norm (fused).
  RETURN_IF_ERROR(ops_->AddRmsNorm(
      hidden, proj, layer.post_attention_norm.view(), eps, normed));
  // The MLP output stays in proj: its residual add fuses with the next norm
  // (see ForwardBatch).
  return layer.mlp.Forward(ops_, tp_, normed, scratch_.mlp, proj);
}

}  // namespace tessera
