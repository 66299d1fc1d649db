#include "runtime/model/llama.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

const TensorView* OptionalView(const std::optional<Tensor>& t,
                               TensorView* storage) {
  if (!t.has_value()) return nullptr;
  *storage = t->view();
  return storage;
}

// Moves the tensors of `set` (a complete set of LlamaWeightTable(c, s)) into
// the model's struct.
absl::StatusOr<LlamaWeights> BindLlamaWeights(WeightSet& set,
                                              const ModelConfig& c,
                                              const ShardSpec& s) {
  if (!set.complete()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the weight set lacks ", set.first_missing()));
  }
  auto opt =
      [&set](bool present,
             const std::string& name) -> absl::StatusOr<std::optional<Tensor>> {
    if (!present) return std::optional<Tensor>();
    ASSIGN_OR_RETURN(Tensor t, set.Take(name));
    return std::optional<Tensor>(std::move(t));
  };
  LlamaWeights w;
  if (s.first_stage()) {
    ASSIGN_OR_RETURN(w.embed_tokens, opt(true, "model.embed_tokens.weight"));
  }
  for (int64_t l = s.first_layer; l < s.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LlamaLayerWeights L;
    ASSIGN_OR_RETURN(L.input_norm, set.Take(p + "input_layernorm.weight"));
    ASSIGN_OR_RETURN(L.q_proj, set.Take(p + "self_attn.q_proj.weight"));
    ASSIGN_OR_RETURN(L.k_proj, set.Take(p + "self_attn.k_proj.weight"));
    ASSIGN_OR_RETURN(L.v_proj, set.Take(p + "self_attn.v_proj.weight"));
    ASSIGN_OR_RETURN(L.o_proj, set.Take(p + "self_attn.o_proj.weight"));
    ASSIGN_OR_RETURN(L.q_bias,
                     opt(c.attention_bias, p + "self_attn.q_proj.bias"));
    ASSIGN_OR_RETURN(L.k_bias,
                     opt(c.attention_bias, p + "self_attn.k_proj.bias"));
    ASSIGN_OR_RETURN(L.v_bias,
                     opt(c.attention_bias, p + "self_attn.v_proj.bias"));
    ASSIGN_OR_RETURN(L.o_bias,
                     opt(c.attention_out_bias, p + "self_attn.o_proj.bias"));
    ASSIGN_OR_RETURN(L.q_norm, opt(c.qk_norm, p + "self_attn.q_norm.weight"));
    ASSIGN_OR_RETURN(L.k_norm, opt(c.qk_norm, p + "self_attn.k_norm.weight"));
    ASSIGN_OR_RETURN(L.post_attention_norm,
                     set.Take(p + "post_attention_layernorm.weight"));
    ASSIGN_OR_RETURN(L.gate_proj, set.Take(p + "mlp.gate_proj.weight"));
    ASSIGN_OR_RETURN(L.up_proj, set.Take(p + "mlp.up_proj.weight"));
    ASSIGN_OR_RETURN(L.down_proj, set.Take(p + "mlp.down_proj.weight"));
    ASSIGN_OR_RETURN(L.gate_bias, opt(c.mlp_bias, p + "mlp.gate_proj.bias"));
    ASSIGN_OR_RETURN(L.up_bias, opt(c.mlp_bias, p + "mlp.up_proj.bias"));
    ASSIGN_OR_RETURN(L.down_bias, opt(c.mlp_bias, p + "mlp.down_proj.bias"));
    w.layers.push_back(std::move(L));
  }
  if (s.last_stage()) {
    ASSIGN_OR_RETURN(w.final_norm, opt(true, "model.norm.weight"));
    if (!(c.tie_word_embeddings && w.embed_tokens)) {
      // A tied head on a rank without the embedding is read under the
      // embedding's name (see LlamaWeightTable).
      ASSIGN_OR_RETURN(w.lm_head, opt(true, c.tie_word_embeddings
                                                ? "model.embed_tokens.weight"
                                                : "lm_head.weight"));
    }
  }
  return w;
}

