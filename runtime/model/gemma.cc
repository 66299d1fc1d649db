#include "runtime/model/gemma.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/core/status.h"
#include "runtime/model/rope.h"

namespace tessera {
namespace {

// Gemma's RMSNorm multiplies by (1 + w) in f32 (transformers: x_norm * (1.0 +
// w.float())). Norm weights are stored as f32 (WeightSpec matrix = false: a
// bf16 checkpoint's value is widened exactly), so adding 1 once here, in f32,
// gives the very factor transformers multiplies by, and the op set's RmsNorm
// (x / rms * w) runs unchanged: no Gemma norm kernel. The weight is small
// ([H] or [D]): one copy to the host and back at load.
absl::StatusOr<Tensor> OnePlus(Ops* ops, const Tensor& w) {
  std::vector<float> host(static_cast<size_t>(w.numel()));
  RETURN_IF_ERROR(ops->CopyToHost(w.view(), host.data()));
  for (float& x : host) x = 1.0f + x;
  return ops->Upload(TensorView(host.data(), DType::kF32, w.shape()),
                     DType::kF32);
}

absl::StatusOr<Tensor> TakeNorm(Ops* ops, WeightBinder& w,
                                const std::string& name) {
  ASSIGN_OR_RETURN(Tensor t, w.Take(name));
  return OnePlus(ops, t);
}

absl::StatusOr<std::optional<Tensor>> TakeOptionalNorm(
    Ops* ops, WeightBinder& w, const std::string& name) {
  ASSIGN_OR_RETURN(std::optional<Tensor> t, w.Optional(name));
  if (!t.has_value()) return t;
  ASSIGN_OR_RETURN(Tensor one_plus, OnePlus(ops, *t));
  return std::optional<Tensor>(std::move(one_plus));
}

// The RoPE types whose inverse frequencies alone describe the rotation
// (ComputeRopeInvFreq); any other is refused rather than half applied.
absl::Status CheckRopeType(const RopeConfig& rope, absl::string_view which) {
  if (rope.scaling == RopeScaling::kNone ||
      rope.scaling == RopeScaling::kLinear ||
      rope.scaling == RopeScaling::kLlama3) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("Gemma: the ", which, " RoPE type is not supported yet"));
}

absl::StatusOr<Tensor> UploadInvFreq(Ops* ops, const ModelConfig& config,
                                     const RopeConfig& rope) {
  ModelConfig one = config;
  one.rope = rope;
  ASSIGN_OR_RETURN(Tensor host, ComputeRopeInvFreq(one));
  return ops->Upload(host.view(), DType::kF32);
}

}  // namespace

WeightTable GemmaWeightTable(const ModelConfig& c, const ShardSpec& s) {
  const GemmaHParams& g = c.gemma;
  const int64_t H = c.hidden_size;
  WeightTable t;
  int part = 0;
  if (s.first_stage()) AddEmbeddingSpec(c, s, part++, &t);
  AttentionTensors attention;
  attention.qkv_bias = attention.o_bias = g.attention_bias;
  attention.qk_norm = g.qk_norm;
  for (int64_t l = s.first_layer; l < s.end_layer; ++l, ++part) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back(Replicated(p + "input_layernorm.weight", {H}, part));
    AddAttentionSpecs(c, s, p, attention, part, &t);
    t.push_back(Replicated(p + "post_attention_layernorm.weight", {H}, part));
    if (g.sandwich_norms) {
      t.push_back(
          Replicated(p + "pre_feedforward_layernorm.weight", {H}, part));
    }
    AddGatedMlpSpecs(c, s, p, /*bias=*/false, part, &t);
    if (g.sandwich_norms) {
      t.push_back(
          Replicated(p + "post_feedforward_layernorm.weight", {H}, part));
    }
  }
  if (s.last_stage()) AddHeadSpecs(c, s, part, &t);
  return t;
}

float GemmaEmbeddingScale(int64_t hidden_size, DType table) {
  // transformers: torch.tensor(hidden_size ** 0.5) (f32), then
  // .to(weight.dtype).
  const float f32 =
      static_cast<float>(std::pow(static_cast<double>(hidden_size), 0.5));
  if (table != DType::kBF16) return f32;
  uint32_t bits;
  std::memcpy(&bits, &f32, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);  // Round to nearest even.
  bits &= 0xffff0000u;
  float bf16;
  std::memcpy(&bf16, &bits, sizeof(bf16));
  return bf16;
}

GemmaModel::GemmaModel(ModelConfig config, ShardSpec shard, Ops* ops,
                       Communicator* tp, Communicator* pp)
    : config_(std::move(config)),
      shard_(shard),
      ops_(ops),
      tp_(tp != nullptr ? tp : &single_),
      pp_(pp != nullptr ? pp : &single_),
      own_source_(std::make_unique<HostMemorySource>()),
      own_allocator_(
          std::make_unique<PinnableBlockAllocator>(own_source_.get())),
      allocator_(own_allocator_.get()),
      max_step_tokens_(DefaultMaxStepTokens(config_)) {}

