// Mixtures of experts through the whole model on the CPU, without
// transformers' numbers (the golden fixtures check those):
//  - a one-expert MoE (top 1, renormalised: weight exactly 1) is its dense
//    architecture with that expert as the MLP, bit for bit (qwen3_moe vs
//    qwen3, mixtral vs mistral), and a qwen2_moe whose every layer is in
//    mlp_only_layers is qwen2;
//  - published per-expert checkpoints and transformers 5's stacked experts
//    load to the same model, at TP 1 and TP 2;
//  - TP 2, PP 2 and TP 2 x PP 2 (ranks as threads) give TP 1's logits;
//  - a missing expert tensor is named;
//  - --random-weights builds a MoE model at TP 1 and TP 2;
//  - on a GPU (the gpu-tagged twin, TESSERA_TEST_DEVICE=cuda), the CUDA
//    model's logits follow the CPU's: within f32 rounding with f32 matrices,
//    within bf16's with bf16 ones.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "nlohmann/json.hpp"
#include "runtime/core/status.h"
#include "runtime/executor/sequence_runner.h"
#include "runtime/model/random_weights.h"
#include "runtime/model/registry.h"
#include "runtime/model/shard.h"
#include "tests/testing/safetensors_writer.h"
#include "tests/testing/thread_communicator.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

std::string MakeDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "moe_model_test" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Deterministic values for the tensor `name` (the same name, the same values),
// scaled like a trained model's: norms near 1, matrices small.
std::vector<float> Values(const std::string& name, int64_t n) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(name)));
  const bool norm = name.find("norm") != std::string::npos;
  std::normal_distribution<float> dist(norm ? 1.0f : 0.0f, norm ? 0.1f : 0.3f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A small config: 2 layers, H 32, 4 heads (2 KV) of 8, vocabulary 64.
Json BaseConfig(const std::string& model_type) {
  return {{"model_type", model_type},
          {"vocab_size", 64},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"sliding_window", nullptr},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"torch_dtype", "float32"}};
}

void WriteConfig(const std::string& dir, const Json& config) {
  std::ofstream out(dir + "/config.json");
  out << config.dump(2);
}

// `x` rounded to the nearest bf16 (ties to even), as an f32.
float RoundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

