#include "runtime/model/config.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

using Json = nlohmann::json;

// The demo checkpoint's config, verbatim from
// shared/models/stories260K/config.json.
constexpr char kStories260K[] = R"json({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "model_type": "llama",
  "hidden_size": 64,
  "intermediate_size": 172,
  "num_hidden_layers": 5,
  "num_attention_heads": 8,
  "num_key_value_heads": 4,
  "head_dim": 8,
  "vocab_size": 512,
  "max_position_embeddings": 512,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "hidden_act": "silu",
  "tie_word_embeddings": true,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "torch_dtype": "float32",
  "attention_bias": false,
  "mlp_bias": false
})json";

// Llama 3.2 1B as transformers 4.45 writes it.
constexpr char kLlama32V4[] = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})json";

// Llama 3.1 8B Instruct as transformers 5 writes it (rope_parameters, dtype).
constexpr char kLlama31V5[] = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": false,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "vocab_size": 128256
})json";

// Mistral 7B v0.1.
constexpr char kMistral[] = R"json({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})json";

// Qwen2.5 0.5B.
constexpr char kQwen2[] = R"json({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})json";

// Qwen3 0.6B: head_dim (128) != hidden_size / heads (64); rope_theta an int.
constexpr char kQwen3[] = R"json({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})json";

testing::AssertionResult MessageContains(const absl::Status& status,
                                         const std::string& needle) {
  if (std::string(status.message()).find(needle) != std::string::npos) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure()
         << "message of " << status << " lacks \"" << needle << "\"";
}

absl::StatusOr<ModelConfig> ParseEdited(const char* base, const Json& patch) {
  Json config = Json::parse(base);
  config.merge_patch(patch);
  return ParseModelConfig(config.dump());
}

absl::StatusOr<ModelConfig> ParseWith(const char* base, const std::string& key,
                                      const Json& value) {
  Json config = Json::parse(base);
  config[key] = value;
  return ParseModelConfig(config.dump());
}

absl::StatusOr<ModelConfig> ParseWithout(const char* base,
                                         const std::string& key) {
  Json config = Json::parse(base);
  config.erase(key);
  return ParseModelConfig(config.dump());
}

TEST(ConfigTest, Stories260K) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kStories260K);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->llama.attention_bias);
  EXPECT_FALSE(c->llama.attention_out_bias);
  EXPECT_FALSE(c->llama.mlp_bias);
  EXPECT_FALSE(c->llama.qk_norm);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(5, 0));
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c->torch_dtype, "float32");
}

TEST(ConfigTest, Llama3RopeScalingTransformers4) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama32V4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position, 8192);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ConfigTest, Llama3RopeParametersTransformers5) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31V5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position, 8192);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c->torch_dtype, "bfloat16");  // From "dtype".
}

