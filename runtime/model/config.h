// ModelConfig: the hyperparameters of a Llama-family checkpoint, read from its
// config.json.
//
// Supported `model_type`s: llama, mistral, qwen2, qwen3, phi3; gemma, gemma2,
// gemma3_text; mixtral, qwen3_moe, qwen2_moe (mixtures of experts).
// Everything the forward pass needs is resolved here (defaults applied,
// derived values computed, unsupported features rejected), so the model code
// never looks at JSON.
#ifndef TESSERA_RUNTIME_MODEL_CONFIG_H_
#define TESSERA_RUNTIME_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json_fwd.hpp"

namespace tessera {

enum class Architecture {
  kLlama,    // model_type "llama" (Llama 1/2/3, TinyLlama, stories*).
  kMistral,  // model_type "mistral": Llama with an optional sliding window.
  kQwen2,    // model_type "qwen2": Llama with q/k/v biases.
  kQwen3,    // model_type "qwen3": Llama with per-head q/k RMSNorm and an
             // explicit head_dim.
  kPhi3,     // model_type "phi3" (Phi-3, Phi-3.5, Phi-4-mini): Llama with
             // fused qkv_proj / gate_up_proj tensors, an optional sliding
             // window, LongRoPE and partial rotary embeddings.
  kGemma,    // model_type "gemma": GeGLU, (1 + w) RMSNorm, a scaled embedding.
  kGemma2,   // model_type "gemma2": Gemma with sandwich norms, alternating
             // sliding/global layers and logit soft-capping.
  kGemma3,   // model_type "gemma3_text" (Gemma3ForCausalLM): Gemma 2 with q/k
             // norms and a local RoPE for the sliding layers.
  // Mixtures of experts: the Llama-family layer with a MoE block in place of
  // the MLP (MoeHParams below).
  kMixtral,   // model_type "mixtral": Mistral attention, every layer MoE.
  kQwen3Moe,  // model_type "qwen3_moe": Qwen3 attention, MoE layers.
  kQwen2Moe,  // model_type "qwen2_moe": Qwen2 attention, MoE layers with a
              // shared expert.
};

absl::string_view ArchitectureName(Architecture arch);

// How rotary frequencies are adjusted for long contexts (HF `rope_type`).
enum class RopeScaling {
  kNone,     // "default": inv_freq[i] = theta^(-2i/head_dim).
  kLinear,   // "linear": positions divided by `factor` (equivalently inv_freq /
             // factor).
  kLlama3,   // "llama3": low frequencies divided by `factor`, high kept, smooth
             // ramp between.
  kYarn,     // "yarn": inv_freq blends interpolated (/ factor) and original
             // frequencies over a ramp set by beta_fast/beta_slow, and cos/sin
             // are scaled by attention_factor. Static.
  kDynamic,  // "dynamic" (dynamic NTK): a sequence longer than
             // original_max_position rotates with theta grown from its
             // length. Depends on each sequence's length at each step.
  kLongRope,  // "longrope" (phi3 also "su", "yarn"): inv_freq divided by
              // short_factor, or by long_factor once a sequence is longer
              // than original_max_position; cos/sin scaled by
              // attention_factor. Depends on each sequence's length.
};

// Every value is resolved at parse, from the checkpoint's config.json, as
// transformers 5 resolves it (RotaryEmbeddingConfigMixin and the
// _compute_*_parameters of modeling_rope_utils.py); nothing here reads
// ModelConfig::max_position_embeddings later, so --max-model-len (which
// lowers it) never changes the rotation.
struct RopeConfig {
  double theta = 10000.0;  // rope_theta.
  RopeScaling scaling = RopeScaling::kNone;
  // linear, llama3, yarn, dynamic; longrope: only for its default
  // attention_factor (absent: max_position_embeddings /
  // original_max_position, as yarn's when null).
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3.
  double high_freq_factor = 4.0;  // llama3.
  // llama3, yarn, longrope: original_max_position_embeddings (yarn and
  // longrope default to max_position_embeddings; phi3's top-level key wins).
  // dynamic: the checkpoint's max_position_embeddings, which transformers'
  // dynamic NTK compares each length with.
  int64_t original_max_position = 8192;
  double beta_fast = 32.0;  // yarn (0 or null: 32).
  double beta_slow = 1.0;   // yarn (0 or null: 1).
  bool truncate = true;     // yarn: floor/ceil the correction range.
  // longrope: the per-frequency divisors, rotary_dim / 2 each.
  std::vector<double> short_factor, long_factor;
  // transformers' attention_scaling, the factor cos and sin are multiplied
  // by: yarn's attention_factor (given, or from factor, mscale and
  // mscale_all_dim), longrope's (given, or sqrt(1 + ln factor / ln
  // original_max_position) when factor > 1); 1 for every other type.
  double attention_factor = 1.0;
  // The leading dims of each head that are rotated:
  // int(head_dim * partial_rotary_factor) (phi3 only; even); 0 means all of
  // head_dim. The rest pass through.
  int64_t rotary_dim = 0;
};

// The variants of the Llama family (llama, mistral, qwen2, qwen3): which
// optional tensors a layer has. Read only by the family's weight table
// (llama.h); the layers apply a tensor exactly when it is present.
struct LlamaHParams {
  bool attention_bias = false;      // q/k/v biases (qwen2: always).
  bool attention_out_bias = false;  // o_proj bias (llama attention_bias=true).
  bool mlp_bias = false;            // gate/up/down biases (llama mlp_bias).
  bool qk_norm = false;  // Per-head RMSNorm on q and k before RoPE (qwen3).
};

// The MLP activation where an architecture's config chooses it.
enum class HiddenActivation {
  kSilu,      // "silu" / "swish".
  kGeluTanh,  // "gelu_pytorch_tanh": GELU with the tanh approximation.
};

// Gemma 1, 2 and 3's own hyperparameters (read by gemma.h's weight table and
// layer loop), as transformers 5 defaults them per model_type.
struct GemmaHParams {
  // gemma: hidden_activation when present (the checkpoint's declared GeGLU),
  // else hidden_act; gemma2/gemma3_text: hidden_activation (hidden_act is
  // ignored there, as transformers does). Default gelu_pytorch_tanh.
  HiddenActivation activation = HiddenActivation::kGeluTanh;
  // Attention scores are scaled by query_pre_attn_scalar^-0.5 (gemma2/3,
  // default 256); 0 (gemma): head_dim^-0.5.
  double query_pre_attn_scalar = 0;
  // Soft caps, 0 = none: attention logits (gemma2 default 50, gemma3 none)
  // and the LM head's logits (gemma2 default 30, gemma3 none).
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  // gemma2/3: post_attention_layernorm normalizes the attention output
  // before its residual add, and pre_/post_feedforward_layernorm wrap the
  // MLP (gemma: post_attention_layernorm is the MLP's input norm, Llama's).
  bool sandwich_norms = false;
  bool qk_norm = false;         // gemma3: per-head q/k (1 + w) RMSNorm.
  bool attention_bias = false;  // q/k/v/o biases (attention_bias).
  // gemma3: the RoPE of "sliding_attention" layers (rope_local_base_freq, or
  // rope_parameters["sliding_attention"]); ModelConfig::rope is then the
  // "full_attention" layers'. Unused by gemma and gemma2 (one RoPE).
  RopeConfig rope_local;
  // Per layer (num_layers): whether it is a "sliding_attention" layer
  // (layer_types, else gemma2's every other layer from layer 0, gemma3's
  // sliding_window_pattern). Its window is sliding_window_per_layer.
  std::vector<bool> sliding_layer;
};
// Mixture-of-experts hyperparameters (mixtral, qwen3_moe, qwen2_moe), as
// Hugging Face's MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock /
// Qwen2MoeSparseMoeBlock run them:
//   p = softmax(x · Wrouterᵀ) in f32 over the experts;
//   the experts_per_token most probable (ties: the lower id), their p
//   divided by their sum when norm_topk_prob;
//   out = Σ p_e · expert_e(x), over those experts in ascending id order
//   [qwen2_moe] + sigmoid(x · Wshared_gateᵀ) · shared_expert(x).
// Each expert (and the shared one) is a SwiGLU MLP. num_experts == 0: a
// dense model (every other field unset).
struct MoeHParams {
  int64_t num_experts = 0;        // num_local_experts (mixtral) / num_experts.
  int64_t experts_per_token = 0;  // num_experts_per_tok (top-k).
  // An expert's intermediate size: moe_intermediate_size (qwen), the
  // intermediate_size (mixtral).
  int64_t expert_intermediate_size = 0;
  // The shared expert's (qwen2_moe: shared_expert_intermediate_size); 0 none.
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;  // mixtral: always.
  // Per layer (size num_layers): 1 where the layer's MLP is the MoE block, 0
  // where it is the dense MLP of intermediate_size (qwen: mlp_only_layers and
  // decoder_sparse_step; mixtral: every layer MoE).
  std::vector<uint8_t> sparse_layers;

