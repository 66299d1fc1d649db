#include "runtime/model/llama.h"

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size,
                D = c.head_dim;
  const int64_t q_dim = c.num_heads * D, kv_dim = c.num_kv_heads * D;
  // This rank's slices.
  const int64_t q_begin = s.tp_rank * s.local_heads * D;
  const int64_t q_end = q_begin + s.local_heads * D;
  const int64_t kv_begin = s.first_kv_head * D;
  const int64_t kv_end = kv_begin + s.local_kv_heads * D;
  const int64_t i_begin = s.tp_rank * s.local_intermediate;
  const int64_t i_end = i_begin + s.local_intermediate;
  const int64_t v_begin = std::min(V, s.first_vocab_id);
  const int64_t v_end = std::min(V, s.first_vocab_id + s.vocab_per_rank);
  const int64_t v_pad = s.vocab_per_rank - (v_end - v_begin);
  WeightTable t;
  int part = 0;
  if (s.first_stage()) {
    t.push_back(VocabSplit("model.embed_tokens.weight", {V, H}, v_begin, v_end,
                           v_pad, part++));
  }
  // Row-parallel biases (o, down) are added once, after the all-reduce, so
  // every rank holds them whole.
  for (int64_t l = s.first_layer; l < s.end_layer; ++l, ++part) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back(Replicated(p + "input_layernorm.weight", {H}, part));
    t.push_back(RowSplit(p + "self_attn.q_proj.weight", {q_dim, H}, q_begin,
                         q_end, part));
    t.push_back(RowSplit(p + "self_attn.k_proj.weight", {kv_dim, H}, kv_begin,
                         kv_end, part));
    t.push_back(RowSplit(p + "self_attn.v_proj.weight", {kv_dim, H}, kv_begin,
                         kv_end, part));
    t.push_back(ColumnSplit(p + "self_attn.o_proj.weight", {H, q_dim}, q_begin,
                            q_end, part));
    if (c.llama.attention_bias) {
      t.push_back(
          RowSplit(p + "self_attn.q_proj.bias", {q_dim}, q_begin, q_end, part));
      t.push_back(RowSplit(p + "self_attn.k_proj.bias", {kv_dim}, kv_begin,
                           kv_end, part));
      t.push_back(RowSplit(p + "self_attn.v_proj.bias", {kv_dim}, kv_begin,
                           kv_end, part));
    }
    if (c.llama.attention_out_bias) {
      t.push_back(Replicated(p + "self_attn.o_proj.bias", {H}, part));
    }
    if (c.llama.qk_norm) {
      t.push_back(Replicated(p + "self_attn.q_norm.weight", {D}, part));
      t.push_back(Replicated(p + "self_attn.k_norm.weight", {D}, part));
    }
    t.push_back(Replicated(p + "post_attention_layernorm.weight", {H}, part));
    if (c.moe.sparse(l)) {
      AddMoeWeights(c, s, p, part, &t);
      continue;
    }
    t.push_back(
        RowSplit(p + "mlp.gate_proj.weight", {I, H}, i_begin, i_end, part));
    t.push_back(
        RowSplit(p + "mlp.up_proj.weight", {I, H}, i_begin, i_end, part));
    t.push_back(
        ColumnSplit(p + "mlp.down_proj.weight", {H, I}, i_begin, i_end, part));
    if (c.llama.mlp_bias) {
      t.push_back(
          RowSplit(p + "mlp.gate_proj.bias", {I}, i_begin, i_end, part));
      t.push_back(RowSplit(p + "mlp.up_proj.bias", {I}, i_begin, i_end, part));
      t.push_back(Replicated(p + "mlp.down_proj.bias", {H}, part));
    }
  }
  if (s.last_stage()) {
    t.push_back(Replicated("model.norm.weight", {H}, part));
    const bool reuse_embedding = c.tie_word_embeddings && s.first_stage();
    if (!reuse_embedding) {
      const char* name = c.tie_word_embeddings ? "model.embed_tokens.weight"
                                               : "lm_head.weight";
      t.push_back(VocabSplit(name, {V, H}, v_begin, v_end, v_pad, part));
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
      max_step_tokens_(
          std::min<int64_t>(2048, config_.max_position_embeddings)) {}

absl::Status LlamaModel::Bind(WeightSet& set) {
  if (!set.complete()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the weight set lacks ", set.first_missing()));
  }
  // Optional tensors (biases, q/k norms) are bound when the table lists them.
  auto opt =
      [&set](const std::string& name) -> absl::StatusOr<std::optional<Tensor>> {
    if (!set.Has(name)) return std::optional<Tensor>();
    ASSIGN_OR_RETURN(Tensor t, set.Take(name));
    return std::optional<Tensor>(std::move(t));
  };
  // The checkpoint's separate projections of one layer, stacked into the one
  // matrix (or bias) a fused GEMM reads (ConcatRows); the parts are freed as
  // soon as the stack exists, so loading holds one layer's parts twice at
  // most.
  HostStaging staging;  // One host buffer for every stack (non-host memory).
  auto stack =
      [this, &set, &staging](
          std::initializer_list<std::string> names) -> absl::StatusOr<Tensor> {
    std::vector<Tensor> parts;
    std::vector<const Tensor*> ptrs;
    for (const std::string& name : names) {
      ASSIGN_OR_RETURN(Tensor t, set.Take(name));
      parts.push_back(std::move(t));
    }
    for (const Tensor& t : parts) ptrs.push_back(&t);
    return ConcatRows(ops_, ptrs, &staging);
  };
  // Biases: all of them or none (the table lists them together).
  auto stack_optional = [&set, &stack](std::initializer_list<std::string> names)
      -> absl::StatusOr<std::optional<Tensor>> {
    size_t present = 0;
    for (const std::string& name : names) present += set.Has(name) ? 1 : 0;
    if (present == 0) return std::optional<Tensor>();
    if (present != names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the weight set has some but not all of the biases stacked with ",
          *names.begin()));
    }
    ASSIGN_OR_RETURN(Tensor t, stack(names));
    return std::optional<Tensor>(std::move(t));
  };
  if (shard_.first_stage()) {
    ASSIGN_OR_RETURN(embed_tokens_, opt("model.embed_tokens.weight"));
  }
  for (int64_t l = shard_.first_layer; l < shard_.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    DecoderLayer layer;
    ASSIGN_OR_RETURN(layer.input_norm, set.Take(p + "input_layernorm.weight"));
    ASSIGN_OR_RETURN(layer.post_attention_norm,
                     set.Take(p + "post_attention_layernorm.weight"));
    AttentionBlock& a = layer.attention;
    AttentionWeights& aw = a.weights;
    ASSIGN_OR_RETURN(aw.qkv_proj, stack({p + "self_attn.q_proj.weight",
                                         p + "self_attn.k_proj.weight",
                                         p + "self_attn.v_proj.weight"}));
    ASSIGN_OR_RETURN(aw.o_proj, set.Take(p + "self_attn.o_proj.weight"));
    ASSIGN_OR_RETURN(aw.qkv_bias,
                     stack_optional({p + "self_attn.q_proj.bias",
                                     p + "self_attn.k_proj.bias",
                                     p + "self_attn.v_proj.bias"}));
    ASSIGN_OR_RETURN(aw.o_bias, opt(p + "self_attn.o_proj.bias"));
    ASSIGN_OR_RETURN(aw.q_norm, opt(p + "self_attn.q_norm.weight"));
    ASSIGN_OR_RETURN(aw.k_norm, opt(p + "self_attn.k_norm.weight"));
    a.local_heads = shard_.local_heads;
    a.local_kv_heads = shard_.local_kv_heads;
    a.head_dim = config_.head_dim;
    a.rms_norm_eps = static_cast<float>(config_.rms_norm_eps);
    a.sliding_window = config_.sliding_window_per_layer.empty()
                           ? 0
                           : config_.sliding_window_per_layer[l];
    if (config_.moe.sparse(l)) {
      // The table's names (LlamaWeightTable / AddMoeWeights).
      MoeBlock moe;
      MoeWeights& w = moe.weights;
      const bool mixtral = config_.arch == Architecture::kMixtral;
      ASSIGN_OR_RETURN(w.router,
                       set.Take(p + (mixtral ? "block_sparse_moe.gate.weight"
                                             : "mlp.gate.weight")));
      ASSIGN_OR_RETURN(w.gate_up_proj,
                       set.Take(p + "mlp.experts.gate_up_proj"));
      ASSIGN_OR_RETURN(w.down_proj, set.Take(p + "mlp.experts.down_proj"));
      if (set.Has(p + "mlp.shared_expert_gate.weight")) {
        const std::string q = p + "mlp.shared_expert.";
        GatedMlpWeights shared;
        ASSIGN_OR_RETURN(shared.gate_up_proj,
                         stack({q + "gate_proj.weight", q + "up_proj.weight"}));
        ASSIGN_OR_RETURN(shared.down_proj, set.Take(q + "down_proj.weight"));
        w.shared_expert = std::move(shared);
        ASSIGN_OR_RETURN(w.shared_expert_gate,
                         opt(p + "mlp.shared_expert_gate.weight"));
      }
      moe.top_k = config_.moe.experts_per_token;
      moe.first_expert = shard_.first_expert;
      moe.renormalize = config_.moe.norm_topk_prob;
      layer.moe = std::move(moe);
      layers_.push_back(std::move(layer));
      continue;
    }
    GatedMlpWeights& m = layer.mlp.weights;
    ASSIGN_OR_RETURN(m.gate_up_proj, stack({p + "mlp.gate_proj.weight",
                                            p + "mlp.up_proj.weight"}));
    ASSIGN_OR_RETURN(m.down_proj, set.Take(p + "mlp.down_proj.weight"));
    ASSIGN_OR_RETURN(m.gate_up_bias, stack_optional({p + "mlp.gate_proj.bias",
                                                     p + "mlp.up_proj.bias"}));
    ASSIGN_OR_RETURN(m.down_bias, opt(p + "mlp.down_proj.bias"));
    layers_.push_back(std::move(layer));
  }
  ASSIGN_OR_RETURN(final_norm_, opt("model.norm.weight"));
  if (shard_.last_stage() &&
      !(config_.tie_word_embeddings && embed_tokens_.has_value())) {
    // A tied head on a rank without the embedding is listed under the
    // embedding's name (see LlamaWeightTable).
    ASSIGN_OR_RETURN(
        lm_head_, opt(config_.tie_word_embeddings ? "model.embed_tokens.weight"
                                                  : "lm_head.weight"));
  }
  if (shard_.first_stage() != embed_tokens_.has_value() ||
      shard_.last_stage() != final_norm_.has_value() ||
      (shard_.last_stage() && !lm_head_.has_value() &&
       !embed_tokens_.has_value())) {
    return absl::InvalidArgumentError(
        "weights do not match the shard's pipeline stage");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  Ops* ops = context.ops;
  if (ops == nullptr) {
    return absl::InvalidArgumentError("LlamaModel::Create: no backend");
  }
  if ((context.tp != nullptr ? context.tp->size() : 1) != shard.tp_size ||
      (context.pp != nullptr ? context.pp->size() : 1) != shard.pp_size) {
    return absl::InvalidArgumentError(
        "communicator group sizes do not match the shard's tp and pp");
  }
  if (context.max_logit_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_logit_rows ", context.max_logit_rows, " must be >= 1"));
  }
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
  int64_t bytes = 0;
  for (const std::optional<Tensor>* t :
       {&embed_tokens_, &final_norm_, &lm_head_}) {
    if (t->has_value()) bytes += static_cast<int64_t>((*t)->nbytes());
  }
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
  const int64_t D = c.head_dim;
  // A model whose every layer is MoE has no dense MLP to hold scratch for.
  const int64_t dense_i = c.moe.any_dense() ? s.local_intermediate : 1;
  struct Spec {
    const char* name;
    TensorView* view;
    Shape shape;
    DType dtype = DType::kF32;
  };
  std::vector<Spec> specs = {
      {"hidden", &hidden_, {T, c.hidden_size}},
      {"normed", &normed_, {T, c.hidden_size}},
      {"qkv",
       &attention_scratch_.qkv,
       {T, (s.local_heads + 2 * s.local_kv_heads) * D}},
      {"q", &attention_scratch_.q, {T, s.local_heads, D}},
      {"attn", &attention_scratch_.attn, {T, s.local_heads, D}},
      {"proj", &proj_, {T, c.hidden_size}},
      {"gate_up", &mlp_scratch_.gate_up, {T, 2 * dense_i}},
      {"act", &mlp_scratch_.act, {T, dense_i}},
      {"last_hidden", &last_hidden_, {max_logit_rows_, c.hidden_size}},
      {"local_logits", &local_logits_, {max_logit_rows_, s.vocab_per_rank}},
      {"gathered_logits",
       &gathered_logits_,
       {s.tp_size * max_logit_rows_, s.vocab_per_rank}},
      {"full_logits",
       &full_logits_,
       {s.tp_size > 1 ? max_logit_rows_ : 1, c.vocab_size}},
  };
  if (c.moe.enabled()) {
    const int64_t E = c.moe.num_experts, k = c.moe.experts_per_token;
    const int64_t experts_bytes = ops_->MoeExpertsScratchBytes(
        T, k, s.local_experts, c.hidden_size, s.local_expert_intermediate);
    const int64_t is = std::max<int64_t>(s.local_shared_intermediate, 1);
    specs.push_back({"router_logits", &moe_scratch_.router_logits, {T, E}});
    specs.push_back({"topk_ids", &moe_scratch_.topk_ids, {T, k}, DType::kI32});
    specs.push_back({"topk_weights", &moe_scratch_.topk_weights, {T, k}});
    specs.push_back(
        {"moe_experts", &moe_scratch_.experts, {(experts_bytes + 3) / 4}});
    if (c.moe.shared_expert_intermediate_size > 0) {
      specs.push_back(
          {"shared_gate_up", &moe_scratch_.shared.gate_up, {T, 2 * is}});
      specs.push_back({"shared_act", &moe_scratch_.shared.act, {T, is}});
      specs.push_back(
          {"shared_out", &moe_scratch_.shared_out, {T, c.hidden_size}});
      specs.push_back({"shared_gate", &moe_scratch_.shared_gate, {T, 1}});
    }
  }
  // Every element is 4 bytes (f32 or int32).
  for (const Spec& spec : specs) {
    RETURN_IF_ERROR(workspace_.RegisterBuffer(
        spec.name, static_cast<size_t>(spec.shape.numel()) * sizeof(float)));
  }
  RETURN_IF_ERROR(workspace_.FinalizeAndBind(allocator_));
  for (const Spec& spec : specs) {
    ASSIGN_OR_RETURN(*spec.view,
                     workspace_.View(spec.name, spec.dtype, spec.shape));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::ForwardBatch(const StepBatch& batch,
                                      const KvPool& pool, float* logits) {
  const ModelConfig& c = config_;
  const AttentionMetadata* meta = batch.metadata;
  const int64_t T = batch.tokens.numel();
  if (meta == nullptr || meta->num_tokens != T || T == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardBatch: ", T, " tokens do not match the attention metadata"));
  }
  if (T > max_step_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBatch: ", T,
                     " tokens in one step, the model's "
                     "scratch holds ",
                     max_step_tokens_));
  }
  const int64_t rows = batch.logit_rows.numel();
  if (rows > max_logit_rows_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardBatch: logits for ", rows,
        " sequences, the model's scratch holds ", max_logit_rows_));
  }
  if (meta->max_seq_len > c.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat(
        "ForwardBatch: a sequence reaches ", meta->max_seq_len,
        " positions, beyond the context length ", c.max_position_embeddings));
  }
  const int64_t local_layers = shard_.end_layer - shard_.first_layer;
  const KvPoolShape expected = kv_pool_shape(pool.shape().dtype);
  if (pool.shape().num_layers != local_layers ||
      pool.shape().num_kv_heads != expected.num_kv_heads ||
      pool.shape().head_dim != expected.head_dim ||
      pool.block_size() != meta->block_size) {
    return absl::InvalidArgumentError(
        "ForwardBatch: the KV pool was built for another model, shard or "
        "block size");
  }
  // Stage input: the embedding (vocabulary-parallel: each TP rank looks up the
  // ids it holds, the sum completes every row) or the previous stage's output.
  TensorView hidden = hidden_.Rows(0, T);
  if (shard_.first_stage()) {
    if (shard_.tp_size == 1) {
      RETURN_IF_ERROR(
          ops_->Embedding(embed_tokens_->view(), batch.tokens, hidden));
    } else {
      RETURN_IF_ERROR(ops_->EmbeddingShard(embed_tokens_->view(), batch.tokens,
                                           shard_.first_vocab_id, hidden));
      RETURN_IF_ERROR(tp_->AllReduceSum(hidden));
    }
  } else {
    RETURN_IF_ERROR(pp_->Recv(hidden, shard_.pp_stage - 1));
  }
  // Each layer leaves its MLP output in proj_ with the residual add pending:
  // it fuses with the next norm (the next layer's input norm, or the final
  // norm), so every layer boundary is one AddRmsNorm.
  for (int64_t l = 0; l < local_layers; ++l) {
    RETURN_IF_ERROR(Layer(static_cast<int>(l), batch, pool.layer(l)));
  }
  TensorView proj = proj_.Rows(0, T);
  if (!shard_.last_stage()) {
    if (local_layers > 0) RETURN_IF_ERROR(ops_->Add(hidden, proj, hidden));
    return pp_->Send(hidden, shard_.pp_stage + 1);
  }
  if (rows == 0) {  // An earlier prefill chunk: no logits this step.
    step_logits_ = TensorView();
    return absl::OkStatus();
  }
  // The final norm over every row (fused with the last residual add), then
  // the sampled rows' logits.
  TensorView normed = normed_.Rows(0, T);
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (local_layers > 0) {
    RETURN_IF_ERROR(
        ops_->AddRmsNorm(hidden, proj, final_norm_->view(), eps, normed));
  } else {
    RETURN_IF_ERROR(ops_->RmsNorm(hidden, final_norm_->view(), eps, normed));
  }
  meta_tokens_ = T;
  return Head(batch.logit_rows, logits);
}

