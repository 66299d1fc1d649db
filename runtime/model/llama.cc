#include "runtime/model/llama.h"

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// A MoE layer's tensors (see LlamaWeightTable): the router, the stacked
// experts (this rank's slice of each expert's intermediate dimension), and
// qwen2_moe's shared expert and gate.
void AddMoeWeights(const ModelConfig& c, const ShardSpec& s,
                   const std::string& p, int part, WeightTable* t) {
  const int64_t H = c.hidden_size, E = c.moe.num_experts;
  const int64_t I = c.moe.expert_intermediate_size;
  const int64_t local = s.local_expert_intermediate;
  const int64_t ib = s.tp_rank * local, ie = ib + local;
  const bool mixtral = c.arch == Architecture::kMixtral;
  // Published checkpoints: Mixtral's block_sparse_moe.experts.N.w1 (gate),
  // w3 (up), w2 (down); Qwen's mlp.experts.N.gate_proj/up_proj/down_proj.
  const std::string experts =
      p + (mixtral ? "block_sparse_moe.experts." : "mlp.experts.");
  const char* gate = mixtral ? ".w1.weight" : ".gate_proj.weight";
  const char* up = mixtral ? ".w3.weight" : ".up_proj.weight";
  const char* down = mixtral ? ".w2.weight" : ".down_proj.weight";
  std::vector<std::string> gate_up_parts, down_parts;
  for (int64_t e = 0; e < E; ++e) {
    gate_up_parts.push_back(absl::StrCat(experts, e, gate));
    gate_up_parts.push_back(absl::StrCat(experts, e, up));
    down_parts.push_back(absl::StrCat(experts, e, down));
  }
  // transformers 5 names the router mlp.gate for Mixtral too.
  WeightSpec router = Replicated(
      p + (mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight"),
      {E, H}, part);
  if (mixtral)
    router = WithParts(std::move(router), {p + "mlp.gate.weight"}, {E, H});
  t->push_back(std::move(router));
  const std::string gate_up_name = p + "mlp.experts.gate_up_proj";
  const std::string down_name = p + "mlp.experts.down_proj";
  // Without tensor parallelism the whole stacks, read in place; with expert
  // parallelism this rank's whole experts; otherwise its slice of each.
  const bool whole = s.tp_size == 1 || s.expert_parallel;
  const int64_t eb = s.first_expert, ee = s.first_expert + s.local_experts;
  WeightSpec gate_up_spec =
      whole ? ExpertSplit(gate_up_name, {E, 2 * I, H}, eb, ee, part)
            : ExpertSlices(gate_up_name, {E, 2 * I, H}, 0, E, 1,
                           {{ib, ie}, {I + ib, I + ie}}, part);
  WeightSpec down_spec =
      whole ? ExpertSplit(down_name, {E, H, I}, eb, ee, part)
            : ExpertSlices(down_name, {E, H, I}, 0, E, 2, {{ib, ie}}, part);
  t->push_back(
      WithParts(std::move(gate_up_spec), std::move(gate_up_parts), {I, H}));
  t->push_back(WithParts(std::move(down_spec), std::move(down_parts), {H, I}));
  const int64_t Is = c.moe.shared_expert_intermediate_size;
  if (Is > 0) {
    const int64_t sb = s.tp_rank * s.local_shared_intermediate;
    const int64_t se = sb + s.local_shared_intermediate;
    const std::string q = p + "mlp.shared_expert.";
    t->push_back(RowSplit(q + "gate_proj.weight", {Is, H}, sb, se, part));
    t->push_back(RowSplit(q + "up_proj.weight", {Is, H}, sb, se, part));
    t->push_back(ColumnSplit(q + "down_proj.weight", {H, Is}, sb, se, part));
    t->push_back(Replicated(p + "mlp.shared_expert_gate.weight", {1, H}, part));
  }
}

}  // namespace

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
    if (c.moe.sparse(l)) {
      AddMoeWeights(c, s, p, part, &t);
    } else {
      AddGatedMlpSpecs(c, s, p, c.llama.mlp_bias, part, &t);
    }
  }
  if (s.last_stage()) AddHeadSpecs(c, s, part, &t);
  return t;
}

