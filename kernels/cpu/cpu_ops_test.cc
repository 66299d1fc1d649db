// The CPU backend is the reference for every other backend, so it is itself
// checked against direct float64 transcriptions of the formulas, on fresh
// random inputs.
#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_metadata.h"
#include "kernels/testing/step_arrays.h"

namespace tessera {
namespace {

class CpuOpsTest : public ::testing::Test {
 protected:
  Tensor Random(Shape shape, float scale = 1.0f) {
    Tensor t = *Tensor::Empty(DType::kF32, std::move(shape));
    std::normal_distribution<float> dist(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng_);
    return t;
  }
  static void ExpectClose(const Tensor& got, const std::vector<double>& want,
                          double tol) {
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got.data_as<float>()[i], want[i],
                  tol * (1.0 + std::fabs(want[i])))
          << i;
    }
  }
  std::mt19937 rng_{std::random_device{}()};
  CpuOps ops_;
};

// Upload takes host tensors in the checkpoint's dtype (here unaligned, as a
// slice of a mapping may be) and widens them into the f32 result.
TEST_F(CpuOpsTest, UploadWidensBf16AndF16HostTensors) {
  const std::vector<float> values = {1.0f, -2.5f, 0.15625f, 3e-3f, 65504.0f};
  for (DType from : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> bits(values.size() + 1);
    for (size_t i = 0; i < values.size(); ++i) {
      bits[i + 1] =
          from == DType::kBF16 ? F32ToBf16(values[i]) : F32ToF16(values[i]);
    }
    char* unaligned = reinterpret_cast<char*>(bits.data()) + 2;
    auto t = ops_.Upload(TensorView(unaligned, from, {5}), DType::kF32);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->dtype(), DType::kF32);
    for (size_t i = 0; i < values.size(); ++i) {
      const float want =
          from == DType::kBF16 ? Bf16ToF32(bits[i + 1]) : F16ToF32(bits[i + 1]);
      EXPECT_EQ(t->data_as<float>()[i], want) << DTypeName(from) << " " << i;
    }
  }
  int8_t bytes[4] = {};
  EXPECT_EQ(ops_.Upload(TensorView(bytes, DType::kI8, {4}), DType::kF32)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuOpsTest, DeviceCannotCaptureGraphs) {
  EXPECT_EQ(ops_.BeginCapture().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ops_.EndCapture().status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(ops_.Synchronize().ok());
  EXPECT_EQ(ops_.stream(), nullptr);
}

// Op profiling on the CPU: the wall clock per op, one row per label, and a
// Collect starts over.
TEST_F(CpuOpsTest, OpTimerTimesEachOpByLabel) {
  absl::StatusOr<std::unique_ptr<OpTimer>> timer = ops_.NewOpTimer();
  ASSERT_TRUE(timer.ok()) << timer.status();
  ops_.set_op_timer(timer->get());
  Tensor x = Random({16, 256}), w = Random({128, 256}), norm = Random({128});
  Tensor out = *Tensor::Zeros(DType::kF32, {16, 128});
  ASSERT_TRUE(ops_.Linear(x.view(), w, nullptr, out.view()).ok());
  ASSERT_TRUE(ops_.RmsNorm(out.view(), norm.view(), 1e-5f, out.view()).ok());
  absl::StatusOr<std::vector<OpTimeTotal>> totals = (*timer)->Collect();
  ASSERT_TRUE(totals.ok()) << totals.status();
  ASSERT_EQ(totals->size(), 2u);
  std::vector<std::string> labels;
  for (const OpTimeTotal& t : *totals) {
    labels.push_back(t.label);
    EXPECT_EQ(t.calls, 1) << t.label;
    EXPECT_GT(t.total_us, 0.0) << t.label;
  }
  std::sort(labels.begin(), labels.end());
  EXPECT_EQ(labels,
            (std::vector<std::string>{"Linear 128x256", "RmsNorm 128"}));
  EXPECT_GE((*totals)[0].total_us, (*totals)[1].total_us);
  totals = (*timer)->Collect();
  ASSERT_TRUE(totals.ok()) << totals.status();
  EXPECT_TRUE(totals->empty());
  ops_.set_op_timer(nullptr);
}

// Since the fp8 contract (ops.h WeightView), a scale goes with f8_e4m3 data
// only: an f32 weight given one is refused by the shared checks.
TEST_F(CpuOpsTest, LinearRefusesAScaledWeight) {
  Tensor x = Random({2, 4}), w = Random({3, 4}), scale = Random({3});
  Tensor out = *Tensor::Zeros(DType::kF32, {2, 3});
  WeightView scaled = w;
  scaled.scale_kind = WeightScaleKind::kPerChannel;
  scaled.scale = scale.view();
  const absl::Status st = ops_.Linear(x.view(), scaled, nullptr, out.view());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("take no scale"), absl::string_view::npos) << st;
  EXPECT_TRUE(ops_.Linear(x.view(), w, nullptr, out.view()).ok());
}

