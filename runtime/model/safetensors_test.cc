#include "runtime/model/safetensors.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/tensor.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

testing::AssertionResult MessageContains(const absl::Status& status,
                                         const std::string& needle) {
  if (std::string(status.message()).find(needle) != std::string::npos) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure()
         << "message of " << status << " lacks \"" << needle << "\"";
}

// A fresh, empty directory under the test's temporary directory.
std::string MakeDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "safetensors_test" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// Writes header JSON text and data bytes in the safetensors layout.
void WriteRaw(const std::string& path, const std::string& header,
              const std::string& data) {
  WriteBytes(path, LengthPrefix(header.size()) + header + data);
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A tiny safetensors writer: tensors laid out back to back, in order.
class Writer {
 public:
  Writer& Add(const std::string& name, const std::string& dtype,
              std::vector<int64_t> shape, const std::string& bytes) {
    header_[name] = {
        {"dtype", dtype},
        {"shape", shape},
        {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_ += bytes;
    return *this;
  }
  Writer& Metadata(const Json& metadata) {
    header_["__metadata__"] = metadata;
    return *this;
  }
  void Write(const std::string& path) const {
    WriteRaw(path, header_.dump(), data_);
  }

 private:
  Json header_ = Json::object();
  std::string data_;
};

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

const std::vector<float> kF32Values = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};
const std::vector<float> kHalfValues = {0.5f, -1.0f, 2.0f, 65504.0f};

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(F32ToBf16(x));
  return out;
}

std::vector<uint16_t> ToF16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(F32ToF16(x));
  return out;
}

Writer ThreeDtypes() {
  Writer w;
  w.Add("a.f32", "F32", {2, 3}, Bytes(kF32Values))
      .Add("b.bf16", "BF16", {4}, Bytes(ToBf16({0.5f, -1.0f, 2.0f, 256.0f})))
      .Add("c.f16", "F16", {2, 2}, Bytes(ToF16(kHalfValues)))
      .Add("d.f64", "F64", {2}, Bytes(std::vector<double>{0.125, -3.0}))
      .Add("e.i32", "I32", {3}, Bytes(std::vector<int32_t>{1, 2, 3}));
  return w;
}

TEST(SafetensorsTest, SingleFileRoundTrip) {
  const std::string dir = MakeDir("single");
  const std::string path = dir + "/model.safetensors";
  ThreeDtypes().Metadata({{"format", "pt"}}).Write(path);

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(
      (*ckpt)->Names(),
      (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.f64", "e.i32"}));
  EXPECT_TRUE((*ckpt)->Has("a.f32"));
  EXPECT_FALSE((*ckpt)->Has("__metadata__"));
  EXPECT_FALSE((*ckpt)->Has("missing"));

  absl::StatusOr<TensorInfo> info = (*ckpt)->Get("c.f16");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "c.f16");
  EXPECT_EQ(info->dtype, DType::kF16);
  EXPECT_EQ(info->shape, (Shape{2, 2}));
  EXPECT_EQ(info->nbytes, 8u);
  EXPECT_EQ(info->file, path);
  ASSERT_NE(info->data, nullptr);

  absl::StatusOr<Tensor> a = (*ckpt)->LoadF32("a.f32", Shape{2, 3});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype(), DType::kF32);
  EXPECT_EQ(a->shape(), (Shape{2, 3}));
  EXPECT_EQ(Values(*a), kF32Values);

  absl::StatusOr<Tensor> b = (*ckpt)->LoadF32("b.bf16", Shape{4});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Values(*b), (std::vector<float>{0.5f, -1.0f, 2.0f, 256.0f}));

  absl::StatusOr<Tensor> c = (*ckpt)->LoadF32("c.f16", Shape{2, 2});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Values(*c), kHalfValues);

  absl::StatusOr<Tensor> d = (*ckpt)->LoadF32("d.f64", Shape{2});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Values(*d), (std::vector<float>{0.125f, -3.0f}));
}

TEST(SafetensorsTest, OpenDirectoryFindsModelSafetensors) {
  const std::string dir = MakeDir("dir_single");
  ThreeDtypes().Write(dir + "/model.safetensors");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names().size(), 5u);
}

TEST(SafetensorsTest, MisalignedAndEmptyTensors) {
  const std::string dir = MakeDir("misaligned");
  const std::string path = dir + "/x.safetensors";
  Writer()
      .Add("byte", "U8", {1}, std::string(1, '\x07'))
      .Add("odd", "F32", {3}, Bytes(std::vector<float>{1.5f, 2.5f, -3.5f}))
      .Add("empty", "F32", {0, 4}, "")
      .Write(path);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<Tensor> odd = (*ckpt)->LoadF32("odd", Shape{3});
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(Values(*odd), (std::vector<float>{1.5f, 2.5f, -3.5f}));
  absl::StatusOr<Tensor> empty = (*ckpt)->LoadF32("empty", Shape{0, 4});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel(), 0);
}

