// The public ops of class Ops run the shared checks once, before the
// backend's Do*, which never sees arguments the checks refuse; the messages
// list what the backend takes.
#include "kernels/ops.h"

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/op_checks.h"
#include "kernels/testing/step_arrays.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr DType kWeights[] = {DType::kF32, DType::kBF16};
constexpr DType kCache[] = {DType::kF32, DType::kI8, DType::kF8E4M3};

// Records which Do* ran; computes nothing. `host`: its memory is host
// memory (the step arrays' values are checked), as on the CPU backend.
class RecordingOps final : public Ops {
 public:
  explicit RecordingOps(
      bool host = true,
      int32_t max_top_logprobs = std::numeric_limits<int32_t>::max())
      : Ops(OpSupport{kWeights, kCache, max_top_logprobs}), host_(host) {}

  bool host_memory() const override { return host_; }
  absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t bytes) override {
    return NewHostUploadBuffer(bytes);
  }

  absl::StatusOr<Tensor> Upload(const TensorView&, DType) override {
    return absl::UnimplementedError("no upload");
  }
  absl::Status CopyToHost(const TensorView&, void*) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<OpTimer>> NewOpTimer() override {
    return std::make_unique<WallClockOpTimer>();
  }

  std::vector<std::string> calls;

 protected:
  absl::Status Record(const char* op) {
    calls.push_back(op);
    return absl::OkStatus();
  }
  absl::Status DoEmbedding(const TensorView&, const TensorView&,
                           const TensorView&) override {
    return Record("Embedding");
  }
  absl::Status DoEmbeddingShard(const TensorView&, const TensorView&, int64_t,
                                const TensorView&) override {
    return Record("EmbeddingShard");
  }
  absl::Status DoGatherRows(const TensorView&, const TensorView&,
                            const TensorView&) override {
    return Record("GatherRows");
  }
  absl::Status DoConcatShards(const TensorView&, int64_t,
                              const TensorView&) override {
    return Record("ConcatShards");
  }
  absl::Status DoRmsNorm(const TensorView&, const TensorView&, float,
                         const TensorView&) override {
    return Record("RmsNorm");
  }
  absl::Status DoAdd(const TensorView&, const TensorView&,
                     const TensorView&) override {
    return Record("Add");
  }
  absl::Status DoLinear(const TensorView&, const WeightView&, const TensorView*,
                        const TensorView&) override {
    return Record("Linear");
  }
  absl::Status DoRope(const TensorView&, const TensorView&,
                      const TensorView&) override {
    return Record("Rope");
  }
  absl::Status DoBiasAdd(const TensorView&, const TensorView&) override {
    return Record("BiasAdd");
  }
  absl::Status DoScale(const TensorView&, float) override {
    return Record("Scale");
  }
  absl::Status DoSoftcap(const TensorView&, float) override {
    return Record("Softcap");
  }
  absl::Status DoSiluMul(const TensorView&, const TensorView&,
                         const TensorView&) override {
    return Record("SiluMul");
  }
  absl::Status DoStoreKvCache(const TensorView&, const TensorView&,
                              const TensorView&, const KvCacheLayer&) override {
    return Record("StoreKvCache");
  }
  absl::Status DoGatedActivation(GatedActivationKind, const TensorView&,
                                 const TensorView&) override {
    return Record("GatedActivation");
  }
  absl::Status DoQkvRopeStore(const QkvRopeStoreArgs&) override {
    return Record("QkvRopeStore");
  }
  absl::Status DoPrefillAttention(const PagedAttentionArgs&) override {
    return Record("PrefillAttention");
  }
  absl::Status DoDecodeAttention(const PagedAttentionArgs&) override {
    return Record("DecodeAttention");
  }
  absl::Status DoStaticAttention(const PagedAttentionArgs&) override {
    return Record("StaticAttention");
  }
  absl::Status DoSample(const TensorView&, absl::Span<const SampleRow>,
                        std::vector<SampleResult>*) override {
    return Record("Sample");
  }

 private:
  bool host_;
};

Tensor F32(Shape shape) {
  return *Tensor::Zeros(DType::kF32, std::move(shape));
}