  bool enabled() const { return num_experts > 0; }
  bool sparse(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(sparse_layers.size()) &&
           sparse_layers[layer] != 0;
  }
  // Whether any layer is dense (the model then holds dense MLPs too).
  bool any_dense() const;
};

// The most experts and experts per token a config may declare (the routing
// kernels keep a token's top-k in registers).
inline constexpr int64_t kMaxExperts = int64_t{1} << 14;
inline constexpr int64_t kMaxExpertsPerToken = 32;

// The longest context config.json may declare (max_position_embeddings):
// positions are int32 in every kernel. Larger values are InvalidArgument.
inline constexpr int64_t kMaxPositionEmbeddings = (int64_t{1} << 31) - 1;

// How a checkpoint's matrices are quantized (its config.json
// `quantization_config`, or `compression_config`). Parsed for the fp8 formats
// we load; every other method is refused at parse (ParseModelConfig).
enum class Fp8WeightScale {
  kPerTensor,   // One scale per matrix (held per channel once loaded).
  kPerChannel,  // One per output row: [N] or [N, 1] in the checkpoint.
  kBlock,       // One per block_rows × block_cols tile: [ceil(N/br),
                // ceil(K/bc)] (weight_block_size; only 128 × 128 is loaded).
};
enum class Fp8InputScale {
  kDynamicPerToken,  // Computed per row at run time (no tensor).
  kStaticPerTensor,  // `<module>.input_scale`, one per matrix.
  kDynamicPerGroup,  // Per 1 × block_cols group at run time (block formats).
};
struct QuantConfig {
  // The format, as quant_method spells it ("compressed-tensors", "fp8",
  // "modelopt", "fbgemm_fp8"); empty: the matrices are not quantized.
  std::string method;
  Fp8WeightScale weight_scale = Fp8WeightScale::kPerChannel;
  int64_t block_rows = 0;  // kBlock only.
  int64_t block_cols = 0;
  Fp8InputScale input_scale = Fp8InputScale::kDynamicPerToken;
  // The name of each quantized matrix's scale beside its `.weight`:
  // "weight_scale" (compressed-tensors, modelopt, fbgemm) or
  // "weight_scale_inv" (the "fp8" method: DeepSeek's and Qwen3's FP8
  // checkpoints; multiplied, despite the name).
  std::string scale_suffix = "weight_scale";
  // Modules kept in the checkpoint's float dtype (compressed-tensors
  // `ignore`, modelopt `exclude_modules`/`ignore`, the others'
  // `modules_to_not_convert` / `ignored_layers`). Each entry is one of:
  //  - "re:<regex>": Python re.match semantics as compressed-tensors and
  //    vLLM apply them: anchored at the start of the module name, free at
  //    its end unless the pattern ends in `$` ("re:.*mlp\.gate$"). The
  //    dialect is literals, `.`, classes, groups, `|`, `* + ? {n,m}` and
  //    `^ $` (ModuleMatches in config.cc; lookaround, backreferences and
  //    flags are refused at parse);
  //  - a glob with `*` / `?` (ModelOpt's fnmatch wildcards,
  //    "model.layers.*.mlp.gate"), matched against the whole name;
  //  - a plain name, matching every module whose dotted name contains it as
  //    whole components: "lm_head" matches "lm_head", "mlp.gate" matches
  //    "model.layers.3.mlp.gate" (not "...mlp.gate_proj"), "self_attn"
  //    matches "model.layers.0.self_attn.q_proj", "model.layers.1" matches
  //    "model.layers.1.mlp.up_proj" (not "model.layers.10...."). This is the
  //    union of the readers' rules restricted to component boundaries:
  //    compressed-tensors compares exactly, vLLM's fp8/modelopt loaders
  //    exactly or by substring, transformers by prefix or suffix.
  std::vector<std::string> unquantized_modules;
  // compressed-tensors `targets` that name modules instead of the class
  // "Linear" (same three forms as above): only the linear modules they
  // match are quantized. Empty: every linear module is (targets ["Linear"],
  // and every other format).
  std::vector<std::string> quantized_modules;
  // fbgemm_fp8's activation_scale_ub: fbgemm clamps each token's activation
  // scale to ub / 448. 0: none. Recorded, not yet applied by the kernels
  // (it only changes tokens whose max |x| exceeds it; Meta's 1200 is far
  // above a Llama's activations).
  double activation_scale_ub = 0;

