#include "runtime/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/model/quantized_weights.h"

namespace tessera {
namespace {

// This rank's rows [begin, end) of the vocabulary, and the zero rows that pad
// its slice to vocab_per_rank.
struct VocabSlice {
  int64_t begin, end, pad;
};
VocabSlice VocabOf(const ModelConfig& c, const ShardSpec& s) {
  const int64_t V = c.vocab_size;
  const int64_t begin = std::min(V, s.first_vocab_id);
  const int64_t end = std::min(V, s.first_vocab_id + s.vocab_per_rank);
  return {begin, end, s.vocab_per_rank - (end - begin)};
}

int64_t Bytes(const std::optional<Tensor>& t) {
  return t.has_value() ? static_cast<int64_t>(t->nbytes()) : 0;
}

}  // namespace

void AddEmbeddingSpec(const ModelConfig& c, const ShardSpec& s, int part,
                      WeightTable* t) {
  const VocabSlice v = VocabOf(c, s);
  t->push_back(VocabSplit("model.embed_tokens.weight",
                          {c.vocab_size, c.hidden_size}, v.begin, v.end, v.pad,
                          part));
}

void AddAttentionSpecs(const ModelConfig& c, const ShardSpec& s,
                       const std::string& p, const AttentionTensors& tensors,
                       int part, WeightTable* t) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_dim = c.num_heads * D, kv_dim = c.num_kv_heads * D;
  // This rank's heads.
  const int64_t q_begin = s.tp_rank * s.local_heads * D;
  const int64_t q_end = q_begin + s.local_heads * D;
  const int64_t kv_begin = s.first_kv_head * D;
  const int64_t kv_end = kv_begin + s.local_kv_heads * D;
  AddLinearSpec(
      c.quant,
      RowSplit(p + "self_attn.q_proj.weight", {q_dim, H}, q_begin, q_end, part),
      t);
  AddLinearSpec(c.quant,
                RowSplit(p + "self_attn.k_proj.weight", {kv_dim, H}, kv_begin,
                         kv_end, part),
                t);
  AddLinearSpec(c.quant,
                RowSplit(p + "self_attn.v_proj.weight", {kv_dim, H}, kv_begin,
                         kv_end, part),
                t);
  AddLinearSpec(c.quant,
                ColumnSplit(p + "self_attn.o_proj.weight", {H, q_dim}, q_begin,
                            q_end, part),
                t);
  if (tensors.qkv_bias) {
    t->push_back(
        RowSplit(p + "self_attn.q_proj.bias", {q_dim}, q_begin, q_end, part));
    t->push_back(RowSplit(p + "self_attn.k_proj.bias", {kv_dim}, kv_begin,
                          kv_end, part));
    t->push_back(RowSplit(p + "self_attn.v_proj.bias", {kv_dim}, kv_begin,
                          kv_end, part));
  }
  // Row-parallel biases (o, down) are added once, after the all-reduce, so
  // every rank holds them whole.
  if (tensors.o_bias) {
    t->push_back(Replicated(p + "self_attn.o_proj.bias", {H}, part));
  }
  if (tensors.qk_norm) {
    t->push_back(Replicated(p + "self_attn.q_norm.weight", {D}, part));
    t->push_back(Replicated(p + "self_attn.k_norm.weight", {D}, part));
  }
  // An fp8 checkpoint's KV cache scales: one value per layer, every rank's
  // heads alike; published as compressed-tensors names them, or as modelopt
  // does (k_proj.k_scale, v_proj.v_scale).
  if (c.quant.kv_cache_scales) {
    for (const char* kv : {"k", "v"}) {
      WeightSpec scale = WithParts(
          Replicated(absl::StrCat(p, "self_attn.", kv, "_scale"), {1}, part),
          {absl::StrCat(p, "self_attn.", kv, "_proj.", kv, "_scale")}, {1});
      scale.any_shape = true;
      t->push_back(std::move(scale));
    }
  }
}

void AddGatedMlpSpecs(const ModelConfig& c, const ShardSpec& s,
                      const std::string& p, bool bias, int part,
                      WeightTable* t) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t i_begin = s.tp_rank * s.local_intermediate;
  const int64_t i_end = i_begin + s.local_intermediate;
  AddLinearSpec(
      c.quant,
      RowSplit(p + "mlp.gate_proj.weight", {I, H}, i_begin, i_end, part), t);
  AddLinearSpec(
      c.quant, RowSplit(p + "mlp.up_proj.weight", {I, H}, i_begin, i_end, part),
      t);
  AddLinearSpec(
      c.quant,
      ColumnSplit(p + "mlp.down_proj.weight", {H, I}, i_begin, i_end, part), t);
  if (bias) {
    t->push_back(RowSplit(p + "mlp.gate_proj.bias", {I}, i_begin, i_end, part));
    t->push_back(RowSplit(p + "mlp.up_proj.bias", {I}, i_begin, i_end, part));
    t->push_back(Replicated(p + "mlp.down_proj.bias", {H}, part));
  }
}