void ExpectInvalid(const absl::Status& st, absl::string_view needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), needle)) << st;
}

TEST(OpsTest, ChecksRunBeforeTheBackendAndOnlyValidCallsReachIt) {
  RecordingOps ops;
  Tensor x = F32({2, 4}), w = F32({3, 4}), out = F32({2, 3});
  // A Tensor and a TensorView both pass as a weight.
  EXPECT_TRUE(ops.Linear(x.view(), w, nullptr, out.view()).ok());
  EXPECT_TRUE(ops.Linear(x.view(), w.view(), nullptr, out.view()).ok());
  Tensor wrong = F32({3, 5});
  ExpectInvalid(ops.Linear(x.view(), wrong, nullptr, out.view()), "Linear");
  Tensor bias = F32({4});
  const TensorView bias_view = bias.view();
  ExpectInvalid(ops.Linear(x.view(), w, &bias_view, out.view()),
                "bias must be [N]");

  Tensor a = F32({2, 4}), b = F32({2, 5});
  EXPECT_TRUE(ops.Add(a.view(), a.view(), a.view()).ok());
  ExpectInvalid(ops.Add(a.view(), b.view(), a.view()), "Add");

  Tensor table = F32({10, 4}), emb = F32({2, 4});
  const std::vector<int32_t> ids = {1, 9}, bad_ids = {1, 10};
  EXPECT_TRUE(ops.Embedding(table.view(), StepArray(ids), emb.view()).ok());
  ExpectInvalid(ops.Embedding(table.view(), StepArray(bad_ids), emb.view()),
                "token id 10 is outside the vocabulary [0, 10)");
  // The sharded form takes ids past its rows (another rank has them).
  EXPECT_TRUE(
      ops.EmbeddingShard(table.view(), StepArray(bad_ids), 0, emb.view()).ok());
  ExpectInvalid(
      ops.EmbeddingShard(table.view(), StepArray(std::vector<int32_t>{-1, 2}),
                         0, emb.view()),
      "EmbeddingShard: negative token id -1");

  EXPECT_EQ(ops.calls,
            (std::vector<std::string>{"Linear", "Linear", "Add", "Embedding",
                                      "EmbeddingShard"}));
}

TEST(OpsTest, AddRmsNormRefusesOutAliasingResidualAndRunsAddThenNorm) {
  RecordingOps ops;
  Tensor residual = F32({2, 4}), x = F32({2, 4}), w = F32({4});
  ExpectInvalid(ops.AddRmsNorm(residual.view(), x.view(), w.view(), 1e-5f,
                               residual.view()),
                "aliases residual");
  EXPECT_TRUE(ops.calls.empty());
  // out may alias x; the default fused op is DoAdd, then DoRmsNorm.
  EXPECT_TRUE(
      ops.AddRmsNorm(residual.view(), x.view(), w.view(), 1e-5f, x.view())
          .ok());
  EXPECT_EQ(ops.calls, (std::vector<std::string>{"Add", "RmsNorm"}));
}

TEST(OpsTest, GatedLinearChecksBothOpsAndRunsThemInSequenceByDefault) {
  RecordingOps ops;
  Tensor gate_up = F32({3, 8}), out = F32({3, 4}), odd = F32({3, 5});
  // GatedLinear: Linear's and GatedActivation's checks, no overlap with x,
  // and by default the two ops in sequence.
  Tensor x = F32({3, 6}), w = F32({8, 6});
  EXPECT_TRUE(ops.GatedLinear(GatedActivationKind::kSilu, x.view(), w.view(),
                              nullptr, gate_up.view(), out.view())
                  .ok());
  EXPECT_EQ(ops.calls, (std::vector<std::string>{"Linear", "GatedActivation"}));
  ops.calls.clear();
  ExpectInvalid(ops.GatedLinear(GatedActivationKind::kSilu, x.view(), w.view(),
                                nullptr, gate_up.view(), odd.view()),
                "gate_up [T, 2I] and out [T, I] disagree");
  const TensorView out_on_x(x.data(), DType::kF32, {3, 4});
  ExpectInvalid(ops.GatedLinear(GatedActivationKind::kSilu, x.view(), w.view(),
                                nullptr, gate_up.view(), out_on_x),
                "overlaps x");
  Tensor w_wide = F32({10, 6});
  ExpectInvalid(
      ops.GatedLinear(GatedActivationKind::kSilu, x.view(), w_wide.view(),
                      nullptr, gate_up.view(), out.view()),
      "Linear");
  EXPECT_TRUE(ops.calls.empty());
}

