#include "runtime/model/weights.h"

#include <malloc.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/executor/sequence_runner.h"
#include "runtime/model/config.h"
#include "runtime/model/llama.h"
#include "runtime/model/registry.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"
#include "runtime/model/testing/checkpoint_writer.h"

namespace tessera {
namespace {

using testing_util::CheckpointWriter;

std::string MakeDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "weights_test" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Element `i` of a host view in any float dtype, as f32.
float At(const TensorView& v, int64_t i) {
  float out = 0;
  EXPECT_TRUE(ConvertToF32(v.dtype(),
                           static_cast<const char*>(v.data()) +
                               i * static_cast<int64_t>(DTypeSize(v.dtype())),
                           1, &out)
                  .ok());
  return out;
}

bool Inside(const void* p, const TensorInfo& info) {
  const char* begin = static_cast<const char*>(info.data);
  return p >= static_cast<const void*>(begin) &&
         p < static_cast<const void*>(begin + info.nbytes);
}

class SplitRuleTest : public testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    dir_ = MakeDir(std::string("split_") + std::string(DTypeName(GetParam())));
    CheckpointWriter()
        .AddRandom("m", GetParam(), {6, 10})
        .AddRandom("e", GetParam(), {4, 3, 5})
        .AddRandom("b", GetParam(), {6})
        .Write(dir_ + "/model.safetensors");
    auto ckpt = Checkpoint::Open(dir_);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
  }

  // Checks ReadSlice(spec) against slicing the full tensor by hand:
  // `expected(index into the slice) → index into the full tensor, or -1 for
  // a padding zero`.
  void Check(const WeightSpec& spec, const Shape& local,
             const std::function<int64_t(int64_t)>& full_index,
             bool contiguous) {
    HostStaging staging;
    auto view = ReadSlice(*ckpt_, spec, &staging);
    ASSERT_TRUE(view.ok()) << view.status();
    const TensorInfo info = *ckpt_->Get(spec.name);
    const TensorView full(const_cast<void*>(info.data), info.dtype, info.shape);
    EXPECT_EQ(view->shape(), local) << spec.name;
    EXPECT_EQ(spec.local_shape(), local);
    EXPECT_EQ(view->dtype(), GetParam()) << "slices keep the file's dtype";
    EXPECT_EQ(Inside(view->data(), info), contiguous)
        << WeightSplitName(spec.split)
        << ": contiguous slices are read in place, others staged";
    for (int64_t i = 0; i < local.numel(); ++i) {
      const int64_t f = full_index(i);
      EXPECT_EQ(At(*view, i), f < 0 ? 0.0f : At(full, f))
          << WeightSplitName(spec.split) << " element " << i;
    }
    // CopySlice writes the same bytes.
    std::vector<char> copy(SliceBytes(spec, info.dtype));
    CopySlice(spec, info.dtype, info.data, copy.data());
    EXPECT_EQ(std::memcmp(copy.data(), view->data(), copy.size()), 0);
  }