TEST(ConfigTest, RopeParametersWinOverRopeScaling) {
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kLlama31V5,
      {{"rope_theta", 1234.0},
       {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLlama3);
}

TEST(ConfigTest, RopeParametersDefaultTakesTopLevelThetaWhenAbsent) {
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kStories260K, {{"rope_theta", 20000.0},
                     {"rope_parameters", {{"rope_type", "default"}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 20000.0);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kNone);
}

TEST(ConfigTest, RopeThetaDefaultsTo10000) {
  absl::StatusOr<ModelConfig> c = ParseWithout(kStories260K, "rope_theta");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
}

TEST(ConfigTest, LinearRopeScalingOldTypeKey) {
  absl::StatusOr<ModelConfig> c = ParseWith(
      kStories260K, "rope_scaling", {{"type", "linear"}, {"factor", 4.0}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.factor, 4.0);
}

TEST(ConfigTest, LinearRopeParameters) {
  absl::StatusOr<ModelConfig> c = ParseWith(
      kStories260K, "rope_parameters",
      {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);
}

TEST(ConfigTest, LinearWithoutFactorIsError) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "rope_scaling", {{"rope_type", "linear"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "factor"));
}

TEST(ConfigTest, Llama3MissingFieldsAreErrors) {
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings"}) {
    Json config = Json::parse(kLlama32V4);
    config["rope_scaling"].erase(key);
    absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_TRUE(MessageContains(c.status(), key));
  }
}

TEST(ConfigTest, UnsupportedRopeTypesAreUnimplemented) {
  for (const char* type : {"su", "ntk", "proportional"}) {
    absl::StatusOr<ModelConfig> c = ParseWith(
        kStories260K, "rope_scaling", {{"rope_type", type}, {"factor", 4.0}});
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << type;
    EXPECT_TRUE(MessageContains(c.status(), std::string("rope_type \"") + type +
                                                "\" is not supported yet"));
  }
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "rope_parameters",
                {{"rope_type", "mrope"}, {"factor", 4.0}, {"rope_theta", 1e6}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(
      MessageContains(c.status(), "rope_type \"mrope\" is not supported yet"));
}

// transformers' get_mscale(scale, m) = 0.1 m ln(scale) + 1 (scale > 1).
double Mscale(double scale, double m) { return 0.1 * m * std::log(scale) + 1; }

// Qwen3 with YaRN as Qwen's model cards say to add it (transformers 4):
// factor 4 over 32768 original positions; attention_factor 0.1 ln 4 + 1;
// the context becomes 32768 * 4 (vLLM's), the rope keeps 32768.
TEST(ConfigTest, YarnTransformers4) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kQwen3, "rope_scaling",
                {{"rope_type", "yarn"},
                 {"factor", 4.0},
                 {"original_max_position_embeddings", 32768}});
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeConfig& r = c->rope;
  EXPECT_EQ(r.scaling, RopeScaling::kYarn);
  EXPECT_DOUBLE_EQ(r.theta, 1e6);
  EXPECT_DOUBLE_EQ(r.factor, 4.0);
  EXPECT_EQ(r.original_max_position, 32768);
  EXPECT_DOUBLE_EQ(r.attention_factor, Mscale(4.0, 1.0));
  EXPECT_DOUBLE_EQ(r.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(r.beta_slow, 1.0);
  EXPECT_TRUE(r.truncate);
  EXPECT_EQ(r.rotary_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 131072);
}

// The same as transformers 5 saves it, with every optional key.
TEST(ConfigTest, YarnTransformers5WithEveryKey) {
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kQwen3, {{"rope_scaling", nullptr},
                           {"rope_theta", nullptr},
                           {"max_position_embeddings", 4096},
                           {"rope_parameters",
                            {{"rope_type", "yarn"},
                             {"rope_theta", 50000.0},
                             {"factor", 8.0},
                             {"original_max_position_embeddings", 1024},
                             {"beta_fast", 16},
                             {"beta_slow", 2.0},
                             {"mscale", 0.707},
                             {"mscale_all_dim", 1.0},
                             {"truncate", false}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeConfig& r = c->rope;
  EXPECT_EQ(r.scaling, RopeScaling::kYarn);
  EXPECT_DOUBLE_EQ(r.theta, 50000.0);
  EXPECT_DOUBLE_EQ(r.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(r.beta_slow, 2.0);
  EXPECT_FALSE(r.truncate);
  EXPECT_DOUBLE_EQ(r.attention_factor, Mscale(8.0, 0.707) / Mscale(8.0, 1.0));
  EXPECT_EQ(c->max_position_embeddings, 8192);
}

TEST(ConfigTest, YarnDefaultsAndExplicitValues) {
  // No original_max_position_embeddings: transformers' standardization uses
  // max_position_embeddings (40960); beta 0 is unset; an explicit
  // attention_factor wins over mscale.
  absl::StatusOr<ModelConfig> c = ParseWith(kQwen3, "rope_scaling",
                                            {{"type", "yarn"},
                                             {"factor", 2.0},
                                             {"beta_fast", 0},
                                             {"attention_factor", 1.5},
                                             {"mscale", 1.0},
                                             {"mscale_all_dim", 0.5}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.original_max_position, 40960);
  EXPECT_DOUBLE_EQ(c->rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c->rope.attention_factor, 1.5);
  EXPECT_EQ(c->max_position_embeddings, 81920);
  // factor null: the ratio of the declared to the original context.
  c = ParseWith(kQwen3, "rope_scaling",
                {{"rope_type", "yarn"},
                 {"factor", nullptr},
                 {"original_max_position_embeddings", 10240}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->max_position_embeddings, 40960);
  // factor absent: refused, as transformers' validation does.
  c = ParseWith(kQwen3, "rope_scaling", {{"rope_type", "yarn"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "\"factor\""));
  c = ParseWith(kQwen3, "rope_scaling",
                {{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_slow", -1}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "beta_slow"));
}

// Dynamic NTK (transformers 4 spelling with "type"): transformers compares
// each length with max_position_embeddings, which the rope keeps; the
// served context is max_position_embeddings * factor (vLLM's), and
// --max-model-len lowers only that.
TEST(ConfigTest, DynamicNtk) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kQwen2, "rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.scaling, RopeScaling::kDynamic);
  EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);
  EXPECT_EQ(c->rope.original_max_position, 32768);
  EXPECT_EQ(c->max_position_embeddings, 65536);
  ASSERT_TRUE(LimitContext(1000, &*c).ok());
  EXPECT_EQ(c->max_position_embeddings, 1000);
  EXPECT_EQ(c->rope.original_max_position, 32768);
  c = ParseWith(kQwen2, "rope_parameters", {{"rope_type", "dynamic"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "\"factor\""));
}

// Phi-3 mini 4k as Microsoft ships it (transformers 4.40): no rope scaling,
// a 2047-token sliding window, rms_norm_eps 1e-5.
constexpr char kPhi3Mini4k[] = R"json({
  "architectures": ["Phi3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "embd_pdrop": 0.0,
  "eos_token_id": 32000,
  "hidden_act": "silu",
  "hidden_size": 3072,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 4096,
  "model_type": "phi3",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "original_max_position_embeddings": 4096,
  "pad_token_id": 32000,
  "resid_pdrop": 0.0,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "sliding_window": 2047,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2",
  "use_cache": true,
  "vocab_size": 32064
})json";

TEST(ConfigTest, Phi3Mini4k) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kPhi3Mini4k);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kPhi3);
  EXPECT_EQ(ArchitectureName(c->arch), "phi3");
  EXPECT_EQ(c->head_dim, 96);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kNone);
  EXPECT_EQ(c->rope.rotary_dim, 96);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->sliding_window_per_layer,
            std::vector<int64_t>(32, int64_t{2047}));
  EXPECT_FALSE(c->llama.attention_bias || c->llama.attention_out_bias ||
               c->llama.mlp_bias || c->llama.qk_norm);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  // Phi3Config's defaults: no window, eps 1e-5.
  c = ParseEdited(kPhi3Mini4k,
                  {{"sliding_window", nullptr}, {"rms_norm_eps", nullptr}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(32, 0));
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
}

std::vector<double> Ramp(int n, double from, double step) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + step * i;
  return v;
}

// Phi-3 mini 128k (transformers 4): LongRoPE with the top-level
// original_max_position_embeddings; factor = 131072 / 4096 = 32 and
// attention_factor sqrt(1 + ln 32 / ln 4096). The context stays 131072.
TEST(ConfigTest, Phi3LongRopeTransformers4) {
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kPhi3Mini4k, {{"max_position_embeddings", 131072},
                                {"sliding_window", 262144},
                                {"rope_scaling",
                                 {{"type", "longrope"},
                                  {"short_factor", Ramp(48, 1.0, 0.01)},
                                  {"long_factor", Ramp(48, 1.0, 0.5)}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeConfig& r = c->rope;
  EXPECT_EQ(r.scaling, RopeScaling::kLongRope);
  EXPECT_EQ(r.original_max_position, 4096);
  EXPECT_DOUBLE_EQ(r.factor, 32.0);
  EXPECT_DOUBLE_EQ(r.attention_factor,
                   std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_EQ(r.short_factor, Ramp(48, 1.0, 0.01));
  EXPECT_EQ(r.long_factor, Ramp(48, 1.0, 0.5));
  EXPECT_EQ(c->max_position_embeddings, 131072);
  // Phi-3's older spellings "su" and "yarn" are LongRoPE too.
  for (const char* type : {"su", "yarn"}) {
    absl::StatusOr<ModelConfig> old =
        ParseEdited(kPhi3Mini4k, {{"max_position_embeddings", 131072},
                                  {"rope_scaling",
                                   {{"type", type},
                                    {"short_factor", Ramp(48, 1.0, 0.01)},
                                    {"long_factor", Ramp(48, 1.0, 0.5)}}}});
    ASSERT_TRUE(old.ok()) << type << " " << old.status();
    EXPECT_EQ(old->rope.scaling, RopeScaling::kLongRope) << type;
  }
}

// Phi-4-mini as transformers 5 saves it: rope_parameters with a partial
// rotary factor of 0.75 (96 of 128 dims, 48 factors) and an explicit
// factor and attention_factor; phi3's top-level original context wins over
// rope_parameters'.
TEST(ConfigTest, Phi3LongRopePartialRotaryTransformers5) {
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kPhi3Mini4k, {{"rope_scaling", nullptr},
                                {"rope_theta", nullptr},
                                {"hidden_size", 3072},
                                {"num_attention_heads", 24},
                                {"num_key_value_heads", 8},
                                {"max_position_embeddings", 131072},
                                {"partial_rotary_factor", 0.75},
                                {"original_max_position_embeddings", 4096},
                                {"rope_parameters",
                                 {{"rope_type", "longrope"},
                                  {"rope_theta", 10000.0},
                                  {"partial_rotary_factor", 0.75},
                                  {"original_max_position_embeddings", 2048},
                                  {"factor", 16.0},
                                  {"attention_factor", 1.2},
                                  {"short_factor", Ramp(48, 1.0, 0.0)},
                                  {"long_factor", Ramp(48, 1.0, 1.0)}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeConfig& r = c->rope;
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(r.rotary_dim, 96);
  EXPECT_EQ(r.original_max_position, 4096);
  EXPECT_DOUBLE_EQ(r.factor, 16.0);
  EXPECT_DOUBLE_EQ(r.attention_factor, 1.2);
  // Factor lists must have one entry per rotated pair.
  c = ParseEdited(kPhi3Mini4k, {{"rope_scaling",
                                 {{"type", "longrope"},
                                  {"short_factor", Ramp(47, 1.0, 0.0)},
                                  {"long_factor", Ramp(48, 1.0, 0.0)}}}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "short_factor"));
  c = ParseEdited(kPhi3Mini4k, {{"rope_scaling",
                                 {{"type", "longrope"},
                                  {"short_factor", Ramp(48, 1.0, 0.0)},
                                  {"long_factor", Ramp(48, -1.0, 0.0)}}}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "long_factor"));
}

TEST(ConfigTest, Phi3RefusesOtherRopeTypesAndOddRotaryDims) {
  absl::StatusOr<ModelConfig> c = ParseWith(
      kPhi3Mini4k, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "\"linear\""));
  // 96 * 0.3 = 28.8 -> 28 dims: fine; 96 * 0.01 -> 0: refused.
  c = ParseWith(kPhi3Mini4k, "partial_rotary_factor", 0.3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.rotary_dim, 28);
  c = ParseWith(kPhi3Mini4k, "partial_rotary_factor", 0.01);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  c = ParseWith(kPhi3Mini4k, "partial_rotary_factor", 1.5);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, Phi3SmallIsRefusedAsAnotherArchitecture) {
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kPhi3Mini4k, {{"model_type", "phi3small"},
                                {"architectures", {"Phi3SmallForCausalLM"}}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      MessageContains(c.status(), "unsupported model_type \"phi3small\""));
  EXPECT_TRUE(MessageContains(c.status(), "not the phi3 architecture"));
}

TEST(ConfigTest, PartialRotaryFactorIsUnimplemented) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "partial_rotary_factor", 0.5);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(MessageContains(c.status(), "partial_rotary_factor"));

  c = ParseWith(kStories260K, "rope_parameters",
                {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);

  c = ParseWith(kStories260K, "partial_rotary_factor", 1.0);
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(ConfigTest, Mistral) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMistral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kMistral);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_FALSE(c->llama.attention_bias);
  EXPECT_FALSE(c->llama.attention_out_bias);
  EXPECT_FALSE(c->llama.mlp_bias);
  EXPECT_FALSE(c->llama.qk_norm);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(32, 4096));
}

TEST(ConfigTest, MistralNullSlidingWindowIsFullAttention) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kMistral, "sliding_window", nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(32, 0));
}

TEST(ConfigTest, Qwen2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_TRUE(c->llama.attention_bias);
  EXPECT_FALSE(c->llama.attention_out_bias);
  EXPECT_FALSE(c->llama.mlp_bias);
  EXPECT_FALSE(c->llama.qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  // use_sliding_window is false: sliding_window is ignored.
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(24, 0));
}

TEST(ConfigTest, Qwen2UseSlidingWindowAboveMaxWindowLayers) {
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kQwen2, {{"use_sliding_window", true},
                           {"max_window_layers", 20},
                           {"sliding_window", 4096}});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<int64_t> expected(24, 0);
  for (int i = 20; i < 24; ++i) expected[i] = 4096;
  EXPECT_EQ(c->sliding_window_per_layer, expected);
}

TEST(ConfigTest, Qwen2LayerTypes) {
  Json types = Json::array();
  for (int i = 0; i < 24; ++i) {
    types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kQwen2, {{"use_sliding_window", true}, {"layer_types", types}});
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(c->sliding_window_per_layer[i], i % 2 == 0 ? 32768 : 0) << i;
  }

  // As in Qwen2Config, the window only exists when use_sliding_window is set.
  c = ParseEdited(kQwen2, {{"layer_types", types}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(24, 0));
}

TEST(ConfigTest, LayerTypesWrongSizeIsError) {
  absl::StatusOr<ModelConfig> c = ParseWith(
      kQwen2, "layer_types", Json::array({"full_attention", "full_attention"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "layer_types"));
}

TEST(ConfigTest, Qwen3) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->num_heads, 16);
  EXPECT_EQ(c->head_dim, 128);  // Not 1024 / 16.
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_TRUE(c->llama.qk_norm);
  EXPECT_FALSE(c->llama.attention_bias);
  EXPECT_FALSE(c->llama.attention_out_bias);
  EXPECT_FALSE(c->llama.mlp_bias);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kNone);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(28, 0));
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{151645});
}

TEST(ConfigTest, Qwen3AttentionBias) {
  absl::StatusOr<ModelConfig> c = ParseWith(kQwen3, "attention_bias", true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->llama.attention_bias);
  EXPECT_TRUE(c->llama.attention_out_bias);
}

TEST(ConfigTest, LlamaBiases) {
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kStories260K, {{"attention_bias", true}, {"mlp_bias", true}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->llama.attention_bias);
  EXPECT_TRUE(c->llama.attention_out_bias);
  EXPECT_TRUE(c->llama.mlp_bias);
}

TEST(ConfigTest, SingleKvHead) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "num_key_value_heads", 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->num_heads, 8);
}