TEST(OpsTest, FusedOpsCheckShapesAndOverlapBeforeTheBackend) {
  RecordingOps ops;
  Tensor gate_up = F32({3, 8}), out = F32({3, 4}), odd = F32({3, 5});
  EXPECT_TRUE(ops.GatedActivation(GatedActivationKind::kSilu, gate_up.view(),
                                  out.view())
                  .ok());
  ExpectInvalid(ops.GatedActivation(GatedActivationKind::kSilu, gate_up.view(),
                                    odd.view()),
                "gate_up [T, 2I] and out [T, I] disagree");
  const TensorView in_place(gate_up.data(), DType::kF32, {3, 4});
  ExpectInvalid(
      ops.GatedActivation(GatedActivationKind::kSilu, gate_up.view(), in_place),
      "out overlaps gate_up");

  // H = 2, Hkv = 1, D = 4: qkv rows of (2 + 2) * 4.
  Tensor qkv = F32({2, 16}), q = F32({2, 2, 4}), freq = F32({2});
  Tensor kc = F32({8, 1, 4}), vc = F32({8, 1, 4}), norm = F32({4});
  const std::vector<int32_t> positions = {0, 1};
  const std::vector<int64_t> slots = {3, -1};
  const TensorView norm_view = norm.view();
  QkvRopeStoreArgs args;
  args.qkv = qkv.view();
  args.q_norm = &norm_view;
  args.k_norm = &norm_view;
  args.positions = StepArray(positions);
  args.inv_freq = freq.view();
  args.slot_mapping = StepArray(slots);
  args.cache = {kc.view(), vc.view()};
  args.q_out = q.view();
  EXPECT_TRUE(ops.QkvRopeStore(args).ok());
  QkvRopeStoreArgs bad = args;
  Tensor q3 = F32({2, 3, 4});
  bad.q_out = q3.view();
  ExpectInvalid(ops.QkvRopeStore(bad), "qkv must be [T, (H + 2 Hkv) * D]");
  bad = args;
  bad.q_out = TensorView(qkv.data(), DType::kF32, {2, 2, 4});
  ExpectInvalid(ops.QkvRopeStore(bad), "q_out overlaps qkv");
  bad = args;
  Tensor norm8 = F32({8});
  const TensorView norm8_view = norm8.view();
  bad.k_norm = &norm8_view;
  ExpectInvalid(ops.QkvRopeStore(bad), "a q/k norm weight must be [D]");
  bad = args;
  Tensor vc8 = F32({8, 1, 8});
  bad.cache = {kc.view(), vc8.view()};
  ExpectInvalid(ops.QkvRopeStore(bad), "k and v head dims must be one even D");
  bad = args;
  const std::vector<int64_t> far = {3, 8};
  bad.slot_mapping = StepArray(far);
  ExpectInvalid(ops.QkvRopeStore(bad), "slot 8 of token 1");
  EXPECT_EQ(ops.calls,
            (std::vector<std::string>{"GatedActivation", "QkvRopeStore"}));
}