  // The checkpoint holds fp8 KV cache scales, one k and one v per layer
  // (compressed-tensors kv_cache_scheme of 8-bit floats per tensor:
  // self_attn.k_scale / v_scale; modelopt kv_cache_quant_algo FP8:
  // self_attn.k_proj.k_scale / v_proj.v_scale). An fp8 KV cache (--kv-dtype
  // fp8) stores k / k_scale and reads it back times k_scale; other caches
  // do not read them.
  bool kv_cache_scales = false;

  // Quantized by Tessera as the weights load (--quantization fp8, method
  // "fp8 (online)"): per-channel scales, dynamic per-token activations, no
  // scale tensors in the checkpoint.
  bool online = false;

  bool quantized() const { return !method.empty(); }
  // Whether the linear module `module` ("model.layers.0.self_attn.q_proj",
  // "lm_head") holds fp8 weights: the checkpoint is quantized, `module` is
  // matched by quantized_modules (when any) and by no unquantized_modules
  // entry. The embedding ("...embed_tokens") never does.
  bool Quantizes(absl::string_view module) const;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type;  // As spelled in config.json.

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers.
  int64_t num_heads = 0;     // num_attention_heads.
  int64_t num_kv_heads = 0;  // num_key_value_heads; defaults to num_heads.
  int64_t head_dim = 0;      // head_dim; defaults to hidden_size / num_heads.
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  // The standard deviation Hugging Face initializes matrices with (only
  // --random-weights reads it).
  double initializer_range = 0.02;
  RopeConfig rope;