  std::string dir_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_P(SplitRuleTest, Replicated) {
  Check(
      Replicated("m", {6, 10}, 0), {6, 10}, [](int64_t i) { return i; }, true);
  Check(
      Replicated("b", {6}, 0), {6}, [](int64_t i) { return i; }, true);
}

TEST_P(SplitRuleTest, Rows) {
  Check(
      RowSplit("m", {6, 10}, 2, 5, 0), {3, 10},
      [](int64_t i) { return 20 + i; }, true);
  Check(
      RowSplit("b", {6}, 1, 4, 0), {3}, [](int64_t i) { return 1 + i; }, true);
}

TEST_P(SplitRuleTest, Columns) {
  Check(
      ColumnSplit("m", {6, 10}, 3, 7, 0), {6, 4},
      [](int64_t i) { return (i / 4) * 10 + 3 + i % 4; }, false);
}

TEST_P(SplitRuleTest, VocabWithAndWithoutPadding) {
  Check(
      VocabSplit("m", {6, 10}, 4, 6, 2, 0), {4, 10},
      [](int64_t i) { return i < 20 ? 40 + i : -1; }, false);
  Check(
      VocabSplit("m", {6, 10}, 0, 3, 0, 0), {3, 10},
      [](int64_t i) { return i; }, true);
}

TEST_P(SplitRuleTest, Experts) {
  Check(
      ExpertSplit("e", {4, 3, 5}, 1, 3, 0), {2, 3, 5},
      [](int64_t i) { return 15 + i; }, true);
}

// Several row ranges stacked in order (a fused projection's q, k and v rows
// on one rank): gathered when apart, read in place when they meet.
TEST_P(SplitRuleTest, RowRanges) {
  const WeightSpec apart = RowRangesSplit("m", {6, 10}, {{0, 1}, {3, 5}}, 0);
  EXPECT_EQ(apart.split, WeightSplit::kRowRanges);
  Check(
      apart, {3, 10}, [](int64_t i) { return i < 10 ? i : 30 + (i - 10); },
      false);
  const WeightSpec meet =
      RowRangesSplit("m", {6, 10}, {{1, 3}, {3, 3}, {3, 4}}, 0);
  ASSERT_EQ(meet.row_ranges.size(), 1u);
  Check(
      meet, {3, 10}, [](int64_t i) { return 10 + i; }, true);
  Check(
      RowRangesSplit("b", {6}, {{4, 6}, {0, 2}}, 0), {4},
      [](int64_t i) { return i < 2 ? 4 + i : i - 2; }, false);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SplitRuleTest,
                         testing::Values(DType::kF32, DType::kBF16,
                                         DType::kF16));

TEST(ReadSliceTest, ErrorsNameTheTensor) {
  const std::string dir = MakeDir("errors");
  CheckpointWriter()
      .AddRandom("m", DType::kBF16, {6, 10})
      .Add("i", DType::kI8, {4}, std::string(4, '\0'))
      .Write(dir + "/model.safetensors");
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  HostStaging staging;
  absl::StatusOr<TensorView> missing =
      ReadSlice(**ckpt, Replicated("model.norm.weight", {10}, 0), &staging);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.norm.weight"),
            std::string::npos);
  absl::StatusOr<TensorView> shape =
      ReadSlice(**ckpt, Replicated("m", {6, 11}, 0), &staging);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shape.status().message(),
            "m: expected shape [6, 11], found [6, 10]");
  absl::StatusOr<TensorView> dtype =
      ReadSlice(**ckpt, Replicated("i", {4}, 0), &staging);
  EXPECT_EQ(dtype.status().message(), "i: dtype i8 is not a float type");
}