TEST(SafetensorsTest, GetMissingTensorIsNotFound) {
  const std::string dir = MakeDir("get_missing");
  ThreeDtypes().Write(dir + "/model.safetensors");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<TensorInfo> info = (*ckpt)->Get("lm_head.weight");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(info.status(), "lm_head.weight"));
  absl::StatusOr<Tensor> t = (*ckpt)->LoadF32("lm_head.weight", Shape{1});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
}

void WriteIndex(const std::string& dir, const Json& weight_map) {
  const Json index = {{"metadata", {{"total_size", 64}}},
                      {"weight_map", weight_map}};
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
}

TEST(SafetensorsTest, ShardedIndex) {
  const std::string dir = MakeDir("sharded");
  Writer()
      .Add("model.embed_tokens.weight", "F32", {2, 3}, Bytes(kF32Values))
      .Add("model.norm.weight", "BF16", {4},
           Bytes(ToBf16({1.0f, 2.0f, 3.0f, 4.0f})))
      .Write(dir + "/model-00001-of-00002.safetensors");
  Writer()
      .Add("lm_head.weight", "F16", {4}, Bytes(ToF16(kHalfValues)))
      .Write(dir + "/model-00002-of-00002.safetensors");
  // A stray file that the index does not name is ignored.
  WriteBytes(dir + "/stray.safetensors", "garbage");
  WriteIndex(dir,
             {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
              {"model.norm.weight", "model-00001-of-00002.safetensors"},
              {"lm_head.weight", "model-00002-of-00002.safetensors"}});

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), (std::vector<std::string>{
                                  "lm_head.weight", "model.embed_tokens.weight",
                                  "model.norm.weight"}));
  absl::StatusOr<TensorInfo> info = (*ckpt)->Get("lm_head.weight");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->file, dir + "/model-00002-of-00002.safetensors");

  absl::StatusOr<Tensor> embed =
      (*ckpt)->LoadF32("model.embed_tokens.weight", Shape{2, 3});
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_EQ(Values(*embed), kF32Values);
  absl::StatusOr<Tensor> head = (*ckpt)->LoadF32("lm_head.weight", Shape{4});
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(Values(*head), kHalfValues);
  absl::StatusOr<Tensor> norm = (*ckpt)->LoadF32("model.norm.weight", Shape{4});
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_EQ(Values(*norm), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
}

TEST(SafetensorsTest, UnindexedFilesAreOpenedInOrder) {
  const std::string dir = MakeDir("glob");
  Writer()
      .Add("b", "F32", {1}, Bytes(std::vector<float>{2.0f}))
      .Write(dir + "/b.safetensors");
  Writer()
      .Add("a", "F32", {1}, Bytes(std::vector<float>{1.0f}))
      .Write(dir + "/a.safetensors");
  WriteBytes(dir + "/README.md", "not weights");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*ckpt)->Get("a")->file, dir + "/a.safetensors");
}

TEST(SafetensorsTest, DuplicateTensorAcrossFiles) {
  const std::string dir = MakeDir("duplicate");
  Writer()
      .Add("w", "F32", {1}, Bytes(std::vector<float>{2.0f}))
      .Write(dir + "/a.safetensors");
  Writer()
      .Add("w", "F32", {1}, Bytes(std::vector<float>{1.0f}))
      .Write(dir + "/b.safetensors");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ckpt.status(), "\"w\""));
}

// ---- Missing things ---------------------------------------------------------

TEST(SafetensorsTest, MissingDirectory) {
  const std::string dir = MakeDir("missing_dir") + "/nope";
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(ckpt.status(), dir));
}

TEST(SafetensorsTest, DirectoryWithoutWeights) {
  const std::string dir = MakeDir("no_weights");
  WriteBytes(dir + "/config.json", "{}");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      MessageContains(ckpt.status(), "no .safetensors files in " + dir));
}

TEST(SafetensorsTest, MissingFile) {
  const std::string path = MakeDir("missing_file") + "/model.safetensors";
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(ckpt.status(), path));
}

TEST(SafetensorsTest, IndexNamesMissingShard) {
  const std::string dir = MakeDir("missing_shard");
  Writer()
      .Add("a", "F32", {1}, Bytes(std::vector<float>{1.0f}))
      .Write(dir + "/model-00001-of-00002.safetensors");
  WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00002-of-00002.safetensors"}});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      MessageContains(ckpt.status(), "model-00002-of-00002.safetensors"));
}