  bool tie_word_embeddings = false;

  // The architecture's own hyperparameters (its ParseHParams below).
  LlamaHParams llama;
  GemmaHParams gemma;
  MoeHParams moe;  // Mixtures of experts; disabled for a dense model.

  // transformers' Phi3ForCausalLM drops a sequence's KV cache the first time
  // it grows past original_max_position_embeddings and recomputes it whole,
  // so that LongRoPE rotates every key with its long factors; the engine's
  // scheduler recomputes at this length too (SchedulerConfig). 0: never
  // (set for phi3 with longrope only).
  int64_t recompute_at_length = 0;

  // Sliding-window attention per layer: 0 = full attention, otherwise a query
  // at position p sees keys at positions (p - window, p]. Size num_layers
  // (set by the architecture's ParseHParams).
  std::vector<int64_t> sliding_window_per_layer;

  // Token ids, each checked at parse to be in [0, vocab_size) (a larger one,
  // e.g. >= 2^31, is InvalidArgument naming the key, never wrapped).
  int64_t bos_token_id = -1;  // -1 when the config has none.
  std::vector<int64_t>
      eos_token_ids;  // eos_token_id (int or list); may be empty.

  std::string torch_dtype;  // "float32", "bfloat16", ... (informational:
                            // weights carry dtypes).

