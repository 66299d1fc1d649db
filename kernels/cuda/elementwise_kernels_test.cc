#include "kernels/cuda/elementwise_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/device_array.h"
#include "kernels/testing/step_arrays.h"

namespace tessera {
namespace {

using testing_cuda::DeviceArray;
using DeviceBuffer = DeviceArray<float>;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// f32 -> bf16 bits, round to nearest even (NaN handled by the caller).
uint16_t ToBF16Rne(float f) {
  uint32_t b = Bits(f);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
bool IsBF16NaN(uint16_t h) {
  return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0;
}

class CudaElementwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::vector<float> Random(size_t n) {
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  std::mt19937 rng_{std::random_device{}()};
  CpuOps cpu_;
};

TEST_F(CudaElementwiseTest, RmsNormMatchesCpu) {
  for (int64_t n : {7, 64, 1000, 4096, 5120, 12288, 20480, 40000}) {
    const int64_t rows = 5;
    std::vector<float> x = Random(rows * n), w = Random(n), want(rows * n);
    ASSERT_TRUE(cpu_.RmsNorm(TensorView(x.data(), DType::kF32, {rows, n}),
                             TensorView(w.data(), DType::kF32, {n}), 1e-6f,
                             TensorView(want.data(), DType::kF32, {rows, n}))
                    .ok());
    DeviceBuffer dx(x), dw(w), dout(std::vector<float>(rows * n, NAN));
    ASSERT_EQ(cuda::LaunchRmsNorm(dx.get(), dw.get(), 1e-6f, rows, n,
                                  dout.get(), nullptr),
              cudaSuccess);
    const std::vector<float> got = dout.Download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i])))
          << "n=" << n << " i=" << i;
    }
  }
}

TEST_F(CudaElementwiseTest, SiluMulMatchesCpu) {
  const int64_t count = 100003;
  std::vector<float> g = Random(count), u = Random(count), want(count);
  ASSERT_TRUE(cpu_.SiluMul(TensorView(g.data(), DType::kF32, {count}),
                           TensorView(u.data(), DType::kF32, {count}),
                           TensorView(want.data(), DType::kF32, {count}))
                  .ok());
  DeviceBuffer dg(g), du(u), dout(std::vector<float>(count, NAN));
  ASSERT_EQ(cuda::LaunchSiluMul(dg.get(), du.get(), count, dout.get(), nullptr),
            cudaSuccess);
  const std::vector<float> got = dout.Download();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << i;
  }
}

TEST_F(CudaElementwiseTest, EmbeddingMatchesCpu) {
  const int64_t vocab = 37;
  for (int64_t hidden : {1, 7, 128, 1000}) {
    std::vector<float> table = Random(vocab * hidden);
    std::uniform_int_distribution<int32_t> id(0, vocab - 1);
    std::vector<int32_t> ids(23);
    for (int32_t& i : ids) i = id(rng_);
    ids[0] = 0;
    ids[1] = vocab - 1;
    const int64_t tokens = ids.size();
    DeviceBuffer dtable(table);
    DeviceArray<int32_t> dids(ids);
    // Plain lookup.
    std::vector<float> want(tokens * hidden);
    ASSERT_TRUE(
        cpu_.Embedding(TensorView(table.data(), DType::kF32, {vocab, hidden}),
                       StepArray(ids),
                       TensorView(want.data(), DType::kF32, {tokens, hidden}))
            .ok());
    DeviceBuffer dout(std::vector<float>(tokens * hidden, NAN));
    ASSERT_EQ(cuda::LaunchEmbedding(dtable.get(), false, dids.get(), tokens,
                                    hidden, 0, vocab, dout.get(), nullptr),
              cudaSuccess);
    EXPECT_EQ(dout.Download(), want) << "hidden=" << hidden;
    // Vocabulary-parallel shard: rows 10 .. 24 of the vocabulary.
    const int64_t first_id = 10, rows = 15;
    std::vector<float> shard(table.begin() + first_id * hidden,
                             table.begin() + (first_id + rows) * hidden);
    ASSERT_TRUE(cpu_.EmbeddingShard(
                        TensorView(shard.data(), DType::kF32, {rows, hidden}),
                        StepArray(ids), first_id,
                        TensorView(want.data(), DType::kF32, {tokens, hidden}))
                    .ok());
    DeviceBuffer dshard(shard);
    ASSERT_EQ(
        cuda::LaunchEmbedding(dshard.get(), false, dids.get(), tokens, hidden,
                              first_id, rows, dout.get(), nullptr),
        cudaSuccess);
    EXPECT_EQ(dout.Download(), want) << "hidden=" << hidden;
    // bf16 shard, widened exactly.
    std::vector<uint16_t> table_bf16(table.size());
    for (size_t i = 0; i < table.size(); ++i)
      table_bf16[i] = ToBF16Rne(table[i]);
    DeviceArray<uint16_t> dtable_bf16(table_bf16);
    // The shard is rows first_id .. first_id + rows - 1 of the full table.
    ASSERT_EQ(cuda::LaunchEmbedding(dtable_bf16.get() + first_id * hidden, true,
                                    dids.get(), tokens, hidden, first_id, rows,
                                    dout.get(), nullptr),
              cudaSuccess);
    const std::vector<float> got = dout.Download();
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t local = ids[t] - first_id;
      for (int64_t i = 0; i < hidden; ++i) {
        const float expect =
            local >= 0 && local < rows
                ? FromBits(
                      static_cast<uint32_t>(table_bf16[(ids[t] * hidden) + i])
                      << 16)
                : 0.0f;
        ASSERT_EQ(got[t * hidden + i], expect)
            << "hidden=" << hidden << " t=" << t << " i=" << i;
      }
    }
  }
}