TEST(ConfigTest, KvHeadsDefaultToHeads) {
  absl::StatusOr<ModelConfig> c =
      ParseWithout(kStories260K, "num_key_value_heads");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);
  c = ParseWith(kStories260K, "num_key_value_heads", nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);
}

TEST(ConfigTest, HeadDimDefaultsWhenAbsentOrNull) {
  absl::StatusOr<ModelConfig> c = ParseWithout(kStories260K, "head_dim");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 8);
  c = ParseWith(kMistral, "head_dim", nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
}

TEST(ConfigTest, TiedAndUntied) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "tie_word_embeddings", false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tie_word_embeddings);
  c = ParseWith(kStories260K, "tie_word_embeddings", true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings);
  c = ParseWithout(kQwen3, "tie_word_embeddings");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tie_word_embeddings);  // Absent: false.
}

TEST(ConfigTest, TokenIdsAbsentOrNull) {
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kStories260K, {{"bos_token_id", nullptr}, {"eos_token_id", nullptr}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());

  Json config = Json::parse(kStories260K);
  config.erase("bos_token_id");
  config.erase("eos_token_id");
  c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(ConfigTest, EosListIsDeduplicated) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "eos_token_id", Json::array({2, 3, 2}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 3}));
}

TEST(ConfigTest, BadEosType) {
  absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, "eos_token_id", "2");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "eos_token_id"));
}

