// config.json parsing of Gemma 1, 2 and 3 (text), as transformers 5 writes
// and reads those configs (GemmaConfig, Gemma2Config, Gemma3TextConfig), and
// the transformers 4 spellings of Gemma 3's two RoPEs.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/config.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

// The shape of tools/make_golden_fixtures.py's tiny models as
// save_pretrained (transformers 5) writes them.
constexpr char kGemma[] = R"json({
  "architectures": ["GemmaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "dtype": "float32",
  "eos_token_id": 2,
  "head_dim": 16,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_size": 64,
  "initializer_range": 0.2,
  "intermediate_size": 128,
  "max_position_embeddings": 256,
  "model_type": "gemma",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "tie_word_embeddings": true,
  "transformers_version": "5.17.0",
  "use_bidirectional_attention": null,
  "use_cache": true,
  "vocab_size": 512
})json";

constexpr char kGemma2[] = R"json({
  "architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 5.0,
  "bos_token_id": 1,
  "dtype": "float32",
  "eos_token_id": 2,
  "final_logit_softcapping": 10.0,
  "head_dim": 16,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 64,
  "initializer_range": 0.2,
  "intermediate_size": 128,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
  "max_position_embeddings": 256,
  "model_type": "gemma2",
  "num_attention_heads": 4,
  "num_hidden_layers": 3,
  "num_key_value_heads": 2,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 24,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "sliding_window": 16,
  "tie_word_embeddings": true,
  "transformers_version": "5.17.0",
  "use_bidirectional_attention": null,
  "use_cache": true,
  "vocab_size": 512
})json";

constexpr char kGemma3Text[] = R"json({
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 1,
  "dtype": "float32",
  "eos_token_id": 2,
  "final_logit_softcapping": null,
  "head_dim": 16,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 64,
  "initializer_range": 0.2,
  "intermediate_size": 128,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
  "max_position_embeddings": 256,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 3,
  "num_key_value_heads": 2,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 20,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "full_attention": {"factor": 4.0, "rope_theta": 1000000.0,
                       "rope_type": "linear"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
  },
  "sliding_window": 16,
  "tie_word_embeddings": true,
  "transformers_version": "5.17.0",
  "use_bidirectional_attention": false,
  "use_cache": true,
  "vocab_size": 512
})json";

// google/gemma-3-1b-it's text config in the transformers 4 spelling (sizes
// cut down): rope_theta / rope_scaling for the global layers,
// rope_local_base_freq for the local ones, sliding_window_pattern.
constexpr char kGemma3TextV4[] = R"json({
  "architectures": ["Gemma3ForCausalLM"],
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "eos_token_id": [1, 106],
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152,
  "intermediate_size": 6912,
  "max_position_embeddings": 32768,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 13,
  "num_key_value_heads": 1,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
  "rope_theta": 1000000,
  "sliding_window": 512,
  "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "vocab_size": 262144
})json";

absl::StatusOr<ModelConfig> ParseEdited(const char* base, const Json& patch) {
  Json config = Json::parse(base);
  config.merge_patch(patch);  // A null value erases the key.
  return ParseModelConfig(config.dump());
}

bool Contains(const absl::Status& status, const std::string& needle) {
  return std::string(status.message()).find(needle) != std::string::npos;
}

TEST(GemmaConfigTest, Gemma) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kGemma);
  EXPECT_EQ(c->model_type, "gemma");
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_TRUE(c->tie_word_embeddings);
  const GemmaHParams& g = c->gemma;
  EXPECT_EQ(g.activation, HiddenActivation::kGeluTanh);
  EXPECT_EQ(g.query_pre_attn_scalar, 0);  // head_dim^-0.5.
  EXPECT_EQ(g.attn_logit_softcapping, 0);
  EXPECT_EQ(g.final_logit_softcapping, 0);
  EXPECT_FALSE(g.sandwich_norms);
  EXPECT_FALSE(g.qk_norm);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>({0, 0}));
  EXPECT_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kNone);
}

