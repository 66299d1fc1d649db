#include "tests/testing/tiny_qwen.h"

#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/core/shape.h"
#include "runtime/core/status.h"
#include "tests/testing/safetensors_writer.h"

namespace tessera {
namespace {

std::vector<float> RandomValues(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

absl::Status CopyFile(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", from));
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", to));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTinyQwen(const std::string& dir,
                           const std::string& tokenizer_dir,
                           const TinyQwenOptions& options) {
  const int64_t h = 16, heads = 2, kv_heads = 1, head_dim = 8, inter = 32;
  const nlohmann::json config = {
      {"architectures", {"Qwen3ForCausalLM"}},
      {"model_type", "qwen3"},
      {"vocab_size", kQwenVocab},
      {"hidden_size", h},
      {"intermediate_size", inter},
      {"num_hidden_layers", 1},
      {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", options.max_position_embeddings},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"tie_word_embeddings", false},
      {"bos_token_id", 151643},
      {"eos_token_id", 151645},
      {"torch_dtype", "float32"}};
  {
    std::ofstream out(dir + "/config.json");
    out << config.dump(2);
    if (!out) return absl::InternalError("cannot write config.json in " + dir);
  }
  SafetensorsWriter w;
  uint32_t seed = 1;
  auto add = [&](const std::string& tensor, std::vector<int64_t> shape,
                 float scale, float offset = 0.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v = RandomValues(n, scale, seed++);
    for (float& x : v) x += offset;
    w.AddF32(tensor, Shape(shape), v);
  };
  add("model.embed_tokens.weight", {kQwenVocab, h}, 0.5f);
  const std::string l = "model.layers.0.";
  add(l + "input_layernorm.weight", {h}, 0.1f, 1.0f);
  add(l + "post_attention_layernorm.weight", {h}, 0.1f, 1.0f);
  add(l + "self_attn.q_proj.weight", {heads * head_dim, h}, 0.3f);
  add(l + "self_attn.k_proj.weight", {kv_heads * head_dim, h}, 0.3f);
  add(l + "self_attn.v_proj.weight", {kv_heads * head_dim, h}, 0.3f);
  add(l + "self_attn.o_proj.weight", {h, heads * head_dim}, 0.3f);
  add(l + "self_attn.q_norm.weight", {head_dim}, 0.1f, 1.0f);
  add(l + "self_attn.k_norm.weight", {head_dim}, 0.1f, 1.0f);
  add(l + "mlp.gate_proj.weight", {inter, h}, 0.3f);
  add(l + "mlp.up_proj.weight", {inter, h}, 0.3f);
  add(l + "mlp.down_proj.weight", {h, inter}, 0.3f);
  add("model.norm.weight", {h}, 0.1f, 1.0f);
  std::vector<float> head = RandomValues(kQwenVocab * h, 0.05f, seed++);
  if (options.gap_wins) {
    for (int64_t id = kQwenTokenizerVocab; id < kQwenVocab; ++id) {
      for (int64_t j = 0; j < h; ++j) head[id * h + j] = 0.0f;
      head[id * h] = id % 2 == 0 ? 40.0f : -40.0f;
    }
  }
  w.AddF32("lm_head.weight", Shape({kQwenVocab, h}), head);
  RETURN_IF_ERROR(w.Write(dir + "/model.safetensors"));
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    RETURN_IF_ERROR(CopyFile(tokenizer_dir + "/" + file, dir + "/" + file));
  }
  return absl::OkStatus();
}

}  // namespace tessera
