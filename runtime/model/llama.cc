#include "runtime/model/llama.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// The checkpoint's entry for `name`, after checking that it has the full shape
// the config implies and a floating-point dtype.
absl::StatusOr<TensorInfo> GetChecked(const Checkpoint& ckpt,
                                      const std::string& name,
                                      const Shape& full) {
  ASSIGN_OR_RETURN(TensorInfo info, ckpt.Get(name));
  if (info.shape != full) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected shape ",
                                                   full.ToString(), ", found ",
                                                   info.shape.ToString()));
  }
  if (!IsFloatConvertible(info.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": dtype ", DTypeName(info.dtype), " is not a float type"));
  }
  return info;
}

// Reads `name`, checks its full shape against `full`, and converts rows
// [begin, end) of its outermost dimension to f32, followed by `pad_rows` rows
// of zeros (vocabulary padding).
absl::StatusOr<Tensor> LoadRows(const Checkpoint* ckpt, const std::string& name,
                                const Shape& full, int64_t begin, int64_t end,
                                int64_t pad_rows = 0) {
  if (ckpt == nullptr) {  // Allocate only: the shape this rank's slice has.
    absl::InlinedVector<int64_t, 4> dims(full.dims().begin(),
                                         full.dims().end());
    if (!dims.empty()) dims[0] = end - begin + pad_rows;
    return Tensor::Zeros(DType::kF32, Shape(absl::MakeConstSpan(dims)));
  }
  ASSIGN_OR_RETURN(const TensorInfo info, GetChecked(*ckpt, name, full));
  const int64_t row = full.rank() == 0 ? 1 : full.numel() / full[0];
  absl::InlinedVector<int64_t, 4> dims(full.dims().begin(), full.dims().end());
  if (!dims.empty()) dims[0] = end - begin + pad_rows;
  ASSIGN_OR_RETURN(
      Tensor t, Tensor::Zeros(DType::kF32, Shape(absl::MakeConstSpan(dims))));
  const char* src =
      static_cast<const char*>(info.data) + begin * row * DTypeSize(info.dtype);
  RETURN_IF_ERROR(
      ConvertToF32(info.dtype, src, (end - begin) * row, t.data_as<float>()));
  return t;
}

absl::StatusOr<Tensor> LoadAll(const Checkpoint* ckpt, const std::string& name,
                               const Shape& full) {
  return LoadRows(ckpt, name, full, 0, full.rank() == 0 ? 1 : full[0]);
}

// Columns [begin, end) of a matrix [N, K]: the input-split half of a
// row-parallel product (o_proj, down_proj).
absl::StatusOr<Tensor> LoadColumns(const Checkpoint* ckpt,
                                   const std::string& name, const Shape& full,
                                   int64_t begin, int64_t end) {
  if (ckpt == nullptr)
    return Tensor::Zeros(DType::kF32, {full[0], end - begin});
  ASSIGN_OR_RETURN(const TensorInfo info, GetChecked(*ckpt, name, full));
  const int64_t rows = full[0], cols = full[1], width = end - begin;
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {rows, width}));
  const size_t elem = DTypeSize(info.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const char* src =
        static_cast<const char*>(info.data) + (r * cols + begin) * elem;
    RETURN_IF_ERROR(
        ConvertToF32(info.dtype, src, width, t.data_as<float>() + r * width));
  }
  return t;
}

absl::StatusOr<std::optional<Tensor>> Optional(bool present,
                                               absl::StatusOr<Tensor> loaded) {
  if (!present) return std::optional<Tensor>();
  if (!loaded.ok()) return loaded.status();
  return std::optional<Tensor>(*std::move(loaded));
}

const TensorView* OptionalView(const std::optional<Tensor>& t,
                               TensorView* storage) {
  if (!t.has_value()) return nullptr;
  *storage = t->view();
  return storage;
}