// Before: a bos_token_id of 2^32 parsed and was cast to int32 as 0 when
// prepended; 2^31 became negative.
TEST(ConfigTest, TokenIdsBeyondInt32AreRefused) {
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    for (const int64_t id : {int64_t{1} << 31, int64_t{1} << 32}) {
      absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, key, id);
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
          << key << " " << id << ": " << c.status();
      EXPECT_TRUE(MessageContains(
          c.status(), absl::StrCat("config key \"", key, "\" holds token id ",
                                   id, ", beyond the largest token id")));
    }
  }
  absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, "eos_token_id",
                                            Json::array({2, int64_t{1} << 31}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, TokenIdsOutsideTheVocabularyAreRefused) {
  // Stories260K's vocabulary is 512 tokens.
  absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, "bos_token_id", 512);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(
      c.status(),
      "config key \"bos_token_id\" holds token id 512, not below vocab_size "
      "512"));
  c = ParseWith(kStories260K, "eos_token_id", Json::array({2, 600}));
  EXPECT_TRUE(MessageContains(c.status(), "token id 600"));
  c = ParseWith(kStories260K, "bos_token_id", 511);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token_id, 511);
  // A negative bos means none, as an absent one does.
  c = ParseWith(kStories260K, "bos_token_id", -1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token_id, -1);
}