TEST(OpsTest, MessagesListTheBackendsDTypes) {
  RecordingOps ops;
  Tensor x = F32({2, 4}), out = F32({2, 3});
  Tensor w16 = *Tensor::Zeros(DType::kF16, {3, 4});
  ExpectInvalid(ops.Linear(x.view(), w16, nullptr, out.view()),
                "Linear: weight must be f32 or bf16, got f16");
  Tensor table16 = *Tensor::Zeros(DType::kF16, {10, 4}), emb = F32({1, 4});
  ExpectInvalid(ops.Embedding(table16.view(),
                              StepArray(std::vector<int32_t>{1}), emb.view()),
                "Embedding: table must be f32 or bf16, got f16");
  Tensor kc = *Tensor::Zeros(DType::kBF16, {8, 1, 4});
  Tensor k = F32({1, 1, 4});
  ExpectInvalid(
      ops.StoreKvCache(k.view(), k.view(), StepArray(std::vector<int64_t>{0}),
                       {kc.view(), kc.view()}),
      "StoreKvCache: cache k and v must both be f32, both int8 or both fp8, "
      "got bf16 and bf16");
  EXPECT_TRUE(ops.calls.empty());
  EXPECT_EQ(DTypeList({DType::kF32}), "f32");
  EXPECT_EQ(DTypeList({DType::kF32, DType::kBF16, DType::kI8}),
            "f32, bf16 or i8");
}

// int8 caches take f32 [S, kv_heads] scales, fp8 caches f32 [kv_heads] (the
// layer's per-head scales); an f32 cache takes none.
TEST(OpsTest, CacheScalesFitTheCacheDType) {
  RecordingOps ops;
  Tensor k = F32({1, 2, 4});
  const std::vector<int64_t> slot_ids = {3};
  const TensorView slots = StepArray(slot_ids);
  Tensor k8 = *Tensor::Zeros(DType::kF8E4M3, {8, 2, 4});
  Tensor v8 = *Tensor::Zeros(DType::kF8E4M3, {8, 2, 4});
  Tensor heads = F32({2}), heads2 = F32({2}), per_slot = F32({8, 2});
  KvCacheLayer fp8{k8.view(), v8.view(), heads.view(), heads2.view()};
  EXPECT_TRUE(fp8.quantized());
  EXPECT_FALSE(fp8.per_slot_scales());
  EXPECT_TRUE(ops.StoreKvCache(k.view(), k.view(), slots, fp8).ok());
  KvCacheLayer bad = fp8;
  bad.v_scale = per_slot.view();
  ExpectInvalid(ops.StoreKvCache(k.view(), k.view(), slots, bad),
                "fp8 cache scales must be [kv_heads]");
  bad = fp8;
  bad.k_scale = TensorView();
  ExpectInvalid(ops.StoreKvCache(k.view(), k.view(), slots, bad),
                "an fp8 cache needs k_scale and v_scale");
  Tensor bf16_heads = *Tensor::Zeros(DType::kBF16, {2});
  bad = fp8;
  bad.k_scale = bf16_heads.view();
  ExpectInvalid(ops.StoreKvCache(k.view(), k.view(), slots, bad), "k_scale");
  // int8 keeps its per-slot scales.
  Tensor k_i8 = *Tensor::Zeros(DType::kI8, {8, 2, 4});
  Tensor per_slot2 = F32({8, 2});
  KvCacheLayer i8{k_i8.view(), k_i8.view(), per_slot.view(), per_slot2.view()};
  EXPECT_TRUE(i8.per_slot_scales());
  EXPECT_TRUE(ops.StoreKvCache(k.view(), k.view(), slots, i8).ok());
  bad = i8;
  bad.k_scale = heads.view();
  ExpectInvalid(ops.StoreKvCache(k.view(), k.view(), slots, bad),
                "int8 cache scales must be [S, kv_heads]");
  // f32: no scales at all.
  Tensor kf = F32({8, 2, 4});
  KvCacheLayer f32{kf.view(), kf.view(), heads.view(), heads2.view()};
  ExpectInvalid(ops.StoreKvCache(k.view(), k.view(), slots, f32),
                "an f32 cache takes no k_scale / v_scale");
  EXPECT_EQ(ops.calls,
            (std::vector<std::string>{"StoreKvCache", "StoreKvCache"}));
}