TEST(WeightSetTest, StoresChecksAndTakes) {
  WeightSet set({RowSplit("a", {4, 2}, 0, 2, 0), Replicated("b", {3}, 1)});
  CpuOps ops;
  std::vector<float> a(4, 1.0f), wrong(6, 0.0f), b(3, 2.0f);
  EXPECT_EQ(set.Store(0, TensorView(wrong.data(), DType::kF32, {3, 2}), &ops,
                      DType::kF32)
                .code(),
            absl::StatusCode::kDataLoss);
  ASSERT_TRUE(
      set.Store(0, TensorView(a.data(), DType::kF32, {2, 2}), &ops, DType::kF32)
          .ok());
  EXPECT_EQ(
      set.Store(0, TensorView(a.data(), DType::kF32, {2, 2}), &ops, DType::kF32)
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(set.complete());
  EXPECT_EQ(set.first_missing(), "b");
  ASSERT_TRUE(
      set.Store(1, TensorView(b.data(), DType::kF32, {3}), &ops, DType::kF32)
          .ok());
  EXPECT_TRUE(set.complete());
  EXPECT_EQ(set.bytes(), 7 * 4);
  ASSERT_NE(set.Find("b"), nullptr);
  EXPECT_TRUE(set.Take("a").ok());
  EXPECT_EQ(set.Take("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(set.Take("zzz").status().code(), absl::StatusCode::kNotFound);
}

// A Llama checkpoint with random weights in `dtype`, shaped by `config_json`.
std::string WriteLlama(const std::string& name, DType dtype,
                       const std::string& config_json) {
  const std::string dir = MakeDir(name);
  std::ofstream(dir + "/config.json") << config_json;
  auto config = ParseModelConfig(config_json);
  EXPECT_TRUE(config.ok()) << config.status();
  CheckpointWriter writer;
  for (const WeightSpec& spec : LlamaWeightTable(*config, FullModel(*config))) {
    writer.AddRandom(spec.name, dtype, spec.full);
  }
  writer.Write(dir + "/model.safetensors");
  return dir;
}

constexpr char kConfig[] = R"({
  "model_type": "llama", "hidden_size": 256, "intermediate_size": 1024,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 4096, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": false})";

int64_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// The GPU path: a bf16 checkpoint reaches the backend's Upload as bf16,
// straight from the mapping (or, for strided slices, one staging buffer in
// bf16); the host never holds an f32 copy of a weight. A counting fake
// backend records what it is given and the host heap at each call.
void ExpectNoF32HostCopy(int tp_rank, int tp_size) {
  const std::string dir = WriteLlama(
      absl::StrCat("bf16_tp", tp_rank, "of", tp_size), DType::kBF16, kConfig);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  auto shard = MakeShardSpec(*config, tp_rank, tp_size, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  const WeightTable table = LlamaWeightTable(*config, *shard);
  int64_t largest_staged = 0;  // bf16 bytes of the largest strided slice.
  for (const WeightSpec& spec : table) {
    if (spec.split == WeightSplit::kColumns)
      largest_staged = std::max(largest_staged, SliceBytes(spec, DType::kBF16));
  }
  static char fake_device[1];
  int64_t calls = 0, bf16_bytes = 0, worst_growth = 0;
  const int64_t baseline = HeapInUse();
  WeightLoadOptions options;
  options.matrix_dtype = DType::kBF16;
  options.upload = [&](const TensorView& host,
                       DType dtype) -> absl::StatusOr<Tensor> {
    ++calls;
    EXPECT_EQ(host.dtype(), DType::kBF16) << "call " << calls;
    bf16_bytes += static_cast<int64_t>(host.nbytes());
    worst_growth = std::max(worst_growth, HeapInUse() - baseline);
    return Tensor::Adopt(fake_device, dtype, host.shape(), [](void*) {});
  };
  // on_tensor: once per tensor, right after it is stored (a parallel job's
  // startup deadline counts it as progress).
  int64_t tensors_done = 0;
  options.on_tensor = [&] {
    ++tensors_done;
    EXPECT_EQ(tensors_done, calls) << "on_tensor before its tensor's upload";
  };
  auto set = LoadWeightSet(**ckpt, table, options);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(calls, static_cast<int64_t>(table.size()));
  EXPECT_EQ(tensors_done, static_cast<int64_t>(table.size()));
  int64_t shard_bf16 = 0;
  for (const WeightSpec& spec : table)
    shard_bf16 += SliceBytes(spec, DType::kBF16);
  EXPECT_EQ(bf16_bytes, shard_bf16);
  // An f32 copy of even one matrix (the 4 MiB embedding) would exceed this.
  EXPECT_LE(worst_growth, largest_staged + (int64_t{1} << 20))
      << "host heap grew by " << worst_growth << " bytes while loading "
      << shard_bf16 << " bytes of bf16 weights";
}

TEST(NoF32HostCopyTest, WholeModelReadsInPlace) { ExpectNoF32HostCopy(0, 1); }
TEST(NoF32HostCopyTest, TensorParallelSliceStagesOnlyStridedSlicesInBf16) {
  ExpectNoF32HostCopy(1, 2);
}

// The CPU backend widens a bf16 checkpoint tensor by tensor: the model equals
// one loaded from an f32 checkpoint of the same (bf16-rounded) values.
TEST(CpuLoadTest, Bf16CheckpointMatchesItsF32Rounding) {
  const std::string bf16_dir = WriteLlama("cpu_bf16", DType::kBF16, kConfig);
  const std::string f32_dir = MakeDir("cpu_f32_rounded");
  std::filesystem::copy_file(bf16_dir + "/config.json",
                             f32_dir + "/config.json");
  {
    auto ckpt = Checkpoint::Open(bf16_dir);
    ASSERT_TRUE(ckpt.ok());
    CheckpointWriter writer;
    for (const std::string& name : (*ckpt)->Names()) {
      const TensorInfo info = *(*ckpt)->Get(name);
      auto t = (*ckpt)->LoadF32(name, info.shape);
      ASSERT_TRUE(t.ok());
      std::vector<float> v(t->data_as<float>(),
                           t->data_as<float>() + t->numel());
      writer.AddFloats(name, DType::kF32, info.shape, v);
    }
    writer.Write(f32_dir + "/model.safetensors");
  }
  CpuOps ops;
  auto a = LoadModel(bf16_dir, &ops);
  auto b = LoadModel(f32_dir, &ops);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*a)->weight_bytes(), (*b)->weight_bytes());
  const std::vector<int32_t> tokens = {1, 7, 300, 4000};
  std::vector<float> la(4096), lb(4096);
  SequenceRunner ra(a->get()), rb(b->get());
  auto ca = ra.NewKvCache(8);
  auto cb = rb.NewKvCache(8);
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_TRUE(ra.Forward(tokens, &*ca, la.data()).ok());
  ASSERT_TRUE(rb.Forward(tokens, &*cb, lb.data()).ok());
  EXPECT_EQ(la, lb);
}

TEST(RegistryTest, UnknownModelTypeNamesTheSupportedOnes) {
  auto entry = FindArchitecture("gpt2");
  // Architectures are appended to the list; the message starts with these.
  EXPECT_TRUE(absl::StartsWith(entry.status().message(),
                               "unsupported model_type \"gpt2\" (supported: "
                               "llama, mistral, qwen2, qwen3"))
      << entry.status();
  EXPECT_NE(entry.status().message().find("qwen3_moe"),
            absl::string_view::npos);
  EXPECT_NE(entry.status().message().find("phi3"), absl::string_view::npos);
  EXPECT_TRUE(FindArchitecture("qwen3").ok());
}

// Config parsing (which cannot depend on the models) and the registry list
// the same architectures with the same ParseHParams.
TEST(RegistryTest, ConfigParsingAndRegistryAgree) {
  size_t found = 0;
  for (const ArchitectureConfig& a : ConfigArchitectures()) {
    auto entry = FindArchitecture(a.model_type);
    ASSERT_TRUE(entry.ok()) << a.model_type;
    EXPECT_EQ((*entry)->parse_hparams, a.parse_hparams) << a.model_type;
    ++found;
  }
  EXPECT_GE(found, 11u);
  for (absl::string_view t :
       {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2",
        "gemma3_text", "mixtral", "qwen3_moe", "qwen2_moe"}) {
    bool listed = false;
    for (const ArchitectureConfig& a : ConfigArchitectures())
      listed |= a.model_type == t;
    EXPECT_TRUE(listed) << t;
  }
}

// Errors keep their text: a missing tensor is NotFound naming it, a shape
// that disagrees with the config says both shapes, and both name the folder.
TEST(LoadModelTest, MissingTensorAndShapeMismatchNameTheTensor) {
  auto config = ParseModelConfig(kConfig);
  ASSERT_TRUE(config.ok());
  const WeightTable table = LlamaWeightTable(*config, FullModel(*config));
  CpuOps ops;
  {
    const std::string dir = MakeDir("missing");
    std::ofstream(dir + "/config.json") << kConfig;
    CheckpointWriter writer;
    for (const WeightSpec& spec : table) {
      if (spec.name != "model.layers.1.mlp.up_proj.weight")
        writer.AddRandom(spec.name, DType::kBF16, spec.full);
    }
    writer.Write(dir + "/model.safetensors");
    auto model = LoadModel(dir, &ops);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(model.status().message().find("loading weights from " + dir),
              std::string::npos)
        << model.status();
    EXPECT_NE(
        model.status().message().find("model.layers.1.mlp.up_proj.weight"),
        std::string::npos)
        << model.status();
  }
  {
    const std::string dir = MakeDir("shape");
    std::ofstream(dir + "/config.json") << kConfig;
    CheckpointWriter writer;
    for (const WeightSpec& spec : table) {
      writer.AddRandom(spec.name, DType::kBF16,
                       spec.name == "model.layers.0.self_attn.k_proj.weight"
                           ? Shape({256, 256})
                           : spec.full);
    }
    writer.Write(dir + "/model.safetensors");
    auto model = LoadModel(dir, &ops);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(model.status().message().find(
                  "model.layers.0.self_attn.k_proj.weight: expected shape "
                  "[128, 256], found [256, 256]"),
              std::string::npos)
        << model.status();
  }
}

TEST(LlamaWeightTableTest, TensorParallelSlicesFollowTheShard) {
  auto config = ParseModelConfig(kConfig);
  ASSERT_TRUE(config.ok());
  auto shard = MakeShardSpec(*config, 1, 2, 0, 1);
  ASSERT_TRUE(shard.ok());
  const WeightTable table = LlamaWeightTable(*config, *shard);
  auto find = [&](const std::string& name) -> const WeightSpec* {
    for (const WeightSpec& s : table)
      if (s.name == name) return &s;
    return nullptr;
  };
  const WeightSpec* q = find("model.layers.0.self_attn.q_proj.weight");
  const WeightSpec* o = find("model.layers.1.self_attn.o_proj.weight");
  const WeightSpec* down = find("model.layers.1.mlp.down_proj.weight");
  const WeightSpec* embed = find("model.embed_tokens.weight");
  const WeightSpec* norm = find("model.norm.weight");
  ASSERT_TRUE(q && o && down && embed && norm);
  EXPECT_EQ(q->split, WeightSplit::kRows);
  EXPECT_EQ(q->begin, 128);
  EXPECT_EQ(q->local_shape(), Shape({128, 256}));
  EXPECT_EQ(o->split, WeightSplit::kColumns);
  EXPECT_EQ(o->local_shape(), Shape({256, 128}));
  EXPECT_EQ(down->local_shape(), Shape({256, 512}));
  EXPECT_EQ(embed->split, WeightSplit::kVocab);
  EXPECT_EQ(embed->begin, 2048);
  EXPECT_EQ(norm->split, WeightSplit::kReplicated);
  EXPECT_FALSE(norm->matrix);
  EXPECT_TRUE(q->matrix);
  EXPECT_EQ(WeightParts(table), 4);  // Embedding, 2 layers, head.
  // Progress bars count parts per shard (the loader's on_part calls): a
  // stage's layers plus its embedding or head.
  for (int stage = 0; stage < 2; ++stage) {
    auto s = MakeShardSpec(*config, 0, 2, stage, 2);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*ModelWeightParts(*config, *s), 2);  // One layer + embed/head.
  }
}

// A backend whose memory the host may not touch (host_memory() false), as
// a GPU's: it keeps bf16 as bf16 and counts the copies, so ConcatRows must
// go through CopyToHost and Upload.
class OpaqueDevice final : public Device {
 public:
  absl::StatusOr<Tensor> Upload(const TensorView& host, DType dtype) override {
    ++uploads;
    if (host.dtype() != dtype) return absl::InvalidArgumentError("dtype");
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, host.shape()));
    if (host.nbytes() > 0) std::memcpy(t.data(), host.data(), host.nbytes());
    return t;
  }
  absl::Status CopyToHost(const TensorView& src, void* dst) override {
    ++copies;
    if (src.nbytes() > 0) std::memcpy(dst, src.data(), src.nbytes());
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t) override {
    return absl::UnimplementedError("none");
  }
  int uploads = 0, copies = 0;
};