TEST_F(CpuOpsTest, LinearMatchesDirectProduct) {
  for (int64_t t : {1, 3, 17}) {
    Tensor x = Random({t, 33});
    Tensor w = Random({45, 33});
    Tensor b = Random({45});
    Tensor out = *Tensor::Empty(DType::kF32, {t, 45});
    TensorView bias = b.view();
    ASSERT_TRUE(ops_.Linear(x.view(), w.view(), &bias, out.view()).ok());
    std::vector<double> want(t * 45);
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t n = 0; n < 45; ++n) {
        double acc = b.data_as<float>()[n];
        for (int64_t k = 0; k < 33; ++k) {
          acc += double(x.data_as<float>()[r * 33 + k]) *
                 w.data_as<float>()[n * 33 + k];
        }
        want[r * 45 + n] = acc;
      }
    }
    ExpectClose(out, want, 1e-5);
  }
  Tensor x = Random({2, 8});
  Tensor w = Random({4, 9});
  Tensor out = *Tensor::Empty(DType::kF32, {2, 4});
  EXPECT_EQ(ops_.Linear(x.view(), w.view(), nullptr, out.view()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Products large enough to run as slices (>= 2^23 multiply-adds) with an
// output width that is not a multiple of any slice or tile: bit for bit the
// same on every thread count (the slices depend on the shape alone), and
// within f32 rounding of one single-threaded OpenBLAS call over the whole
// product (which need not be bit-identical: on Zen cores OpenBLAS sums a
// column in another order when the product is wider).
TEST_F(CpuOpsTest, LargeLinearIsBitIdenticalOnAnyThreadCount) {
  struct Case {
    int64_t t, n, k;
  };
  for (const Case c :
       {Case{1, 70001, 128}, Case{3, 70001, 128}, Case{3, 9001, 1024},
        Case{5, 9001, 1024}, Case{64, 4099, 64}}) {
    const int64_t t = c.t, kN = c.n, kK = c.k;
    SCOPED_TRACE(testing::Message() << t << " x " << kK << " by " << kN);
    Tensor w = Random({kN, kK});
    Tensor x = Random({t, kK});
    Tensor out = *Tensor::Empty(DType::kF32, {t, kN});
    // A first Linear fixes OpenBLAS's threading.
    ASSERT_TRUE(ops_.Linear(x.view(), w.view(), nullptr, out.view()).ok());
    const int before = openblas_get_num_threads();
    openblas_set_num_threads(1);
    Tensor whole = *Tensor::Empty(DType::kF32, {t, kN});
    if (t == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, kN, kK, 1.0f, w.data_as<float>(),
                  kK, x.data_as<float>(), 1, 0.0f, whole.data_as<float>(), 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, kN, kK, 1.0f,
                  x.data_as<float>(), kK, w.data_as<float>(), kK, 0.0f,
                  whole.data_as<float>(), kN);
    }
    openblas_set_num_threads(before);
    std::vector<float> want;
    for (int threads : {1, 2, 3, 4, 7}) {
      CpuThreadPool pool(threads);
      CpuOps ops(&pool);
      std::fill_n(out.data_as<float>(), t * kN, NAN);
      ASSERT_TRUE(ops.Linear(x.view(), w.view(), nullptr, out.view()).ok());
      const float* o = out.data_as<float>();
      if (want.empty()) {
        want.assign(o, o + t * kN);
        const float* h = whole.data_as<float>();
        ExpectClose(out, std::vector<double>(h, h + t * kN), 1e-4);
      }
      EXPECT_EQ(std::memcmp(o, want.data(), want.size() * 4), 0)
          << threads << " threads";
    }
  }
}

// By default OpenBLAS's own thread pool stays idle (large products are split
// over CpuThreadPool's threads instead): two busy-waiting pools on few cores
// fight for them. OPENBLAS_NUM_THREADS set by the user brings OpenBLAS's pool
// back (cpu_ops_openblas_threads_test).
TEST_F(CpuOpsTest, LargeLinearKeepsOpenBlasOnOneThreadByDefault) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr ||
      std::getenv("GOTO_NUM_THREADS") != nullptr) {
    GTEST_SKIP() << "the user chose OpenBLAS's threads";
  }
  if (openblas_get_num_procs() < 2) GTEST_SKIP() << "one CPU";
  Tensor w = Random({70001, 128});
  Tensor x = Random({1, 128});
  Tensor out = *Tensor::Empty(DType::kF32, {1, 70001});
  ASSERT_TRUE(ops_.Linear(x.view(), w.view(), nullptr, out.view()).ok());
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST_F(CpuOpsTest, RmsNormMatchesFormula) {
  Tensor x = Random({5, 24}, 3.0f);
  Tensor w = Random({24});
  Tensor out = *Tensor::Empty(DType::kF32, {5, 24});
  ASSERT_TRUE(ops_.RmsNorm(x.view(), w.view(), 1e-5f, out.view()).ok());
  std::vector<double> want(5 * 24);
  for (int r = 0; r < 5; ++r) {
    double ss = 0;
    for (int i = 0; i < 24; ++i)
      ss += std::pow(x.data_as<float>()[r * 24 + i], 2);
    const double inv = 1.0 / std::sqrt(ss / 24 + 1e-5);
    for (int i = 0; i < 24; ++i) {
      want[r * 24 + i] =
          x.data_as<float>()[r * 24 + i] * inv * w.data_as<float>()[i];
    }
  }
  ExpectClose(out, want, 1e-5);
}

