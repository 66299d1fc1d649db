#include "runtime/model/random_weights.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/core/dtype.h"
#include "runtime/model/config.h"
#include "runtime/model/registry.h"
#include "runtime/model/shard.h"

namespace tessera {
namespace {

// The golden Qwen2 fixture's shape (biases on q/k/v), odd vocabulary so that
// a TP-2 vocab split pads.
constexpr char kConfig[] = R"({
  "model_type": "qwen2", "vocab_size": 509, "hidden_size": 64,
  "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 256, "initializer_range": 0.2,
  "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
  "torch_dtype": "DTYPE"})";

ModelConfig Config(const std::string& dtype = "float32",
                   const std::string& extra = "") {
  std::string text = absl::StrReplaceAll(kConfig, {{"DTYPE", dtype}});
  if (!extra.empty()) text.insert(text.size() - 1, ", " + extra);
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

WeightSet Make(const ModelConfig& config, int tp_rank, int tp, Ops* ops,
               int threads = 0, uint64_t seed = kRandomWeightSeed) {
  absl::StatusOr<ShardSpec> shard = MakeShardSpec(config, tp_rank, tp, 0, 1);
  EXPECT_TRUE(shard.ok()) << shard.status();
  absl::StatusOr<WeightTable> table = ModelWeightTable(config, *shard);
  EXPECT_TRUE(table.ok()) << table.status();
  WeightLoadOptions options;
  options.device = ops;
  absl::StatusOr<WeightSet> set =
      MakeRandomWeightSet(config, *std::move(table), options,
                          /*available_bytes=*/-1, seed, threads);
  EXPECT_TRUE(set.ok()) << set.status();
  return *std::move(set);
}

std::vector<float> Values(const WeightSet& set, const std::string& name) {
  const Tensor* t = set.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype(), DType::kF32);  // The CPU stores f32.
  const float* p = t->data_as<float>();
  return std::vector<float>(p, p + t->shape().numel());
}

TEST(RandomWeightsTest, DeterministicAcrossRunsAndThreadCounts) {
  CpuOps ops;
  const ModelConfig config = Config();
  WeightSet a = Make(config, 0, 1, &ops, /*threads=*/1);
  WeightSet b = Make(config, 0, 1, &ops, /*threads=*/4);
  ASSERT_TRUE(a.complete());
  for (const WeightSpec& spec : a.table()) {
    EXPECT_EQ(Values(a, spec.name), Values(b, spec.name)) << spec.name;
  }
  // Another seed is another model.
  WeightSet c = Make(config, 0, 1, &ops, 1, kRandomWeightSeed + 1);
  EXPECT_NE(Values(a, "model.layers.0.mlp.up_proj.weight"),
            Values(c, "model.layers.0.mlp.up_proj.weight"));
  // Two tensors of one shape differ.
  EXPECT_NE(Values(a, "model.layers.0.mlp.up_proj.weight"),
            Values(a, "model.layers.0.mlp.gate_proj.weight"));
}

TEST(RandomWeightsTest, ScalesFollowHuggingFaceInit) {
  CpuOps ops;
  const ModelConfig config = Config();
  WeightSet set = Make(config, 0, 1, &ops);
  for (const WeightSpec& spec : set.table()) {
    const std::vector<float> v = Values(set, spec.name);
    double sum = 0, sq = 0;
    for (float x : v) {
      sum += x;
      sq += static_cast<double>(x) * x;
    }
    const double mean = sum / v.size();
    const double sd = std::sqrt(sq / v.size() - mean * mean);
    if (spec.full.rank() == 2) {
      EXPECT_NEAR(mean, 0.0, 0.02) << spec.name;
      EXPECT_NEAR(sd, 0.2, 0.02) << spec.name;  // initializer_range.
      for (float x : v) ASSERT_LE(std::fabs(x), 0.2f * 3.47f) << spec.name;
    } else if (spec.name.find("norm") != std::string::npos) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << spec.name;
    } else {
      for (float x : v) ASSERT_EQ(x, 0.0f) << spec.name;  // Biases.
    }
  }
}