// The same, with copies inside its own memory (as CudaOps::StackRows).
class StackingDevice final : public Device {
 public:
  absl::StatusOr<Tensor> Upload(const TensorView&, DType) override {
    return absl::InternalError("no upload expected");
  }
  absl::Status CopyToHost(const TensorView&, void*) override {
    return absl::InternalError("no host copy expected");
  }
  absl::StatusOr<Tensor> StackRows(absl::Span<const TensorView> parts,
                                   const Shape& shape) override {
    ++stacks;
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(parts[0].dtype(), shape));
    char* dst = static_cast<char*>(t.data());
    for (const TensorView& part : parts) {
      if (part.nbytes() > 0) std::memcpy(dst, part.data(), part.nbytes());
      dst += part.nbytes();
    }
    return t;
  }
  absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t) override {
    return absl::UnimplementedError("none");
  }
  int stacks = 0;
};

Tensor Filled(DType dtype, Shape shape, uint8_t first) {
  Tensor t = *Tensor::Empty(dtype, std::move(shape));
  for (size_t i = 0; i < t.nbytes(); ++i) {
    static_cast<uint8_t*>(t.data())[i] = static_cast<uint8_t>(first + i);
  }
  return t;
}

// The fused projections' rows are the parts' rows in order, byte for byte,
// on a host-memory backend (in place), on one that copies within its own
// memory (StackRows, as a GPU), and on one that cannot (one round trip: a
// copy per part, one upload).
constexpr char kPhi3Config[] = R"({
  "model_type": "phi3", "hidden_size": 256, "intermediate_size": 1024,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 4096, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": false})";

