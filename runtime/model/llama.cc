#include "runtime/model/llama.h"

#include <cmath>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// Loads `name` (f32 after conversion) after checking its shape against
// `expected`.
absl::StatusOr<Tensor> Load(const Checkpoint& ckpt, const std::string& name,
                            Shape expected) {
  return ckpt.LoadF32(name, expected);
}

absl::StatusOr<std::optional<Tensor>> LoadIf(bool present,
                                             const Checkpoint& ckpt,
                                             const std::string& name,
                                             Shape expected) {
  if (!present) return std::optional<Tensor>();
  ASSIGN_OR_RETURN(Tensor t, ckpt.LoadF32(name, expected));
  return std::optional<Tensor>(std::move(t));
}

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

const TensorView* OptionalView(const std::optional<Tensor>& t,
                               TensorView* storage) {
  if (!t.has_value()) return nullptr;
  *storage = t->view();
  return storage;
}

}  // namespace

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const Checkpoint& ckpt,
                                              const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size,
                D = c.head_dim;
  const int64_t q_dim = c.num_heads * D, kv_dim = c.num_kv_heads * D;
  LlamaWeights w;
  ASSIGN_OR_RETURN(w.embed_tokens,
                   Load(ckpt, "model.embed_tokens.weight", {V, H}));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LlamaLayerWeights L;
    ASSIGN_OR_RETURN(L.input_norm,
                     Load(ckpt, p + "input_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.q_proj,
                     Load(ckpt, p + "self_attn.q_proj.weight", {q_dim, H}));
    ASSIGN_OR_RETURN(L.k_proj,
                     Load(ckpt, p + "self_attn.k_proj.weight", {kv_dim, H}));
    ASSIGN_OR_RETURN(L.v_proj,
                     Load(ckpt, p + "self_attn.v_proj.weight", {kv_dim, H}));
    ASSIGN_OR_RETURN(L.o_proj,
                     Load(ckpt, p + "self_attn.o_proj.weight", {H, q_dim}));
    ASSIGN_OR_RETURN(L.q_bias, LoadIf(c.attention_bias, ckpt,
                                      p + "self_attn.q_proj.bias", {q_dim}));
    ASSIGN_OR_RETURN(L.k_bias, LoadIf(c.attention_bias, ckpt,
                                      p + "self_attn.k_proj.bias", {kv_dim}));
    ASSIGN_OR_RETURN(L.v_bias, LoadIf(c.attention_bias, ckpt,
                                      p + "self_attn.v_proj.bias", {kv_dim}));
    ASSIGN_OR_RETURN(L.o_bias, LoadIf(c.attention_out_bias, ckpt,
                                      p + "self_attn.o_proj.bias", {H}));
    ASSIGN_OR_RETURN(
        L.q_norm, LoadIf(c.qk_norm, ckpt, p + "self_attn.q_norm.weight", {D}));
    ASSIGN_OR_RETURN(
        L.k_norm, LoadIf(c.qk_norm, ckpt, p + "self_attn.k_norm.weight", {D}));
    ASSIGN_OR_RETURN(L.post_attention_norm,
                     Load(ckpt, p + "post_attention_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.gate_proj,
                     Load(ckpt, p + "mlp.gate_proj.weight", {I, H}));
    ASSIGN_OR_RETURN(L.up_proj, Load(ckpt, p + "mlp.up_proj.weight", {I, H}));
    ASSIGN_OR_RETURN(L.down_proj,
                     Load(ckpt, p + "mlp.down_proj.weight", {H, I}));
    ASSIGN_OR_RETURN(L.gate_bias,
                     LoadIf(c.mlp_bias, ckpt, p + "mlp.gate_proj.bias", {I}));
    ASSIGN_OR_RETURN(L.up_bias,
                     LoadIf(c.mlp_bias, ckpt, p + "mlp.up_proj.bias", {I}));
    ASSIGN_OR_RETURN(L.down_bias,
                     LoadIf(c.mlp_bias, ckpt, p + "mlp.down_proj.bias", {H}));
    w.layers.push_back(std::move(L));
  }
  ASSIGN_OR_RETURN(w.final_norm, Load(ckpt, "model.norm.weight", {H}));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(Tensor lm_head, Load(ckpt, "lm_head.weight", {V, H}));
    w.lm_head = std::move(lm_head);
  }
  return w;
}

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

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& c,
                                        int64_t capacity) {
  if (capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache capacity ", capacity));
  }
  KvCache cache;
  cache.capacity_ = capacity;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    ASSIGN_OR_RETURN(
        Tensor k,
        Tensor::Zeros(DType::kF32, {capacity, c.num_kv_heads, c.head_dim}));
    ASSIGN_OR_RETURN(
        Tensor v,
        Tensor::Zeros(DType::kF32, {capacity, c.num_kv_heads, c.head_dim}));
    cache.k_.push_back(std::move(k));
    cache.v_.push_back(std::move(v));
  }
  return cache;
}