// Before: 2^62 parsed, and sizing the KV cache from it overflowed int64.
TEST(ConfigTest, HugeMaxPositionEmbeddingsIsRefused) {
  for (const int64_t n : {int64_t{1} << 31, int64_t{1} << 62,
                          std::numeric_limits<int64_t>::max()}) {
    absl::StatusOr<ModelConfig> c =
        ParseWith(kStories260K, "max_position_embeddings", n);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_TRUE(MessageContains(
        c.status(), absl::StrCat("\"max_position_embeddings\" is ", n,
                                 ", more than the 2147483647 supported")));
  }
  absl::StatusOr<ModelConfig> c = ParseWith(
      kStories260K, "max_position_embeddings", kMaxPositionEmbeddings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_position_embeddings, kMaxPositionEmbeddings);
}

TEST(ConfigTest, ArchitectureNames) {
  EXPECT_EQ(ArchitectureName(Architecture::kLlama), "llama");
  EXPECT_EQ(ArchitectureName(Architecture::kMistral), "mistral");
  EXPECT_EQ(ArchitectureName(Architecture::kQwen2), "qwen2");
  EXPECT_EQ(ArchitectureName(Architecture::kQwen3), "qwen3");
}

// ---- Errors -----------------------------------------------------------------

TEST(ConfigTest, MalformedJson) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig("{\"model_type\": ");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "malformed JSON"));
  c = ParseModelConfig("[1, 2]");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, MissingRequiredKeys) {
  {  // model_type is required only when no architectures class names one.
    Json root = Json::parse(kStories260K);
    root.erase("architectures");
    root.erase("model_type");
    absl::StatusOr<ModelConfig> c = ParseModelConfig(root.dump());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageContains(c.status(), "\"model_type\""));
  }
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "max_position_embeddings"}) {
    absl::StatusOr<ModelConfig> c = ParseWithout(kStories260K, key);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_TRUE(MessageContains(c.status(), std::string("\"") + key + "\""));
  }
}

TEST(ConfigTest, WrongTypeOrNonPositiveSizes) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "max_position_embeddings", "num_key_value_heads",
        "head_dim"}) {
    absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, key, "64");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_TRUE(MessageContains(c.status(), key));
    c = ParseWith(kStories260K, key, 0);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_TRUE(MessageContains(c.status(), key));
    c = ParseWith(kStories260K, key, -4);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    c = ParseWith(kStories260K, key, 64.5);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
  }
}