// The table of tensors a shard holds, read from `ckpt` or, when it is null,
// allocated (zeros) with the same shapes for a rank that receives its weights.
absl::StatusOr<LlamaWeights> BuildLlamaWeights(
    const Checkpoint* ckpt, const ModelConfig& c, const ShardSpec& s,
    const std::function<void()>& on_part = {}) {
  auto part_done = [&] {
    if (on_part) on_part();
  };
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
  // Row-parallel biases are added once, after the all-reduce, so every rank
  // holds them whole.
  LlamaWeights w;
  if (s.first_stage()) {
    ASSIGN_OR_RETURN(w.embed_tokens, LoadRows(ckpt, "model.embed_tokens.weight",
                                              {V, H}, v_begin, v_end, v_pad));
    part_done();
  }
  for (int64_t l = s.first_layer; l < s.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LlamaLayerWeights L;
    ASSIGN_OR_RETURN(L.input_norm,
                     LoadAll(ckpt, p + "input_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.q_proj, LoadRows(ckpt, p + "self_attn.q_proj.weight",
                                        {q_dim, H}, q_begin, q_end));
    ASSIGN_OR_RETURN(L.k_proj, LoadRows(ckpt, p + "self_attn.k_proj.weight",
                                        {kv_dim, H}, kv_begin, kv_end));
    ASSIGN_OR_RETURN(L.v_proj, LoadRows(ckpt, p + "self_attn.v_proj.weight",
                                        {kv_dim, H}, kv_begin, kv_end));
    ASSIGN_OR_RETURN(L.o_proj, LoadColumns(ckpt, p + "self_attn.o_proj.weight",
                                           {H, q_dim}, q_begin, q_end));
    const bool qkv_bias = c.attention_bias;
    ASSIGN_OR_RETURN(
        L.q_bias, Optional(qkv_bias, LoadRows(ckpt, p + "self_attn.q_proj.bias",
                                              {q_dim}, q_begin, q_end)));
    ASSIGN_OR_RETURN(
        L.k_bias, Optional(qkv_bias, LoadRows(ckpt, p + "self_attn.k_proj.bias",
                                              {kv_dim}, kv_begin, kv_end)));
    ASSIGN_OR_RETURN(
        L.v_bias, Optional(qkv_bias, LoadRows(ckpt, p + "self_attn.v_proj.bias",
                                              {kv_dim}, kv_begin, kv_end)));
    ASSIGN_OR_RETURN(L.o_bias,
                     Optional(c.attention_out_bias,
                              LoadAll(ckpt, p + "self_attn.o_proj.bias", {H})));
    ASSIGN_OR_RETURN(
        L.q_norm,
        Optional(c.qk_norm, LoadAll(ckpt, p + "self_attn.q_norm.weight", {D})));
    ASSIGN_OR_RETURN(
        L.k_norm,
        Optional(c.qk_norm, LoadAll(ckpt, p + "self_attn.k_norm.weight", {D})));
    ASSIGN_OR_RETURN(L.post_attention_norm,
                     LoadAll(ckpt, p + "post_attention_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.gate_proj, LoadRows(ckpt, p + "mlp.gate_proj.weight",
                                           {I, H}, i_begin, i_end));
    ASSIGN_OR_RETURN(L.up_proj, LoadRows(ckpt, p + "mlp.up_proj.weight", {I, H},
                                         i_begin, i_end));
    ASSIGN_OR_RETURN(L.down_proj, LoadColumns(ckpt, p + "mlp.down_proj.weight",
                                              {H, I}, i_begin, i_end));
    ASSIGN_OR_RETURN(
        L.gate_bias,
        Optional(c.mlp_bias, LoadRows(ckpt, p + "mlp.gate_proj.bias", {I},
                                      i_begin, i_end)));
    ASSIGN_OR_RETURN(L.up_bias,
                     Optional(c.mlp_bias, LoadRows(ckpt, p + "mlp.up_proj.bias",
                                                   {I}, i_begin, i_end)));
    ASSIGN_OR_RETURN(
        L.down_bias,
        Optional(c.mlp_bias, LoadAll(ckpt, p + "mlp.down_proj.bias", {H})));
    w.layers.push_back(std::move(L));
    part_done();
  }
  if (s.last_stage()) {
    ASSIGN_OR_RETURN(w.final_norm, LoadAll(ckpt, "model.norm.weight", {H}));
    const bool reuse_embedding = c.tie_word_embeddings && w.embed_tokens;
    if (!reuse_embedding) {
      const char* name = c.tie_word_embeddings ? "model.embed_tokens.weight"
                                               : "lm_head.weight";
      ASSIGN_OR_RETURN(w.lm_head,
                       LoadRows(ckpt, name, {V, H}, v_begin, v_end, v_pad));
    }
    part_done();
  }
  return w;
}

}  // namespace

