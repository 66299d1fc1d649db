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

// ---------------------------------------------------------------------------
// fp8 quantization configs. Each kXxx is the quantization_config of a
// published checkpoint, trimmed of keys the parser does not read only where
// noted.

// RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 (llm-compressor, static per-tensor
// weights and activations).
constexpr char kCtStaticTensor[] = R"json({
  "config_groups": {
    "group_0": {
      "input_activations": {
        "actorder": null, "block_structure": null, "dynamic": false,
        "group_size": null, "num_bits": 8, "observer": "minmax",
        "observer_kwargs": {}, "strategy": "tensor", "symmetric": true,
        "type": "float"
      },
      "output_activations": null,
      "targets": ["Linear"],
      "weights": {
        "actorder": null, "block_structure": null, "dynamic": false,
        "group_size": null, "num_bits": 8, "observer": "minmax",
        "observer_kwargs": {}, "strategy": "tensor", "symmetric": true,
        "type": "float"
      }
    }
  },
  "format": "float-quantized",
  "global_compression_ratio": 1.2405352996226195,
  "ignore": ["lm_head"],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "compressed"
})json";

// RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic (FP8_DYNAMIC: per-channel
// weights, dynamic per-token activations).
constexpr char kCtDynamicChannel[] = R"json({
  "config_groups": {
    "group_0": {
      "input_activations": {
        "actorder": null, "block_structure": null, "dynamic": true,
        "group_size": null, "num_bits": 8, "observer": null,
        "observer_kwargs": {}, "strategy": "token", "symmetric": true,
        "type": "float"
      },
      "output_activations": null,
      "targets": ["Linear"],
      "weights": {
        "actorder": null, "block_structure": null, "dynamic": false,
        "group_size": null, "num_bits": 8, "observer": "minmax",
        "observer_kwargs": {}, "strategy": "channel", "symmetric": true,
        "type": "float"
      }
    }
  },
  "format": "float-quantized",
  "global_compression_ratio": 1.463543865167781,
  "ignore": ["lm_head"],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "compressed"
})json";

// llm-compressor's FP8_BLOCK scheme (RedHatAI/Qwen3-30B-A3B-FP8-block: the
// MoE routers ignored by pattern).
constexpr char kCtBlock[] = R"json({
  "config_groups": {
    "group_0": {
      "format": "float-quantized",
      "input_activations": {
        "actorder": null, "block_structure": null, "dynamic": true,
        "group_size": 128, "num_bits": 8, "observer": null,
        "observer_kwargs": {}, "strategy": "group", "symmetric": true,
        "type": "float"
      },
      "output_activations": null,
      "targets": ["Linear"],
      "weights": {
        "actorder": null, "block_structure": [128, 128], "dynamic": false,
        "group_size": null, "num_bits": 8, "observer": "static_minmax",
        "observer_kwargs": {}, "strategy": "block", "symmetric": true,
        "type": "float"
      }
    }
  },
  "format": "float-quantized",
  "global_compression_ratio": null,
  "ignore": ["lm_head", "re:.*mlp.gate$"],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "compressed",
  "sparsity_config": {},
  "transform_config": {},
  "version": "0.11.1"
})json";

// neuralmagic/Meta-Llama-3-8B-Instruct-FP8 (2024): the older
// "naive-quantized" name of the format, status "frozen".
constexpr char kCtNaive[] = R"json({
  "config_groups": {
    "group_0": {
      "input_activations": {
        "block_structure": null, "dynamic": false, "group_size": null,
        "num_bits": 8, "observer": "minmax", "observer_kwargs": {},
        "strategy": "tensor", "symmetric": true, "type": "float"
      },
      "output_activations": null,
      "targets": ["Linear"],
      "weights": {
        "block_structure": null, "dynamic": false, "group_size": null,
        "num_bits": 8, "observer": "minmax", "observer_kwargs": {},
        "strategy": "tensor", "symmetric": true, "type": "float"
      }
    }
  },
  "format": "naive-quantized",
  "global_compression_ratio": 1.2320464091312503,
  "ignore": ["lm_head"],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "frozen"
})json";

// Qwen/Qwen3-8B-FP8 (and deepseek-ai/DeepSeek-V3's, byte for byte).
constexpr char kFp8Qwen3[] = R"json({
  "activation_scheme": "dynamic",
  "fmt": "e4m3",
  "quant_method": "fp8",
  "weight_block_size": [128, 128]
})json";