// A TP-2 rank holds exactly its slice of the TP-1 tensors: rows (q), columns
// (o, down) and the padded vocabulary (zeros past the real rows).
// Also for Phi-3's fused tensors (row-range slices).
TEST(RandomWeightsTest, TensorParallelSlicesAreSlicesOfTheWholeModel) {
  CpuOps ops;
  ModelConfig phi3 = Config();
  {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(absl::StrReplaceAll(
        kConfig, {{"DTYPE", "float32"}, {"qwen2", "phi3"}}));
    ASSERT_TRUE(c.ok()) << c.status();
    phi3 = *c;
  }
  for (const ModelConfig& config : {Config(), phi3}) {
    SCOPED_TRACE(config.model_type);
    WeightSet whole = Make(config, 0, 1, &ops);
    for (int r = 0; r < 2; ++r) {
      WeightSet part = Make(config, r, 2, &ops);
      for (const WeightSpec& spec : part.table()) {
        const std::vector<float> full = Values(whole, spec.name);
        const std::vector<float> mine = Values(part, spec.name);
        const Shape local = spec.local_shape();
        for (int64_t i = 0; i < local.numel(); ++i) {
          float expected = 0;
          const int64_t row_elems =
              local.rank() <= 1 ? 1 : local.numel() / local[0];
          const int64_t row = i / row_elems, col = i % row_elems;
          switch (spec.split) {
            case WeightSplit::kReplicated:
              expected = full[i];
              break;
            case WeightSplit::kRows:
            case WeightSplit::kExperts:
              expected = full[(spec.begin + row) * row_elems + col];
              break;
            case WeightSplit::kVocab:
              expected = row < spec.end - spec.begin
                             ? full[(spec.begin + row) * row_elems + col]
                             : 0.0f;
              break;
            case WeightSplit::kColumns:
              expected = full[row * spec.full[1] + spec.begin + col];
              break;
            case WeightSplit::kRowRanges: {
              int64_t before = 0, full_row = -1;
              for (const RowRange& range : spec.row_ranges) {
                if (row < before + range.end - range.begin) {
                  full_row = range.begin + row - before;
                  break;
                }
                before += range.end - range.begin;
              }
              ASSERT_GE(full_row, 0);
              expected = full[full_row * row_elems + col];
              break;
            }
          }
          ASSERT_EQ(mine[i], expected)
              << spec.name << " rank " << r << " #" << i;
        }
      }
    }
  }
}

// The values are made in the config's dtype: a bfloat16 config hands Upload
// bf16 views (and the CPU's f32 copy is exactly those values).
TEST(RandomWeightsTest, GeneratedInTheConfigsDtype) {
  CpuOps ops;
  const ModelConfig config = Config("bfloat16");
  absl::StatusOr<ShardSpec> shard = MakeShardSpec(config, 0, 1, 0, 1);
  ASSERT_TRUE(shard.ok());
  absl::StatusOr<WeightTable> table = ModelWeightTable(config, *shard);
  ASSERT_TRUE(table.ok());
  int uploads = 0;
  WeightLoadOptions options;
  options.upload = [&](const TensorView& host, DType dtype) {
    ++uploads;
    EXPECT_EQ(host.dtype(), DType::kBF16);
    return ops.Upload(host, dtype);
  };
  absl::StatusOr<WeightSet> set =
      MakeRandomWeightSet(config, *table, options, -1);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(uploads, static_cast<int>(table->size()));
  for (float x : Values(*set, "model.layers.1.self_attn.o_proj.weight")) {
    ASSERT_EQ(Bf16ToF32(F32ToBf16(x)), x);
  }
  // The f32 model's values, rounded to bf16.
  WeightSet f32 = Make(Config("float32"), 0, 1, &ops);
  const std::vector<float> a = Values(*set, "model.embed_tokens.weight");
  const std::vector<float> b = Values(f32, "model.embed_tokens.weight");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], Bf16ToF32(F32ToBf16(b[i])));
  }
}

TEST(RandomWeightsTest, RefusesAnUnknownDtype) {
  CpuOps ops;
  const ModelConfig config = Config("int8");
  absl::StatusOr<ShardSpec> shard = MakeShardSpec(config, 0, 1, 0, 1);
  ASSERT_TRUE(shard.ok());
  WeightLoadOptions options;
  options.device = &ops;
  absl::StatusOr<WeightSet> set = MakeRandomWeightSet(
      config, *ModelWeightTable(config, *shard), options, -1);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("torch_dtype \"int8\""),
            std::string::npos)
      << set.status();
}

TEST(RandomWeightsTest, RefusesAbsurdDimensions) {
  ModelConfig config = Config();
  config.hidden_size = int64_t{1} << 40;
  absl::Status s = CheckRandomWeightConfig(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s;
  config = Config();
  config.num_heads = int64_t{1} << 20;
  config.head_dim = int64_t{1} << 20;
  EXPECT_EQ(CheckRandomWeightConfig(config).code(),
            absl::StatusCode::kInvalidArgument);
}

// 10^12 parameters (a 2^22-token vocabulary x 2^18 hidden) do not fit any
// host: refused before a single tensor is made or uploaded.
TEST(RandomWeightsTest, RefusesWhatDoesNotFitBeforeAllocating) {
  const ModelConfig config =
      Config("bfloat16", "\"vocab_size\": 4194304, \"hidden_size\": 262144");
  ASSERT_EQ(config.hidden_size, 262144);
  absl::StatusOr<ShardSpec> shard = MakeShardSpec(config, 0, 1, 0, 1);
  ASSERT_TRUE(shard.ok());
  absl::StatusOr<WeightTable> table = ModelWeightTable(config, *shard);
  ASSERT_TRUE(table.ok());
  int uploads = 0;
  WeightLoadOptions options;
  options.upload = [&](const TensorView&, DType) -> absl::StatusOr<Tensor> {
    ++uploads;
    return absl::InternalError("must not be reached");
  };
  absl::StatusOr<WeightSet> set = MakeRandomWeightSet(
      config, *table, options, /*available_bytes=*/int64_t{64} << 30);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(set.status().message().find("GiB"), std::string::npos)
      << set.status();
  EXPECT_EQ(uploads, 0);
}

}  // namespace
}  // namespace tessera