TEST(SafetensorsTest, IndexNamesTensorAbsentFromShard) {
  const std::string dir = MakeDir("absent_tensor");
  Writer()
      .Add("a", "F32", {1}, Bytes(std::vector<float>{1.0f}))
      .Write(dir + "/model-00001-of-00002.safetensors");
  Writer()
      .Add("b", "F32", {1}, Bytes(std::vector<float>{1.0f}))
      .Write(dir + "/model-00002-of-00002.safetensors");
  // "b" lives in shard 2, but the index says shard 1.
  WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00001-of-00002.safetensors"}});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ckpt.status(), "\"b\""));
  EXPECT_TRUE(
      MessageContains(ckpt.status(), "model-00001-of-00002.safetensors"));
}

TEST(SafetensorsTest, MalformedIndex) {
  const std::string dir = MakeDir("bad_index");
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": [";
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ckpt.status(), "model.safetensors.index.json"));

  std::ofstream(dir + "/model.safetensors.index.json") << "{\"metadata\": {}}";
  ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ckpt.status(), "weight_map"));

  WriteIndex(dir, {{"a", "../elsewhere.safetensors"}});
  ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Corrupt files ----------------------------------------------------------

// Writes `bytes` as a file, opens it, and expects InvalidArgument naming the
// file and containing `needle`.
void ExpectInvalid(const std::string& name, const std::string& bytes,
                   const std::string& needle) {
  const std::string path = MakeDir(name) + "/model.safetensors";
  WriteBytes(path, bytes);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument)
      << ckpt.status();
  EXPECT_TRUE(MessageContains(ckpt.status(), path));
  EXPECT_TRUE(MessageContains(ckpt.status(), needle));
}

std::string File(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

TEST(SafetensorsTest, FileShorterThanEightBytes) {
  ExpectInvalid("short0", "", "too short");
  ExpectInvalid("short5", std::string("\x05\x00\x00\x00\x00", 5), "too short");
}

TEST(SafetensorsTest, HeaderLengthBeyondEndOfFile) {
  ExpectInvalid("beyond_eof", LengthPrefix(1000) + "{}", "header length 1000");
  ExpectInvalid("huge_len", LengthPrefix(~uint64_t{0}) + "{}", "header length");
}

TEST(SafetensorsTest, HeaderLongerThanLimit) {
  // A sparse file: the length is checked before anything is read.
  const std::string path = MakeDir("header_limit") + "/model.safetensors";
  WriteBytes(path, LengthPrefix(100'000'001));
  std::filesystem::resize_file(path, 100'000'001 + 8);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ckpt.status(), "limit"));
}

TEST(SafetensorsTest, InvalidJson) {
  ExpectInvalid("bad_json", File("{\"a\": {", ""), "malformed JSON");
  ExpectInvalid("not_object", File("[1, 2]", ""), "not a JSON object");
}

TEST(SafetensorsTest, UnknownDtype) {
  ExpectInvalid(
      "bad_dtype",
      File(R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})",
           std::string(1, '\0')),
      "\"w\"");
  ExpectInvalid(
      "bad_dtype2",
      File(R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})",
           std::string(1, '\0')),
      "F4");
}

TEST(SafetensorsTest, NegativeDimension) {
  ExpectInvalid(
      "negative_dim",
      File(
          R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})",
          std::string(8, '\0')),
      "invalid dimension -1");
  ExpectInvalid(
      "float_dim",
      File(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})",
           std::string(4, '\0')),
      "invalid dimension");
}

TEST(SafetensorsTest, OffsetsOutOfRange) {
  // Data region of 8 bytes; the tensor claims [8, 16).
  ExpectInvalid(
      "offsets_range",
      File(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
           std::string(8, '\0')),
      "outside the data region");
  // begin > end.
  ExpectInvalid(
      "offsets_reversed",
      File(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})",
           std::string(16, '\0')),
      "data_offsets");
  ExpectInvalid(
      "offsets_missing",
      File(R"({"w": {"dtype": "F32", "shape": [2]}})", std::string(8, '\0')),
      "data_offsets");
}

TEST(SafetensorsTest, TruncatedDataRegion) {
  // A valid header whose data was cut short.
  ExpectInvalid(
      "truncated_data",
      File(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
           std::string(10, '\0')),
      "\"w\"");
}

TEST(SafetensorsTest, ByteLengthMismatch) {
  ExpectInvalid(
      "length_mismatch",
      File(
          R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})",
          std::string(16, '\0')),
      "needs 12");
}