// transformers 5's FineGrainedFP8Config.to_dict().
constexpr char kFp8Transformers[] = R"json({
  "activation_scheme": "dynamic",
  "dequantize": false,
  "modules_to_not_convert": ["lm_head"],
  "quant_method": "fp8",
  "scale_fmt": "float",
  "weight_block_size": [128, 128]
})json";

// vLLM's Fp8Config as AutoFP8 wrote it (per-tensor, static activations).
constexpr char kFp8Static[] = R"json({
  "quant_method": "fp8",
  "activation_scheme": "static",
  "ignored_layers": ["lm_head"]
})json";

// ModelOpt's config.json as newer exports write it (compressed-tensors-like
// groups beside quant_algo, which decides; vLLM reads `ignore` here).
constexpr char kModelopt[] = R"json({
  "config_groups": {
    "group_0": {
      "input_activations": {"dynamic": false, "num_bits": 8, "type": "float"},
      "weights": {"dynamic": false, "num_bits": 8, "type": "float"},
      "targets": ["Linear"]
    }
  },
  "ignore": ["lm_head"],
  "kv_cache_quant_algo": "FP8",
  "producer": {"name": "modelopt", "version": "0.29.0"},
  "quant_algo": "FP8",
  "quant_method": "modelopt"
})json";

// The hf_quant_config.json spelling (ModelOpt's own file), nested.
constexpr char kModeloptNested[] = R"json({
  "quant_method": "modelopt",
  "producer": {"name": "modelopt", "version": "0.15.1"},
  "quantization": {
    "quant_algo": "FP8",
    "kv_cache_quant_algo": null,
    "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]
  }
})json";

// meta-llama/Llama-3.1-405B-Instruct-FP8 (its modules_to_not_convert lists
// every layer's attention and the first and last layers' MLPs; trimmed).
constexpr char kFbgemm[] = R"json({
  "quant_method": "fbgemm_fp8",
  "activation_scale_ub": 1200.0,
  "modules_to_not_convert": [
    "model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj",
    "model.layers.0.mlp.up_proj", "model.layers.0.self_attn.k_proj",
    "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.q_proj",
    "lm_head"
  ]
})json";

absl::StatusOr<ModelConfig> ParseQuant(const Json& quantization_config) {
  return ParseWith(kLlama31V5, "quantization_config", quantization_config);
}
absl::StatusOr<ModelConfig> ParseQuant(const char* quantization_config) {
  return ParseQuant(Json::parse(quantization_config));
}

TEST(QuantConfigTest, UnquantizedByDefault) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31V5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->quant.quantized());
  EXPECT_FALSE(c->quant.Quantizes("model.layers.0.self_attn.q_proj"));
}

TEST(QuantConfigTest, CompressedTensorsStaticPerTensor) {
  absl::StatusOr<ModelConfig> c = ParseQuant(kCtStaticTensor);
  ASSERT_TRUE(c.ok()) << c.status();
  const QuantConfig& q = c->quant;
  EXPECT_EQ(q.method, "compressed-tensors");
  EXPECT_FALSE(q.kv_cache_scales);  // kv_cache_scheme null.
  EXPECT_EQ(q.weight_scale, Fp8WeightScale::kPerTensor);
  EXPECT_EQ(q.input_scale, Fp8InputScale::kStaticPerTensor);
  EXPECT_EQ(q.scale_suffix, "weight_scale");
  EXPECT_EQ(q.unquantized_modules, std::vector<std::string>{"lm_head"});
  EXPECT_TRUE(q.quantized_modules.empty());
  EXPECT_TRUE(q.Quantizes("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.31.mlp.down_proj"));
  EXPECT_FALSE(q.Quantizes("lm_head"));
  EXPECT_FALSE(q.Quantizes("model.embed_tokens"));
  // The older naive-quantized name, quantization_status "frozen".
  c = ParseQuant(kCtNaive);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerTensor);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kStaticPerTensor);
}

TEST(QuantConfigTest, CompressedTensorsDynamicPerChannel) {
  absl::StatusOr<ModelConfig> c = ParseQuant(kCtDynamicChannel);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerChannel);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kDynamicPerToken);
  EXPECT_EQ(c->quant.block_rows, 0);
}

TEST(QuantConfigTest, CompressedTensorsBlock) {
  absl::StatusOr<ModelConfig> c = ParseQuant(kCtBlock);
  ASSERT_TRUE(c.ok()) << c.status();
  const QuantConfig& q = c->quant;
  EXPECT_EQ(q.weight_scale, Fp8WeightScale::kBlock);
  EXPECT_EQ(q.block_rows, 128);
  EXPECT_EQ(q.block_cols, 128);
  EXPECT_EQ(q.input_scale, Fp8InputScale::kDynamicPerGroup);
  EXPECT_EQ(q.scale_suffix, "weight_scale");
  EXPECT_FALSE(q.Quantizes("model.layers.5.mlp.gate"));
  EXPECT_TRUE(q.Quantizes("model.layers.5.mlp.experts.3.gate_proj"));
  EXPECT_FALSE(q.Quantizes("lm_head"));
}