TEST(ConfigTest, UnknownModelType) {
  Json root = Json::parse(kStories260K);
  root.erase("architectures");
  root["model_type"] = "gpt2";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(root.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  // Architectures are appended to the list; the message starts with these.
  EXPECT_TRUE(absl::StartsWith(c.status().message(),
                               "unsupported model_type \"gpt2\" (supported: "
                               "llama, mistral, qwen2, qwen3"))
      << c.status();
  EXPECT_TRUE(MessageContains(c.status(), "gemma3_text"));
  EXPECT_TRUE(MessageContains(c.status(), "mixtral"));
  EXPECT_TRUE(MessageContains(c.status(), "qwen3_moe"));
  EXPECT_TRUE(MessageContains(c.status(), "qwen2_moe"));
  EXPECT_TRUE(MessageContains(c.status(), "phi3"));
}

// Dispatch: the architectures class first (transformers' AutoModelForCausalLM
// resolves it so), model_type as the fallback.
TEST(ConfigTest, ArchitecturesClassDecides) {
  absl::StatusOr<ModelConfig> c = ParseWithout(kStories260K, "model_type");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  c = ParseWithout(kStories260K, "architectures");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  c = ParseWith(kStories260K, "architectures", Json::array());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
}

TEST(ConfigTest, ArchitecturesAndModelTypeMismatch) {
  absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, "architectures",
                                            Json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "config.json's architectures names Qwen2ForCausalLM (model_type "
            "\"qwen2\") but its model_type is \"llama\": the config does not "
            "describe one architecture");
}

TEST(ConfigTest, UnknownArchitectureClass) {
  // A causal LM class Tessera does not list falls back to model_type.
  absl::StatusOr<ModelConfig> c = ParseWith(
      kStories260K, "architectures", Json::array({"MyLlamaForCausalLM"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  // Anything else is refused, naming the class.
  c = ParseWith(kStories260K, "architectures",
                Json::array({"LlamaForSequenceClassification"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(
      c.status(),
      "unsupported architecture \"LlamaForSequenceClassification\" (not a "
      "causal language model)"));
  c = ParseWithout(kStories260K, "model_type");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<ModelConfig> d =
      ParseModelConfig(R"({"architectures": ["GPT2LMHeadModel"]})");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(d.status(),
                              "unsupported architecture \"GPT2LMHeadModel\""));
  d = ParseModelConfig(R"({"architectures": "LlamaForCausalLM"})");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(d.status(), "\"architectures\" must be a list"));
}

TEST(ConfigTest, NonSiluActivation) {
  absl::StatusOr<ModelConfig> c = ParseWith(kStories260K, "hidden_act", "gelu");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "gelu"));
  c = ParseWithout(kStories260K, "hidden_act");
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(ConfigTest, RecognisedQuantizationMethodsAreUnimplemented) {
  for (const char* method : {"awq", "gptq", "compressed-tensors", "fp8",
                             "quark", "mxfp4", "AWQ", "FP8"}) {
    absl::StatusOr<ModelConfig> c =
        ParseWith(kLlama32V4, "quantization_config",
                  {{"quant_method", method}, {"bits", 4}});
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << method;
    EXPECT_TRUE(
        MessageContains(c.status(), std::string("quantization method \"") +
                                        method + "\" is not supported yet"));
  }
}

TEST(ConfigTest, UnknownQuantizationMethodIsInvalid) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kLlama32V4, "quantization_config", {{"quant_method", "foo"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      MessageContains(c.status(), "unknown quantization method \"foo\""));

  c = ParseWith(kLlama32V4, "quantization_config", {{"bits", 4}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "quant_method"));
}

TEST(ConfigTest, HeadsNotDivisible) {
  absl::StatusOr<ModelConfig> c =
      ParseWith(kStories260K, "num_key_value_heads", 3);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "num_key_value_heads"));

  // hidden_size 64 over 6 heads without head_dim.
  Json config = Json::parse(kStories260K);
  config.erase("head_dim");
  config["num_attention_heads"] = 6;
  config["num_key_value_heads"] = 6;
  c = ParseModelConfig(config.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "head_dim"));
}

// ---- LoadModelConfig --------------------------------------------------------

std::string MakeDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "config_test" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(LoadModelConfigTest, MissingDirectory) {
  const std::string dir = MakeDir("missing") + "/nope";
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(c.status(),
                              "model directory " + dir + " does not exist"));
}

TEST(LoadModelConfigTest, MissingConfigJson) {
  const std::string dir = MakeDir("no_config");
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(c.status(), dir + "/config.json not found"));
}

TEST(LoadModelConfigTest, ReadsConfigAndMergesGenerationEos) {
  const std::string dir = MakeDir("with_generation");
  WriteText(dir + "/config.json", kStories260K);
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{2});

  WriteText(
      dir + "/generation_config.json",
      R"({"bos_token_id": 1, "eos_token_id": [2, 7, 9], "do_sample": true})");
  c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 7, 9}));
}

TEST(LoadModelConfigTest, ErrorsNameTheFile) {
  const std::string dir = MakeDir("bad_config");
  WriteText(dir + "/config.json", "{not json");
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), dir + "/config.json"));

  WriteText(dir + "/config.json", kStories260K);
  WriteText(dir + "/generation_config.json", "{\"eos_token_id\": ");
  c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "generation_config.json"));
}

TEST(LoadModelConfigTest, GenerationEosIsRangeChecked) {
  const std::string dir = MakeDir("generation_range");
  WriteText(dir + "/config.json", kStories260K);
  WriteText(dir + "/generation_config.json", R"({"eos_token_id": 4294967296})");
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "generation_config.json"));
  EXPECT_TRUE(MessageContains(c.status(), "token id 4294967296"));
}