// Writes the tensors of `config`'s whole-model weight table: each tensor's
// values are Values(source(name)) (rounded to bf16 with `bf16_values`); a
// stacked expert tensor is written whole (`stacked`) or as its per-expert
// parts (the published layout), the parts holding the stacked tensor's
// elements in order.
void WriteCheckpoint(
    const std::string& dir, const Json& config, bool stacked,
    const std::function<std::string(const std::string&)>& source =
        [](const std::string& n) { return n; },
    const std::string& skip = "", bool bf16_values = false) {
  WriteConfig(dir, config);
  auto parsed = ParseModelConfig(config.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto table = ModelWeightTable(*parsed, FullModel(*parsed));
  ASSERT_TRUE(table.ok()) << table.status();
  SafetensorsWriter w;
  for (const WeightSpec& spec : *table) {
    std::vector<float> v = Values(source(spec.name), spec.full.numel());
    if (bf16_values) {
      for (float& x : v) x = RoundToBf16(x);
    }
    if (spec.parts.empty() || stacked) {
      w.AddF32(spec.name, spec.full, v);
      continue;
    }
    const int64_t n = spec.part_shape.numel();
    for (size_t p = 0; p < spec.parts.size(); ++p) {
      if (spec.parts[p] == skip) continue;
      w.AddF32(spec.parts[p], spec.part_shape,
               std::vector<float>(v.begin() + p * n, v.begin() + (p + 1) * n));
    }
  }
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
}

const std::vector<int32_t> kPrompt = {1, 17, 5, 40, 33, 8, 21};
const std::vector<int32_t> kFollow = {9, 60, 3};

// The next-token logits after the prompt and after each following token,
// one process (on `ops`, with `placement`; the CPU by default).
std::vector<std::vector<float>> RunOne(const std::string& dir,
                                       Ops* on = nullptr,
                                       const ModelPlacement& placement = {}) {
  CpuOps cpu;
  Ops* ops = on != nullptr ? on : &cpu;
  auto model = LoadModel(dir, ops, 0, 1, placement);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  SequenceRunner runner(model->get());
  auto cache = runner.NewKvCache(32);
  EXPECT_TRUE(cache.ok());
  const int64_t V = (*model)->config().vocab_size;
  std::vector<std::vector<float>> out;
  std::vector<float> logits(V);
  EXPECT_TRUE(runner.Forward(kPrompt, &*cache, logits.data()).ok());
  out.push_back(logits);
  for (int32_t t : kFollow) {
    EXPECT_TRUE(runner.Forward({t}, &*cache, logits.data()).ok());
    out.push_back(logits);
  }
  return out;
}

// The same on a tp x pp grid of threads; the logits of the first rank of the
// last stage.
std::vector<std::vector<float>> RunGrid(const std::string& dir, int tp, int pp,
                                        bool expert_parallel = false) {
  const int world = tp * pp;
  std::vector<std::unique_ptr<ThreadGroup>> tp_groups, pp_groups;
  for (int s = 0; s < pp; ++s)
    tp_groups.push_back(std::make_unique<ThreadGroup>(tp));
  for (int r = 0; r < tp; ++r)
    pp_groups.push_back(std::make_unique<ThreadGroup>(pp));
  std::vector<std::vector<std::vector<float>>> results(world);
  std::vector<absl::Status> status(world);
  auto rank_main = [&](int rank) {
    const int stage = rank / tp, tp_rank = rank % tp;
    auto run = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
      ASSIGN_OR_RETURN(
          ShardSpec shard,
          MakeShardSpec(config, tp_rank, tp, stage, pp, {}, expert_parallel));
      ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
      CpuOps ops;
      WeightLoadOptions load;
      load.device = &ops;
      ASSIGN_OR_RETURN(WeightSet weights,
                       LoadShardWeights(*ckpt, config, shard, load));
      ModelContext context;
      context.ops = &ops;
      context.tp = tp_groups[stage]->member(tp_rank);
      context.pp = pp_groups[tp_rank]->member(stage);
      ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                       CreateModel(config, shard, std::move(weights), context));
      SequenceRunner runner(model.get());
      ASSIGN_OR_RETURN(KvCache cache, runner.NewKvCache(32));
      std::vector<float> logits(config.vocab_size);
      float* out = shard.last_stage() ? logits.data() : nullptr;
      RETURN_IF_ERROR(runner.Forward(kPrompt, &cache, out));
      results[rank].push_back(logits);
      for (int32_t t : kFollow) {
        RETURN_IF_ERROR(runner.Forward({t}, &cache, out));
        results[rank].push_back(logits);
      }
      return absl::OkStatus();
    };
    status[rank] = run();
    // A failed rank leaves the others waiting in a collective.
    if (!status[rank].ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << status[rank];
      std::abort();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  return results[(pp - 1) * tp];
}

// ||got - want|| / ||want||.
double RelativeError(const std::vector<float>& got,
                     const std::vector<float>& want) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    diff += std::pow(got[i] - want[i], 2);
    ref += std::pow(want[i], 2);
  }
  return std::sqrt(diff / ref);
}

void ExpectClose(const std::vector<std::vector<float>>& got,
                 const std::vector<std::vector<float>>& want,
                 const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << what;
    double diff = 0, ref = 0;
    for (size_t i = 0; i < want[s].size(); ++i) {
      diff += std::pow(got[s][i] - want[s][i], 2);
      ref += std::pow(want[s][i], 2);
    }
    EXPECT_LT(std::sqrt(diff / ref), tol) << what << " step " << s;
  }
}