TEST(QuantConfigTest, CompressedTensorsWeightOnlyRunsPerToken) {
  // W8A16 (llm-compressor's FP8 weight-only): no input_activations.
  Json j = Json::parse(kCtDynamicChannel);
  j["config_groups"]["group_0"]["input_activations"] = nullptr;
  absl::StatusOr<ModelConfig> c = ParseQuant(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kDynamicPerToken);
  j["config_groups"]["group_0"].erase("input_activations");
  c = ParseQuant(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kDynamicPerToken);
}

TEST(QuantConfigTest, CompressedTensorsDefaultsAndOptionalKeys) {
  // compressed-tensors' defaults: symmetric, static, strategy from
  // block_structure; format absent; kv_cache_scheme read as absent.
  const Json j = Json::parse(R"json({
    "quant_method": "compressed-tensors",
    "config_groups": {"group_0": {
      "targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "block_structure": [128, 128]},
      "input_activations": {"num_bits": 8, "type": "float", "dynamic": true,
                            "strategy": "group", "group_size": 128}}},
    "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                        "dynamic": false, "symmetric": true},
    "quantization_status": "compressed"
  })json");
  absl::StatusOr<ModelConfig> c = ParseQuant(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kBlock);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kDynamicPerGroup);
  EXPECT_TRUE(c->quant.unquantized_modules.empty());
  // 8-bit float KV scales per tensor: loaded for an fp8 KV cache.
  EXPECT_TRUE(c->quant.kv_cache_scales);
  Json int_kv = j;
  int_kv["kv_cache_scheme"]["type"] = "int";
  c = ParseQuant(int_kv);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->quant.kv_cache_scales);
  // The older compression_config key.
  c = ParseWith(kLlama31V5, "compression_config", Json::parse(kCtStaticTensor));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.method, "compressed-tensors");
  // The quantization part nested beside a dense sparsity_config.
  Json nested = {{"quant_method", "compressed-tensors"},
                 {"quantization_config", Json::parse(kCtDynamicChannel)},
                 {"sparsity_config", {{"format", "dense"}}}};
  c = ParseQuant(nested);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerChannel);
}

TEST(QuantConfigTest, CompressedTensorsGroupsSharingASchemeMerge) {
  // Two groups, one scheme, module targets: only those modules quantized.
  Json j = Json::parse(kCtDynamicChannel);
  Json group = j["config_groups"]["group_0"];
  group["targets"] = {"re:.*self_attn\\.(q|k|v|o)_proj$"};
  j["config_groups"]["group_0"] = group;
  group["targets"] = {"model.layers.0.mlp.down_proj"};
  j["config_groups"]["group_1"] = group;
  absl::StatusOr<ModelConfig> c = ParseQuant(j);
  ASSERT_TRUE(c.ok()) << c.status();
  const QuantConfig& q = c->quant;
  EXPECT_EQ(q.quantized_modules.size(), 2);
  EXPECT_TRUE(q.Quantizes("model.layers.3.self_attn.k_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(q.Quantizes("model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(q.Quantizes("model.layers.3.mlp.up_proj"));
  EXPECT_FALSE(q.Quantizes("lm_head"));
  // "Linear" in any group covers every linear module.
  j["config_groups"]["group_1"]["targets"] = {"Linear"};
  c = ParseQuant(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quant.quantized_modules.empty());
  EXPECT_TRUE(c->quant.Quantizes("model.layers.3.mlp.up_proj"));
}

TEST(QuantConfigTest, Fp8BlockMethod) {
  for (const char* config : {kFp8Qwen3, kFp8Transformers}) {
    absl::StatusOr<ModelConfig> c = ParseQuant(config);
    ASSERT_TRUE(c.ok()) << c.status();
    const QuantConfig& q = c->quant;
    EXPECT_EQ(q.method, "fp8");
    EXPECT_EQ(q.weight_scale, Fp8WeightScale::kBlock);
    EXPECT_EQ(q.block_rows, 128);
    EXPECT_EQ(q.block_cols, 128);
    EXPECT_EQ(q.input_scale, Fp8InputScale::kDynamicPerGroup);
    EXPECT_EQ(q.scale_suffix, "weight_scale_inv");
    EXPECT_TRUE(q.Quantizes("model.layers.0.mlp.gate_proj"));
  }
  absl::StatusOr<ModelConfig> c = ParseQuant(kFp8Transformers);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->quant.Quantizes("lm_head"));
  // DeepSeek-style upper-case scheme names are accepted as transformers
  // lower-cases them.
  c = ParseQuant(Patched(kFp8Qwen3, {{"activation_scheme", "DYNAMIC"}}));
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(QuantConfigTest, Fp8PerTensorMethod) {
  absl::StatusOr<ModelConfig> c = ParseQuant(kFp8Static);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerTensor);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kStaticPerTensor);
  EXPECT_EQ(c->quant.scale_suffix, "weight_scale");
  EXPECT_FALSE(c->quant.Quantizes("lm_head"));
  c = ParseQuant(Json{{"quant_method", "fp8"},
                      {"activation_scheme", "dynamic"},
                      {"weight_block_size", nullptr}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerTensor);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kDynamicPerToken);
}