TEST(OpsTest, AWeightScaleGoesWithFp8DataAndFitsItsShape) {
  RecordingOps ops;
  Tensor x = F32({2, 4}), w = F32({3, 4}), out = F32({2, 3});
  Tensor scale = F32({3});
  WeightView scaled = w;
  EXPECT_FALSE(scaled.has_scale());
  EXPECT_EQ(scaled.dtype(), DType::kF32);
  scaled.scale_kind = WeightScaleKind::kPerChannel;
  scaled.scale = scale.view();
  EXPECT_TRUE(scaled.has_scale());
  // An f32 weight takes no scale (whatever the backend's dtypes).
  EXPECT_THAT(CheckWeightScale("Linear", scaled).message(),
              HasSubstr("f32 weights take no scale"));
  // fp8 data: a scale is required and must fit the weight's shape.
  Tensor fp8 = *Tensor::Empty(DType::kF8E4M3, Shape({3, 4}));
  WeightView q = fp8;
  EXPECT_THAT(CheckWeightScale("Linear", q).message(),
              HasSubstr("f8_e4m3 weights need a scale"));
  q.scale_kind = WeightScaleKind::kPerChannel;
  q.scale = scale.view();
  EXPECT_TRUE(CheckWeightScale("Linear", q).ok());
  Tensor wrong = F32({4});
  q.scale = wrong.view();
  EXPECT_THAT(CheckWeightScale("Linear", q).message(),
              HasSubstr("does not fit the weight"));
  Tensor blocks = F32({1, 1});
  q.scale_kind = WeightScaleKind::kBlock;
  q.block = 128;
  q.scale = blocks.view();
  EXPECT_TRUE(CheckWeightScale("Linear", q).ok());
  q.activations = ActivationScaleKind::kStatic;
  EXPECT_FALSE(CheckWeightScale("Linear", q).ok());  // No input scale.
  // This backend's weights are f32 only: fp8 is refused naming the dtypes.
  ExpectInvalid(ops.Linear(x.view(), q, nullptr, out.view()), "f8_e4m3");
  EXPECT_TRUE(ops.calls.empty());
}