// LlamaWeights as host f32 tensors: read from `ckpt`, or zeros when it is
// null (a rank that receives its weights).
absl::StatusOr<LlamaWeights> HostLlamaWeights(
    const Checkpoint* ckpt, const ModelConfig& c, const ShardSpec& s,
    const std::function<void()>& on_part) {
  WeightSet set(LlamaWeightTable(c, s));
  HostStaging staging;
  for (size_t i = 0; i < set.size(); ++i) {
    const WeightSpec& spec = set.table()[i];
    ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kF32, spec.local_shape()));
    if (ckpt != nullptr) {
      ASSIGN_OR_RETURN(const TensorView host, ReadSlice(*ckpt, spec, &staging));
      RETURN_IF_ERROR(ConvertToF32(host.dtype(), host.data(), host.numel(),
                                   t.data_as<float>()));
    }
    RETURN_IF_ERROR(set.Put(i, std::move(t)));
    const bool part_done =
        i + 1 == set.size() || set.table()[i + 1].part != spec.part;
    if (part_done && on_part) on_part();
  }
  return BindLlamaWeights(set, c, s);
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
    if (c.attention_bias) {
      t.push_back(
          RowSplit(p + "self_attn.q_proj.bias", {q_dim}, q_begin, q_end, part));
      t.push_back(RowSplit(p + "self_attn.k_proj.bias", {kv_dim}, kv_begin,
                           kv_end, part));
      t.push_back(RowSplit(p + "self_attn.v_proj.bias", {kv_dim}, kv_begin,
                           kv_end, part));
    }
    if (c.attention_out_bias) {
      t.push_back(Replicated(p + "self_attn.o_proj.bias", {H}, part));
    }
    if (c.qk_norm) {
      t.push_back(Replicated(p + "self_attn.q_norm.weight", {D}, part));
      t.push_back(Replicated(p + "self_attn.k_norm.weight", {D}, part));
    }
    t.push_back(Replicated(p + "post_attention_layernorm.weight", {H}, part));
    t.push_back(
        RowSplit(p + "mlp.gate_proj.weight", {I, H}, i_begin, i_end, part));
    t.push_back(
        RowSplit(p + "mlp.up_proj.weight", {I, H}, i_begin, i_end, part));
    t.push_back(
        ColumnSplit(p + "mlp.down_proj.weight", {H, I}, i_begin, i_end, part));
    if (c.mlp_bias) {
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

absl::StatusOr<LlamaWeights> LoadLlamaWeights(
    const Checkpoint& ckpt, const ModelConfig& config, const ShardSpec& shard,
    const std::function<void()>& on_part) {
  return HostLlamaWeights(&ckpt, config, shard, on_part);
}

int64_t LlamaWeightParts(const ShardSpec& shard) {
  return (shard.end_layer - shard.first_layer) + (shard.first_stage() ? 1 : 0) +
         (shard.last_stage() ? 1 : 0);
}

absl::Status UploadLlamaWeights(LlamaWeights* weights, Ops* ops,
                                DType matrix_dtype) {
  absl::Status status;
  ForEachWeight(weights, [&](const std::string& name, Tensor* t) {
    if (!status.ok()) return;
    // Matrices (projections, embedding, head) in the compute dtype; norms and
    // biases stay f32.
    const DType dtype = t->shape().rank() == 2 ? matrix_dtype : DType::kF32;
    absl::StatusOr<Tensor> device = ops->Upload(t->view(), dtype);
    if (!device.ok()) {
      status = Annotate(device.status(), absl::StrCat("uploading ", name));
      return;
    }
    *t = *std::move(device);
  });
  return status;
}

absl::StatusOr<LlamaWeights> AllocateLlamaWeights(const ModelConfig& config,
                                                  const ShardSpec& shard) {
  return HostLlamaWeights(nullptr, config, shard, {});
}

void ForEachWeight(LlamaWeights* w,
                   const std::function<void(const std::string&, Tensor*)>& fn) {
  auto opt = [&](const std::string& name, std::optional<Tensor>* t) {
    if (t->has_value()) fn(name, &**t);
  };
  opt("embed_tokens", &w->embed_tokens);
  for (size_t l = 0; l < w->layers.size(); ++l) {
    LlamaLayerWeights& L = w->layers[l];
    const std::string p = absl::StrCat("layers[", l, "].");
    fn(p + "input_norm", &L.input_norm);
    fn(p + "q_proj", &L.q_proj);
    fn(p + "k_proj", &L.k_proj);
    fn(p + "v_proj", &L.v_proj);
    fn(p + "o_proj", &L.o_proj);
    opt(p + "q_bias", &L.q_bias);
    opt(p + "k_bias", &L.k_bias);
    opt(p + "v_bias", &L.v_bias);
    opt(p + "o_bias", &L.o_bias);
    opt(p + "q_norm", &L.q_norm);
    opt(p + "k_norm", &L.k_norm);
    fn(p + "post_attention_norm", &L.post_attention_norm);
    fn(p + "gate_proj", &L.gate_proj);
    fn(p + "up_proj", &L.up_proj);
    fn(p + "down_proj", &L.down_proj);
    opt(p + "gate_bias", &L.gate_bias);
    opt(p + "up_bias", &L.up_bias);
    opt(p + "down_bias", &L.down_bias);
  }
  opt("final_norm", &w->final_norm);
  opt("lm_head", &w->lm_head);
}

namespace {}  // namespace

absl::StatusOr<Tensor> ComputeRopeInvFreq(const ModelConfig& c) {
  const int64_t dim = c.head_dim;
  if (dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", dim, " must be even for RoPE"));
  }
  ASSIGN_OR_RETURN(Tensor inv_freq, Tensor::Empty(DType::kF32, {dim / 2}));
  float* f = inv_freq.data_as<float>();
  const RopeConfig& r = c.rope;
  for (int64_t i = 0; i < dim / 2; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[i] = 1.0f / std::pow(static_cast<float>(r.theta), exponent);
  }
  switch (r.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (int64_t i = 0; i < dim / 2; ++i)
        f[i] = f[i] / static_cast<float>(r.factor);
      break;
    case RopeScaling::kLlama3: {
      // Long wavelengths (low frequencies) are slowed by `factor`, short ones
      // kept, and the band between is interpolated smoothly (transformers'
      // _compute_llama3_parameters).
      const double old_len = static_cast<double>(r.original_max_position);
      const double low_freq_wavelen = old_len / r.low_freq_factor;
      const double high_freq_wavelen = old_len / r.high_freq_factor;
      for (int64_t i = 0; i < dim / 2; ++i) {
        const float freq = f[i];
        const float wavelen = 2.0f * static_cast<float>(M_PI) / freq;
        float scaled = wavelen > low_freq_wavelen
                           ? freq / static_cast<float>(r.factor)
                           : freq;
        const bool medium =
            !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const float smooth =
              static_cast<float>((old_len / wavelen - r.low_freq_factor) /
                                 (r.high_freq_factor - r.low_freq_factor));
          scaled = (1.0f - smooth) * scaled / static_cast<float>(r.factor) +
                   smooth * scaled;
        }
        f[i] = scaled;
      }
      break;
    }
  }
  return inv_freq;
}