void AddHeadSpecs(const ModelConfig& c, const ShardSpec& s, int part,
                  WeightTable* t) {
  t->push_back(Replicated("model.norm.weight", {c.hidden_size}, part));
  const bool reuse_embedding = c.tie_word_embeddings && s.first_stage();
  if (reuse_embedding) return;
  const VocabSlice v = VocabOf(c, s);
  const char* name =
      c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  t->push_back(VocabSplit(name, {c.vocab_size, c.hidden_size}, v.begin, v.end,
                          v.pad, part));
}

absl::Status WeightBinder::CheckComplete() const {
  if (set_->complete()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the weight set lacks ", set_->first_missing()));
}

absl::StatusOr<Tensor> WeightBinder::Take(const std::string& name) {
  return set_->Take(name);
}

absl::StatusOr<float> WeightBinder::TakeScalar(const std::string& name) {
  ASSIGN_OR_RETURN(Tensor t, set_->Take(name));
  if (t.numel() != 1 || t.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected one f32 value, found ",
                     t.shape().ToString(), " ", DTypeName(t.dtype())));
  }
  float value = 0.0f;
  RETURN_IF_ERROR(ops_->CopyToHost(t.view(), &value));
  return value;
}

absl::StatusOr<Weight> WeightBinder::TakeLinear(const std::string& name) {
  ASSIGN_OR_RETURN(Weight w, TakeLinearWeight(set_, quant_, name));
  const std::string module(ModuleOf(name));
  return FinishLinearWeight(ops_, quant_, {module}, std::move(w));
}

absl::StatusOr<Weight> WeightBinder::StackLinear(
    std::initializer_list<std::string> names) {
  std::vector<Weight> parts;
  std::vector<std::string> modules;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(Weight w, TakeLinearWeight(set_, quant_, name));
    parts.push_back(std::move(w));
    modules.emplace_back(ModuleOf(name));
  }
  ASSIGN_OR_RETURN(Weight stacked, StackLinearWeights(ops_, parts, &staging_));
  parts.clear();  // Frees the parts before quantizing the stack.
  return FinishLinearWeight(ops_, quant_, modules, std::move(stacked));
}

absl::StatusOr<std::optional<Tensor>> WeightBinder::Optional(
    const std::string& name) {
  if (!set_->Has(name)) return std::optional<Tensor>();
  ASSIGN_OR_RETURN(Tensor t, set_->Take(name));
  return std::optional<Tensor>(std::move(t));
}

absl::StatusOr<Tensor> WeightBinder::Stack(
    std::initializer_list<std::string> names) {
  std::vector<Tensor> parts;
  std::vector<const Tensor*> ptrs;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(Tensor t, set_->Take(name));
    parts.push_back(std::move(t));
  }
  for (const Tensor& t : parts) ptrs.push_back(&t);
  return ConcatRows(ops_, ptrs, &staging_);
}

absl::StatusOr<std::optional<Tensor>> WeightBinder::StackOptional(
    std::initializer_list<std::string> names) {
  size_t present = 0;
  for (const std::string& name : names) present += set_->Has(name) ? 1 : 0;
  if (present == 0) return std::optional<Tensor>();
  if (present != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the weight set has some but not all of the biases stacked with ",
        *names.begin()));
  }
  ASSIGN_OR_RETURN(Tensor t, Stack(names));
  return std::optional<Tensor>(std::move(t));
}

absl::Status BindAttentionWeights(WeightBinder& w, const std::string& p,
                                  AttentionWeights* a) {
  // A fused checkpoint tensor (Phi-3's qkv_proj, split by row ranges) is
  // already this rank's stack.
  if (w.Has(p + "self_attn.qkv_proj.weight")) {
    ASSIGN_OR_RETURN(a->qkv_proj,
                     w.TakeLinear(p + "self_attn.qkv_proj.weight"));
  } else {
    ASSIGN_OR_RETURN(a->qkv_proj,
                     w.StackLinear({p + "self_attn.q_proj.weight",
                                    p + "self_attn.k_proj.weight",
                                    p + "self_attn.v_proj.weight"}));
  }
  ASSIGN_OR_RETURN(a->o_proj, w.TakeLinear(p + "self_attn.o_proj.weight"));
  ASSIGN_OR_RETURN(a->qkv_bias, w.StackOptional({p + "self_attn.q_proj.bias",
                                                 p + "self_attn.k_proj.bias",
                                                 p + "self_attn.v_proj.bias"}));
  ASSIGN_OR_RETURN(a->o_bias, w.Optional(p + "self_attn.o_proj.bias"));
  ASSIGN_OR_RETURN(a->q_norm, w.Optional(p + "self_attn.q_norm.weight"));
  ASSIGN_OR_RETURN(a->k_norm, w.Optional(p + "self_attn.k_norm.weight"));
  if (w.Has(p + "self_attn.k_scale")) {
    ASSIGN_OR_RETURN(const float k, w.TakeScalar(p + "self_attn.k_scale"));
    ASSIGN_OR_RETURN(const float v, w.TakeScalar(p + "self_attn.v_scale"));
    if (!(k > 0) || !(v > 0) || !std::isfinite(k) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(p, "self_attn: the checkpoint's KV cache scales ", k,
                       " and ", v, " must be positive and finite"));
    }
    a->kv_scales = LayerKvScales{k, v};
  }
  return absl::OkStatus();
}