TEST_F(CpuOpsTest, RopeRotatesHalvesByPositionTimesFrequency) {
  Tensor x = Random({3, 2, 8});
  Tensor orig = *Tensor::Empty(DType::kF32, {3, 2, 8});
  std::copy_n(x.data_as<float>(), 48, orig.data_as<float>());
  Tensor freq = Random({4});
  std::vector<int32_t> pos = {0, 5, 11};
  ASSERT_TRUE(ops_.Rope(x.view(), StepArray(pos), freq.view()).ok());
  std::vector<double> want(48);
  for (int t = 0; t < 3; ++t) {
    for (int h = 0; h < 2; ++h) {
      const float* o = orig.data_as<float>() + (t * 2 + h) * 8;
      for (int i = 0; i < 4; ++i) {
        const double angle = double(pos[t]) * freq.data_as<float>()[i];
        want[(t * 2 + h) * 8 + i] =
            o[i] * std::cos(angle) - o[i + 4] * std::sin(angle);
        want[(t * 2 + h) * 8 + i + 4] =
            o[i + 4] * std::cos(angle) + o[i] * std::sin(angle);
      }
    }
  }
  ExpectClose(x, want, 1e-5);
}

TEST_F(CpuOpsTest, SiluMulAndAdd) {
  Tensor g = Random({4, 7});
  Tensor u = Random({4, 7});
  Tensor out = *Tensor::Empty(DType::kF32, {4, 7});
  ASSERT_TRUE(ops_.SiluMul(g.view(), u.view(), out.view()).ok());
  std::vector<double> want(28), sum(28);
  for (int i = 0; i < 28; ++i) {
    const double gi = g.data_as<float>()[i];
    want[i] = gi / (1 + std::exp(-gi)) * u.data_as<float>()[i];
    sum[i] = want[i] + gi;
  }
  ExpectClose(out, want, 1e-6);
  ASSERT_TRUE(ops_.Add(out.view(), g.view(), out.view()).ok());
  ExpectClose(out, sum, 1e-6);
}