WeightTable Phi3WeightTable(const ModelConfig& c, const ShardSpec& s) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_dim = c.num_heads * D, kv_dim = c.num_kv_heads * D;
  const int64_t q_begin = s.tp_rank * s.local_heads * D;
  const int64_t q_end = q_begin + s.local_heads * D;
  const int64_t kv_begin = s.first_kv_head * D;
  const int64_t kv_end = kv_begin + s.local_kv_heads * D;
  const int64_t i_begin = s.tp_rank * s.local_intermediate;
  const int64_t i_end = i_begin + s.local_intermediate;
  // The Llama table, with each layer's q/k/v and gate/up tensors replaced by
  // Phi-3's fused ones: this rank's q, k and v rows of qkv_proj ([q; k; v]
  // rows), its gate and up rows of gate_up_proj ([gate; up] rows), stacked
  // as AttentionWeights and GatedMlpWeights hold them.
  WeightTable llama = LlamaWeightTable(c, s);
  WeightTable t;
  t.reserve(llama.size());
  for (WeightSpec& spec : llama) {
    absl::string_view layer = spec.name;
    if (absl::ConsumeSuffix(&layer, "self_attn.q_proj.weight")) {
      t.push_back(
          RowRangesSplit(absl::StrCat(layer, "self_attn.qkv_proj.weight"),
                         {q_dim + 2 * kv_dim, H},
                         {{q_begin, q_end},
                          {q_dim + kv_begin, q_dim + kv_end},
                          {q_dim + kv_dim + kv_begin, q_dim + kv_dim + kv_end}},
                         spec.part));
    } else if (absl::ConsumeSuffix(&layer, "mlp.gate_proj.weight")) {
      t.push_back(RowRangesSplit(
          absl::StrCat(layer, "mlp.gate_up_proj.weight"), {2 * I, H},
          {{i_begin, i_end}, {I + i_begin, I + i_end}}, spec.part));
    } else if (!absl::EndsWith(spec.name, "self_attn.k_proj.weight") &&
               !absl::EndsWith(spec.name, "self_attn.v_proj.weight") &&
               !absl::EndsWith(spec.name, "mlp.up_proj.weight")) {
      t.push_back(std::move(spec));
    }
  }
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
  WeightBinder w(ops_, &set, config_.quant);
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
    if (a.weights.kv_scales.has_value()) {
      checkpoint_kv_scales_.push_back(*a.weights.kv_scales);
    }
    a.local_heads = shard_.local_heads;
    a.local_kv_heads = shard_.local_kv_heads;
    a.head_dim = config_.head_dim;
    a.rms_norm_eps = static_cast<float>(config_.rms_norm_eps);
    a.sliding_window = config_.sliding_window_per_layer.empty()
                           ? 0
                           : config_.sliding_window_per_layer[l];
    a.scale = attention_scale_;
    a.rope = rope_options_;
    if (config_.moe.sparse(l)) {
      // The table's names (LlamaWeightTable / AddMoeWeights).
      MoeBlock moe;
      MoeWeights& mw = moe.weights;
      const bool mixtral = config_.arch == Architecture::kMixtral;
      ASSIGN_OR_RETURN(mw.router,
                       w.Take(p + (mixtral ? "block_sparse_moe.gate.weight"
                                           : "mlp.gate.weight")));
      ASSIGN_OR_RETURN(mw.gate_up_proj, w.Take(p + "mlp.experts.gate_up_proj"));
      ASSIGN_OR_RETURN(mw.down_proj, w.Take(p + "mlp.experts.down_proj"));
      if (w.Has(p + "mlp.shared_expert_gate.weight")) {
        const std::string q = p + "mlp.shared_expert.";
        GatedMlpWeights shared;
        ASSIGN_OR_RETURN(
            shared.gate_up_proj,
            w.StackLinear({q + "gate_proj.weight", q + "up_proj.weight"}));
        ASSIGN_OR_RETURN(shared.down_proj,
                         w.TakeLinear(q + "down_proj.weight"));
        mw.shared_expert = std::move(shared);
        ASSIGN_OR_RETURN(mw.shared_expert_gate,
                         w.Optional(p + "mlp.shared_expert_gate.weight"));
      }
      moe.top_k = config_.moe.experts_per_token;
      moe.first_expert = shard_.first_expert;
      moe.renormalize = config_.moe.norm_topk_prob;
      layer.moe = std::move(moe);
    } else {
      RETURN_IF_ERROR(BindGatedMlpWeights(w, p, &layer.mlp.weights));
    }
    layers_.push_back(std::move(layer));
  }
  return BindHead(w, config_, shard_, &ends_);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  RETURN_IF_ERROR(CheckModelContext(context, shard, "LlamaModel"));
  Ops* ops = context.ops;
  ASSIGN_OR_RETURN(RopeTables rope, ComputeRope(config));
  ASSIGN_OR_RETURN(Tensor inv_freq,
                   ops->Upload(rope.inv_freq.view(), DType::kF32));
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(config), shard,
                                                   std::move(inv_freq), ops,
                                                   context.tp, context.pp));
  // The rope's per-sequence tables and factors, which Bind gives every
  // attention block (rope.h).
  model->rope_options_ = rope.options;
  if (rope.long_inv_freq.has_value()) {
    ASSIGN_OR_RETURN(model->long_inv_freq_,
                     ops->Upload(rope.long_inv_freq->view(), DType::kF32));
    model->rope_options_.long_inv_freq = model->long_inv_freq_->view();
  }
  if (rope.softmax_scale_factor != 1.0) {
    model->attention_scale_ = static_cast<float>(
        rope.softmax_scale_factor /
        std::sqrt(static_cast<double>(model->config_.head_dim)));
  }
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
             layer.attention.weights.bytes() +
             (layer.moe.has_value() ? layer.moe->weights.bytes()
                                    : layer.mlp.weights.bytes());
  }
  return bytes;
}