absl::Status BindGatedMlpWeights(WeightBinder& w, const std::string& p,
                                 GatedMlpWeights* m) {
  if (w.Has(p + "mlp.gate_up_proj.weight")) {  // Phi-3's fused gate/up.
    ASSIGN_OR_RETURN(m->gate_up_proj,
                     w.TakeLinear(p + "mlp.gate_up_proj.weight"));
  } else {
    ASSIGN_OR_RETURN(
        m->gate_up_proj,
        w.StackLinear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}));
  }
  ASSIGN_OR_RETURN(m->down_proj, w.TakeLinear(p + "mlp.down_proj.weight"));
  ASSIGN_OR_RETURN(m->gate_up_bias, w.StackOptional({p + "mlp.gate_proj.bias",
                                                     p + "mlp.up_proj.bias"}));
  ASSIGN_OR_RETURN(m->down_bias, w.Optional(p + "mlp.down_proj.bias"));
  return absl::OkStatus();
}

int64_t EmbeddingAndHead::bytes() const {
  return Bytes(embed_tokens) + Bytes(final_norm) + Bytes(lm_head);
}

absl::StatusOr<std::optional<Tensor>> BindEmbedding(WeightBinder& w,
                                                    const ShardSpec& shard) {
  if (!shard.first_stage()) return std::optional<Tensor>();
  return w.Optional("model.embed_tokens.weight");
}

absl::Status BindHead(WeightBinder& w, const ModelConfig& config,
                      const ShardSpec& shard, EmbeddingAndHead* out) {
  ASSIGN_OR_RETURN(out->final_norm, w.Optional("model.norm.weight"));
  if (shard.last_stage() &&
      !(config.tie_word_embeddings && out->embed_tokens.has_value())) {
    // A tied head on a rank without the embedding is listed under the
    // embedding's name (AddHeadSpecs).
    ASSIGN_OR_RETURN(out->lm_head, w.Optional(config.tie_word_embeddings
                                                  ? "model.embed_tokens.weight"
                                                  : "lm_head.weight"));
  }
  if (shard.first_stage() != out->embed_tokens.has_value() ||
      shard.last_stage() != out->final_norm.has_value() ||
      (shard.last_stage() && !out->lm_head.has_value() &&
       !out->embed_tokens.has_value())) {
    return absl::InvalidArgumentError(
        "weights do not match the shard's pipeline stage");
  }
  return absl::OkStatus();
}

absl::Status CheckModelContext(const ModelContext& context,
                               const ShardSpec& shard,
                               absl::string_view model) {
  if (context.ops == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, "::Create: no backend"));
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
  return absl::OkStatus();
}

int64_t DefaultMaxStepTokens(const ModelConfig& config) {
  return std::min<int64_t>(2048, config.max_position_embeddings);
}

void ScratchPlan::Add(std::string name, TensorView* view, Shape shape,
                      DType dtype) {
  buffers_.push_back({std::move(name), view, std::move(shape), dtype});
}

absl::Status ScratchPlan::Bind(Workspace* workspace,
                               PinnableBlockAllocator* allocator) {
  for (const Buffer& b : buffers_) {
    RETURN_IF_ERROR(workspace->RegisterBuffer(
        b.name, static_cast<size_t>(b.shape.numel()) * sizeof(float)));
  }
  RETURN_IF_ERROR(workspace->FinalizeAndBind(allocator));
  for (const Buffer& b : buffers_) {
    ASSIGN_OR_RETURN(*b.view, workspace->View(b.name, b.dtype, b.shape));
  }
  return absl::OkStatus();
}