TEST(QuantConfigTest, Modelopt) {
  absl::StatusOr<ModelConfig> c = ParseQuant(kModelopt);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.method, "modelopt");
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerTensor);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kStaticPerTensor);
  EXPECT_EQ(c->quant.scale_suffix, "weight_scale");
  EXPECT_FALSE(c->quant.Quantizes("lm_head"));
  EXPECT_TRUE(c->quant.kv_cache_scales);  // kv_cache_quant_algo FP8.

  // Flat with the hf_quant_config.json key name.
  c = ParseQuant(Json{{"quant_method", "modelopt"},
                      {"quant_algo", "FP8"},
                      {"exclude_modules", {"lm_head"}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->quant.Quantizes("lm_head"));

  c = ParseQuant(kModeloptNested);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerTensor);
  EXPECT_FALSE(c->quant.kv_cache_scales);  // kv_cache_quant_algo null.
  EXPECT_FALSE(c->quant.Quantizes("model.layers.7.mlp.gate"));
  EXPECT_TRUE(c->quant.Quantizes("model.layers.7.mlp.gate_proj"));

  // Newer exports: compressed-tensors-like, `ignore`, lower-case algo.
  c = ParseQuant(Json{{"quant_method", "modelopt"},
                      {"quant_algo", "fp8_per_channel_per_token"},
                      {"ignore", {"lm_head", "model.layers.*.self_attn*"}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant.weight_scale, Fp8WeightScale::kPerChannel);
  EXPECT_EQ(c->quant.input_scale, Fp8InputScale::kDynamicPerToken);
  EXPECT_FALSE(c->quant.Quantizes("model.layers.2.self_attn.o_proj"));
  EXPECT_TRUE(c->quant.Quantizes("model.layers.2.mlp.down_proj"));
}

TEST(QuantConfigTest, Fbgemm) {
  absl::StatusOr<ModelConfig> c = ParseQuant(kFbgemm);
  ASSERT_TRUE(c.ok()) << c.status();
  const QuantConfig& q = c->quant;
  EXPECT_EQ(q.method, "fbgemm_fp8");
  EXPECT_EQ(q.weight_scale, Fp8WeightScale::kPerChannel);
  EXPECT_EQ(q.input_scale, Fp8InputScale::kDynamicPerToken);
  EXPECT_EQ(q.scale_suffix, "weight_scale");
  EXPECT_EQ(q.activation_scale_ub, 1200.0);
  EXPECT_FALSE(q.Quantizes("model.layers.0.mlp.up_proj"));
  EXPECT_FALSE(q.Quantizes("model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.1.self_attn.k_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.1.mlp.up_proj"));
  EXPECT_FALSE(q.Quantizes("lm_head"));
}

TEST(QuantConfigTest, KnownMethodsAreUnimplementedNamingThem) {
  for (const char* method :
       {"awq", "gptq", "gptq_marlin", "bitsandbytes", "quark", "mxfp4", "gguf",
        "hqq", "eetq", "aqlm", "torchao", "bitnet", "higgs", "vptq", "spqr",
        "auto-round", "AWQ", "modelopt_fp4"}) {
    absl::StatusOr<ModelConfig> c =
        ParseQuant(Json{{"quant_method", method}, {"bits", 4}});
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << method;
    EXPECT_TRUE(MessageContains(
        c.status(), std::string("quantization method \"") + method +
                        "\" is not supported yet (supported: "
                        "compressed-tensors fp8, fp8, modelopt FP8, "
                        "fbgemm_fp8)"));
  }
}

TEST(QuantConfigTest, UnknownMethodIsInvalid) {
  absl::StatusOr<ModelConfig> c = ParseQuant(Json{{"quant_method", "foo"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      MessageContains(c.status(), "unknown quantization method \"foo\""));
  c = ParseQuant(Json{{"bits", 4}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "quant_method"));
  c = ParseQuant(Json{{"quant_method", 8}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "quantization_config.quant_method"));
  c = ParseWith(kLlama31V5, "quantization_config", "fp8");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), "\"quantization_config\" must be"));
}

// Edits `base` at the JSON pointer `pointer` (a whole-object replace with
// `value`), parses it, and expects `code` with every needle in the message.
void ExpectQuantError(const char* base, const std::string& pointer,
                      const Json& value, absl::StatusCode code,
                      const std::vector<std::string>& needles) {
  Json j = Json::parse(base);
  if (value.is_discarded()) {
    j.erase(pointer.substr(1));  // Top-level keys only.
  } else {
    j[Json::json_pointer(pointer)] = value;
  }
  absl::StatusOr<ModelConfig> c = ParseQuant(j);
  EXPECT_EQ(c.status().code(), code)
      << pointer << " = " << value.dump() << ": " << c.status();
  for (const std::string& needle : needles) {
    EXPECT_TRUE(MessageContains(c.status(), needle)) << pointer;
  }
}

constexpr absl::StatusCode kUnimpl = absl::StatusCode::kUnimplemented;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
const char kW[] = "/config_groups/group_0/weights";
const char kA[] = "/config_groups/group_0/input_activations";

TEST(QuantConfigTest, CompressedTensorsRefusals) {
  ExpectQuantError(
      kCtDynamicChannel, "/format", "int-quantized", kUnimpl,
      {"compressed-tensors format \"int-quantized\"", "not supported yet"});
  ExpectQuantError(kCtDynamicChannel, "/format", "pack-quantized", kUnimpl,
                   {"\"pack-quantized\""});
  ExpectQuantError(kCtDynamicChannel, "/format", "nvfp4-pack-quantized",
                   kUnimpl, {"\"nvfp4-pack-quantized\""});
  ExpectQuantError(kCtDynamicChannel, "/format", "dense", kUnimpl,
                   {"\"dense\""});
  ExpectQuantError(kCtDynamicChannel, "/config_groups/group_0/format",
                   "pack-quantized", kUnimpl, {"\"pack-quantized\""});
  // int8 weights under the older shared format name.
  ExpectQuantError(kCtNaive, std::string(kW) + "/type", "int", kUnimpl,
                   {"int8 weights", "group_0"});
  ExpectQuantError(kCtDynamicChannel, std::string(kW) + "/num_bits", 4, kUnimpl,
                   {"4-bit float weights", "fp4"});
  ExpectQuantError(kCtDynamicChannel, std::string(kW) + "/symmetric", false,
                   kUnimpl, {"asymmetric"});
  ExpectQuantError(kCtDynamicChannel, std::string(kW) + "/dynamic", true,
                   kUnimpl, {"dynamic"});
  ExpectQuantError(kCtDynamicChannel, std::string(kW) + "/strategy", "group",
                   kUnimpl, {"strategy \"group\""});
  ExpectQuantError(kCtBlock, std::string(kW) + "/block_structure",
                   Json::array({64, 64}), kUnimpl, {"64x64", "only 128x128"});
  ExpectQuantError(kCtBlock, kA, Json::parse(R"({"num_bits": 8,
                   "type": "float", "strategy": "tensor", "dynamic": false})"),
                   kUnimpl, {"static activations with block weights"});
  ExpectQuantError(kCtDynamicChannel, std::string(kA) + "/strategy", "tensor",
                   kUnimpl, {"dynamic activations of strategy \"tensor\""});
  ExpectQuantError(kCtDynamicChannel, std::string(kA) + "/type", "int", kUnimpl,
                   {"int8"});
  // Per-group activations need block weights.
  ExpectQuantError(kCtDynamicChannel, kA, Json::parse(R"({"num_bits": 8,
                   "type": "float", "strategy": "group", "group_size": 128,
                   "dynamic": true})"),
                   kUnimpl, {"strategy \"group\""});
  ExpectQuantError(kCtBlock, std::string(kA) + "/group_size", 64, kUnimpl,
                   {"strategy \"group\""});
  ExpectQuantError(kCtDynamicChannel,
                   "/config_groups/group_0/output_activations",
                   Json::parse(R"({"num_bits": 8, "type": "float"})"), kUnimpl,
                   {"output activations"});
  ExpectQuantError(kCtDynamicChannel, "/config_groups/group_0/targets",
                   Json::array({"Embedding"}), kUnimpl,
                   {"class \"Embedding\""});
  ExpectQuantError(kCtDynamicChannel, "/sparsity_config",
                   Json::parse(R"({"format": "sparse-24-bitmask"})"), kUnimpl,
                   {"sparse"});
  // Two groups with different schemes, both named.
  Json j = Json::parse(kCtDynamicChannel);
  Json other = Json::parse(kCtStaticTensor)["config_groups"]["group_0"];
  other["targets"] = {"re:.*down_proj"};
  j["config_groups"]["group_1"] = other;
  absl::StatusOr<ModelConfig> c = ParseQuant(j);
  EXPECT_EQ(c.status().code(), kUnimpl);
  EXPECT_TRUE(MessageContains(c.status(), "different schemes"));
  EXPECT_TRUE(MessageContains(c.status(),
                              "group_0 (fp8 per-channel weights, "
                              "dynamic per-token activations)"));
  EXPECT_TRUE(MessageContains(c.status(),
                              "group_1 (fp8 per-tensor weights, "
                              "static per-tensor activations)"));
}