LlamaModel::LlamaModel(ModelConfig config, ShardSpec shard,
                       LlamaWeights weights, Tensor inv_freq, Ops* ops,
                       Communicator* tp, Communicator* pp)
    : config_(std::move(config)),
      shard_(shard),
      weights_(std::move(weights)),
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

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, LlamaWeights weights, Ops* ops) {
  const ShardSpec shard = FullModel(config);
  return Create(std::move(config), shard, std::move(weights), ops, nullptr,
                nullptr);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, ShardSpec shard, LlamaWeights weights, Ops* ops,
    Communicator* tp, Communicator* pp, int64_t max_step_tokens,
    int64_t max_logit_rows, PinnableBlockAllocator* allocator) {
  const int64_t local_layers = shard.end_layer - shard.first_layer;
  if (static_cast<int64_t>(weights.layers.size()) != local_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", weights.layers.size(),
                     " layers, the shard holds ", local_layers));
  }
  if ((tp != nullptr ? tp->size() : 1) != shard.tp_size ||
      (pp != nullptr ? pp->size() : 1) != shard.pp_size) {
    return absl::InvalidArgumentError(
        "communicator group sizes do not match the shard's tp and pp");
  }
  if (shard.first_stage() != weights.embed_tokens.has_value() ||
      shard.last_stage() != weights.final_norm.has_value()) {
    return absl::InvalidArgumentError(
        "weights do not match the shard's pipeline stage");
  }
  ASSIGN_OR_RETURN(Tensor host_inv_freq, ComputeRopeInvFreq(config));
  ASSIGN_OR_RETURN(Tensor inv_freq,
                   ops->Upload(host_inv_freq.view(), DType::kF32));
  std::unique_ptr<LlamaModel> model(
      new LlamaModel(std::move(config), shard, std::move(weights),
                     std::move(inv_freq), ops, tp, pp));
  if (max_step_tokens > 0) model->max_step_tokens_ = max_step_tokens;
  if (max_logit_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_logit_rows ", max_logit_rows, " must be >= 1"));
  }
  model->max_logit_rows_ = max_logit_rows;
  if (allocator != nullptr) model->allocator_ = allocator;
  RETURN_IF_ERROR(model->BindScratch());
  return model;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  if (context.ops == nullptr) {
    return absl::InvalidArgumentError("LlamaModel::Create: no backend");
  }
  ASSIGN_OR_RETURN(LlamaWeights bound,
                   BindLlamaWeights(weights, config, shard));
  return Create(std::move(config), shard, std::move(bound), context.ops,
                context.tp, context.pp, context.max_step_tokens,
                context.max_logit_rows, context.allocator);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(
    const std::string& model_dir, Ops* ops, int64_t max_step_tokens,
    int64_t max_logit_rows, const Placement& placement) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  RETURN_IF_ERROR(LimitContext(placement.max_model_len, &config));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                   Checkpoint::Open(model_dir));
  // Weights in host memory (the CPU backend): they are f32 there.
  if (placement.allocator == nullptr) {
    RETURN_IF_ERROR(CheckHostMemoryForF32(*ckpt, model_dir));
  }
  const ShardSpec shard = FullModel(config);
  WeightLoadOptions options;
  options.ops = ops;
  options.matrix_dtype = placement.matrix_dtype;
  options.on_part = placement.on_weight_part;
  absl::StatusOr<WeightSet> weights =
      LoadWeightSet(*ckpt, LlamaWeightTable(config, shard), options);
  if (!weights.ok()) {
    return Annotate(weights.status(),
                    absl::StrCat("loading weights from ", model_dir));
  }
  ModelContext context;
  context.ops = ops;
  context.max_step_tokens = max_step_tokens;
  context.max_logit_rows = max_logit_rows;
  context.allocator = placement.allocator;
  return Create(std::move(config), shard, *std::move(weights), context);
}