void PlanDecoderScratch(const ModelConfig& c, const ShardSpec& s, int64_t T,
                        int64_t rows, DecoderScratch* x, ScratchPlan* plan) {
  const int64_t D = c.head_dim, H = c.hidden_size;
  plan->Add("hidden", &x->hidden, {T, H});
  plan->Add("normed", &x->normed, {T, H});
  plan->Add("qkv", &x->attention.qkv,
            {T, (s.local_heads + 2 * s.local_kv_heads) * D});
  plan->Add("q", &x->attention.q, {T, s.local_heads, D});
  plan->Add("attn", &x->attention.attn, {T, s.local_heads, D});
  plan->Add("proj", &x->proj, {T, H});
  // A model whose every layer is MoE has no dense MLP to hold scratch for.
  const int64_t dense_i = c.moe.any_dense() ? s.local_intermediate : 1;
  plan->Add("gate_up", &x->mlp.gate_up, {T, 2 * dense_i});
  plan->Add("act", &x->mlp.act, {T, dense_i});
  plan->Add("last_hidden", &x->last_hidden, {rows, H});
  plan->Add("local_logits", &x->local_logits, {rows, s.vocab_per_rank});
  plan->Add("gathered_logits", &x->gathered_logits,
            {s.tp_size * rows, s.vocab_per_rank});
  plan->Add("full_logits", &x->full_logits,
            {s.tp_size > 1 ? rows : 1, c.vocab_size});
}

absl::Status CheckStepBatch(const StepBatch& batch, const KvPool& pool,
                            const ModelConfig& c, int64_t local_layers,
                            const KvPoolShape& expected, int64_t max_tokens,
                            int64_t max_rows) {
  const AttentionMetadata* meta = batch.metadata;
  const int64_t T = batch.tokens.numel();
  if (meta == nullptr || meta->num_tokens != T || T == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardBatch: ", T, " tokens do not match the attention metadata"));
  }
  if (T > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBatch: ", T,
                     " tokens in one step, the model's "
                     "scratch holds ",
                     max_tokens));
  }
  const int64_t rows = batch.logit_rows.numel();
  if (rows > max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBatch: logits for ", rows,
                     " sequences, the model's scratch holds ", max_rows));
  }
  if (meta->max_seq_len > c.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat(
        "ForwardBatch: a sequence reaches ", meta->max_seq_len,
        " positions, beyond the context length ", c.max_position_embeddings));
  }
  if (pool.shape().num_layers != local_layers ||
      pool.shape().num_kv_heads != expected.num_kv_heads ||
      pool.shape().head_dim != expected.head_dim ||
      pool.block_size() != meta->block_size) {
    return absl::InvalidArgumentError(
        "ForwardBatch: the KV pool was built for another model, shard or "
        "block size");
  }
  return absl::OkStatus();
}

absl::Status EmbedOrReceive(Ops* ops, Communicator* tp, Communicator* pp,
                            const ShardSpec& shard,
                            const std::optional<Tensor>& embed_tokens,
                            const TensorView& tokens,
                            const TensorView& hidden) {
  if (!shard.first_stage()) return pp->Recv(hidden, shard.pp_stage - 1);
  if (shard.tp_size == 1) {
    return ops->Embedding(embed_tokens->view(), tokens, hidden);
  }
  RETURN_IF_ERROR(ops->EmbeddingShard(embed_tokens->view(), tokens,
                                      shard.first_vocab_id, hidden));
  return tp->AllReduceSum(hidden);
}

absl::StatusOr<TensorView> VocabParallelLogits(Ops* ops, Communicator* tp,
                                               const ShardSpec& shard,
                                               const DecoderScratch& scratch,
                                               const TensorView& normed,
                                               const TensorView& rows,
                                               const Tensor& lm_head) {
  const int64_t n = rows.numel();
  // Only the sampled positions' logits are needed to pick next tokens: their
  // rows of the final norm's output.
  TensorView last = scratch.last_hidden.Rows(0, n);
  RETURN_IF_ERROR(ops->GatherRows(normed, rows, last));
  TensorView local = scratch.local_logits.Rows(0, n);
  RETURN_IF_ERROR(ops->Linear(last, lm_head.view(), nullptr, local));
  // vocab_per_rank == V without tensor parallelism.
  if (shard.tp_size == 1) return local;
  // Vocabulary-parallel head: each rank scores its rows, the gather stacks
  // them [rank, row, vocab], and the concatenation drops the padding.
  const TensorView gathered(scratch.gathered_logits.data(), DType::kF32,
                            {shard.tp_size * n, shard.vocab_per_rank});
  RETURN_IF_ERROR(tp->AllGather(local, gathered));
  TensorView logits = scratch.full_logits.Rows(0, n);
  RETURN_IF_ERROR(ops->ConcatShards(gathered, shard.tp_size, logits));
  return logits;
}

}  // namespace tessera