TEST(QuantConfigTest, Fp8MethodRefusals) {
  ExpectQuantError(kFp8Qwen3, "/fmt", "e5m2", kUnimpl, {"\"e5m2\""});
  ExpectQuantError(kFp8Qwen3, "/weight_block_size", Json::array({64, 64}),
                   kUnimpl, {"[64, 64]", "only [128, 128]"});
  ExpectQuantError(kFp8Qwen3, "/weight_block_size", Json::array({128, 256}),
                   kUnimpl, {"[128, 256]"});
  ExpectQuantError(kFp8Qwen3, "/activation_scheme", "static", kUnimpl,
                   {"\"static\" with weight_block_size"});
  ExpectQuantError(kFp8Qwen3, "/scale_fmt", "ue8m0", kUnimpl, {"ue8m0"});
}

TEST(QuantConfigTest, ModeloptRefusals) {
  for (const char* algo :
       {"NVFP4", "W4A8_AWQ", "INT8_SQ", "FP8_PB_WO", "MIXED_PRECISION"}) {
    ExpectQuantError(kModelopt, "/quant_algo", algo, kUnimpl,
                     {std::string("modelopt quant_algo \"") + algo + "\"",
                      "supported: FP8, FP8_PER_CHANNEL_PER_TOKEN"});
  }
  ExpectQuantError(kModelopt, "/quant_algo", Json(Json::value_t::discarded),
                   kInvalid, {"quantization_config.quant_algo"});
  ExpectQuantError(kModeloptNested, "/quantization/quant_algo", "NVFP4",
                   kUnimpl, {"\"NVFP4\""});
  ExpectQuantError(kModeloptNested, "/quantization", "FP8", kInvalid,
                   {"quantization_config.quantization"});
}