absl::StatusOr<LlamaWeights> LoadLlamaWeights(
    const Checkpoint& ckpt, const ModelConfig& config, const ShardSpec& shard,
    const std::function<void()>& on_part) {
  return BuildLlamaWeights(&ckpt, config, shard, on_part);
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
  return BuildLlamaWeights(nullptr, config, shard);
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

namespace {

// Bytes the checkpoint's floating-point tensors take once widened to f32.
int64_t F32WeightBytes(const Checkpoint& ckpt) {
  int64_t bytes = 0;
  for (const std::string& name : ckpt.Names()) {
    absl::StatusOr<TensorInfo> info = ckpt.Get(name);
    if (info.ok() && IsFloatConvertible(info->dtype))
      bytes += 4 * info->shape.numel();
  }
  return bytes;
}

// MemAvailable from /proc/meminfo in bytes; -1 when it cannot be read.
int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// The CPU backend holds every weight as f32. Refuse up front when that cannot
// fit, instead of letting the kernel's out-of-memory killer end the process
// half-way through loading.
absl::Status CheckHostMemory(const Checkpoint& ckpt,
                             const std::string& model_dir) {
  const int64_t needed = F32WeightBytes(ckpt);
  const int64_t available = AvailableHostBytes();
  if (available >= 0 && needed > available) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s needs %.1f GiB for its weights as f32 on the CPU, "
                        "but only %.1f GiB of memory is available",
                        model_dir, needed / kGiB, available / kGiB));
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(
    const std::string& model_dir, Ops* ops, int64_t max_step_tokens,
    int64_t max_logit_rows, const Placement& placement) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  RETURN_IF_ERROR(LimitContext(placement.max_model_len, &config));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                   Checkpoint::Open(model_dir));
  RETURN_IF_ERROR(CheckHostMemory(*ckpt, model_dir));
  const ShardSpec shard = FullModel(config);
  absl::StatusOr<LlamaWeights> weights =
      LoadLlamaWeights(*ckpt, config, shard, placement.on_weight_part);
  if (!weights.ok()) {
    return Annotate(weights.status(),
                    absl::StrCat("loading weights from ", model_dir));
  }
  if (placement.upload_weights) {
    RETURN_IF_ERROR(UploadLlamaWeights(&*weights, ops, placement.matrix_dtype));
  }
  return Create(std::move(config), shard, *std::move(weights), ops, nullptr,
                nullptr, max_step_tokens, max_logit_rows, placement.allocator);
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

KvPoolShape LlamaModel::kv_pool_shape(DType dtype) const {
  KvPoolShape shape;
  shape.num_layers = shard_.end_layer - shard_.first_layer;
  shape.num_kv_heads = shard_.local_kv_heads;
  shape.head_dim = config_.head_dim;
  shape.dtype = dtype;
  return shape;
}

absl::StatusOr<KvCache> LlamaModel::NewKvCache(int64_t capacity,
                                               DType dtype) const {
  if (capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache capacity ", capacity));
  }
  KvCache cache;
  ASSIGN_OR_RETURN(cache.pool_, KvPool::Create(kv_pool_shape(dtype), 1,
                                               capacity, allocator_));
  return cache;
}

absl::Status LlamaModel::Forward(absl::Span<const int32_t> tokens,
                                 KvCache* cache, float* logits) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t start = cache->length_;
  if (T == 0) return absl::InvalidArgumentError("Forward: no tokens");
  if (start + T > cache->capacity() ||
      start + T > config_.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat(
        "Forward: positions ", start, "..", start + T - 1,
        " exceed the KV cache capacity ", cache->capacity(),
        " or the context length ", config_.max_position_embeddings));
  }
  // Long inputs run in chunks of at most max_step_tokens_ (chunked prefill):
  // each chunk appends to the cache, and only the last one produces logits.
  if (forward_inputs_ == nullptr) {
    StepInputsLimits limits;
    limits.max_tokens = max_step_tokens_;
    limits.max_seqs = 1;
    limits.max_logit_rows = 1;
    limits.max_blocks_per_seq = 1;  // The static layout.
    limits.vocab_size = config_.vocab_size;
    ASSIGN_OR_RETURN(forward_inputs_, StepInputs::Create(ops_, limits));
  }
  const int32_t block_table[1] = {0};
  for (int64_t begin = 0; begin < T; begin += max_step_tokens_) {
    const int64_t end = std::min(T, begin + max_step_tokens_);
    SequenceSlice slice;
    slice.context_len = start + begin;
    slice.query_len = end - begin;
    slice.block_table = block_table;
    const int32_t rows[1] = {static_cast<int32_t>(end - begin - 1)};
    RETURN_IF_ERROR(forward_inputs_->Fill(
        absl::MakeConstSpan(&slice, 1), static_cast<int32_t>(cache->capacity()),
        1, tokens.subspan(begin, end - begin),
        end == T ? absl::Span<const int32_t>(rows)
                 : absl::Span<const int32_t>()));
    StepBatch batch;
    batch.tokens = forward_inputs_->tokens();
    batch.metadata = &forward_inputs_->metadata();
    batch.backend = AttentionBackend::kStatic;
    batch.logit_rows = forward_inputs_->logit_rows();
    RETURN_IF_ERROR(
        ForwardBatch(batch, cache->pool_, end == T ? logits : nullptr));
    cache->length_ = end + start;
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