// Before: a FIFO named config.json was reported as "not found"; one named
// generation_config.json was skipped; neither may ever block.
TEST(LoadModelConfigTest, FifosAreRefusedNotWaitedOn) {
  const std::string dir = MakeDir("fifo");
  ASSERT_EQ(::mkfifo((dir + "/config.json").c_str(), 0644), 0);
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), dir + "/config.json is a FIFO"));

  std::filesystem::remove(dir + "/config.json");
  WriteText(dir + "/config.json", kStories260K);
  ASSERT_EQ(::mkfifo((dir + "/generation_config.json").c_str(), 0644), 0);
  c = LoadModelConfig(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      MessageContains(c.status(), dir + "/generation_config.json is a FIFO"));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Mixtral-8x7B-v0.1's config.json (transformers 4.36 spelling).
constexpr char kMixtral[] = R"json({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "vocab_size": 32000
})json";

// Qwen3-30B-A3B's config.json.
constexpr char kQwen3Moe[] = R"json({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})json";

// Qwen1.5-MoE-A2.7B's config.json.
constexpr char kQwen2Moe[] = R"json({
  "architectures": ["Qwen2MoeForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 8192,
  "max_window_layers": 21,
  "model_type": "qwen2_moe",
  "moe_intermediate_size": 1408,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts": 60,
  "num_experts_per_tok": 4,
  "num_hidden_layers": 24,
  "num_key_value_heads": 16,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 5632,
  "sliding_window": 32768,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})json";

Json Patched(const char* base, const Json& patch) {
  Json config = Json::parse(base);
  config.merge_patch(patch);
  return config;
}

TEST(MoeConfigTest, Mixtral) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMixtral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kMixtral);
  EXPECT_EQ(ArchitectureName(c->arch), "mixtral");
  EXPECT_FALSE(c->llama.attention_bias);
  EXPECT_FALSE(c->llama.qk_norm);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(32, 0));
  const MoeHParams& m = c->moe;
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(m.expert_intermediate_size, 14336);  // intermediate_size.
  EXPECT_EQ(m.shared_expert_intermediate_size, 0);
  EXPECT_TRUE(m.norm_topk_prob);  // Mixtral always renormalises.
  EXPECT_EQ(m.sparse_layers, std::vector<uint8_t>(32, 1));
  EXPECT_FALSE(m.any_dense());
  // norm_topk_prob is not Mixtral's: ignored.
  c = ParseEdited(kMixtral, {{"norm_topk_prob", false}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->moe.norm_topk_prob);
}

TEST(MoeConfigTest, MixtralDefaults) {
  Json config = Json::parse(kMixtral);
  for (const char* key : {"num_local_experts", "num_experts_per_tok",
                          "sliding_window", "router_aux_loss_coef"}) {
    config.erase(key);
  }
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 8);
  EXPECT_EQ(c->moe.experts_per_token, 2);
  // MixtralConfig's sliding_window defaults to None, unlike Mistral's 4096.
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(32, 0));
  c = ParseEdited(kMixtral, {{"sliding_window", 4096}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(32, 4096));
}

TEST(MoeConfigTest, Qwen3Moe) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3Moe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen3Moe);
  EXPECT_EQ(ArchitectureName(c->arch), "qwen3_moe");
  EXPECT_TRUE(c->llama.qk_norm);
  EXPECT_FALSE(c->llama.attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(48, 0));
  const MoeHParams& m = c->moe;
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_EQ(m.experts_per_token, 8);
  EXPECT_EQ(m.expert_intermediate_size, 768);
  EXPECT_EQ(c->intermediate_size, 6144);  // The dense layers' (none here).
  EXPECT_EQ(m.shared_expert_intermediate_size, 0);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.sparse_layers, std::vector<uint8_t>(48, 1));
  EXPECT_FALSE(m.any_dense());
  // Qwen3MoeConfig's norm_topk_prob defaults to false.
  c = ParseModelConfig([] {
    Json j = Json::parse(kQwen3Moe);
    j.erase("norm_topk_prob");
    return j.dump();
  }());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->moe.norm_topk_prob);
}

TEST(MoeConfigTest, Qwen3MoeSlidingWindowCoversEveryLayer) {
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kQwen3Moe, {{"use_sliding_window", true}, {"sliding_window", 512}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(48, 512));
}

TEST(MoeConfigTest, Qwen2Moe) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen2Moe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kQwen2Moe);
  EXPECT_EQ(ArchitectureName(c->arch), "qwen2_moe");
  EXPECT_TRUE(c->llama.attention_bias);  // qkv_bias defaults to true.
  EXPECT_FALSE(c->llama.attention_out_bias);
  EXPECT_FALSE(c->llama.qk_norm);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>(24, 0));
  const MoeHParams& m = c->moe;
  EXPECT_EQ(m.num_experts, 60);
  EXPECT_EQ(m.experts_per_token, 4);
  EXPECT_EQ(m.expert_intermediate_size, 1408);
  EXPECT_EQ(m.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(m.norm_topk_prob);
  EXPECT_EQ(m.sparse_layers, std::vector<uint8_t>(24, 1));
  c = ParseEdited(kQwen2Moe, {{"qkv_bias", false}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->llama.attention_bias);
}

TEST(MoeConfigTest, Qwen2MoeDefaults) {
  Json config = Json::parse(kQwen2Moe);
  for (const char* key :
       {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size", "norm_topk_prob",
        "decoder_sparse_step"}) {
    config.erase(key);
  }
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 60);
  EXPECT_EQ(c->moe.experts_per_token, 4);
  EXPECT_EQ(c->moe.expert_intermediate_size, 1408);
  EXPECT_EQ(c->moe.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.sparse_layers, std::vector<uint8_t>(24, 1));
}