// A Phi-3 checkpoint holding exactly a Llama one's tensors, q/k/v and
// gate/up fused as Phi-3 stores them ([q; k; v] rows, [gate; up] rows).
std::string WriteFusedCopy(const std::string& llama_dir,
                           const std::string& name) {
  const std::string dir = MakeDir(name);
  std::ofstream(dir + "/config.json") << kPhi3Config;
  auto ckpt = Checkpoint::Open(llama_dir);
  EXPECT_TRUE(ckpt.ok());
  auto bytes = [&](const std::string& n) {
    const TensorInfo info = *(*ckpt)->Get(n);
    return std::string(static_cast<const char*>(info.data),
                       info.shape.numel() * DTypeSize(info.dtype));
  };
  CheckpointWriter writer;
  for (const std::string& n : (*ckpt)->Names()) {
    const TensorInfo info = *(*ckpt)->Get(n);
    absl::string_view layer = n;
    if (absl::ConsumeSuffix(&layer, "self_attn.q_proj.weight")) {
      const std::string p(layer);
      const int64_t rows =
          info.shape[0] +
          2 * (*ckpt)->Get(p + "self_attn.k_proj.weight")->shape[0];
      writer.Add(p + "self_attn.qkv_proj.weight", info.dtype,
                 {rows, info.shape[1]},
                 bytes(n) + bytes(p + "self_attn.k_proj.weight") +
                     bytes(p + "self_attn.v_proj.weight"));
    } else if (absl::ConsumeSuffix(&layer, "mlp.gate_proj.weight")) {
      const std::string p(layer);
      writer.Add(p + "mlp.gate_up_proj.weight", info.dtype,
                 {2 * info.shape[0], info.shape[1]},
                 bytes(n) + bytes(p + "mlp.up_proj.weight"));
    } else if (!absl::EndsWith(n, "k_proj.weight") &&
               !absl::EndsWith(n, "v_proj.weight") &&
               !absl::EndsWith(n, "up_proj.weight")) {
      writer.Add(n, info.dtype, info.shape, bytes(n));
    }
  }
  writer.Write(dir + "/model.safetensors");
  return dir;
}