TEST(MoeModelTest, OneExpertQwen3MoeIsQwen3) {
  const std::string dense = MakeDir("qwen3");
  WriteCheckpoint(dense, BaseConfig("qwen3"), true);
  Json moe_config = BaseConfig("qwen3_moe");
  moe_config["num_experts"] = 1;
  moe_config["num_experts_per_tok"] = 1;
  moe_config["norm_topk_prob"] = true;
  moe_config["moe_intermediate_size"] = 48;
  const std::string moe = MakeDir("qwen3_moe_1");
  // The expert's gate/up stack [1, 2I, H] is the dense gate and up; its
  // down [1, H, I] the dense down: written as its parts, named after them.
  WriteConfig(moe, moe_config);
  {
    auto dense_ckpt = Checkpoint::Open(dense);
    ASSERT_TRUE(dense_ckpt.ok());
    SafetensorsWriter w;
    for (const std::string& name : (*dense_ckpt)->Names()) {
      auto info = (*dense_ckpt)->Get(name);
      std::string to = name;
      to = absl::StrReplaceAll(to,
                               {{"mlp.gate_proj", "mlp.experts.0.gate_proj"},
                                {"mlp.up_proj", "mlp.experts.0.up_proj"},
                                {"mlp.down_proj", "mlp.experts.0.down_proj"}});
      info->name = to;
      w.AddCopy(*info);
    }
    for (int l = 0; l < 2; ++l) {
      w.AddF32(absl::StrCat("model.layers.", l, ".mlp.gate.weight"),
               Shape({1, 32}), Values("router", 32));
    }
    ASSERT_TRUE(w.Write(moe + "/model.safetensors").ok());
  }
  const auto want = RunOne(dense);
  const auto got = RunOne(moe);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s], want[s]) << "step " << s;
  }
}

TEST(MoeModelTest, OneExpertMixtralIsMistral) {
  const std::string dense = MakeDir("mistral");
  WriteCheckpoint(dense, BaseConfig("mistral"), true);
  Json moe_config = BaseConfig("mixtral");
  moe_config["num_local_experts"] = 1;
  moe_config["num_experts_per_tok"] = 1;
  const std::string moe = MakeDir("mixtral_1");
  WriteConfig(moe, moe_config);
  auto dense_ckpt = Checkpoint::Open(dense);
  ASSERT_TRUE(dense_ckpt.ok());
  SafetensorsWriter w;
  for (const std::string& name : (*dense_ckpt)->Names()) {
    auto info = (*dense_ckpt)->Get(name);
    info->name = absl::StrReplaceAll(
        name, {{"mlp.gate_proj", "block_sparse_moe.experts.0.w1"},
               {"mlp.up_proj", "block_sparse_moe.experts.0.w3"},
               {"mlp.down_proj", "block_sparse_moe.experts.0.w2"}});
    w.AddCopy(*info);
  }
  for (int l = 0; l < 2; ++l) {
    w.AddF32(absl::StrCat("model.layers.", l, ".block_sparse_moe.gate.weight"),
             Shape({1, 32}), Values("router", 32));
  }
  ASSERT_TRUE(w.Write(moe + "/model.safetensors").ok());
  const auto want = RunOne(dense);
  const auto got = RunOne(moe);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s], want[s]) << "step " << s;
  }
}

TEST(MoeModelTest, Qwen2MoeWithEveryLayerDenseIsQwen2) {
  const std::string dense = MakeDir("qwen2");
  WriteCheckpoint(dense, BaseConfig("qwen2"), true);
  Json moe_config = BaseConfig("qwen2_moe");
  moe_config["mlp_only_layers"] = Json::array({0, 1});
  const std::string moe = MakeDir("qwen2_moe_dense");
  WriteCheckpoint(moe, moe_config, true);
  const auto want = RunOne(dense);
  const auto got = RunOne(moe);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s], want[s]) << "step " << s;
  }
}