int64_t LlamaModel::weight_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const Tensor& t) { bytes += t.nbytes(); };
  auto add_opt = [&](const std::optional<Tensor>& t) {
    if (t) add(*t);
  };
  add_opt(weights_.embed_tokens);
  add_opt(weights_.final_norm);
  add_opt(weights_.lm_head);
  for (const LlamaLayerWeights& L : weights_.layers) {
    for (const Tensor* t :
         {&L.input_norm, &L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj,
          &L.post_attention_norm, &L.gate_proj, &L.up_proj, &L.down_proj}) {
      add(*t);
    }
    for (const std::optional<Tensor>* t :
         {&L.q_bias, &L.k_bias, &L.v_bias, &L.o_bias, &L.q_norm, &L.k_norm,
          &L.gate_bias, &L.up_bias, &L.down_bias}) {
      add_opt(*t);
    }
  }
  return bytes;
}

absl::Status LlamaModel::BindScratch() {
  const ModelConfig& c = config_;
  const ShardSpec& s = shard_;
  const int64_t T = max_step_tokens_;
  const int64_t D = c.head_dim;
  struct Spec {
    const char* name;
    TensorView* view;
    Shape shape;
  };
  const Spec specs[] = {
      {"hidden", &hidden_, {T, c.hidden_size}},
      {"normed", &normed_, {T, c.hidden_size}},
      {"q", &q_, {T, s.local_heads, D}},
      {"k", &k_, {T, s.local_kv_heads, D}},
      {"v", &v_, {T, s.local_kv_heads, D}},
      {"attn", &attn_, {T, s.local_heads, D}},
      {"proj", &proj_, {T, c.hidden_size}},
      {"gate", &gate_, {T, s.local_intermediate}},
      {"up", &up_, {T, s.local_intermediate}},
      {"last_hidden", &last_hidden_, {max_logit_rows_, c.hidden_size}},
      {"local_logits", &local_logits_, {max_logit_rows_, s.vocab_per_rank}},
      {"gathered_logits",
       &gathered_logits_,
       {s.tp_size * max_logit_rows_, s.vocab_per_rank}},
      {"full_logits",
       &full_logits_,
       {s.tp_size > 1 ? max_logit_rows_ : 1, c.vocab_size}},
  };
  for (const Spec& spec : specs) {
    RETURN_IF_ERROR(workspace_.RegisterBuffer(
        spec.name, static_cast<size_t>(spec.shape.numel()) * sizeof(float)));
  }
  RETURN_IF_ERROR(workspace_.FinalizeAndBind(allocator_));
  for (const Spec& spec : specs) {
    ASSIGN_OR_RETURN(*spec.view,
                     workspace_.View(spec.name, DType::kF32, spec.shape));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::AddBias(const std::optional<Tensor>& bias,
                                 const TensorView& x) {
  if (!bias.has_value()) return absl::OkStatus();
  return ops_->BiasAdd(x, bias->view());
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
          ops_->Embedding(weights_.embed_tokens->view(), batch.tokens, hidden));
    } else {
      RETURN_IF_ERROR(ops_->EmbeddingShard(weights_.embed_tokens->view(),
                                           batch.tokens, shard_.first_vocab_id,
                                           hidden));
      RETURN_IF_ERROR(tp_->AllReduceSum(hidden));
    }
  } else {
    RETURN_IF_ERROR(pp_->Recv(hidden, shard_.pp_stage - 1));
  }
  for (int64_t l = 0; l < local_layers; ++l) {
    RETURN_IF_ERROR(Layer(static_cast<int>(l), batch, pool.layer(l)));
  }
  if (!shard_.last_stage()) return pp_->Send(hidden, shard_.pp_stage + 1);
  if (rows == 0) {  // An earlier prefill chunk: no logits this step.
    step_logits_ = TensorView();
    return absl::OkStatus();
  }
  meta_tokens_ = T;
  return Head(batch.logit_rows, logits);
}