TEST(GemmaConfigTest, GemmaDefaultsDifferFromLlamas) {
  // transformers' Gemma defaults: tied embeddings, head_dim 256, GeGLU.
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kGemma, {{"tie_word_embeddings", nullptr},
                           {"head_dim", nullptr},
                           {"hidden_act", nullptr}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->gemma.activation, HiddenActivation::kGeluTanh);
  c = ParseEdited(kGemma, {{"tie_word_embeddings", false}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(GemmaConfigTest, GemmaActivations) {
  // Gemma 1's own configs: the legacy hidden_act beside the declared
  // hidden_activation, which wins.
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kGemma,
      {{"hidden_act", "gelu"}, {"hidden_activation", "gelu_pytorch_tanh"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemma.activation, HiddenActivation::kGeluTanh);
  c = ParseEdited(kGemma, {{"hidden_act", "silu"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemma.activation, HiddenActivation::kSilu);
  c = ParseEdited(kGemma, {{"hidden_act", "gelu"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(c.status(), "exact (erf) GELU")) << c.status();
  c = ParseEdited(kGemma, {{"hidden_act", "relu"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status(), "\"hidden_act\": unsupported activation"))
      << c.status();
  // Gemma 2 and 3 read hidden_activation alone.
  c = ParseEdited(kGemma2, {{"hidden_act", "relu"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemma.activation, HiddenActivation::kGeluTanh);
  c = ParseEdited(kGemma3Text, {{"hidden_activation", "tanh"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GemmaConfigTest, Gemma2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kGemma2);
  const GemmaHParams& g = c->gemma;
  EXPECT_EQ(g.query_pre_attn_scalar, 24);
  EXPECT_EQ(g.attn_logit_softcapping, 5.0);
  EXPECT_EQ(g.final_logit_softcapping, 10.0);
  EXPECT_TRUE(g.sandwich_norms);
  EXPECT_FALSE(g.qk_norm);
  EXPECT_EQ(g.sliding_layer, std::vector<bool>({true, false, true}));
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>({16, 0, 16}));
  EXPECT_EQ(c->rope.theta, 10000.0);
}

TEST(GemmaConfigTest, Gemma2Defaults) {
  // Gemma2Config's defaults: caps 50 and 30, scalar 256, window 4096, and
  // without layer_types every other layer slides, from layer 0.
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kGemma2, {{"attn_logit_softcapping", nullptr},
                            {"final_logit_softcapping", nullptr},
                            {"query_pre_attn_scalar", nullptr},
                            {"sliding_window", nullptr},
                            {"layer_types", nullptr},
                            {"num_hidden_layers", 4}});
  ASSERT_TRUE(c.ok()) << c.status();
  const GemmaHParams& g = c->gemma;
  EXPECT_EQ(g.attn_logit_softcapping, 50.0);
  EXPECT_EQ(g.final_logit_softcapping, 30.0);
  EXPECT_EQ(g.query_pre_attn_scalar, 256);
  EXPECT_EQ(g.sliding_layer, std::vector<bool>({true, false, true, false}));
  EXPECT_EQ(c->sliding_window_per_layer,
            std::vector<int64_t>({4096, 0, 4096, 0}));
}

TEST(GemmaConfigTest, NullCapsAndWindowTurnThemOff) {
  Json config = Json::parse(kGemma2);
  config["attn_logit_softcapping"] = nullptr;
  config["final_logit_softcapping"] = nullptr;
  config["sliding_window"] = nullptr;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gemma.attn_logit_softcapping, 0);
  EXPECT_EQ(c->gemma.final_logit_softcapping, 0);
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>({0, 0, 0}));
  EXPECT_EQ(c->gemma.sliding_layer, std::vector<bool>({true, false, true}));
}

TEST(GemmaConfigTest, Gemma3TextTransformers5) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma3Text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Architecture::kGemma3);
  const GemmaHParams& g = c->gemma;
  EXPECT_TRUE(g.qk_norm);
  EXPECT_TRUE(g.sandwich_norms);
  EXPECT_EQ(g.query_pre_attn_scalar, 20);
  EXPECT_EQ(g.attn_logit_softcapping, 0);
  EXPECT_EQ(g.final_logit_softcapping, 0);
  EXPECT_EQ(g.sliding_layer, std::vector<bool>({true, false, true}));
  EXPECT_EQ(c->sliding_window_per_layer, std::vector<int64_t>({16, 0, 16}));
  // Global layers: linear x4 at 1e6; local layers: the default RoPE at 1e4.
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(g.rope_local.scaling, RopeScaling::kNone);
  EXPECT_EQ(g.rope_local.theta, 1e4);
}

TEST(GemmaConfigTest, Gemma3TextTransformers4) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma3TextV4);
  ASSERT_TRUE(c.ok()) << c.status();
  const GemmaHParams& g = c->gemma;
  EXPECT_EQ(c->rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(g.rope_local.scaling, RopeScaling::kNone);
  EXPECT_EQ(g.rope_local.theta, 1e4);
  // sliding_window_pattern 6: layers 5 and 11 are global.
  ASSERT_EQ(g.sliding_layer.size(), 13u);
  for (int i = 0; i < 13; ++i) {
    const bool global = i == 5 || i == 11;
    EXPECT_EQ(g.sliding_layer[i], !global) << i;
    EXPECT_EQ(c->sliding_window_per_layer[i], global ? 0 : 512) << i;
  }
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>({1, 106}));
  EXPECT_TRUE(c->tie_word_embeddings);  // Absent: Gemma's default.
}

TEST(GemmaConfigTest, Gemma3PatternAsTransformers5SavesIt) {
  Json config = Json::parse(kGemma3TextV4);
  config.erase("sliding_window_pattern");
  config["_sliding_window_pattern"] = 3;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 13; ++i) {
    EXPECT_EQ(c->gemma.sliding_layer[i], (i + 1) % 3 != 0) << i;
  }
}

TEST(GemmaConfigTest, Gemma3RopeDefaults) {
  // No RoPE keys at all: 1e6 global, 1e4 local, both default.
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kGemma3TextV4, {{"rope_scaling", nullptr},
                                  {"rope_theta", nullptr},
                                  {"rope_local_base_freq", nullptr}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(c->rope.scaling, RopeScaling::kNone);
  EXPECT_EQ(c->gemma.rope_local.theta, 1e4);
  // Keyed by layer type, one side missing or without a theta: the default
  // RoPE at the top-level (or default) theta.
  Json config = Json::parse(kGemma3Text);
  config["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  config["rope_local_base_freq"] = 20000.0;
  c = ParseModelConfig(config.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(c->gemma.rope_local.theta, 20000.0);
  EXPECT_EQ(c->gemma.rope_local.scaling, RopeScaling::kNone);
}

TEST(GemmaConfigTest, Gemma3RopeErrors) {
  Json config = Json::parse(kGemma3Text);
  // Not keyed by layer type.
  config["rope_parameters"] = {{"rope_type", "default"},
                               {"rope_theta", 10000.0}};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status(), "must be keyed by layer type"))
      << c.status();
  // A layer type's own RoPE error names it.
  config["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}}},
      {"sliding_attention", {{"rope_type", "default"}}}};
  c = ParseModelConfig(config.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status(), "rope_parameters[\"full_attention\"]"))
      << c.status();
  EXPECT_TRUE(Contains(c.status(), "requires \"factor\"")) << c.status();
  config["rope_parameters"] = {
      {"full_attention", {{"rope_type", "default"}}},
      {"sliding_attention", {{"rope_type", "something_new"}}}};
  c = ParseModelConfig(config.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(GemmaConfigTest, LayerTypesAreChecked) {
  absl::StatusOr<ModelConfig> c = ParseEdited(
      kGemma2, {{"layer_types", Json::array({"sliding_attention"})}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status(), "\"layer_types\" has 1 entries"));
  c = ParseEdited(
      kGemma3Text,
      {{"layer_types", Json::array({"sliding_attention", "chunked_attention",
                                    "full_attention"})}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status(), "\"layer_types\"[1]")) << c.status();
  c = ParseEdited(kGemma3Text, {{"layer_types", "full_attention"}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GemmaConfigTest, BadValuesAreRefusedNamingTheKey) {
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping",
                          "query_pre_attn_scalar"}) {
    for (const Json& bad : {Json(-1.0), Json(0.0), Json("30")}) {
      absl::StatusOr<ModelConfig> c = ParseEdited(kGemma2, {{key, bad}});
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
          << key << " " << bad.dump();
      EXPECT_TRUE(Contains(c.status(), key)) << c.status();
    }
  }
  absl::StatusOr<ModelConfig> c =
      ParseEdited(kGemma3TextV4, {{"sliding_window_pattern", 0}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status(), "sliding_window_pattern"));
  c = ParseEdited(kGemma2, {{"sliding_window", -3}});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GemmaConfigTest, BidirectionalAttentionIsUnimplemented) {
  for (const char* base : {kGemma, kGemma2, kGemma3Text}) {
    absl::StatusOr<ModelConfig> c =
        ParseEdited(base, {{"use_bidirectional_attention", true}});
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_TRUE(Contains(c.status(), "use_bidirectional_attention"));
  }
}

TEST(GemmaConfigTest, MultimodalGemma3IsRefusedWithTheReason) {
  // As transformers writes it (the class), and by model_type alone.
  Json config = Json::parse(kGemma3Text);
  config["model_type"] = "gemma3";
  config["architectures"] = {"Gemma3ForConditionalGeneration"};
  for (const bool with_class : {true, false}) {
    if (!with_class) config.erase("architectures");
    absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_TRUE(Contains(c.status(), "Gemma3ForConditionalGeneration"));
    EXPECT_TRUE(Contains(c.status(), "gemma3_text"));
  }
}

TEST(GemmaConfigTest, ArchitectureNames) {
  EXPECT_EQ(ArchitectureName(Architecture::kGemma), "gemma");
  EXPECT_EQ(ArchitectureName(Architecture::kGemma2), "gemma2");
  EXPECT_EQ(ArchitectureName(Architecture::kGemma3), "gemma3_text");
  bool listed = false;
  for (const ArchitectureConfig& a : ConfigArchitectures()) {
    if (a.model_type == "gemma3_text") listed = a.own_activation_and_rope;
  }
  EXPECT_TRUE(listed);
}

}  // namespace
}  // namespace tessera