TEST(SafetensorsTest, OverlappingTensors) {
  ExpectInvalid(
      "overlap",
      File(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
           R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
           std::string(12, '\0')),
      "overlap");
}

// A header padded with spaces to a multiple of 8, as the reference writer
// does, whose length field is then off by `delta`.
std::string PaddedFileWithLengthOff(int delta) {
  std::string header =
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
      R"( "b": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}})";
  header.append(8 - header.size() % 8 + 3, ' ');  // At least 4 spaces.
  const std::string data = Bytes(std::vector<float>{1.0f, 2.0f}) + "xyz";
  return LengthPrefix(header.size() + delta) + header + data;
}

TEST(SafetensorsTest, SpacePaddedHeaderLoads) {
  const std::string path = MakeDir("padded") + "/model.safetensors";
  WriteBytes(path, PaddedFileWithLengthOff(0));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<Tensor> a = (*ckpt)->LoadF32("a", Shape{2});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(Values(*a), (std::vector<float>{1.0f, 2.0f}));
}

// Before: a length field 1-3 bytes short cut only padding, the JSON still
// parsed and every tensor was read shifted (garbage output, exit 0).
TEST(SafetensorsTest, HeaderLengthAFewBytesShortIsRefused) {
  for (int delta : {-1, -2, -3}) {
    ExpectInvalid(absl::StrCat("short_len", -delta),
                  PaddedFileWithLengthOff(delta), "cover");
  }
  // Shorter than the padding: the JSON object itself is cut.
  ExpectInvalid("short_len_cut", PaddedFileWithLengthOff(-40),
                "malformed JSON (or a wrong header length field)");
}

TEST(SafetensorsTest, HeaderLengthAFewBytesLongIsRefused) {
  for (int delta : {1, 2, 3}) {
    ExpectInvalid(absl::StrCat("long_len", delta),
                  PaddedFileWithLengthOff(delta), "JSON object");
  }
}

TEST(SafetensorsTest, HeaderMustStartWithTheObject) {
  ExpectInvalid("leading_space",
                File(R"( {"w": {"dtype": "U8", "shape": [1], )"
                     R"("data_offsets": [0, 1]}})",
                     "x"),
                "does not hold exactly one JSON object");
  ExpectInvalid("trailing_newline",
                File(R"({"w": {"dtype": "U8", "shape": [1], )"
                     R"("data_offsets": [0, 1]}})"
                     "\n",
                     "x"),
                "does not hold exactly one JSON object");
}

TEST(SafetensorsTest, TensorsMustCoverTheDataRegionExactly) {
  // A gap at the start.
  ExpectInvalid(
      "gap_start",
      File(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})",
           "xyz"),
      "bytes [0, 1) of the data region belong to no tensor");
  // A gap between two tensors.
  ExpectInvalid(
      "gap_middle",
      File(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
           R"( "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]}})",
           "xyz"),
      "bytes [1, 2)");
  // Bytes after the last tensor.
  ExpectInvalid(
      "trailing_data",
      File(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})",
           "xyz"),
      "the tensors cover 2 bytes of the data region of 3 bytes");
  // No tensors, but data.
  ExpectInvalid("no_tensors_with_data", File("{}", "x"),
                "cover 0 bytes of the data region of 1 bytes");
  // An empty tensor inside another one's bytes.
  ExpectInvalid(
      "empty_inside",
      File(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
           R"( "e": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})",
           "wxyz"),
      "overlap");
}

TEST(SafetensorsTest, FifoIsRefusedNotWaitedOn) {
  const std::string dir = MakeDir("fifo");
  const std::string path = dir + "/model.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument)
      << ckpt.status();
  EXPECT_TRUE(MessageContains(ckpt.status(), path + " is a FIFO"));
}

// ---- LoadF32 ----------------------------------------------------------------

TEST(SafetensorsTest, LoadF32ShapeMismatch) {
  const std::string dir = MakeDir("shape_mismatch");
  ThreeDtypes().Write(dir + "/model.safetensors");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<Tensor> t = (*ckpt)->LoadF32("a.f32", Shape{3, 2});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "tensor a.f32: expected shape [3, 2], found [2, 3]");
}

TEST(SafetensorsTest, LoadF32NonFloat) {
  const std::string dir = MakeDir("non_float");
  ThreeDtypes().Write(dir + "/model.safetensors");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<Tensor> t = (*ckpt)->LoadF32("e.i32", Shape{3});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(t.status(), "e.i32"));
  EXPECT_TRUE(MessageContains(t.status(), "i32"));
}

}  // namespace
}  // namespace tessera