absl::Status LlamaModel::BindScratch() {
  const ModelConfig& c = config_;
  const ShardSpec& s = shard_;
  const int64_t T = max_step_tokens_;
  ScratchPlan plan;
  PlanDecoderScratch(c, s, T, max_logit_rows_, &scratch_, &plan);
  if (c.moe.enabled()) {
    const int64_t E = c.moe.num_experts, k = c.moe.experts_per_token;
    const int64_t experts_bytes = ops_->MoeExpertsScratchBytes(
        T, k, s.local_experts, c.hidden_size, s.local_expert_intermediate);
    const int64_t is = std::max<int64_t>(s.local_shared_intermediate, 1);
    plan.Add("router_logits", &moe_scratch_.router_logits, {T, E});
    plan.Add("topk_ids", &moe_scratch_.topk_ids, {T, k}, DType::kI32);
    plan.Add("topk_weights", &moe_scratch_.topk_weights, {T, k});
    plan.Add("moe_experts", &moe_scratch_.experts, {(experts_bytes + 3) / 4});
    if (c.moe.shared_expert_intermediate_size > 0) {
      plan.Add("shared_gate_up", &moe_scratch_.shared.gate_up, {T, 2 * is});
      plan.Add("shared_act", &moe_scratch_.shared.act, {T, is});
      plan.Add("shared_out", &moe_scratch_.shared_out, {T, c.hidden_size});
      plan.Add("shared_gate", &moe_scratch_.shared_gate, {T, 1});
    }
  }
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
  if (layer.moe.has_value()) {
    return layer.moe->Forward(ops_, tp_, normed, moe_scratch_, proj);
  }
  return layer.mlp.Forward(ops_, tp_, normed, scratch_.mlp, proj);
}

}  // namespace tessera