TEST(QuantConfigTest, MalformedFieldsNameTheKey) {
  struct Case {
    const char* base;
    std::string pointer;
    Json value;
    std::string key;
  };
  const std::string big(1025, 'x');
  const Case cases[] = {
      {kCtDynamicChannel, "/ignore", "lm_head", "quantization_config.ignore"},
      {kCtDynamicChannel, "/ignore", Json::array({1}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/ignore", Json::array({""}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/ignore", Json::array({"lm_head", big}),
       "quantization_config.ignore[1]"},
      {kCtDynamicChannel, "/ignore",
       Json(std::vector<std::string>(257, "re:lm_head")),
       "quantization_config.ignore[256]"},
      {kCtDynamicChannel, "/ignore", Json::array({"re:(abc"}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/ignore", Json::array({"re:a**"}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/ignore", Json::array({"re:(a)\\1"}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/ignore", Json::array({"re:[z-a]"}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/ignore", Json::array({"re:x{5,2}"}),
       "quantization_config.ignore[0]"},
      {kCtDynamicChannel, "/config_groups", Json::object(),
       "quantization_config.config_groups"},
      {kCtDynamicChannel, "/config_groups", Json::array(),
       "quantization_config.config_groups"},
      {kCtDynamicChannel, "/config_groups/group_0", 3,
       "quantization_config.config_groups.group_0"},
      {kCtDynamicChannel, "/config_groups/group_0/targets", "Linear",
       "quantization_config.config_groups.group_0.targets"},
      {kCtDynamicChannel, std::string(kW) + "/num_bits", "8",
       "quantization_config.config_groups.group_0.weights.num_bits"},
      {kCtDynamicChannel, std::string(kW) + "/type", "fp",
       "quantization_config.config_groups.group_0.weights.type"},
      {kCtDynamicChannel, std::string(kW) + "/strategy", "rows",
       "quantization_config.config_groups.group_0.weights.strategy"},
      {kCtDynamicChannel, std::string(kW) + "/dynamic", "yes",
       "quantization_config.config_groups.group_0.weights.dynamic"},
      {kCtDynamicChannel, std::string(kW) + "/symmetric", 1, "symmetric"},
      {kCtDynamicChannel, std::string(kW), "fp8",
       "quantization_config.config_groups.group_0.weights"},
      {kCtBlock, std::string(kW) + "/block_structure", Json::array({128}),
       "quantization_config.config_groups.group_0.weights.block_structure"},
      {kCtBlock, std::string(kW) + "/block_structure", nullptr,
       "quantization_config.config_groups.group_0.weights.block_structure"},
      {kCtDynamicChannel, "/format", "fancy-quantized",
       "quantization_config.format"},
      {kCtDynamicChannel, "/format", 1, "quantization_config.format"},
      {kFp8Qwen3, "/activation_scheme", "sometimes",
       "quantization_config.activation_scheme"},
      {kFp8Qwen3, "/activation_scheme", 1,
       "quantization_config.activation_scheme"},
      {kFp8Qwen3, "/weight_block_size", "128x128",
       "quantization_config.weight_block_size"},
      {kFp8Qwen3, "/weight_block_size", Json::array({0, 128}),
       "quantization_config.weight_block_size"},
      {kFp8Qwen3, "/weight_block_size", Json::array({128.5, 128}),
       "quantization_config.weight_block_size"},
      {kFp8Qwen3, "/fmt", "e3m4", "quantization_config.fmt"},
      {kFp8Transformers, "/modules_to_not_convert", "lm_head",
       "quantization_config.modules_to_not_convert"},
      {kFp8Static, "/ignored_layers", Json::array({nullptr}),
       "quantization_config.ignored_layers[0]"},
      {kModelopt, "/exclude_modules", Json::object(),
       "quantization_config.exclude_modules"},
      {kModelopt, "/quant_algo", 8, "quantization_config.quant_algo"},
      {kFbgemm, "/activation_scale_ub", -1.0,
       "quantization_config.activation_scale_ub"},
      {kFbgemm, "/activation_scale_ub", "1200",
       "quantization_config.activation_scale_ub"},
  };
  for (const Case& t : cases) {
    ExpectQuantError(t.base, t.pointer, t.value, kInvalid, {t.key});
  }
  // A missing required key, by name.
  ExpectQuantError(kFp8Qwen3, "/activation_scheme",
                   Json(Json::value_t::discarded), kInvalid,
                   {"missing required key \"quantization_config."
                    "activation_scheme\""});
  ExpectQuantError(kCtDynamicChannel, "/config_groups",
                   Json(Json::value_t::discarded), kInvalid,
                   {"missing required key \"quantization_config."
                    "config_groups\""});
  Json j = Json::parse(kCtDynamicChannel);
  j["config_groups"]["group_0"].erase("targets");
  absl::StatusOr<ModelConfig> c = ParseQuant(j);
  EXPECT_EQ(c.status().code(), kInvalid);
  EXPECT_TRUE(MessageContains(c.status(),
                              "quantization_config.config_groups.group_0."
                              "targets"));
  // Bounded lists: 4096 entries is the most.
  Json many = Json::array();
  for (int i = 0; i < 4096; ++i) many.push_back("m" + std::to_string(i));
  c = ParseQuant(Patched(kCtDynamicChannel, {{"ignore", many}}));
  EXPECT_TRUE(c.ok()) << c.status();
  many.push_back("one.more");
  ExpectQuantError(kCtDynamicChannel, "/ignore", many, kInvalid,
                   {"quantization_config.ignore", "4096"});
  Json groups = Json::object();
  for (int i = 0; i < 65; ++i) {
    groups["g" + std::to_string(i)] =
        Json::parse(kCtDynamicChannel)["config_groups"]["group_0"];
  }
  ExpectQuantError(kCtDynamicChannel, "/config_groups", groups, kInvalid,
                   {"quantization_config.config_groups", "64"});
}

QuantConfig Ignoring(std::vector<std::string> modules) {
  QuantConfig q;
  q.method = "compressed-tensors";
  q.unquantized_modules = std::move(modules);
  return q;
}

TEST(QuantizesTest, PlainNamesMatchWholeComponents) {
  const QuantConfig q = Ignoring({"lm_head", "mlp.gate", "model.layers.1"});
  EXPECT_FALSE(q.Quantizes("lm_head"));
  EXPECT_FALSE(q.Quantizes("model.lm_head"));
  EXPECT_FALSE(q.Quantizes("model.layers.0.mlp.gate"));
  EXPECT_TRUE(q.Quantizes("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.0.mlp.shared_expert_gate"));
  EXPECT_FALSE(q.Quantizes("model.layers.1.mlp.up_proj"));
  EXPECT_FALSE(q.Quantizes("model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.10.mlp.up_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.11.self_attn.q_proj"));
  EXPECT_FALSE(
      Ignoring({"self_attn"}).Quantizes("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(Ignoring({"attn"}).Quantizes("model.layers.0.self_attn.q_proj"));
  // transformers' subtree spelling with a trailing dot.
  EXPECT_FALSE(
      Ignoring({"model.layers.2."}).Quantizes("model.layers.2.mlp.down_proj"));
  // The embedding is never quantized; an unquantized config nothing.
  EXPECT_FALSE(Ignoring({}).Quantizes("model.embed_tokens"));
  EXPECT_TRUE(Ignoring({}).Quantizes("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(QuantConfig().Quantizes("model.layers.0.mlp.down_proj"));
}

TEST(QuantizesTest, RegexesUseReMatchSemantics) {
  // Anchored at the start, free at the end, as Python's re.match.
  QuantConfig q = Ignoring({"re:.*mlp\\.gate$"});
  EXPECT_FALSE(q.Quantizes("model.layers.3.mlp.gate"));
  EXPECT_TRUE(q.Quantizes("model.layers.3.mlp.gate_proj"));
  q = Ignoring({"re:.*mlp.gate"});  // No `$`: gate_proj matches too.
  EXPECT_FALSE(q.Quantizes("model.layers.3.mlp.gate_proj"));
  q = Ignoring({"re:lm_head"});
  EXPECT_FALSE(q.Quantizes("lm_head"));
  EXPECT_TRUE(q.Quantizes("model.lm_head"));  // Not at the start.
  q = Ignoring({"re:model\\.layers\\.[0-9]{1,2}\\.self_attn\\.(q|k)_proj$"});
  EXPECT_FALSE(q.Quantizes("model.layers.7.self_attn.q_proj"));
  EXPECT_FALSE(q.Quantizes("model.layers.42.self_attn.k_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.123.self_attn.k_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.7.self_attn.v_proj"));
  q = Ignoring({"re:^model\\.layers\\.\\d+\\.mlp\\.[^.]+$"});
  EXPECT_FALSE(q.Quantizes("model.layers.7.mlp.up_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.7.mlp.experts.0.up_proj"));
  q = Ignoring({"re:(?:visual|vision_tower)\\..*?", "re:.*[Mm]erger"});
  EXPECT_FALSE(q.Quantizes("visual.blocks.0.attn.qkv"));
  EXPECT_TRUE(q.Quantizes("model.visual.blocks.0.attn.qkv"));
  EXPECT_FALSE(q.Quantizes("model.mm_Merger.linear"));
  q = Ignoring({"re:(?P<l>model)\\.layers\\.0\\.\\w+\\.[a-z_]+proj\\Z"});
  EXPECT_FALSE(q.Quantizes("model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(q.Quantizes("model.layers.0.mlp.down_proj.x"));
}

TEST(QuantizesTest, RegexesStayLinearOnPathologicalPatterns) {
  // Exponential for a backtracking engine: here a few thousand steps.
  const std::string name(1000, 'a');
  for (const char* pattern :
       {"re:(a*)*b", "re:(a|aa)+$x", "re:(a+a+)+b", "re:(.*){20}b",
        "re:(()*)*b", "re:(a{1000}){1000}b", "re:(?=a*b)a"}) {
    const QuantConfig q = Ignoring({pattern});
    EXPECT_TRUE(q.Quantizes(name)) << pattern;
  }
  EXPECT_FALSE(Ignoring({"re:(a*)*$"}).Quantizes(name));
}

TEST(QuantizesTest, GlobsMatchTheWholeName) {
  const QuantConfig q =
      Ignoring({"model.layers.*.mlp.gate", "*self_attn*", "lm_he?d"});
  EXPECT_FALSE(q.Quantizes("model.layers.12.mlp.gate"));
  EXPECT_TRUE(q.Quantizes("model.layers.12.mlp.gate_proj"));
  EXPECT_FALSE(q.Quantizes("model.layers.0.self_attn.o_proj"));
  EXPECT_FALSE(q.Quantizes("lm_head"));
  EXPECT_TRUE(q.Quantizes("model.layers.0.mlp.up_proj"));
}

}  // namespace
}  // namespace tessera