// Each tensor-parallel rank reads, from Phi-3's fused tensors, exactly the
// rows its Llama counterpart stacks from the separate ones: its q heads, its
// kv heads' k and v, its slice of gate and of up.
TEST(Phi3WeightTableTest, FusedSlicesAreTheLlamaRanksStacks) {
  const std::string llama_dir = WriteLlama("phi3_src", DType::kBF16, kConfig);
  const std::string phi3_dir = WriteFusedCopy(llama_dir, "phi3_fused");
  auto llama_config = ParseModelConfig(kConfig);
  auto phi3_config = ParseModelConfig(kPhi3Config);
  ASSERT_TRUE(llama_config.ok() && phi3_config.ok());
  auto llama_ckpt = Checkpoint::Open(llama_dir);
  auto phi3_ckpt = Checkpoint::Open(phi3_dir);
  ASSERT_TRUE(llama_ckpt.ok() && phi3_ckpt.ok());
  for (const int tp : {1, 2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE(testing::Message() << "tp " << tp << " rank " << rank);
      auto llama_shard = MakeShardSpec(*llama_config, rank, tp, 0, 1);
      auto phi3_shard = MakeShardSpec(*phi3_config, rank, tp, 0, 1);
      ASSERT_TRUE(llama_shard.ok() && phi3_shard.ok());
      const WeightTable llama = LlamaWeightTable(*llama_config, *llama_shard);
      const WeightTable phi3 = Phi3WeightTable(*phi3_config, *phi3_shard);
      EXPECT_EQ(phi3.size(), llama.size() - 2 * 3);  // 2 layers x 3 fewer.
      EXPECT_EQ(WeightParts(phi3), WeightParts(llama));
      auto read = [](const Checkpoint& ckpt, const WeightTable& table,
                     const std::string& name) {
        for (const WeightSpec& spec : table) {
          if (spec.name != name) continue;
          HostStaging staging;
          auto view = ReadSlice(ckpt, spec, &staging);
          EXPECT_TRUE(view.ok()) << view.status();
          return std::string(static_cast<const char*>(view->data()),
                             view->nbytes());
        }
        ADD_FAILURE() << name << " not in the table";
        return std::string();
      };
      for (int l = 0; l < 2; ++l) {
        const std::string p = absl::StrCat("model.layers.", l, ".");
        EXPECT_EQ(read(**phi3_ckpt, phi3, p + "self_attn.qkv_proj.weight"),
                  read(**llama_ckpt, llama, p + "self_attn.q_proj.weight") +
                      read(**llama_ckpt, llama, p + "self_attn.k_proj.weight") +
                      read(**llama_ckpt, llama, p + "self_attn.v_proj.weight"));
        EXPECT_EQ(read(**phi3_ckpt, phi3, p + "mlp.gate_up_proj.weight"),
                  read(**llama_ckpt, llama, p + "mlp.gate_proj.weight") +
                      read(**llama_ckpt, llama, p + "mlp.up_proj.weight"));
        EXPECT_EQ(read(**phi3_ckpt, phi3, p + "self_attn.o_proj.weight"),
                  read(**llama_ckpt, llama, p + "self_attn.o_proj.weight"));
      }
    }
  }
}