absl::Status LlamaModel::Head(const TensorView& rows, float* logits) {
  const ModelConfig& c = config_;
  const int64_t n = rows.numel();
  // Only the sampled positions' logits are needed to pick next tokens.
  TensorView last = last_hidden_.Rows(0, n);
  RETURN_IF_ERROR(ops_->GatherRows(hidden_.Rows(0, meta_tokens_), rows, last));
  RETURN_IF_ERROR(
      ops_->RmsNorm(last, weights_.final_norm->view(), c.rms_norm_eps, last));
  const Tensor& lm_head =
      weights_.lm_head.has_value() ? *weights_.lm_head : *weights_.embed_tokens;
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
  const ModelConfig& c = config_;
  const ShardSpec& s = shard_;
  const LlamaLayerWeights& w = weights_.layers[l];
  const AttentionMetadata& meta = *batch.metadata;
  const int64_t T = meta.num_tokens;
  const int64_t D = c.head_dim;
  TensorView hidden = hidden_.Rows(0, T);
  TensorView normed = normed_.Rows(0, T);
  TensorView q = q_.Rows(0, T);
  TensorView k = k_.Rows(0, T);
  TensorView v = v_.Rows(0, T);
  TensorView attn = attn_.Rows(0, T);
  TensorView proj = proj_.Rows(0, T);
  TensorView gate = gate_.Rows(0, T);
  TensorView up = up_.Rows(0, T);
  TensorView bias_storage[3];

  // Attention block: this rank's heads; the o_proj partial sums meet in the
  // all-reduce.
  RETURN_IF_ERROR(
      ops_->RmsNorm(hidden, w.input_norm.view(), c.rms_norm_eps, normed));
  ASSIGN_OR_RETURN(TensorView q2d, q.Reshape({T, s.local_heads * D}));
  ASSIGN_OR_RETURN(TensorView k2d, k.Reshape({T, s.local_kv_heads * D}));
  ASSIGN_OR_RETURN(TensorView v2d, v.Reshape({T, s.local_kv_heads * D}));
  RETURN_IF_ERROR(ops_->Linear(normed, w.q_proj.view(),
                               OptionalView(w.q_bias, &bias_storage[0]), q2d));
  RETURN_IF_ERROR(ops_->Linear(normed, w.k_proj.view(),
                               OptionalView(w.k_bias, &bias_storage[1]), k2d));
  RETURN_IF_ERROR(ops_->Linear(normed, w.v_proj.view(),
                               OptionalView(w.v_bias, &bias_storage[2]), v2d));
  if (c.qk_norm) {
    RETURN_IF_ERROR(ops_->RmsNorm(q, w.q_norm->view(), c.rms_norm_eps, q));
    RETURN_IF_ERROR(ops_->RmsNorm(k, w.k_norm->view(), c.rms_norm_eps, k));
  }
  RETURN_IF_ERROR(ops_->Rope(q, meta.positions, inv_freq_.view()));
  RETURN_IF_ERROR(ops_->Rope(k, meta.positions, inv_freq_.view()));
  // Every new key and value is in the cache before any sequence attends.
  RETURN_IF_ERROR(ops_->StoreKvCache(k, v, meta.slot_mapping, cache));
  PagedAttentionArgs args;
  args.q = q;
  args.cache = cache;
  args.metadata = &meta;
  args.out = attn;
  const int64_t global_layer = s.first_layer + l;
  args.sliding_window = c.sliding_window_per_layer.empty()
                            ? 0
                            : c.sliding_window_per_layer[global_layer];
  args.scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (batch.backend == AttentionBackend::kStatic) {
    args.first_seq = 0;
    args.end_seq = meta.num_seqs;
    RETURN_IF_ERROR(ops_->StaticAttention(args));
  } else {
    // Decodes lead the batch (see attention_metadata.h).
    if (meta.num_decode_seqs > 0) {
      args.first_seq = 0;
      args.end_seq = meta.num_decode_seqs;
      RETURN_IF_ERROR(ops_->DecodeAttention(args));
    }
    if (meta.num_decode_seqs < meta.num_seqs) {
      args.first_seq = meta.num_decode_seqs;
      args.end_seq = meta.num_seqs;
      RETURN_IF_ERROR(ops_->PrefillAttention(args));
    }
  }
  ASSIGN_OR_RETURN(TensorView attn2d, attn.Reshape({T, s.local_heads * D}));
  RETURN_IF_ERROR(ops_->Linear(attn2d, w.o_proj.view(), nullptr, proj));
  if (s.tp_size > 1) RETURN_IF_ERROR(tp_->AllReduceSum(proj));
  RETURN_IF_ERROR(AddBias(w.o_bias, proj));
  // hidden += attention output; normed = the MLP's input norm (fused).
  RETURN_IF_ERROR(ops_->AddRmsNorm(hidden, proj, w.post_attention_norm.view(),
                                   c.rms_norm_eps, normed));

  // MLP block: this rank's slice of the intermediate dimension.
  RETURN_IF_ERROR(ops_->Linear(normed, w.gate_proj.view(),
                               OptionalView(w.gate_bias, &bias_storage[0]),
                               gate));
  RETURN_IF_ERROR(ops_->Linear(normed, w.up_proj.view(),
                               OptionalView(w.up_bias, &bias_storage[1]), up));
  RETURN_IF_ERROR(ops_->SiluMul(gate, up, gate));
  RETURN_IF_ERROR(ops_->Linear(gate, w.down_proj.view(), nullptr, proj));
  if (s.tp_size > 1) RETURN_IF_ERROR(tp_->AllReduceSum(proj));
  RETURN_IF_ERROR(AddBias(w.down_bias, proj));
  return ops_->Add(hidden, proj, hidden);
}

}  // namespace tessera