absl::Status LlamaModel::Head(const TensorView& rows, float* logits) {
  const int64_t n = rows.numel();
  // Only the sampled positions' logits are needed to pick next tokens; their
  // rows of the final norm's output (normed_).
  TensorView last = last_hidden_.Rows(0, n);
  RETURN_IF_ERROR(ops_->GatherRows(normed_.Rows(0, meta_tokens_), rows, last));
  const Tensor& lm_head = lm_head_.has_value() ? *lm_head_ : *embed_tokens_;
  TensorView local = local_logits_.Rows(0, n);
  RETURN_IF_ERROR(ops_->Linear(last, lm_head.view(), nullptr, local));
  if (shard_.tp_size == 1) {
    step_logits_ = local;  // vocab_per_rank == V without tensor parallelism.
  } else {
    // Vocabulary-parallel head: each rank scores its rows, the gather stacks
    // them [rank, row, vocab], and the concatenation drops the padding.
    const TensorView gathered(gathered_logits_.data(), DType::kF32,
                              {shard_.tp_size * n, shard_.vocab_per_rank});
    RETURN_IF_ERROR(tp_->AllGather(local, gathered));
    step_logits_ = full_logits_.Rows(0, n);
    RETURN_IF_ERROR(ops_->ConcatShards(gathered, shard_.tp_size, step_logits_));
  }
  if (logits == nullptr) return absl::OkStatus();  // They stay on the device.
  return ops_->CopyToHost(step_logits_, logits);
}

absl::Status LlamaModel::Layer(int l, const StepBatch& batch,
                               const KvCacheLayer& cache) {
  const DecoderLayer& layer = layers_[l];
  const AttentionMetadata& meta = *batch.metadata;
  const int64_t T = meta.num_tokens;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  TensorView hidden = hidden_.Rows(0, T);
  TensorView normed = normed_.Rows(0, T);
  TensorView proj = proj_.Rows(0, T);
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
                              inv_freq_.view(), attention_scratch_, proj));
  // hidden += attention output; normed = the MLP's input norm (fused).
  RETURN_IF_ERROR(ops_->AddRmsNorm(
      hidden, proj, layer.post_attention_norm.view(), eps, normed));
  // The MLP output stays in proj: its residual add fuses with the next norm
  // (see ForwardBatch).
  if (layer.moe.has_value()) {
    return layer.moe->Forward(ops_, tp_, normed, moe_scratch_, proj);
  }
  return layer.mlp.Forward(ops_, tp_, normed, mlp_scratch_, proj);
}

}  // namespace tessera