// Phi-3 over fused tensors is the Llama model over the separate ones: the
// same logits, bit for bit, on the CPU.
TEST(Phi3WeightTableTest, Phi3ModelIsLlamaOverFusedTensors) {
  const std::string llama_dir = WriteLlama("phi3_eq_src", DType::kF32, kConfig);
  const std::string phi3_dir = WriteFusedCopy(llama_dir, "phi3_eq_fused");
  CpuOps ops;
  auto a = LoadModel(llama_dir, &ops);
  auto b = LoadModel(phi3_dir, &ops);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->config().arch, Architecture::kPhi3);
  EXPECT_EQ((*a)->weight_bytes(), (*b)->weight_bytes());
  const std::vector<int32_t> tokens = {1, 7, 300, 4000, 12};
  std::vector<float> la(4096), lb(4096);
  SequenceRunner ra(a->get()), rb(b->get());
  auto ca = ra.NewKvCache(8);
  auto cb = rb.NewKvCache(8);
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_TRUE(ra.Forward(tokens, &*ca, la.data()).ok());
  ASSERT_TRUE(rb.Forward(tokens, &*cb, lb.data()).ok());
  EXPECT_EQ(la, lb);
}

// The next-token logits of `tokens` prefilled in one step by the model in
// `dir`, its config.json replaced by `config_json` (a key given twice takes
// its last value).
std::vector<float> PrefillLogits(const std::string& dir,
                                 const std::string& config_json,
                                 const std::vector<int32_t>& tokens) {
  std::ofstream(dir + "/config.json") << config_json;
  CpuOps ops;
  auto model = LoadModel(dir, &ops);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  std::vector<float> logits((*model)->config().vocab_size);
  SequenceRunner runner(model->get());
  auto cache = runner.NewKvCache(static_cast<int64_t>(tokens.size()));
  EXPECT_TRUE(cache.ok()) << cache.status();
  EXPECT_TRUE(runner.Forward(tokens, &*cache, logits.data()).ok());
  return logits;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                double tol) {
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), tol);
}

constexpr char kRopeConfig[] = R"({
  "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 4096, "max_position_embeddings": 16, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": false, ROPE})";

std::string WithRope(const std::string& rope) {
  std::string s = kRopeConfig;
  s.replace(s.find("ROPE"), 4, rope);
  return s;
}

// A model with per-sequence RoPE, end to end (config, tables, the fused
// prologue): a prompt longer than the original context, prefilled in one
// step, equals the same weights under the static RoPE its length implies.
// Dynamic NTK: default RoPE with theta' = theta (factor L / Lmax - (factor -
// 1))^(D / (D - 2)). LongRoPE with short factors 1 and long factors f (and
// attention factor 1): default RoPE within the original context, linear
// scaling by f beyond it.
TEST(LengthScaledRopeTest, AStepEqualsTheStaticRopeOfItsLength) {
  const std::string dir = WriteLlama(
      "rope_e2e", DType::kF32,
      WithRope(R"("rope_theta": 10000.0, "max_position_embeddings": 64)"));
  std::vector<int32_t> tokens(24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 17 * i % 4096;
  const double D = 64, L = 24, Lmax = 16, f = 2.0;
  const double theta = 10000.0 * std::pow(f * L / Lmax - (f - 1), D / (D - 2));
  {
    SCOPED_TRACE("dynamic NTK");
    const std::vector<float> dynamic = PrefillLogits(
        dir,
        WithRope(R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                    "rope_theta": 10000.0})"),
        tokens);
    const std::vector<float> fixed = PrefillLogits(
        dir,
        WithRope(absl::StrCat(R"("rope_theta": )", theta,
                              R"(, "max_position_embeddings": 64)")),
        tokens);
    ExpectNear(dynamic, fixed, 1e-4);
    // Within the original context the table is the plain one.
    const std::vector<int32_t> short_prompt(tokens.begin(),
                                            tokens.begin() + 16);
    ExpectNear(
        PrefillLogits(dir, WithRope(R"("rope_parameters": {
                                "rope_type": "dynamic", "factor": 2.0,
                                "rope_theta": 10000.0})"),
                      short_prompt),
        PrefillLogits(dir, WithRope(R"("rope_theta": 10000.0)"), short_prompt),
        1e-6);
  }
  {
    SCOPED_TRACE("longrope");
    std::string ones = "[1", threes = "[3";
    for (int i = 1; i < 32; ++i) {
      ones += ", 1";
      threes += ", 3";
    }
    ones += "]";
    threes += "]";
    const std::string longrope = WithRope(absl::StrCat(
        R"("rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
            "original_max_position_embeddings": 16, "attention_factor": 1.0,
            "short_factor": )",
        ones, R"(, "long_factor": )", threes,
        R"(}, "max_position_embeddings": 64)"));
    ExpectNear(PrefillLogits(dir, longrope, tokens),
               PrefillLogits(dir, WithRope(R"("rope_parameters": {
                                "rope_type": "linear", "factor": 3.0,
                                "rope_theta": 10000.0},
                                "max_position_embeddings": 64)"),
                             tokens),
               1e-5);
    const std::vector<int32_t> short_prompt(tokens.begin(),
                                            tokens.begin() + 16);
    ExpectNear(
        PrefillLogits(dir, longrope, short_prompt),
        PrefillLogits(dir, WithRope(R"("rope_theta": 10000.0)"), short_prompt),
        1e-6);
  }
}