// An 8-expert top-2 config of each architecture (qwen2_moe with its shared
// expert and a dense layer 1; qwen3_moe without renormalisation).
Json MoeConfig(const std::string& model_type) {
  Json c = BaseConfig(model_type);
  if (model_type == "mixtral") {
    c["num_local_experts"] = 8;
  } else {
    c["num_experts"] = 8;
    c["moe_intermediate_size"] = 24;
  }
  c["num_experts_per_tok"] = 2;
  if (model_type == "qwen2_moe") {
    c["shared_expert_intermediate_size"] = 40;
    c["norm_topk_prob"] = false;
    c["mlp_only_layers"] = Json::array({1});
  }
  if (model_type == "qwen3_moe") c["norm_topk_prob"] = false;
  return c;
}

class MoeLayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeLayoutTest, BothCheckpointLayoutsAndEverySplitAgree) {
  const std::string type = GetParam();
  const std::string per_expert = MakeDir(type + "_per_expert");
  const std::string stacked = MakeDir(type + "_stacked");
  WriteCheckpoint(per_expert, MoeConfig(type), false);
  WriteCheckpoint(stacked, MoeConfig(type), true);
  const auto want = RunOne(per_expert);
  ASSERT_FALSE(want.empty());
  const auto same = RunOne(stacked);
  ASSERT_EQ(same.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(same[s], want[s]) << "stacked layout, step " << s;
  }
  ExpectClose(RunGrid(per_expert, 2, 1), want, type + " tp2 per-expert");
  ExpectClose(RunGrid(stacked, 2, 1), want, type + " tp2 stacked");
  ExpectClose(RunGrid(per_expert, 1, 2), want, type + " pp2");
  ExpectClose(RunGrid(stacked, 2, 2), want, type + " tp2 pp2");
  ExpectClose(RunGrid(per_expert, 4, 1), want, type + " tp4");
  // Expert parallelism: whole experts per rank (4, then 2 of the 8).
  ExpectClose(RunGrid(per_expert, 2, 1, true), want, type + " tp2 ep");
  ExpectClose(RunGrid(stacked, 4, 1, true), want, type + " tp4 ep");
  ExpectClose(RunGrid(per_expert, 2, 2, true), want, type + " tp2 pp2 ep");
}