TEST_F(CudaElementwiseTest, AddMatchesCpuAndMayAlias) {
  for (int64_t n : {1, 1000, 100003}) {
    std::vector<float> a = Random(n), b = Random(n);
    std::vector<float> want(n);
    ASSERT_TRUE(cpu_.Add(TensorView(a.data(), DType::kF32, {n}),
                         TensorView(b.data(), DType::kF32, {n}),
                         TensorView(want.data(), DType::kF32, {n}))
                    .ok());
    DeviceBuffer da(a), db(b), dout(std::vector<float>(n, NAN));
    ASSERT_EQ(cuda::LaunchAdd(da.get(), db.get(), n, dout.get(), nullptr),
              cudaSuccess);
    EXPECT_EQ(dout.Download(), want) << "n=" << n;
    ASSERT_EQ(cuda::LaunchAdd(da.get(), db.get(), n, da.get(), nullptr),
              cudaSuccess);
    EXPECT_EQ(da.Download(), want) << "n=" << n << " (out aliases a)";
  }
}

TEST_F(CudaElementwiseTest, AddRmsNormMatchesCpu) {
  for (int64_t n : {7, 64, 1000, 4096, 5120, 12288, 20480, 40000}) {
    for (bool alias : {false, true}) {
      const int64_t rows = 5;
      std::vector<float> residual = Random(rows * n), x = Random(rows * n),
                         w = Random(n);
      std::vector<float> want_residual(rows * n), want(rows * n);
      ASSERT_TRUE(
          cpu_.Add(TensorView(residual.data(), DType::kF32, {rows, n}),
                   TensorView(x.data(), DType::kF32, {rows, n}),
                   TensorView(want_residual.data(), DType::kF32, {rows, n}))
              .ok());
      ASSERT_TRUE(
          cpu_.RmsNorm(TensorView(want_residual.data(), DType::kF32, {rows, n}),
                       TensorView(w.data(), DType::kF32, {n}), 1e-6f,
                       TensorView(want.data(), DType::kF32, {rows, n}))
              .ok());
      DeviceBuffer dres(residual), dx(x), dw(w),
          dout(std::vector<float>(rows * n, NAN));
      float* out = alias ? dx.get() : dout.get();
      ASSERT_EQ(cuda::LaunchAddRmsNorm(dres.get(), dx.get(), dw.get(), 1e-6f,
                                       rows, n, out, nullptr),
                cudaSuccess);
      EXPECT_EQ(dres.Download(), want_residual) << "n=" << n;
      const std::vector<float> got = alias ? dx.Download() : dout.Download();
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i])))
            << "n=" << n << " alias=" << alias << " i=" << i;
      }
    }
  }
}

TEST_F(CudaElementwiseTest, RopeMatchesCpu) {
  struct Shape3 {
    int64_t tokens, heads, dim;
  };
  for (const Shape3& s : {Shape3{1, 1, 2}, Shape3{7, 3, 64}, Shape3{33, 8, 128},
                          Shape3{5, 2, 6}}) {
    std::vector<float> x = Random(s.tokens * s.heads * s.dim);
    std::vector<float> inv_freq(s.dim / 2);
    for (int64_t i = 0; i < s.dim / 2; ++i) {
      inv_freq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) /
                                                  static_cast<float>(s.dim));
    }
    std::uniform_int_distribution<int32_t> pos(0, 32767);
    std::vector<int32_t> positions(s.tokens);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = 0;
    DeviceBuffer dx(x), dfreq(inv_freq);
    DeviceArray<int32_t> dpos(positions);
    ASSERT_TRUE(
        cpu_.Rope(TensorView(x.data(), DType::kF32, {s.tokens, s.heads, s.dim}),
                  StepArray(positions),
                  TensorView(inv_freq.data(), DType::kF32, {s.dim / 2}))
            .ok());
    ASSERT_EQ(cuda::LaunchRope(dx.get(), dpos.get(), dfreq.get(), s.tokens,
                               s.heads, s.dim, nullptr),
              cudaSuccess);
    const std::vector<float> got = dx.Download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], x[i], 1e-5f * (1.0f + std::fabs(x[i])))
          << "tokens=" << s.tokens << " heads=" << s.heads << " dim=" << s.dim
          << " i=" << i;
    }
  }
}