TEST(ConcatRowsTest, StacksRowsInOrderOnEitherKindOfBackend) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor a = Filled(dtype, {2, 3}, 1), b = Filled(dtype, {1, 3}, 50),
           c = Filled(dtype, {4, 3}, 100);
    std::vector<uint8_t> want;
    for (const Tensor* t : {&a, &b, &c}) {
      const uint8_t* p = static_cast<const uint8_t*>(t->data());
      want.insert(want.end(), p, p + t->nbytes());
    }
    CpuOps cpu;
    OpaqueDevice opaque;
    StackingDevice stacking;
    for (Device* device :
         {static_cast<Device*>(&cpu), static_cast<Device*>(&opaque),
          static_cast<Device*>(&stacking)}) {
      HostStaging staging;
      absl::StatusOr<Tensor> out = ConcatRows(device, {&a, &b, &c}, &staging);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->shape(), Shape({7, 3}));
      EXPECT_EQ(out->dtype(), dtype);
      ASSERT_EQ(out->nbytes(), want.size());
      EXPECT_EQ(std::memcmp(out->data(), want.data(), want.size()), 0);
    }
    EXPECT_EQ(opaque.copies, 3);
    EXPECT_EQ(opaque.uploads, 1);
    EXPECT_EQ(stacking.stacks, 1);
  }
  // Vectors (biases) stack along their length.
  Tensor u = Filled(DType::kF32, {4}, 0), v = Filled(DType::kF32, {2}, 9);
  CpuOps cpu;
  absl::StatusOr<Tensor> bias = ConcatRows(&cpu, {&u, &v});
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(bias->shape(), Shape({6}));
}

TEST(ConcatRowsTest, RefusesPartsThatDoNotStack) {
  CpuOps cpu;
  Tensor a = Filled(DType::kF32, {2, 3}, 0),
         wide = Filled(DType::kF32, {2, 4}, 0);
  Tensor half = Filled(DType::kBF16, {2, 3}, 0);
  EXPECT_EQ(ConcatRows(&cpu, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status st = ConcatRows(&cpu, {&a, &wide}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("[2, 4] does not stack on [2, 3]"),
            std::string::npos)
      << st;
  EXPECT_EQ(ConcatRows(&cpu, {&a, &half}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The model stacks q/k/v and gate/up at bind: the stacked matrices have the
// parts' rows (weight_bytes counts them once), and a weight set with some but
// not all of a stack's biases is refused by name.
TEST(LlamaBindTest, StacksProjectionsAndRefusesPartialBiases) {
  auto config = ParseModelConfig(kConfig);
  ASSERT_TRUE(config.ok());
  const ShardSpec shard = FullModel(*config);
  CpuOps ops;
  ModelContext context;
  context.ops = &ops;
  context.max_step_tokens = 8;
  auto filled = [](WeightTable table) {
    WeightSet set(std::move(table));
    for (size_t i = 0; i < set.size(); ++i) {
      EXPECT_TRUE(
          set.Put(i, *Tensor::Zeros(DType::kF32, set.table()[i].local_shape()))
              .ok());
    }
    return set;
  };
  const WeightTable table = LlamaWeightTable(*config, shard);
  int64_t table_bytes = 0;
  for (const WeightSpec& spec : table)
    table_bytes += SliceBytes(spec, DType::kF32);
  auto model = LlamaModel::Create(*config, shard, filled(table), context);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weight_bytes(), table_bytes);

  WeightTable partial = table;
  partial.push_back(
      RowSplit("model.layers.0.self_attn.k_proj.bias", {128}, 0, 128, 1));
  auto refused = LlamaModel::Create(*config, shard, filled(partial), context);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "some but not all of the biases stacked with "
                "model.layers.0.self_attn.q_proj.bias"),
            std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace tessera