  // fp8 matrices (quantization_config); unquantized when method is empty.
  QuantConfig quant;
};

// Parses config.json text (transformers 4 and 5 spellings). Errors name the
// offending key:
//  - InvalidArgument: malformed JSON, a missing required key, a non-positive
//  size, heads not
//    dividing evenly (num_heads % num_kv_heads != 0), hidden_size % num_heads
//    != 0 without an explicit head_dim, hidden_act other than silu (Gemma:
//    its activations, see ParseGemmaHParams), an unknown model_type
//    ("unsupported model_type \"gpt2\" (supported: llama, mistral, qwen2,
//    qwen3, phi3, gemma, gemma2, gemma3_text)"); model_type "phi3small"
//    (Phi-3-small: another architecture, not phi3);
//  - Unimplemented: model_type "gemma3" (the multimodal
//    Gemma3ForConditionalGeneration; its text part is a gemma3_text model);
//  - rope types: default, linear, llama3, yarn, dynamic, longrope (phi3:
//    default and longrope, its "su" and "yarn" read as longrope, others
//    InvalidArgument as transformers' Phi3Config refuses them); unknown types
//    Unimplemented; partial_rotary_factor != 1 Unimplemented except for phi3;
//  - the context (max_position_embeddings) of a dynamic or yarn model is the
//    length its scaling extends to, as vLLM derives it: dynamic
//    max_position_embeddings * factor, yarn original_max_position * factor
//    (when longer than max_position_embeddings); rope.original_max_position
//    keeps the checkpoint's value;
//  - `quantization_config` (or the older `compression_config`) fills
//    ModelConfig::quant for the fp8 formats, each as published:
//    * "compressed-tensors" (llm-compressor; format "float-quantized", or
//      "naive-quantized" / "mixed-precision" / none with float 8-bit
//      weights): symmetric static e4m3 weights of strategy "tensor",
//      "channel" or "block" ([128, 128]); input_activations dynamic
//      "token", static "tensor" (input_scale tensors), dynamic "group" of
//      128 (block weights only), or null (weight-only, run as dynamic
//      per-token); targets ["Linear"] or module names / "re:" patterns
//      (QuantConfig::quantized_modules); `ignore` -> unquantized_modules.
//      Several config_groups must share one scheme;
//    * "fp8" (transformers' FineGrainedFP8Config: DeepSeek-V3, Qwen3-FP8;
//      vLLM's Fp8Config): activation_scheme "dynamic" / "static", fmt
//      "e4m3", weight_block_size [128, 128] (block scales
//      "weight_scale_inv", activations per 1 × 128 group; dynamic only) or
//      absent / null (per-tensor "weight_scale"); modules_to_not_convert /
//      ignored_layers;
//    * "modelopt" (NVIDIA ModelOpt; quant_algo at the top, or nested in
//      "quantization" as hf_quant_config.json holds it): "FP8" (per-tensor
//      weight_scale, static input_scale), "FP8_PER_CHANNEL_PER_TOKEN";
//      exclude_modules / ignore;
//    * "fbgemm_fp8": per-channel weight_scale [N, 1], dynamic per-token
//      activations, activation_scale_ub, modules_to_not_convert.
//    KV-cache schemes (kv_cache_scheme, kv_cache_quant_algo) are read as
//    absent: the KV cache keeps --kv-dtype (an fp8 KV cache is separate).
//    Unimplemented, naming what: every other known method ("quantization
//    method \"awq\" is not supported yet (supported: ...)"), int or 4-bit
//    formats, asymmetric, dynamic-weight or group-weight schemes, e5m2,
//    DeepSeek-V3.1's scale_fmt "ue8m0", class targets other than Linear,
//    block sizes other than 128 × 128, static activations with blocks,
//    sparse checkpoints, output-activation quantization, differing
//    config_groups, other quant_algos (NVFP4, W4A8_AWQ, INT8_SQ, ...).
//    InvalidArgument naming the key: a missing or unknown quant_method,
//    wrong types, missing required keys, lists over 4096 entries or names
//    over 1024 characters, malformed "re:" patterns. Never a silent
//    fallback.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

// One architecture's part of config parsing: after the fields every
// architecture shares, `parse_hparams` reads the architecture's own (biases,
// q/k norms, sliding windows, ...) from the config.json object into
// `config`. The model registry (registry.h) has one entry per model_type
// listed here, checked by its test.
struct ArchitectureConfig {
  absl::string_view model_type;
  Architecture arch;
  absl::Status (*parse_hparams)(const nlohmann::json& root,
                                ModelConfig* config);
  // The architecture reads hidden_act / hidden_activation and the RoPE keys
  // itself (parse_hparams), instead of the shared reading (silu only; one
  // RoPE for every layer).
  bool own_activation_and_rope = false;
};
// Every model_type ParseModelConfig accepts.
absl::Span<const ArchitectureConfig> ConfigArchitectures();

// The Llama family's ParseHParams: biases (llama: attention_bias, mlp_bias;
// qwen2: q/k/v always; qwen3: attention_bias), qwen3's q/k norms, and the
// sliding windows (mistral: sliding_window, default 4096; qwen2/qwen3:
// use_sliding_window, layer_types, max_window_layers).
absl::Status ParseLlamaHParams(const nlohmann::json& root, ModelConfig* config);
absl::Status ParseMistralHParams(const nlohmann::json& root,
                                 ModelConfig* config);
absl::Status ParseQwen2HParams(const nlohmann::json& root, ModelConfig* config);
absl::Status ParseQwen3HParams(const nlohmann::json& root, ModelConfig* config);
// The mixtures of experts: their attention as mistral's (mixtral, but with
// sliding_window absent meaning full attention, as MixtralConfig has it),
// qwen3's (qwen3_moe) or qwen2's (qwen2_moe: qkv_bias, default true, and its
// own sliding-window layer rule), plus MoeHParams: num_local_experts or
// num_experts (either spelling; both must then agree), num_experts_per_tok,
// moe_intermediate_size, shared_expert_intermediate_size (qwen2_moe),
// norm_topk_prob, decoder_sparse_step (>= 1) and mlp_only_layers (layer
// indices). Defaults are the transformers classes'. router_aux_loss_coef,
// router_jitter_noise and output_router_logits are training-only and
// ignored.
absl::Status ParseMixtralHParams(const nlohmann::json& root,
                                 ModelConfig* config);
absl::Status ParseQwen3MoeHParams(const nlohmann::json& root,
                                  ModelConfig* config);
absl::Status ParseQwen2MoeHParams(const nlohmann::json& root,
                                  ModelConfig* config);
// Phi-3: no biases; sliding_window (absent or null: full attention) for every
// layer; rms_norm_eps defaults to 1e-5 (Phi3Config's); with LongRoPE,
// recompute_at_length = original_max_position_embeddings.
absl::Status ParsePhi3HParams(const nlohmann::json& root, ModelConfig* config);

// Gemma's ParseHParams (transformers 5's GemmaConfig, Gemma2Config and
// Gemma3TextConfig): tied embeddings and head_dim 256 by default, the
// activation, the attention scale, the soft caps, the sandwich norms, the
// layer types and sliding windows, and gemma3's two RoPEs (rope_parameters
// keyed by layer type, or rope_theta + rope_scaling for the global layers and
// rope_local_base_freq for the local ones). use_bidirectional_attention is
// Unimplemented.
absl::Status ParseGemmaHParams(const nlohmann::json& root, ModelConfig* config);
absl::Status ParseGemma2HParams(const nlohmann::json& root,
                                ModelConfig* config);
absl::Status ParseGemma3HParams(const nlohmann::json& root,
                                ModelConfig* config);

// Adds the eos ids of a generation_config.json text to config->eos_token_ids
// (deduplicated): Hugging Face's generate() stops on those too. InvalidArgument
// for malformed JSON or a malformed eos_token_id.
absl::Status MergeGenerationConfig(absl::string_view json_text,
                                   ModelConfig* config);

// Reads and parses `<model_dir>/config.json`; also merges eos ids from
// `<model_dir>/generation_config.json` when present. NotFound if the directory
// or config.json is missing.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// --max-model-len (vLLM's): the context a model is served with. > 0 lowers
// config->max_position_embeddings to it, so everything sized or checked by
// the context (KV pool, request validation, max tokens) follows; 0 keeps it.
// InvalidArgument when it exceeds max_position_embeddings (as vLLM refuses
// it) or is negative. RoPE does not depend on it.
absl::Status LimitContext(int64_t max_model_len, ModelConfig* config);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_CONFIG_H_