TEST_F(CudaElementwiseTest, BiasAddMatchesCpu) {
  for (int64_t rows : {1, 5}) {
    for (int64_t n : {1, 7, 4096}) {
      std::vector<float> x = Random(rows * n), bias = Random(n);
      DeviceBuffer dx(x), dbias(bias);
      ASSERT_TRUE(cpu_.BiasAdd(TensorView(x.data(), DType::kF32, {rows, n}),
                               TensorView(bias.data(), DType::kF32, {n}))
                      .ok());
      ASSERT_EQ(cuda::LaunchBiasAdd(dx.get(), dbias.get(), rows, n, nullptr),
                cudaSuccess);
      EXPECT_EQ(dx.Download(), x) << "rows=" << rows << " n=" << n;
    }
  }
}

TEST_F(CudaElementwiseTest, CastF32ToBF16RoundsToNearestEven) {
  std::vector<float> in = Random(100001);
  // Wide magnitudes, halfway cases (odd and even), specials.
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 20000; ++i) {
    uint32_t b = any_bits(rng_);
    if (i % 3 == 0) b = (b & 0xffff0000u) | 0x8000u;  // exactly halfway
    in.push_back(FromBits(b));
  }
  for (float f :
       {0.0f, -0.0f, 1.0f, -1.0f, 1e-40f, -1e-40f,
        std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
        std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(), FromBits(0x3f808000u),
        FromBits(0x3f818000u), FromBits(0x7f7f8000u)}) {
    in.push_back(f);
  }
  const int64_t n = in.size();
  DeviceBuffer din(in);
  DeviceArray<uint16_t> dout(std::vector<uint16_t>(n, 0));
  ASSERT_EQ(cuda::LaunchCastF32ToBF16(din.get(), dout.get(), n, nullptr),
            cudaSuccess);
  const std::vector<uint16_t> got = dout.Download();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(in[i])) {
      ASSERT_TRUE(IsBF16NaN(got[i])) << i;
    } else {
      ASSERT_EQ(got[i], ToBF16Rne(in[i]))
          << "i=" << i << " bits=" << std::hex << Bits(in[i]);
    }
  }
}

TEST_F(CudaElementwiseTest, CastBF16ToF32IsExact) {
  std::vector<uint16_t> in(65536 + 3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  const int64_t n = in.size();
  DeviceArray<uint16_t> din(in);
  DeviceBuffer dout(std::vector<float>(n, 0.0f));
  ASSERT_EQ(cuda::LaunchCastBF16ToF32(din.get(), dout.get(), n, nullptr),
            cudaSuccess);
  const std::vector<float> got = dout.Download();
  for (int64_t i = 0; i < n; ++i) {
    if (IsBF16NaN(in[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << i;
    } else {
      ASSERT_EQ(Bits(got[i]), static_cast<uint32_t>(in[i]) << 16) << i;
    }
  }
}

TEST_F(CudaElementwiseTest, GatherRowsCopiesTheChosenRows) {
  const int64_t src_rows = 50;
  for (int64_t row_elems : {1, 7, 1000}) {
    const std::vector<float> src = Random(src_rows * row_elems);
    std::uniform_int_distribution<int32_t> row(0, src_rows - 1);
    std::vector<int32_t> rows(17);
    for (int32_t& r : rows) r = row(rng_);
    rows[3] = rows[4];  // Repeats are allowed.
    const int64_t num_rows = rows.size();
    DeviceBuffer dsrc(src), ddst(std::vector<float>(num_rows * row_elems, NAN));
    DeviceArray<int32_t> drows(rows);
    ASSERT_EQ(cuda::LaunchGatherRows(dsrc.get(), drows.get(), num_rows,
                                     row_elems, ddst.get(), nullptr),
              cudaSuccess);
    std::vector<float> want;
    for (int32_t r : rows) {
      want.insert(want.end(), src.begin() + r * row_elems,
                  src.begin() + (r + 1) * row_elems);
    }
    EXPECT_EQ(ddst.Download(), want) << "row_elems=" << row_elems;
  }
}

}  // namespace
}  // namespace tessera