TEST_F(CpuOpsTest, EmbeddingRejectsOutOfRangeIds) {
  Tensor table = Random({10, 4});
  Tensor out = *Tensor::Empty(DType::kF32, {2, 4});
  std::vector<int32_t> ids = {3, 9};
  ASSERT_TRUE(ops_.Embedding(table.view(), StepArray(ids), out.view()).ok());
  EXPECT_EQ(out.data_as<float>()[4], table.data_as<float>()[36]);
  ids[1] = 10;
  EXPECT_EQ(ops_.Embedding(table.view(), StepArray(ids), out.view()).code(),
            absl::StatusCode::kInvalidArgument);
  // Step arrays must be kI32 vectors.
  const std::vector<int64_t> wide = {3, 9};
  EXPECT_EQ(ops_.Embedding(table.view(), StepArray(wide), out.view()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuOpsTest, GatherRowsChecksRows) {
  Tensor src = Random({4, 3});
  Tensor dst = *Tensor::Empty(DType::kF32, {2, 3});
  std::vector<int32_t> rows = {3, 0};
  ASSERT_TRUE(ops_.GatherRows(src.view(), StepArray(rows), dst.view()).ok());
  EXPECT_EQ(dst.data_as<float>()[0], src.data_as<float>()[9]);
  EXPECT_EQ(dst.data_as<float>()[3], src.data_as<float>()[0]);
  rows[0] = 4;
  EXPECT_EQ(ops_.GatherRows(src.view(), StepArray(rows), dst.view()).code(),
            absl::StatusCode::kInvalidArgument);
}

// One layer's cache of `slots` slots, every byte a sentinel, so a write
// where none belongs shows.
struct TestCache {
  Tensor k, v, k_scale, v_scale;
  KvCacheLayer layer() const {
    KvCacheLayer l{k.view(), v.view(), TensorView(), TensorView()};
    if (k.dtype() == DType::kI8) {
      l.k_scale = k_scale.view();
      l.v_scale = v_scale.view();
    }
    return l;
  }
};

TestCache MakeCache(DType dtype, int64_t slots, int64_t kv_heads, int64_t dim) {
  TestCache c;
  c.k = *Tensor::Empty(dtype, {slots, kv_heads, dim});
  c.v = *Tensor::Empty(dtype, {slots, kv_heads, dim});
  std::memset(c.k.data(), 0x5a, c.k.nbytes());
  std::memset(c.v.data(), 0x5a, c.v.nbytes());
  if (dtype == DType::kI8) {
    c.k_scale = *Tensor::Empty(DType::kF32, {slots, kv_heads});
    c.v_scale = *Tensor::Empty(DType::kF32, {slots, kv_heads});
    std::memset(c.k_scale.data(), 0x5a, c.k_scale.nbytes());
    std::memset(c.v_scale.data(), 0x5a, c.v_scale.nbytes());
  }
  return c;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// The fused prologue is the unfused ops in sequence: the same bits in q and
// in the cache (values and int8 scales), for every cache dtype, with and
// without q/k norms, GQA and MQA, and a padded token (slot -1) that writes
// nothing.
TEST_F(CpuOpsTest, QkvRopeStoreIsTheUnfusedOpsBitForBit) {
  struct Case {
    int64_t heads, kv_heads, dim;
    bool norm;
    DType cache;
  };
  const Case cases[] = {
      {4, 2, 8, false, DType::kF32}, {4, 2, 8, true, DType::kF32},
      {6, 1, 16, true, DType::kI8},  {2, 2, 32, false, DType::kI8},
      {8, 2, 64, true, DType::kF32},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << c.heads << "/" << c.kv_heads << " D " << c.dim << " norm "
                 << c.norm << " " << DTypeName(c.cache));
    const int64_t T = 5, S = 16, H = c.heads, Hkv = c.kv_heads, D = c.dim;
    Tensor qkv = Random({T, (H + 2 * Hkv) * D});
    Tensor q_norm = Random({D}), k_norm = Random({D});
    Tensor freq = Random({D / 2}, 0.1f);
    const std::vector<int32_t> positions = {0, 3, 7, 100, 2};
    const std::vector<int64_t> slots = {4, -1, 9, 0, 15};
    const TensorView qn = q_norm.view(), kn = k_norm.view();

    TestCache fused = MakeCache(c.cache, S, Hkv, D);
    Tensor q = *Tensor::Empty(DType::kF32, {T, H, D});
    QkvRopeStoreArgs args;
    args.qkv = qkv.view();
    args.q_norm = c.norm ? &qn : nullptr;
    args.k_norm = c.norm ? &kn : nullptr;
    args.eps = 1e-6f;
    args.positions = StepArray(positions);
    args.inv_freq = freq.view();
    args.slot_mapping = StepArray(slots);
    args.cache = fused.layer();
    args.q_out = q.view();
    ASSERT_TRUE(ops_.QkvRopeStore(args).ok());

    // The unfused path: split, norm, rope, store the tokens that have slots.
    Tensor q_ref = *Tensor::Empty(DType::kF32, {T, H, D});
    Tensor k_ref = *Tensor::Empty(DType::kF32, {T, Hkv, D});
    Tensor v_ref = *Tensor::Empty(DType::kF32, {T, Hkv, D});
    const float* in = qkv.data_as<float>();
    for (int64_t t = 0; t < T; ++t) {
      const float* row = in + t * (H + 2 * Hkv) * D;
      std::copy_n(row, H * D, q_ref.data_as<float>() + t * H * D);
      std::copy_n(row + H * D, Hkv * D, k_ref.data_as<float>() + t * Hkv * D);
      std::copy_n(row + (H + Hkv) * D, Hkv * D,
                  v_ref.data_as<float>() + t * Hkv * D);
    }
    if (c.norm) {
      ASSERT_TRUE(ops_.RmsNorm(q_ref.view(), qn, 1e-6f, q_ref.view()).ok());
      ASSERT_TRUE(ops_.RmsNorm(k_ref.view(), kn, 1e-6f, k_ref.view()).ok());
    }
    ASSERT_TRUE(
        ops_.Rope(q_ref.view(), StepArray(positions), freq.view()).ok());
    ASSERT_TRUE(
        ops_.Rope(k_ref.view(), StepArray(positions), freq.view()).ok());
    TestCache unfused = MakeCache(c.cache, S, Hkv, D);
    std::vector<int64_t> kept_slots;
    Tensor k_kept = *Tensor::Empty(DType::kF32, {T - 1, Hkv, D});
    Tensor v_kept = *Tensor::Empty(DType::kF32, {T - 1, Hkv, D});
    for (int64_t t = 0; t < T; ++t) {
      if (slots[t] < 0) continue;
      const int64_t i = static_cast<int64_t>(kept_slots.size());
      kept_slots.push_back(slots[t]);
      std::copy_n(k_ref.data_as<float>() + t * Hkv * D, Hkv * D,
                  k_kept.data_as<float>() + i * Hkv * D);
      std::copy_n(v_ref.data_as<float>() + t * Hkv * D, Hkv * D,
                  v_kept.data_as<float>() + i * Hkv * D);
    }
    ASSERT_TRUE(ops_.StoreKvCache(k_kept.view(), v_kept.view(),
                                  StepArray(kept_slots), unfused.layer())
                    .ok());
    EXPECT_TRUE(SameBytes(q, q_ref));
    EXPECT_TRUE(SameBytes(fused.k, unfused.k));
    EXPECT_TRUE(SameBytes(fused.v, unfused.v));
    if (c.cache == DType::kI8) {
      EXPECT_TRUE(SameBytes(fused.k_scale, unfused.k_scale));
      EXPECT_TRUE(SameBytes(fused.v_scale, unfused.v_scale));
    }
  }
}

TEST_F(CpuOpsTest, QkvRopeStoreRefusesSlotsOutsideTheCacheOtherThanMinusOne) {
  const int64_t H = 2, Hkv = 1, D = 4;
  Tensor qkv = Random({2, (H + 2 * Hkv) * D});
  Tensor q = *Tensor::Empty(DType::kF32, {2, H, D});
  Tensor freq = Random({D / 2});
  TestCache cache = MakeCache(DType::kF32, 8, Hkv, D);
  const std::vector<int32_t> positions = {0, 1};
  for (int64_t bad : {int64_t{-2}, int64_t{8}}) {
    const std::vector<int64_t> slots = {0, bad};
    QkvRopeStoreArgs args;
    args.qkv = qkv.view();
    args.positions = StepArray(positions);
    args.inv_freq = freq.view();
    args.slot_mapping = StepArray(slots);
    args.cache = cache.layer();
    args.q_out = q.view();
    const absl::Status st = ops_.QkvRopeStore(args);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("is neither -1 nor in [0, 8)"),
              std::string::npos)
        << st;
  }
}

// QkvRopeStore's RoPE variants against a float64 transcription of
// transformers' rotation (modeling_rope_utils.py, apply_rotary_pos_emb):
// partial rotary (dims [R, D) pass through), cos and sin times a factor,
// and per-sequence frequencies in a mixed batch, where every token of
// sequence s rotates with the table for L = seq_lens[s] (its length after
// the step): dynamic NTK grows theta to theta * (factor * L / Lmax -
// (factor - 1))^(R / (R - 2)) once L > Lmax, LongRoPE switches to its long
// table. Both q (q_out) and k (the f32 cache) are checked; v is stored as
// given.
struct RopeVariantCase {
  const char* name;
  int64_t rotary;  // R <= D = 8.
  RopeLengthScaling scaling;
  float cos_sin_scale;
};

TEST_F(CpuOpsTest, QkvRopeStoreRopeVariantsMatchTheFormula) {
  const RopeVariantCase cases[] = {
      {"full", 8, RopeLengthScaling::kNone, 1.0f},
      {"partial 6 of 8", 6, RopeLengthScaling::kNone, 1.0f},
      {"partial, cos/sin x 1.19", 4, RopeLengthScaling::kNone, 1.19f},
      {"dynamic NTK", 8, RopeLengthScaling::kDynamicNtk, 1.0f},
      {"dynamic NTK, partial", 6, RopeLengthScaling::kDynamicNtk, 1.0f},
      {"longrope", 8, RopeLengthScaling::kLongRope, 1.0f},
      {"longrope, partial, scaled", 6, RopeLengthScaling::kLongRope, 1.3f},
  };
  const int64_t H = 3, Hkv = 1, D = 8;
  constexpr int32_t kOriginal = 8;
  constexpr double kTheta = 10000.0, kFactor = 2.5;
  // A decode beyond the original context, a prefill within it, a prefill
  // that crosses it, a decode exactly at it.
  const std::vector<int32_t> table0 = {0}, table1 = {1}, table2 = {2},
                             table3 = {3};
  const SequenceSlice seqs[] = {
      {10, 1, table0}, {0, 3, table1}, {5, 6, table2}, {7, 1, table3}};
  auto meta = BuildAttentionMetadata(seqs, /*block_size=*/16,
                                     /*num_blocks=*/4);
  ASSERT_TRUE(meta.ok()) << meta.status();
  const AttentionMetadata view = meta->View();
  const int64_t T = meta->num_tokens;
  for (const RopeVariantCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t R = c.rotary, half = R / 2;
    Tensor qkv = Random({T, (H + 2 * Hkv) * D});
    Tensor freq = *Tensor::Empty(DType::kF32, {half});
    Tensor long_freq = *Tensor::Empty(DType::kF32, {half});
    for (int64_t i = 0; i < half; ++i) {
      freq.data_as<float>()[i] =
          static_cast<float>(1.0 / std::pow(kTheta, 2.0 * i / R));
      long_freq.data_as<float>()[i] = freq.data_as<float>()[i] / (1.5f + i);
    }
    TestCache cache = MakeCache(DType::kF32, 64, Hkv, D);
    Tensor q = *Tensor::Empty(DType::kF32, {T, H, D});
    QkvRopeStoreArgs args;
    args.qkv = qkv.view();
    args.positions = StepArray(meta->positions);
    args.inv_freq = freq.view();
    args.rope.length_scaling = c.scaling;
    args.rope.cos_sin_scale = c.cos_sin_scale;
    if (c.scaling != RopeLengthScaling::kNone) {
      args.rope.original_max_len = kOriginal;
      args.metadata = &view;
    }
    args.rope.long_inv_freq = long_freq.view();
    args.rope.base = static_cast<float>(kTheta);
    args.rope.factor = static_cast<float>(kFactor);
    args.rope.factor_minus_one = static_cast<float>(kFactor - 1.0);
    args.rope.exponent = static_cast<float>(R / (R - 2.0));
    args.slot_mapping = StepArray(meta->slot_mapping);
    args.cache = cache.layer();
    args.q_out = q.view();
    ASSERT_TRUE(ops_.QkvRopeStore(args).ok());

    for (int32_t s = 0; s < meta->num_seqs; ++s) {
      const int32_t length = meta->seq_lens[s];
      // The sequence's frequencies, in double.
      std::vector<double> f(half);
      for (int64_t i = 0; i < half; ++i) {
        f[i] = freq.data_as<float>()[i];
        if (length <= kOriginal) continue;
        if (c.scaling == RopeLengthScaling::kLongRope) {
          f[i] = long_freq.data_as<float>()[i];
        } else if (c.scaling == RopeLengthScaling::kDynamicNtk) {
          const double base =
              kTheta * std::pow(kFactor * length / kOriginal - (kFactor - 1),
                                static_cast<double>(R) / (R - 2));
          f[i] = 1.0 / std::pow(base, 2.0 * i / R);
        }
      }
      for (int32_t t = meta->query_start_loc[s];
           t < meta->query_start_loc[s + 1]; ++t) {
        const double pos = meta->positions[t];
        const float* row = qkv.data_as<float>() + t * (H + 2 * Hkv) * D;
        for (int64_t h = 0; h < H + Hkv; ++h) {
          const float* in = row + h * D;
          const float* got =
              h < H ? q.data_as<float>() + (t * H + h) * D
                    : cache.k.data_as<float>() +
                          (meta->slot_mapping[t] * Hkv + (h - H)) * D;
          for (int64_t i = 0; i < half; ++i) {
            const double cs = std::cos(pos * f[i]) * c.cos_sin_scale;
            const double sn = std::sin(pos * f[i]) * c.cos_sin_scale;
            const double a = in[i], b = in[i + half];
            const double want_a = a * cs - b * sn, want_b = b * cs + a * sn;
            ASSERT_NEAR(got[i], want_a, 2e-5 * (1 + std::fabs(want_a)))
                << "seq " << s << " token " << t << " head " << h << " " << i;
            ASSERT_NEAR(got[i + half], want_b, 2e-5 * (1 + std::fabs(want_b)))
                << "seq " << s << " token " << t << " head " << h << " " << i;
          }
          for (int64_t i = R; i < D; ++i) {
            ASSERT_EQ(got[i], in[i]) << "pass-through dim " << i;
          }
        }
      }
    }
  }
}

// Length-scaled RoPE needs the step's metadata, and the long table for
// LongRoPE; inv_freq may not be wider than half a head.
TEST_F(CpuOpsTest, QkvRopeStoreRefusesIncompleteRopeOptions) {
  const int64_t H = 2, Hkv = 1, D = 4;
  Tensor qkv = Random({1, (H + 2 * Hkv) * D});
  Tensor q = *Tensor::Empty(DType::kF32, {1, H, D});
  Tensor freq = Random({D / 2});
  Tensor wide = Random({D});
  TestCache cache = MakeCache(DType::kF32, 8, Hkv, D);
  const std::vector<int32_t> positions = {0};
  const std::vector<int64_t> slots = {0};
  const std::vector<int32_t> table = {0};
  const SequenceSlice seq[] = {{0, 1, table}};
  auto meta = BuildAttentionMetadata(seq, 8, 1);
  ASSERT_TRUE(meta.ok());
  const AttentionMetadata view = meta->View();
  QkvRopeStoreArgs args;
  args.qkv = qkv.view();
  args.positions = StepArray(positions);
  args.inv_freq = freq.view();
  args.slot_mapping = StepArray(slots);
  args.cache = cache.layer();
  args.q_out = q.view();
  ASSERT_TRUE(ops_.QkvRopeStore(args).ok());
  QkvRopeStoreArgs bad = args;
  bad.inv_freq = wide.view();
  EXPECT_EQ(ops_.QkvRopeStore(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = args;
  bad.rope.length_scaling = RopeLengthScaling::kLongRope;
  bad.rope.original_max_len = 4;
  EXPECT_EQ(ops_.QkvRopeStore(bad).code(), absl::StatusCode::kInvalidArgument)
      << "no metadata";
  bad.metadata = &view;
  EXPECT_EQ(ops_.QkvRopeStore(bad).code(), absl::StatusCode::kInvalidArgument)
      << "no long table";
  bad.rope.long_inv_freq = freq.view();
  EXPECT_TRUE(ops_.QkvRopeStore(bad).ok());
  bad.rope.original_max_len = 0;
  EXPECT_EQ(ops_.QkvRopeStore(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = args;
  bad.rope.cos_sin_scale = INFINITY;
  EXPECT_EQ(ops_.QkvRopeStore(bad).code(), absl::StatusCode::kInvalidArgument);
}

// The gated activation over the stacked gate/up output is SiluMul over its
// halves, bit for bit.
TEST_F(CpuOpsTest, GatedActivationIsSiluMulOverTheHalves) {
  const int64_t T = 3, I = 11;
  Tensor gate_up = Random({T, 2 * I}, 3.0f);
  Tensor out = *Tensor::Empty(DType::kF32, {T, I});
  ASSERT_TRUE(ops_.GatedActivation(GatedActivationKind::kSilu, gate_up.view(),
                                   out.view())
                  .ok());
  Tensor gate = *Tensor::Empty(DType::kF32, {T, I});
  Tensor up = *Tensor::Empty(DType::kF32, {T, I});
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(gate_up.data_as<float>() + t * 2 * I, I,
                gate.data_as<float>() + t * I);
    std::copy_n(gate_up.data_as<float>() + t * 2 * I + I, I,
                up.data_as<float>() + t * I);
  }
  ASSERT_TRUE(ops_.SiluMul(gate.view(), up.view(), gate.view()).ok());
  EXPECT_TRUE(SameBytes(out, gate));
}

// GeGLU's activation is the tanh-approximated GELU of the gate times the up
// half: within f32 rounding of the formula evaluated in double.
TEST_F(CpuOpsTest, GatedGeluTanhIsTheFormulaOverTheHalves) {
  const int64_t T = 4, I = 9;
  Tensor gate_up = Random({T, 2 * I}, 3.0f);
  gate_up.data_as<float>()[0] = 0.0f;    // gelu(0) = 0 exactly.
  gate_up.data_as<float>()[1] = -12.0f;  // Far left: ~0 (tanh saturates).
  Tensor out = *Tensor::Empty(DType::kF32, {T, I});
  ASSERT_TRUE(ops_.GatedActivation(GatedActivationKind::kGeluTanh,
                                   gate_up.view(), out.view())
                  .ok());
  const double k_beta = std::sqrt(2.0 / M_PI);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      const double g = gate_up.data_as<float>()[t * 2 * I + i];
      const double u = gate_up.data_as<float>()[t * 2 * I + I + i];
      const double want =
          0.5 * g * (1.0 + std::tanh(k_beta * (g + 0.044715 * g * g * g))) * u;
      EXPECT_NEAR(out.data_as<float>()[t * I + i], want,
                  2e-6 * (1.0 + std::fabs(want)))
          << t << "," << i;
    }
  }
  EXPECT_EQ(out.data_as<float>()[0], 0.0f);
  EXPECT_LT(std::fabs(out.data_as<float>()[1]), 1e-6f);
}

TEST_F(CpuOpsTest, ScaleAndSoftcapWorkInPlace) {
  Tensor x = Random({3, 17}, 40.0f);
  const std::vector<float> before(x.data_as<float>(),
                                  x.data_as<float>() + x.numel());
  ASSERT_TRUE(ops_.Scale(x.view(), 8.0f).ok());
  for (int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(x.data_as<float>()[i], before[i] * 8.0f) << i;
  }
  ASSERT_TRUE(ops_.Softcap(x.view(), 30.0f).ok());
  for (int64_t i = 0; i < x.numel(); ++i) {
    // transformers' order: divide, tanh, multiply.
    const float scaled = before[i] * 8.0f;
    EXPECT_EQ(x.data_as<float>()[i], std::tanh(scaled / 30.0f) * 30.0f) << i;
    EXPECT_LE(std::fabs(x.data_as<float>()[i]), 30.0f);
  }
}

// Attention kernels: paged_attention_test.cc.

}  // namespace
}  // namespace tessera