absl::Status GemmaModel::Bind(WeightSet& set) {
  const GemmaHParams& g = config_.gemma;
  WeightBinder w(ops_, &set, config_.quant);
  RETURN_IF_ERROR(w.CheckComplete());
  ASSIGN_OR_RETURN(ends_.embed_tokens, BindEmbedding(w, shard_));
  // transformers scales q·k by query_pre_attn_scalar^-0.5 (gemma: head_dim),
  // a double rounded to f32 where it multiplies the f32 scores.
  const double scalar = g.query_pre_attn_scalar > 0
                            ? g.query_pre_attn_scalar
                            : static_cast<double>(config_.head_dim);
  const float scale = static_cast<float>(std::pow(scalar, -0.5));
  const GatedActivationKind activation = g.activation == HiddenActivation::kSilu
                                             ? GatedActivationKind::kSilu
                                             : GatedActivationKind::kGeluTanh;
  for (int64_t l = shard_.first_layer; l < shard_.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    DecoderLayer layer;
    ASSIGN_OR_RETURN(layer.input_norm,
                     TakeNorm(ops_, w, p + "input_layernorm.weight"));
    ASSIGN_OR_RETURN(layer.post_attention_norm,
                     TakeNorm(ops_, w, p + "post_attention_layernorm.weight"));
    ASSIGN_OR_RETURN(
        layer.pre_feedforward_norm,
        TakeOptionalNorm(ops_, w, p + "pre_feedforward_layernorm.weight"));
    ASSIGN_OR_RETURN(
        layer.post_feedforward_norm,
        TakeOptionalNorm(ops_, w, p + "post_feedforward_layernorm.weight"));
    if (layer.pre_feedforward_norm.has_value() != g.sandwich_norms ||
        layer.post_feedforward_norm.has_value() != g.sandwich_norms) {
      return absl::InvalidArgumentError(
          absl::StrCat(p,
                       "*_feedforward_layernorm: the weight set does not "
                       "match the config's norms"));
    }
    AttentionBlock& a = layer.attention;
    RETURN_IF_ERROR(BindAttentionWeights(w, p, &a.weights));
    if (a.weights.kv_scales.has_value()) {
      checkpoint_kv_scales_.push_back(*a.weights.kv_scales);
    }
    // Gemma 3's per-head q/k norms are Gemma RMSNorms too.
    for (std::optional<Tensor>* norm : {&a.weights.q_norm, &a.weights.k_norm}) {
      if (norm->has_value()) {
        ASSIGN_OR_RETURN(Tensor one_plus, OnePlus(ops_, **norm));
        *norm = std::move(one_plus);
      }
    }
    a.local_heads = shard_.local_heads;
    a.local_kv_heads = shard_.local_kv_heads;
    a.head_dim = config_.head_dim;
    a.rms_norm_eps = static_cast<float>(config_.rms_norm_eps);
    a.sliding_window = config_.sliding_window_per_layer[l];
    a.scale = scale;
    a.softcap = static_cast<float>(g.attn_logit_softcapping);
    layer.local_rope =
        config_.arch == Architecture::kGemma3 && g.sliding_layer[l];
    RETURN_IF_ERROR(BindGatedMlpWeights(w, p, &layer.mlp.weights));
    layer.mlp.activation = activation;
    layers_.push_back(std::move(layer));
  }
  RETURN_IF_ERROR(BindHead(w, config_, shard_, &ends_));
  if (ends_.final_norm.has_value()) {
    ASSIGN_OR_RETURN(ends_.final_norm, OnePlus(ops_, *ends_.final_norm));
  }
  if (ends_.embed_tokens.has_value()) {
    embed_scale_ =
        GemmaEmbeddingScale(config_.hidden_size, ends_.embed_tokens->dtype());
  }
  final_softcap_ = static_cast<float>(g.final_logit_softcapping);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GemmaModel>> GemmaModel::Create(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  RETURN_IF_ERROR(CheckModelContext(context, shard, "GemmaModel"));
  const bool gemma3 = config.arch == Architecture::kGemma3;
  const int64_t n = config.num_layers;
  if (static_cast<int64_t>(config.sliding_window_per_layer.size()) != n ||
      static_cast<int64_t>(config.gemma.sliding_layer.size()) != n) {
    return absl::InvalidArgumentError(
        "GemmaModel: the config's per-layer tables do not match its layers "
        "(not parsed as a Gemma config)");
  }
  RETURN_IF_ERROR(CheckRopeType(config.rope, gemma3 ? "global" : "model's"));
  Ops* ops = context.ops;
  std::unique_ptr<GemmaModel> model(
      new GemmaModel(config, shard, ops, context.tp, context.pp));
  ASSIGN_OR_RETURN(model->inv_freq_, UploadInvFreq(ops, config, config.rope));
  if (gemma3) {
    RETURN_IF_ERROR(CheckRopeType(config.gemma.rope_local, "local"));
    ASSIGN_OR_RETURN(Tensor local,
                     UploadInvFreq(ops, config, config.gemma.rope_local));
    model->local_inv_freq_ = std::move(local);
  }
  RETURN_IF_ERROR(model->Bind(weights));
  // Binding freed the separate q/k/v and gate/up parts and the raw norms;
  // give their blocks back, so the KV cache, sized from the free memory, can
  // have them.
  if (context.allocator != nullptr) context.allocator->Trim();
  if (context.max_step_tokens > 0) {
    model->max_step_tokens_ = context.max_step_tokens;
  }
  model->max_logit_rows_ = context.max_logit_rows;
  if (context.allocator != nullptr) model->allocator_ = context.allocator;
  ScratchPlan plan;
  PlanDecoderScratch(model->config_, model->shard_, model->max_step_tokens_,
                     model->max_logit_rows_, &model->scratch_, &plan);
  RETURN_IF_ERROR(plan.Bind(&model->workspace_, model->allocator_));
  return model;
}

int64_t GemmaModel::weight_bytes() const {
  int64_t bytes = ends_.bytes();
  for (const DecoderLayer& layer : layers_) {
    bytes += static_cast<int64_t>(layer.input_norm.nbytes() +
                                  layer.post_attention_norm.nbytes()) +
             layer.attention.weights.bytes() + layer.mlp.weights.bytes();
    for (const std::optional<Tensor>* norm :
         {&layer.pre_feedforward_norm, &layer.post_feedforward_norm}) {
      if (norm->has_value()) bytes += static_cast<int64_t>((*norm)->nbytes());
    }
  }
  return bytes;
}

absl::Status GemmaModel::ForwardBatch(const StepBatch& batch,
                                      const KvPool& pool, float* logits) {
  const int64_t local_layers = shard_.end_layer - shard_.first_layer;
  RETURN_IF_ERROR(CheckStepBatch(batch, pool, config_, local_layers,
                                 kv_pool_shape(pool.shape().dtype),
                                 max_step_tokens_, max_logit_rows_));
  const int64_t T = batch.tokens.numel();
  TensorView hidden = scratch_.hidden.Rows(0, T);
  RETURN_IF_ERROR(EmbedOrReceive(ops_, tp_, pp_, shard_, ends_.embed_tokens,
                                 batch.tokens, hidden));
  // The normalizer multiplies the whole lookup (after the vocabulary-parallel
  // sum, which adds zeros to the one rank's row: the same product).
  if (shard_.first_stage()) RETURN_IF_ERROR(ops_->Scale(hidden, embed_scale_));
  // Each layer leaves its (normed) MLP output in proj with the residual add
  // pending: it fuses with the next norm.
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
  TensorView normed = scratch_.normed.Rows(0, T);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const TensorView final_norm = ends_.final_norm->view();
  if (local_layers > 0) {
    RETURN_IF_ERROR(ops_->AddRmsNorm(hidden, proj, final_norm, eps, normed));
  } else {
    RETURN_IF_ERROR(ops_->RmsNorm(hidden, final_norm, eps, normed));
  }
  ASSIGN_OR_RETURN(step_logits_,
                   VocabParallelLogits(ops_, tp_, shard_, scratch_, normed,
                                       batch.logit_rows, ends_.head()));
  if (final_softcap_ > 0.0f) {
    RETURN_IF_ERROR(ops_->Softcap(step_logits_, final_softcap_));
  }
  if (logits == nullptr) return absl::OkStatus();  // They stay on the device.
  return ops_->CopyToHost(step_logits_, logits);
}

absl::Status GemmaModel::Layer(int l, const StepBatch& batch,
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
  const TensorView inv_freq =
      layer.local_rope ? local_inv_freq_->view() : inv_freq_.view();
  RETURN_IF_ERROR(layer.attention.Forward(ops_, tp_, normed, meta,
                                          batch.backend, cache, inv_freq,
                                          scratch_.attention, proj));
  if (layer.pre_feedforward_norm.has_value()) {
    // Sandwich: the attention output is normed before its residual add;
    // then hidden += it, normed = the MLP's input norm (fused).
    RETURN_IF_ERROR(
        ops_->RmsNorm(proj, layer.post_attention_norm.view(), eps, proj));
    RETURN_IF_ERROR(ops_->AddRmsNorm(
        hidden, proj, layer.pre_feedforward_norm->view(), eps, normed));
  } else {
    RETURN_IF_ERROR(ops_->AddRmsNorm(
        hidden, proj, layer.post_attention_norm.view(), eps, normed));
  }
  RETURN_IF_ERROR(layer.mlp.Forward(ops_, tp_, normed, scratch_.mlp, proj));
  if (layer.post_feedforward_norm.has_value()) {
    RETURN_IF_ERROR(
        ops_->RmsNorm(proj, layer.post_feedforward_norm->view(), eps, proj));
  }
  return absl::OkStatus();
}

}  // namespace tessera
