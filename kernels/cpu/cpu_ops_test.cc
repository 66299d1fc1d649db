// The CPU backend is the reference for every other backend, so it is itself
// checked against direct float64 transcriptions of the formulas, on fresh
// random inputs.
#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
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

TEST_F(CpuOpsTest, LinearRefusesAScaledWeight) {
  Tensor x = Random({2, 4}), w = Random({3, 4}), scale = Random({3});
  Tensor out = *Tensor::Zeros(DType::kF32, {2, 3});
  WeightView scaled = w;
  scaled.scale = scale.view();
  const absl::Status st = ops_.Linear(x.view(), scaled, nullptr, out.view());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("weight scale"), absl::string_view::npos) << st;
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

// Products large enough to run on several threads (>= 2^23 multiply-adds)
// with an output width that is not a multiple of any slice or tile.
// K = 1024 with 3 or 5 tokens: slices of about 10^6 multiply-adds would take
// OpenBLAS's small-matrix path and differ in the last bit.
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
    // The reference: one single-threaded OpenBLAS call over the whole
    // product (after a first Linear, which fixes the threading).
    ASSERT_TRUE(ops_.Linear(x.view(), w.view(), nullptr, out.view()).ok());
    const int before = openblas_get_num_threads();
    openblas_set_num_threads(1);
    std::vector<float> want(t * kN);
    if (t == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, kN, kK, 1.0f, w.data_as<float>(),
                  kK, x.data_as<float>(), 1, 0.0f, want.data(), 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, kN, kK, 1.0f,
                  x.data_as<float>(), kK, w.data_as<float>(), kK, 0.0f,
                  want.data(), kN);
    }
    openblas_set_num_threads(before);
    for (int threads : {1, 2, 3, 4, 7}) {
      CpuThreadPool pool(threads);
      CpuOps ops(&pool);
      std::fill_n(out.data_as<float>(), t * kN, NAN);
      ASSERT_TRUE(ops.Linear(x.view(), w.view(), nullptr, out.view()).ok());
      EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * 4), 0)
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

// Attention kernels: paged_attention_test.cc.

}  // namespace
}  // namespace tessera