TEST(OpsTest, ScaleAndSoftcapCheckTheirFactorsBeforeTheBackend) {
  RecordingOps ops;
  Tensor x = F32({3, 5});
  EXPECT_TRUE(ops.Scale(x.view(), 8.0f).ok());
  EXPECT_TRUE(ops.Softcap(x.view(), 30.0f).ok());
  ExpectInvalid(ops.Scale(x.view(), std::numeric_limits<float>::infinity()),
                "Scale: factor must be finite");
  for (const float bad : {0.0f, -2.0f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    ExpectInvalid(ops.Softcap(x.view(), bad),
                  "Softcap: cap must be positive and finite");
  }
  Tensor ids = *Tensor::Zeros(DType::kI32, {3});
  ExpectInvalid(ops.Scale(ids.view(), 2.0f), "Scale: x must be f32");
  EXPECT_EQ(ops.calls, (std::vector<std::string>{"Scale", "Softcap"}));
}

TEST(OpsTest, AttentionChecksTheStepBeforeTheBackend) {
  RecordingOps ops;
  // One sequence of two new tokens after a context of one, block size 4,
  // checked against the two blocks of a cache of 8 slots.
  const std::vector<int32_t> table = {1};
  auto h = BuildAttentionMetadata({{1, 2, table}}, 4, 2);
  ASSERT_TRUE(h.ok()) << h.status();
  const AttentionMetadata m = h->View();
  EXPECT_EQ(m.num_blocks, 2);
  Tensor q = F32({2, 2, 4}), o = F32({2, 2, 4});
  Tensor kc = F32({8, 1, 4}), vc = F32({8, 1, 4});
  PagedAttentionArgs args;
  args.q = q.view();
  args.out = o.view();
  args.cache = {kc.view(), vc.view()};
  args.metadata = &m;
  args.first_seq = 0;
  args.end_seq = 1;
  EXPECT_TRUE(ops.PrefillAttention(args).ok());
  // No leading decodes: the host scalars refuse it.
  ExpectInvalid(ops.DecodeAttention(args),
                "DecodeAttention: sequences [0, 1) go beyond the 0 leading "
                "decodes");
  // Arrays that do not match the scalars.
  AttentionMetadata short_tables = m;
  short_tables.block_tables =
      TensorView(h->block_tables.data(), DType::kI32, {1});
  args.metadata = &short_tables;
  ExpectInvalid(ops.PrefillAttention(args), "malformed metadata");
  // Metadata whose values nobody checked (its block ids may be anything).
  AttentionMetadata unchecked = m;
  unchecked.num_blocks = 0;
  args.metadata = &unchecked;
  ExpectInvalid(ops.PrefillAttention(args), "were not checked");
  // Checked against a pool larger than this cache: 3 blocks of 4 > 8 slots.
  auto wide = BuildAttentionMetadata({{1, 2, table}}, 4, 3);
  ASSERT_TRUE(wide.ok()) << wide.status();
  const AttentionMetadata wide_view = wide->View();
  args.metadata = &wide_view;
  ExpectInvalid(ops.PrefillAttention(args), "outside the cache of 8 slots");
  args.metadata = &m;
  PagedAttentionArgs aliased = args;
  aliased.out = args.q;
  ExpectInvalid(ops.PrefillAttention(aliased), "out must not alias q");
  // A block outside the pool is refused once, when the step is packed.
  const std::vector<int32_t> outside = {2};
  EXPECT_EQ(BuildAttentionMetadata({{1, 2, outside}}, 4, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Static: three positions do not fit a static block of 2.
  const std::vector<int32_t> two = {0, 1};
  auto paged2 = BuildAttentionMetadata({{1, 2, two}}, 2, 4);
  ASSERT_TRUE(paged2.ok()) << paged2.status();
  const AttentionMetadata paged2_view = paged2->View();
  args.metadata = &paged2_view;
  ExpectInvalid(ops.StaticAttention(args),
                "does not fit its static block of 2");
  // A soft cap is 0 (none) or positive and finite.
  args.metadata = &m;
  for (const float bad : {-1.0f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    PagedAttentionArgs capped = args;
    capped.softcap = bad;
    ExpectInvalid(ops.PrefillAttention(capped), "softcap must be 0 (none)");
  }
  EXPECT_EQ(ops.calls, (std::vector<std::string>{"PrefillAttention"}));
  PagedAttentionArgs capped = args;
  capped.softcap = 50.0f;
  EXPECT_TRUE(ops.PrefillAttention(capped).ok());

  // The checks read no array: a device backend gets the same answers.
  RecordingOps device(/*host=*/false);
  args.metadata = &m;
  EXPECT_TRUE(device.PrefillAttention(args).ok());
  args.metadata = &unchecked;
  ExpectInvalid(device.PrefillAttention(args), "were not checked");
  EXPECT_EQ(device.calls, (std::vector<std::string>{"PrefillAttention"}));
}

// Step arrays: dtype and shape on every backend, values only where they are
// host memory.
TEST(OpsTest, StepArraysAreCheckedForShapeEverywhereForValuesOnTheHost) {
  RecordingOps host, device(/*host=*/false);
  Tensor table = F32({10, 4}), emb = F32({2, 4});
  const std::vector<int32_t> bad_ids = {1, 10};
  ExpectInvalid(host.Embedding(table.view(), StepArray(bad_ids), emb.view()),
                "outside the vocabulary");
  EXPECT_TRUE(
      device.Embedding(table.view(), StepArray(bad_ids), emb.view()).ok());
  const std::vector<int64_t> wide = {1, 2};
  for (RecordingOps* ops : {&host, &device}) {
    ExpectInvalid(ops->Embedding(table.view(), StepArray(wide), emb.view()),
                  "Embedding: ids must be i32, got i64");
    const TensorView matrix(const_cast<int32_t*>(bad_ids.data()), DType::kI32,
                            {1, 2});
    ExpectInvalid(ops->Embedding(table.view(), matrix, emb.view()),
                  "ids must be a vector");
  }
  Tensor src = F32({3, 4}), dst = F32({1, 4});
  const std::vector<int32_t> row = {3};
  ExpectInvalid(host.GatherRows(src.view(), StepArray(row), dst.view()),
                "GatherRows: row 3 of 3");
  EXPECT_TRUE(device.GatherRows(src.view(), StepArray(row), dst.view()).ok());
  Tensor kc = F32({8, 1, 4}), k = F32({1, 1, 4});
  const std::vector<int64_t> slot = {8};
  ExpectInvalid(host.StoreKvCache(k.view(), k.view(), StepArray(slot),
                                  {kc.view(), kc.view()}),
                "slot 8 of token 0 is outside [0, 8)");
  EXPECT_TRUE(device
                  .StoreKvCache(k.view(), k.view(), StepArray(slot),
                                {kc.view(), kc.view()})
                  .ok());
}

// Sample reaches DoSample only with f32 [rows, V] logits and valid rows; no
// rows is done without the backend.
TEST(OpsTest, SampleChecksLogitsAndRowsBeforeTheBackend) {
  RecordingOps ops;
  Tensor logits = F32({2, 5});
  SamplingParams ok, bad;
  bad.top_p = 0.0f;
  std::vector<SampleRow> rows(2);
  rows[0].params = rows[1].params = &ok;
  std::vector<SampleResult> out;
  EXPECT_TRUE(ops.Sample(logits.view(), rows, &out).ok());
  EXPECT_EQ(out.size(), 2u);
  ExpectInvalid(ops.Sample(logits.view(), {rows[0]}, &out),
                "Sample: logits must be f32 [1, V > 0], got f32 [2, 5]");
  ExpectInvalid(ops.Sample(logits.view(), rows, nullptr), "Sample: no output");
  rows[1].params = &bad;
  ExpectInvalid(ops.Sample(logits.view(), rows, &out),
                "Sample: row 1: top_p must be in (0, 1]");
  rows[1].params = nullptr;
  ExpectInvalid(ops.Sample(logits.view(), rows, &out),
                "row 1 has no sampling parameters");
  rows[1].params = &ok;
  rows[1].top_logprobs = -1;
  ExpectInvalid(ops.Sample(logits.view(), rows, &out), "-1 top logprobs");
  Tensor ints = *Tensor::Zeros(DType::kI32, {2, 5});
  ExpectInvalid(ops.Sample(ints.view(), rows, &out), "got i32");
  Tensor none = F32({0, 5});
  EXPECT_TRUE(ops.Sample(none.view(), {}, &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(ops.calls, (std::vector<std::string>{"Sample"}));
}

// A backend's ranking limit (OpSupport::max_top_logprobs) is checked before
// it is called.
TEST(OpsTest, SampleRefusesMoreTopLogprobsThanTheBackendRanks) {
  RecordingOps ops(/*host=*/true, /*max_top_logprobs=*/2);
  EXPECT_EQ(ops.max_top_logprobs(), 2);
  Tensor logits = F32({1, 5});
  SamplingParams params;
  std::vector<SampleRow> rows(1);
  rows[0].params = &params;
  rows[0].top_logprobs = 2;
  std::vector<SampleResult> out;
  EXPECT_TRUE(ops.Sample(logits.view(), rows, &out).ok());
  rows[0].top_logprobs = 3;
  ExpectInvalid(ops.Sample(logits.view(), rows, &out),
                "asks for 3 top logprobs; this backend ranks at most 2");
  EXPECT_EQ(ops.calls, (std::vector<std::string>{"Sample"}));
}

// Writes Begin and End into the ops' own call log, so a test sees where the
// bracket sits around the backend's Do<Op>.
class LoggingTimer final : public OpTimer {
 public:
  explicit LoggingTimer(std::vector<std::string>* log) : log_(log) {}
  void Begin() override { log_->push_back("Begin"); }
  void End(std::string label) override {
    log_->push_back(absl::StrCat("End ", label));
  }
  absl::StatusOr<std::vector<OpTimeTotal>> Collect() override {
    return std::vector<OpTimeTotal>();
  }

 private:
  std::vector<std::string>* log_;
};

// Each timed op is bracketed around its Do<Op> alone (a refused call is not
// timed), its label names the static dims and not the token count, and
// without a timer nothing is recorded.
TEST(OpsTest, ATimerBracketsEachOpWithItsLabel) {
  RecordingOps ops;
  LoggingTimer timer(&ops.calls);
  ops.set_op_timer(&timer);
  EXPECT_EQ(ops.op_timer(), &timer);
  Tensor x = F32({2, 4}), w = F32({3, 4}), out = F32({2, 3}), bias = F32({3});
  const TensorView bias_view = bias.view();
  EXPECT_TRUE(ops.Linear(x.view(), w, nullptr, out.view()).ok());
  Tensor x5 = F32({5, 4}), out5 = F32({5, 3});
  EXPECT_TRUE(ops.Linear(x5.view(), w, &bias_view, out5.view()).ok());
  Tensor wrong = F32({3, 5});
  ExpectInvalid(ops.Linear(x.view(), wrong, nullptr, out.view()), "Linear");
  Tensor residual = F32({2, 4}), norm = F32({4});
  EXPECT_TRUE(
      ops.AddRmsNorm(residual.view(), x.view(), norm.view(), 1e-5f, x.view())
          .ok());
  EXPECT_TRUE(ops.RmsNorm(x.view(), norm.view(), 1e-5f, x.view()).ok());
  Tensor gate_up = F32({2, 8}), act = F32({2, 4});
  EXPECT_TRUE(ops.GatedActivation(GatedActivationKind::kSilu, gate_up.view(),
                                  act.view())
                  .ok());

  // H = 2, Hkv = 1, D = 4.
  Tensor qkv = F32({2, 16}), q = F32({2, 2, 4}), freq = F32({2});
  Tensor kc = F32({8, 1, 4}), vc = F32({8, 1, 4});
  const std::vector<int32_t> positions = {0, 1};
  const std::vector<int64_t> slots = {3, -1};
  QkvRopeStoreArgs args;
  args.qkv = qkv.view();
  args.positions = StepArray(positions);
  args.inv_freq = freq.view();
  args.slot_mapping = StepArray(slots);
  args.cache = {kc.view(), vc.view()};
  args.q_out = q.view();
  EXPECT_TRUE(ops.QkvRopeStore(args).ok());

  ops.set_op_timer(nullptr);
  EXPECT_TRUE(ops.Linear(x.view(), w, nullptr, out.view()).ok());

  EXPECT_EQ(ops.calls, (std::vector<std::string>{"Begin",
                                                 "Linear",
                                                 "End Linear 3x4",  //
                                                 "Begin",
                                                 "Linear",
                                                 "End Linear 3x4+bias",  //
                                                 "Begin",
                                                 "Add",
                                                 "RmsNorm",
                                                 "End AddRmsNorm 4",  //
                                                 "Begin",
                                                 "RmsNorm",
                                                 "End RmsNorm 4",  //
                                                 "Begin",
                                                 "GatedActivation",
                                                 "End GatedActivation 4",
                                                 "Begin",
                                                 "QkvRopeStore",
                                                 "End QkvRopeStore 2/1x4",  //
                                                 "Linear"}));
}

// The wall-clock timer sums per label, sorts by total time and starts over
// at each Collect.
TEST(OpsTest, WallClockTimerSumsPerLabelAndResets) {
  WallClockOpTimer timer;
  for (int i = 0; i < 3; ++i) {
    timer.Begin();
    timer.End("A");
  }
  timer.Begin();
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start <
         std::chrono::milliseconds(2)) {
  }
  timer.End("B");
  absl::StatusOr<std::vector<OpTimeTotal>> totals = timer.Collect();
  ASSERT_TRUE(totals.ok()) << totals.status();
  ASSERT_EQ(totals->size(), 2u);
  EXPECT_EQ((*totals)[0].label, "B");
  EXPECT_EQ((*totals)[0].calls, 1);
  EXPECT_GE((*totals)[0].total_us, 2000.0);
  EXPECT_EQ((*totals)[1].label, "A");
  EXPECT_EQ((*totals)[1].calls, 3);
  EXPECT_LE((*totals)[1].total_us, (*totals)[0].total_us);
  totals = timer.Collect();
  ASSERT_TRUE(totals.ok());
  EXPECT_TRUE(totals->empty());
}

}  // namespace
}  // namespace tessera