TEST(MoeConfigTest, Qwen2MoeSlidingWindowRule) {
  // Without layer_types: the even layers below max_window_layers slide.
  Json config = Patched(kQwen2Moe, {{"use_sliding_window", true},
                                    {"sliding_window", 64},
                                    {"max_window_layers", 5},
                                    {"num_hidden_layers", 6}});
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer,
            (std::vector<int64_t>{64, 0, 64, 0, 64, 0}));
  // layer_types (what transformers 5 writes) decides when present.
  config["layer_types"] =
      Json::array({"full_attention", "sliding_attention", "full_attention",
                   "full_attention", "full_attention", "full_attention"});
  c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window_per_layer,
            (std::vector<int64_t>{0, 64, 0, 0, 0, 0}));
}

TEST(MoeConfigTest, SparseLayers) {
  // decoder_sparse_step 2: layers 1, 3, 5 are MoE; mlp_only_layers takes 3
  // back.
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kQwen3Moe, {{"num_hidden_layers", 6},
                              {"decoder_sparse_step", 2},
                              {"mlp_only_layers", Json::array({3})}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.sparse_layers, (std::vector<uint8_t>{0, 1, 0, 0, 0, 1}));
  EXPECT_TRUE(c->moe.sparse(1));
  EXPECT_FALSE(c->moe.sparse(3));
  EXPECT_FALSE(c->moe.sparse(6));
  EXPECT_TRUE(c->moe.any_dense());
  c = ParseEdited(kQwen2Moe, {{"mlp_only_layers", Json::array({0, 23})}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->moe.sparse(0));
  EXPECT_TRUE(c->moe.sparse(1));
  EXPECT_FALSE(c->moe.sparse(23));
}

TEST(MoeConfigTest, ExpertCountEitherSpelling) {
  // transformers 5's Qwen3MoeConfig maps num_experts to num_local_experts.
  Json config = Json::parse(kQwen3Moe);
  config.erase("num_experts");
  config["num_local_experts"] = 16;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 16);
  config["num_experts"] = 16;
  c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 16);
  config["num_experts"] = 32;
  c = ParseModelConfig(config.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "disagree")) << c.status();
  c = ParseEdited(kMixtral, {{"num_experts", 8}});
  ASSERT_TRUE(c.ok()) << c.status();
}

TEST(MoeConfigTest, BadValuesNameTheKey) {
  const struct {
    const char* base;
    const char* key;
    Json value;
  } cases[] = {
      {kMixtral, "num_local_experts", 0},
      {kMixtral, "num_local_experts", -3},
      {kMixtral, "num_local_experts", int64_t{1} << 40},
      {kMixtral, "num_local_experts", "8"},
      {kMixtral, "num_experts_per_tok", 0},
      {kMixtral, "num_experts_per_tok", 9},  // More than the 8 experts.
      {kQwen3Moe, "num_experts", 0},
      {kQwen3Moe, "num_experts_per_tok", 64},  // More than supported.
      {kQwen3Moe, "moe_intermediate_size", 0},
      {kQwen3Moe, "moe_intermediate_size", int64_t{1} << 30},
      {kQwen3Moe, "moe_intermediate_size", 7.5},
      {kQwen3Moe, "decoder_sparse_step", 0},
      {kQwen3Moe, "norm_topk_prob", 1},
      {kQwen3Moe, "mlp_only_layers", 3},
      {kQwen3Moe, "mlp_only_layers", Json::array({48})},
      {kQwen3Moe, "mlp_only_layers", Json::array({-1})},
      {kQwen3Moe, "mlp_only_layers", Json::array({"0"})},
      {kQwen2Moe, "shared_expert_intermediate_size", -1},
      {kQwen2Moe, "qkv_bias", "yes"},
  };
  for (const auto& t : cases) {
    absl::StatusOr<ModelConfig> c = ParseWith(t.base, t.key, t.value);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
        << t.key << " = " << t.value.dump();
    EXPECT_TRUE(MessageContains(c.status(), t.key))
        << t.key << ": " << c.status();
  }
}

TEST(MoeConfigTest, DenseModelsHaveNoExperts) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->moe.enabled());
  EXPECT_TRUE(c->moe.sparse_layers.empty());
  EXPECT_FALSE(c->moe.sparse(0));
  EXPECT_TRUE(c->moe.any_dense());
}

}  // namespace
}  // namespace tessera