TEST(MoeModelTest, ExpertParallelShards) {
  auto config = ParseModelConfig(MoeConfig("qwen3_moe").dump());
  ASSERT_TRUE(config.ok());
  auto s = MakeShardSpec(*config, 1, 4, 0, 1, {}, true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->expert_parallel);
  EXPECT_EQ(s->local_experts, 2);
  EXPECT_EQ(s->first_expert, 2);
  EXPECT_EQ(s->local_expert_intermediate, 24);  // Whole experts.
  auto table = ModelWeightTable(*config, *s);
  ASSERT_TRUE(table.ok());
  int found = 0;
  for (const WeightSpec& spec : *table) {
    if (spec.name == "model.layers.0.mlp.experts.gate_up_proj") {
      EXPECT_EQ(spec.local_shape(), Shape({2, 48, 32}));
      ++found;
    }
    if (spec.name == "model.layers.0.mlp.experts.down_proj") {
      EXPECT_EQ(spec.local_shape(), Shape({2, 32, 24}));
      ++found;
    }
  }
  EXPECT_EQ(found, 2);
  // 8 experts do not split over 3 ranks; a dense model has none to split.
  Json c = MoeConfig("qwen3_moe");
  c["num_attention_heads"] = 6;
  c["num_key_value_heads"] = 3;
  c["head_dim"] = 8;
  auto odd = ParseModelConfig(c.dump());
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_NE(MakeShardSpec(*odd, 0, 3, 0, 1, {}, true)
                .status()
                .message()
                .find("experts"),
            absl::string_view::npos);
  auto dense = ParseModelConfig(BaseConfig("qwen3").dump());
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(MakeShardSpec(*dense, 0, 2, 0, 1, {}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Architectures, MoeLayoutTest,
                         ::testing::Values("mixtral", "qwen3_moe",
                                           "qwen2_moe"));

TEST(MoeModelTest, MissingExpertTensorIsNamed) {
  const std::string dir = MakeDir("missing");
  const std::string gone = "model.layers.1.mlp.experts.5.up_proj.weight";
  WriteCheckpoint(
      dir, MoeConfig("qwen3_moe"), false,
      [](const std::string& n) { return n; }, gone);
  CpuOps ops;
  auto model = LoadModel(dir, &ops);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find(gone), absl::string_view::npos)
      << model.status();
  // Neither layout: the stacked name and a part are both named.
  const std::string none = MakeDir("none");
  WriteConfig(none, MoeConfig("mixtral"));
  SafetensorsWriter w;
  w.AddF32("model.embed_tokens.weight", Shape({64, 32}), Values("e", 64 * 32));
  ASSERT_TRUE(w.Write(none + "/model.safetensors").ok());
  auto config = LoadModelConfig(none);
  ASSERT_TRUE(config.ok());
  auto table = ModelWeightTable(*config, FullModel(*config));
  ASSERT_TRUE(table.ok());
  auto ckpt = Checkpoint::Open(none);
  ASSERT_TRUE(ckpt.ok());
  HostStaging staging;
  for (const WeightSpec& spec : *table) {
    if (spec.name != "model.layers.0.mlp.experts.gate_up_proj") continue;
    absl::StatusOr<TensorView> slice = ReadSlice(**ckpt, spec, &staging);
    EXPECT_EQ(slice.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(slice.status().message().find(spec.name), absl::string_view::npos)
        << slice.status();
    EXPECT_NE(slice.status().message().find(
                  "model.layers.0.block_sparse_moe.experts.0.w1.weight"),
              absl::string_view::npos)
        << slice.status();
  }
}

// A part of the wrong shape is refused by name.
TEST(MoeModelTest, ExpertPartOfTheWrongShapeIsNamed) {
  const std::string dir = MakeDir("bad_shape");
  WriteCheckpoint(dir, MoeConfig("qwen2_moe"), false);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  SafetensorsWriter w;
  const std::string bad = "model.layers.0.mlp.experts.3.down_proj.weight";
  for (const std::string& name : (*ckpt)->Names()) {
    auto info = (*ckpt)->Get(name);
    if (name == bad) {
      w.AddF32(bad, Shape({24, 32}), Values(bad, 24 * 32));  // Transposed.
    } else {
      w.AddCopy(*info);
    }
  }
  ckpt->reset();
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  CpuOps ops;
  auto model = LoadModel(dir, &ops);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find(bad), absl::string_view::npos)
      << model.status();
}

// --random-weights: a MoE model at TP 1 and each TP 2 rank's stacked expert
// slices hold exactly the whole tensors' elements.
TEST(MoeModelTest, RandomWeightsBuildAMoeModel) {
  for (const std::string type : {"mixtral", "qwen3_moe", "qwen2_moe"}) {
    Json c = MoeConfig(type);
    c["torch_dtype"] = "bfloat16";
    auto config = ParseModelConfig(c.dump());
    ASSERT_TRUE(config.ok()) << config.status();
    CpuOps ops;
    WeightLoadOptions options;
    options.device = &ops;
    auto table = ModelWeightTable(*config, FullModel(*config));
    ASSERT_TRUE(table.ok());
    auto whole = MakeRandomWeightSet(*config, *table, options, -1);
    ASSERT_TRUE(whole.ok()) << whole.status();
    for (int rank = 0; rank < 2; ++rank) {
      auto shard = MakeShardSpec(*config, rank, 2, 0, 1);
      ASSERT_TRUE(shard.ok()) << shard.status();
      auto part_table = ModelWeightTable(*config, *shard);
      ASSERT_TRUE(part_table.ok());
      auto part = MakeRandomWeightSet(*config, *part_table, options, -1);
      ASSERT_TRUE(part.ok()) << part.status();
      const int64_t E = config->moe.num_experts, H = config->hidden_size;
      const int64_t I = config->moe.expert_intermediate_size, li = I / 2;
      const float* full = whole->Find("model.layers.0.mlp.experts.gate_up_proj")
                              ->data_as<float>();
      const float* mine = part->Find("model.layers.0.mlp.experts.gate_up_proj")
                              ->data_as<float>();
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < 2 * li; ++r) {
          const int64_t full_row =
              r < li ? rank * li + r : I + rank * li + r - li;
          for (int64_t h = 0; h < H; ++h) {
            ASSERT_EQ(mine[(e * 2 * li + r) * H + h],
                      full[(e * 2 * I + full_row) * H + h])
                << type << " rank " << rank << " expert " << e;
          }
        }
      }
      const float* full_down =
          whole->Find("model.layers.0.mlp.experts.down_proj")->data_as<float>();
      const float* my_down =
          part->Find("model.layers.0.mlp.experts.down_proj")->data_as<float>();
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t i = 0; i < li; ++i) {
            ASSERT_EQ(my_down[(e * H + h) * li + i],
                      full_down[(e * H + h) * I + rank * li + i]);
          }
        }
      }
    }
    ModelContext context;
    context.ops = &ops;
    auto model =
        CreateModel(*config, FullModel(*config), *std::move(whole), context);
    ASSERT_TRUE(model.ok()) << model.status();
    // The experts count in the model's weights.
    int64_t table_bytes = 0;
    for (const WeightSpec& spec : *table)
      table_bytes += SliceBytes(spec, DType::kF32);
    EXPECT_EQ((*model)->weight_bytes(), table_bytes) << type;
    SequenceRunner runner(model->get());
    auto cache = runner.NewKvCache(16);
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits(config->vocab_size);
    ASSERT_TRUE(runner.Forward(kPrompt, &*cache, logits.data()).ok());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
}

