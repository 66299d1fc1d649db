#include "runtime/model/quantized_weights.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/core/dtype.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/config.h"
#include "runtime/model/decoder.h"
#include "runtime/model/registry.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"
#include "runtime/model/testing/checkpoint_writer.h"
#include "runtime/model/weights.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing_util::CheckpointWriter;

// A small Llama: 4 heads of 32 (2 KV heads), hidden 128, intermediate 256.
ModelConfig SmallLlama() {
  ModelConfig c;
  c.arch = Architecture::kLlama;
  c.model_type = "llama";
  c.vocab_size = 64;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 64;
  c.sliding_window_per_layer = {0};
  return c;
}

QuantConfig PerChannel() {
  QuantConfig q;
  q.method = "compressed-tensors";
  q.weight_scale = Fp8WeightScale::kPerChannel;
  q.unquantized_modules = {"lm_head"};
  return q;
}

const WeightSpec* Find(const WeightTable& t, const std::string& name) {
  for (const WeightSpec& s : t) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(QuantizedWeightsTest, ScalesSplitWithTheirMatrices) {
  ModelConfig c = SmallLlama();
  c.quant = PerChannel();
  c.quant.input_scale = Fp8InputScale::kStaticPerTensor;
  const ShardSpec s = *MakeShardSpec(c, /*tp_rank=*/1, /*tp_size=*/2, 0, 1);
  const WeightTable t = *ModelWeightTable(c, s);
  const std::string p = "model.layers.0.";
  const WeightSpec* q = Find(t, p + "self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(q->fp8);
  // Rows split: the scale's rows go with them.
  const WeightSpec* qs = Find(t, p + "self_attn.q_proj.weight_scale");
  ASSERT_NE(qs, nullptr);
  EXPECT_EQ(qs->split, WeightSplit::kRows);
  EXPECT_EQ(qs->begin, q->begin);
  EXPECT_EQ(qs->end, q->end);
  EXPECT_TRUE(qs->any_shape);
  // Columns split: every rank needs every row's scale.
  const WeightSpec* os = Find(t, p + "self_attn.o_proj.weight_scale");
  ASSERT_NE(os, nullptr);
  EXPECT_EQ(os->split, WeightSplit::kReplicated);
  EXPECT_EQ(os->local_shape(), Shape({128}));
  ASSERT_NE(Find(t, p + "mlp.down_proj.input_scale"), nullptr);
  // The head and the embedding stay in the checkpoint's float dtype.
  EXPECT_FALSE(Find(t, "lm_head.weight")->fp8);
  EXPECT_EQ(Find(t, "lm_head.weight_scale"), nullptr);
  EXPECT_FALSE(Find(t, "model.embed_tokens.weight")->fp8);

  // Per-tensor: one value, repeated for this rank's rows.
  c.quant.weight_scale = Fp8WeightScale::kPerTensor;
  const WeightTable pt = *ModelWeightTable(c, s);
  const WeightSpec* ks = Find(pt, p + "self_attn.k_proj.weight_scale");
  ASSERT_NE(ks, nullptr);
  EXPECT_EQ(ks->full, Shape({1}));
  EXPECT_EQ(ks->local_shape(), Shape({32}));  // One KV head of 32 rows.

  // Blocks of 32 (the shapes here are small): block columns for o_proj.
  c.quant.weight_scale = Fp8WeightScale::kBlock;
  c.quant.block_rows = c.quant.block_cols = 32;
  c.quant.scale_suffix = "weight_scale_inv";
  const WeightTable bt = *ModelWeightTable(c, s);
  const WeightSpec* ob = Find(bt, p + "self_attn.o_proj.weight_scale_inv");
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(ob->full, Shape({4, 4}));
  EXPECT_EQ(ob->local_shape(), Shape({4, 2}));
  const WeightSpec* gb = Find(bt, p + "mlp.gate_proj.weight_scale_inv");
  EXPECT_EQ(gb->local_shape(), Shape({4, 4}));  // 128 of 256 rows.
}

TEST(QuantizedWeightsTest, RefusesWhatItCannotHold) {
  ModelConfig c = SmallLlama();
  c.quant = PerChannel();
  c.quant.weight_scale = Fp8WeightScale::kBlock;
  c.quant.block_rows = c.quant.block_cols = 128;
  // At TP2 a rank's 64 query rows are half a 128-row block.
  const ShardSpec s = *MakeShardSpec(c, 0, 2, 0, 1);
  absl::StatusOr<WeightTable> t = ModelWeightTable(c, s);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("128-wide scale blocks"));
  EXPECT_TRUE(ModelWeightTable(c, FullModel(c)).ok());
  // Online quantization lists no scales.
  c.quant.online = true;
  const WeightTable online = *ModelWeightTable(c, s);
  for (const WeightSpec& spec : online) EXPECT_FALSE(spec.fp8) << spec.name;
}

// Random e4m3 codes (finite) and positive scales.
std::string RandomCodes(int64_t n, std::mt19937* rng) {
  std::string out(static_cast<size_t>(n), '\0');
  std::uniform_int_distribution<int> code(0, 255);
  for (char& c : out) {
    int v = code(*rng);
    if ((v & 0x7f) == 0x7f) v = 0x7e;  // Not NaN.
    c = static_cast<char>(v);
  }
  return out;
}
std::vector<float> RandomScales(int64_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> d(0.001f, 0.1f);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = d(*rng);
  return out;
}

class QuantizedLoadTest : public ::testing::Test {
 protected:
  // Writes layer 0 of SmallLlama with fp8 projections under `quant`'s
  // scheme, and everything else f32.
  std::string WriteCheckpoint(const ModelConfig& c, const std::string& name) {
    const std::filesystem::path dir =
        std::filesystem::path(::testing::TempDir()) / "quantized" / name;
    std::filesystem::create_directories(dir);
    CheckpointWriter w;
    std::mt19937 rng(7);
    const WeightTable table = *ModelWeightTable(c, FullModel(c));
    for (const WeightSpec& spec : table) {
      if (spec.fp8) {
        const std::string bytes = RandomCodes(spec.full.numel(), &rng);
        w.Add(spec.name, DType::kF8E4M3, spec.full, bytes);
        codes_[spec.name] = bytes;
      } else if (spec.any_shape) {
        // Scales as the formats publish them: [N, 1] per channel, [] per
        // tensor.
        std::vector<float> v = RandomScales(spec.full.numel(), &rng);
        Shape published = spec.full;
        if (spec.full.rank() == 1 && spec.full[0] > 1) {
          published = Shape({spec.full[0], 1});
        } else if (spec.full == Shape({1})) {
          published = Shape(std::vector<int64_t>{});
        }
        w.AddFloats(spec.name, DType::kF32, published, v);
        scales_[spec.name] = v;
      } else {
        w.AddRandom(spec.name, DType::kF32, spec.full);
      }
    }
    w.Write((dir / "model.safetensors").string());
    return dir.string();
  }

  std::map<std::string, std::string> codes_;
  std::map<std::string, std::vector<float>> scales_;
};

TEST_F(QuantizedLoadTest, TheCpuRunsTheDequantizedWeights) {
  for (const Fp8WeightScale kind :
       {Fp8WeightScale::kPerChannel, Fp8WeightScale::kPerTensor,
        Fp8WeightScale::kBlock}) {
    ModelConfig c = SmallLlama();
    c.quant = PerChannel();
    c.quant.weight_scale = kind;
    if (kind == Fp8WeightScale::kBlock) {
      c.quant.block_rows = c.quant.block_cols = 32;
      c.quant.scale_suffix = "weight_scale_inv";
    }
    const std::string dir =
        WriteCheckpoint(c, absl::StrCat("k", static_cast<int>(kind)));
    CpuOps ops;
    std::unique_ptr<Checkpoint> ckpt = *Checkpoint::Open(dir);
    WeightLoadOptions options;
    options.device = &ops;
    absl::StatusOr<WeightSet> set =
        LoadShardWeights(*ckpt, c, FullModel(c), options);
    ASSERT_TRUE(set.ok()) << set.status();
    WeightBinder binder(&ops, &*set, c.quant);
    const std::string p = "model.layers.0.self_attn.";
    absl::StatusOr<Weight> qkv = binder.StackLinear(
        {p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"});
    ASSERT_TRUE(qkv.ok()) << qkv.status();
    // Dequantized, f32, no scale left: row r of the stack is q, k or v's.
    EXPECT_EQ(qkv->scale_kind, WeightScaleKind::kNone);
    ASSERT_EQ(qkv->dtype(), DType::kF32);
    ASSERT_EQ(qkv->shape(), Shape({256, 128}));
    const float* got = qkv->data.data_as<const float>();
    int64_t row = 0;
    for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
      const std::string& codes = codes_[p + m + ".weight"];
      const std::vector<float>& scale =
          scales_[p + m + "." + c.quant.scale_suffix];
      const int64_t rows = static_cast<int64_t>(codes.size()) / 128;
      for (int64_t r = 0; r < rows; ++r, ++row) {
        for (int64_t k = 0; k < 128; ++k) {
          float s = scale[0];
          if (kind == Fp8WeightScale::kPerChannel) s = scale[r];
          if (kind == Fp8WeightScale::kBlock) s = scale[(r / 32) * 4 + k / 32];
          const float want =
              Fp8E4M3ToF32(static_cast<uint8_t>(codes[r * 128 + k])) * s;
          ASSERT_EQ(got[row * 128 + k], want)
              << m << " row " << r << " col " << k << " kind "
              << static_cast<int>(kind);
        }
      }
    }
  }
}

TEST_F(QuantizedLoadTest, AMatrixInTheWrongDtypeIsRefusedNamingIt) {
  ModelConfig c = SmallLlama();
  c.quant = PerChannel();
  const std::string dir = WriteCheckpoint(c, "dtype");
  // The config says nothing is quantized, but the file holds fp8.
  ModelConfig plain = SmallLlama();
  CpuOps ops;
  std::unique_ptr<Checkpoint> ckpt = *Checkpoint::Open(dir);
  WeightLoadOptions options;
  options.device = &ops;
  absl::StatusOr<WeightSet> set =
      LoadShardWeights(*ckpt, plain, FullModel(plain), options);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(set.status().message(),
              HasSubstr("q_proj.weight: f8_e4m3 in the checkpoint"));
  // The config quantizes q_proj, but the file holds it f32.
  const std::string plain_dir = WriteCheckpoint(plain, "plain");
  std::unique_ptr<Checkpoint> plain_ckpt = *Checkpoint::Open(plain_dir);
  set = LoadShardWeights(*plain_ckpt, c, FullModel(c), options);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(set.status().message(),
              HasSubstr("q_proj.weight: the quantization_config makes it an "
                        "fp8 matrix, but the checkpoint holds f32"));
}

TEST(QuantizedWeightsTest, StacksKeepEachPartsScaleAndTheLargestInputScale) {
  CpuOps ops;
  auto f32 = [&](std::vector<float> v, Shape s) {
    return *ops.Upload(TensorView(v.data(), DType::kF32, s), DType::kF32);
  };
  Weight a(f32({1, 2, 3, 4}, {2, 2})), b(f32({5, 6}, {1, 2}));
  for (Weight* w : {&a, &b}) {
    w->scale_kind = WeightScaleKind::kPerChannel;
    w->activations = ActivationScaleKind::kStatic;
  }
  a.scale = f32({0.5f, 0.25f}, {2});
  b.scale = f32({2.0f}, {1});
  a.input_scale = f32({0.1f}, {1});
  b.input_scale = f32({0.3f}, {1});
  std::vector<Weight> parts;
  parts.push_back(std::move(a));
  parts.push_back(std::move(b));
  HostStaging staging;
  absl::StatusOr<Weight> s = StackLinearWeights(&ops, parts, &staging);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shape(), Shape({3, 2}));
  const float* scale = s->scale->data_as<const float>();
  EXPECT_EQ(scale[0], 0.5f);
  EXPECT_EQ(scale[1], 0.25f);
  EXPECT_EQ(scale[2], 2.0f);
  EXPECT_EQ(s->input_scale->data_as<const float>()[0], 0.3f);
  // Differently quantized parts do not stack.
  parts[1].scale_kind = WeightScaleKind::kBlock;
  EXPECT_FALSE(StackLinearWeights(&ops, parts, &staging).ok());
}

TEST(QuantizedWeightsTest, QuantizeOnLoadTakesUnquantizedDenseModels) {
  ModelConfig c = SmallLlama();
  ASSERT_TRUE(QuantizeOnLoad(&c).ok());
  EXPECT_TRUE(c.quant.online);
  EXPECT_TRUE(c.quant.Quantizes("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(c.quant.Quantizes("lm_head"));
  // Twice, or on an fp8 checkpoint: refused, naming the checkpoint's method.
  ModelConfig fp8 = SmallLlama();
  fp8.quant = PerChannel();
  absl::Status st = QuantizeOnLoad(&fp8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              HasSubstr("quantized already (compressed-tensors)"));
  ModelConfig moe = SmallLlama();
  moe.moe.num_experts = 4;
  EXPECT_EQ(QuantizeOnLoad(&moe).code(), absl::StatusCode::kUnimplemented);
}

// An fp8 checkpoint's KV cache scales (compressed-tensors' and modelopt's
// names) reach an fp8 KV pool, every head of a layer its layer's.
TEST(QuantizedWeightsTest, CheckpointKvScalesReachAnFp8Pool) {
  for (const bool modelopt : {false, true}) {
    ModelConfig c = SmallLlama();
    c.quant = PerChannel();
    c.quant.kv_cache_scales = true;
    const std::filesystem::path dir =
        std::filesystem::path(::testing::TempDir()) / "quantized" /
        (modelopt ? "kv_modelopt" : "kv_ct");
    std::filesystem::create_directories(dir);
    CheckpointWriter w;
    std::mt19937 rng(3);
    const WeightTable table = *ModelWeightTable(c, FullModel(c));
    for (const WeightSpec& spec : table) {
      std::string name = spec.name;
      if (absl::EndsWith(name, "self_attn.k_scale")) {
        if (modelopt)
          name = absl::StrReplaceAll(name, {{"k_scale", "k_proj.k_scale"}});
        w.AddFloats(name, DType::kF32, Shape(std::vector<int64_t>{}), {0.5f});
      } else if (absl::EndsWith(name, "self_attn.v_scale")) {
        if (modelopt)
          name = absl::StrReplaceAll(name, {{"v_scale", "v_proj.v_scale"}});
        w.AddFloats(name, DType::kF32, Shape({1}), {0.25f});
      } else if (spec.fp8) {
        w.Add(name, DType::kF8E4M3, spec.full,
              RandomCodes(spec.full.numel(), &rng));
      } else if (spec.any_shape) {
        w.AddFloats(name, DType::kF32, spec.full,
                    RandomScales(spec.full.numel(), &rng));
      } else {
        w.AddRandom(name, DType::kF32, spec.full);
      }
    }
    w.Write((dir / "model.safetensors").string());
    CpuOps ops;
    std::unique_ptr<Checkpoint> ckpt = *Checkpoint::Open(dir.string());
    WeightLoadOptions options;
    options.device = &ops;
    absl::StatusOr<WeightSet> set =
        LoadShardWeights(*ckpt, c, FullModel(c), options);
    ASSERT_TRUE(set.ok()) << set.status();
    ModelContext context;
    context.ops = &ops;
    absl::StatusOr<std::unique_ptr<Model>> model =
        CreateModel(c, FullModel(c), *std::move(set), context);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->checkpoint_kv_scales().size(), 1u);
    EXPECT_EQ((*model)->checkpoint_kv_scales()[0].k, 0.5f);
    EXPECT_EQ((*model)->checkpoint_kv_scales()[0].v, 0.25f);
    absl::StatusOr<KvPool> pool =
        KvPool::Create((*model)->kv_pool_shape(DType::kF8E4M3), 2, 16, &ops,
                       (*model)->allocator());
    ASSERT_TRUE(pool.ok()) << pool.status();
    ASSERT_TRUE(ApplyCheckpointKvScales(**model, &*pool).ok());
    ASSERT_EQ(pool->k_scales(0).size(), 2u);  // Both KV heads.
    for (float s : pool->k_scales(0)) EXPECT_EQ(s, 0.5f);
    for (float s : pool->v_scales(0)) EXPECT_EQ(s, 0.25f);
    // A bf16/f32 pool does not read them.
    absl::StatusOr<KvPool> f32 =
        KvPool::Create((*model)->kv_pool_shape(DType::kF32), 2, 16, &ops,
                       (*model)->allocator());
    ASSERT_TRUE(f32.ok());
    EXPECT_TRUE(ApplyCheckpointKvScales(**model, &*f32).ok());
  }
}

}  // namespace
}  // namespace tessera