LlamaModel::LlamaModel(ModelConfig config, LlamaWeights weights,
                       Tensor inv_freq, Ops* ops)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      inv_freq_(std::move(inv_freq)),
      ops_(ops) {}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    ModelConfig config, LlamaWeights weights, Ops* ops) {
  if (static_cast<int64_t>(weights.layers.size()) != config.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", weights.layers.size(),
                     " layers, config says ", config.num_layers));
  }
  ASSIGN_OR_RETURN(Tensor inv_freq, ComputeRopeInvFreq(config));
  return std::unique_ptr<LlamaModel>(new LlamaModel(
      std::move(config), std::move(weights), std::move(inv_freq), ops));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(
    const std::string& model_dir, Ops* ops) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                   Checkpoint::Open(model_dir));
  RETURN_IF_ERROR(CheckHostMemory(*ckpt, model_dir));
  absl::StatusOr<LlamaWeights> weights = LoadLlamaWeights(*ckpt, config);
  if (!weights.ok()) {
    return Annotate(weights.status(),
                    absl::StrCat("loading weights from ", model_dir));
  }
  return Create(std::move(config), *std::move(weights), ops);
}

absl::Status LlamaModel::EnsureScratch(int64_t tokens) {
  if (tokens <= scratch_tokens_) return absl::OkStatus();
  const ModelConfig& c = config_;
  const int64_t T = tokens;
  ASSIGN_OR_RETURN(hidden_, Tensor::Empty(DType::kF32, {T, c.hidden_size}));
  ASSIGN_OR_RETURN(normed_, Tensor::Empty(DType::kF32, {T, c.hidden_size}));
  ASSIGN_OR_RETURN(q_,
                   Tensor::Empty(DType::kF32, {T, c.num_heads, c.head_dim}));
  ASSIGN_OR_RETURN(k_,
                   Tensor::Empty(DType::kF32, {T, c.num_kv_heads, c.head_dim}));
  ASSIGN_OR_RETURN(v_,
                   Tensor::Empty(DType::kF32, {T, c.num_kv_heads, c.head_dim}));
  ASSIGN_OR_RETURN(attn_,
                   Tensor::Empty(DType::kF32, {T, c.num_heads, c.head_dim}));
  ASSIGN_OR_RETURN(proj_, Tensor::Empty(DType::kF32, {T, c.hidden_size}));
  ASSIGN_OR_RETURN(gate_, Tensor::Empty(DType::kF32, {T, c.intermediate_size}));
  ASSIGN_OR_RETURN(up_, Tensor::Empty(DType::kF32, {T, c.intermediate_size}));
  ASSIGN_OR_RETURN(last_hidden_,
                   Tensor::Empty(DType::kF32, {1, c.hidden_size}));
  positions_.resize(T);
  scratch_tokens_ = T;
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(absl::Span<const int32_t> tokens,
                                 KvCache* cache, float* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t start = cache->length_;
  if (T == 0) return absl::InvalidArgumentError("Forward: no tokens");
  if (start + T > cache->capacity_ || start + T > c.max_position_embeddings) {
    return absl::OutOfRangeError(
        absl::StrCat("Forward: positions ", start, "..", start + T - 1,
                     " exceed the KV cache capacity ", cache->capacity_,
                     " or the context length ", c.max_position_embeddings));
  }
  if (static_cast<int64_t>(cache->k_.size()) != c.num_layers) {
    return absl::InvalidArgumentError(
        "Forward: KV cache was built for another model");
  }
  RETURN_IF_ERROR(EnsureScratch(T));
  for (int64_t t = 0; t < T; ++t)
    positions_[t] = static_cast<int32_t>(start + t);
  const absl::Span<const int32_t> positions(positions_.data(), T);

  TensorView hidden = hidden_.view().Rows(0, T);
  RETURN_IF_ERROR(
      ops_->Embedding(weights_.embed_tokens.view(), tokens, hidden));
  for (int l = 0; l < c.num_layers; ++l) {
    RETURN_IF_ERROR(Layer(l, T, positions, cache));
  }
  cache->length_ = start + T;

  // Only the last position's logits are needed to pick the next token.
  const TensorView last = hidden.Rows(T - 1, T);
  RETURN_IF_ERROR(ops_->RmsNorm(last, weights_.final_norm.view(),
                                c.rms_norm_eps, last_hidden_.view()));
  const Tensor& lm_head =
      weights_.lm_head.has_value() ? *weights_.lm_head : weights_.embed_tokens;
  return ops_->Linear(last_hidden_.view(), lm_head.view(), nullptr,
                      TensorView(logits, DType::kF32, {1, c.vocab_size}));
}

absl::Status LlamaModel::Layer(int l, int64_t T,
                               absl::Span<const int32_t> positions,
                               KvCache* cache) {
  const ModelConfig& c = config_;
  const LlamaLayerWeights& w = weights_.layers[l];
  const int64_t start = positions[0];
  TensorView hidden = hidden_.view().Rows(0, T);
  TensorView normed = normed_.view().Rows(0, T);
  TensorView q = q_.view().Rows(0, T);
  TensorView k = k_.view().Rows(0, T);
  TensorView v = v_.view().Rows(0, T);
  TensorView attn = attn_.view().Rows(0, T);
  TensorView proj = proj_.view().Rows(0, T);
  TensorView gate = gate_.view().Rows(0, T);
  TensorView up = up_.view().Rows(0, T);
  TensorView bias_storage[3];

  // Attention block.
  RETURN_IF_ERROR(
      ops_->RmsNorm(hidden, w.input_norm.view(), c.rms_norm_eps, normed));
  ASSIGN_OR_RETURN(TensorView q2d, q.Reshape({T, c.num_heads * c.head_dim}));
  ASSIGN_OR_RETURN(TensorView k2d, k.Reshape({T, c.num_kv_heads * c.head_dim}));
  ASSIGN_OR_RETURN(TensorView v2d, v.Reshape({T, c.num_kv_heads * c.head_dim}));
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
  RETURN_IF_ERROR(ops_->Rope(q, positions, inv_freq_.view()));
  RETURN_IF_ERROR(ops_->Rope(k, positions, inv_freq_.view()));
  const TensorView k_cache = cache->k_[l].view();
  const TensorView v_cache = cache->v_[l].view();
  RETURN_IF_ERROR(ops_->StoreKv(k, v, start, k_cache, v_cache));
  AttentionArgs args;
  args.q = q;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.out = attn;
  args.start_pos = start;
  args.sliding_window =
      c.sliding_window_per_layer.empty() ? 0 : c.sliding_window_per_layer[l];
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  RETURN_IF_ERROR(ops_->Attention(args));
  ASSIGN_OR_RETURN(TensorView attn2d,
                   attn.Reshape({T, c.num_heads * c.head_dim}));
  TensorView o_bias;
  RETURN_IF_ERROR(ops_->Linear(attn2d, w.o_proj.view(),
                               OptionalView(w.o_bias, &o_bias), proj));
  RETURN_IF_ERROR(ops_->Add(hidden, proj, hidden));

  // MLP block.
  RETURN_IF_ERROR(ops_->RmsNorm(hidden, w.post_attention_norm.view(),
                                c.rms_norm_eps, normed));
  RETURN_IF_ERROR(ops_->Linear(normed, w.gate_proj.view(),
                               OptionalView(w.gate_bias, &bias_storage[0]),
                               gate));
  RETURN_IF_ERROR(ops_->Linear(normed, w.up_proj.view(),
                               OptionalView(w.up_bias, &bias_storage[1]), up));
  RETURN_IF_ERROR(ops_->SiluMul(gate, up, gate));
  RETURN_IF_ERROR(ops_->Linear(gate, w.down_proj.view(),
                               OptionalView(w.down_bias, &bias_storage[2]),
                               proj));
  return ops_->Add(hidden, proj, hidden);
}

}  // namespace tessera