std::string TestDevice() {
  const char* d = std::getenv("TESSERA_TEST_DEVICE");
  return d != nullptr ? d : "cpu";
}

class MoeCudaTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeCudaTest, LogitsFollowTheCpu) {
  if (TestDevice() != "cuda") GTEST_SKIP() << "the gpu-tagged twin runs it";
  if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string type = GetParam();
  const std::string dir = MakeDir(type + "_cuda");
  WriteCheckpoint(dir, MoeConfig(type), false);
  const auto want = RunOne(dir);
  ASSERT_FALSE(want.empty());
  // The reference's own bf16 spread, step by step: the CPU (f32) on the
  // weights rounded to bf16. Routing is a discontinuous top-k: where rounding
  // flips a near-tie between experts, the reference moves as far as a bf16
  // engine may, and the bf16 bound there is that distance.
  const std::string rounded = MakeDir(type + "_cuda_bf16_rounded");
  WriteCheckpoint(
      rounded, MoeConfig(type), false, [](const std::string& n) { return n; },
      "", true);
  const auto want_rounded = RunOne(rounded);
  ASSERT_EQ(want_rounded.size(), want.size());
  std::vector<double> bf16_tol;
  for (size_t s = 0; s < want.size(); ++s) {
    bf16_tol.push_back(
        std::max(3e-2, 3 * RelativeError(want_rounded[s], want[s])));
  }
  for (DType matrices : {DType::kF32, DType::kBF16}) {
    auto backend = CreateBackend("cuda", 0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ModelPlacement placement;
    placement.allocator = backend->allocator.get();
    placement.matrix_dtype = matrices;
    const auto got = RunOne(dir, backend->ops.get(), placement);
    const std::string what = type + " cuda " + std::string(DTypeName(matrices));
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t s = 0; s < want.size(); ++s) {
      EXPECT_LT(RelativeError(got[s], want[s]),
                matrices == DType::kF32 ? 1e-4 : bf16_tol[s])
          << what << " step " << s << " (the reference's bf16 spread "
          << RelativeError(want_rounded[s], want[s]) << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, MoeCudaTest,
                         ::testing::Values("mixtral", "qwen3_moe",
                                           "qwen2_moe"));

}  // namespace
}  // namespace tessera
