// The split decode (decode_attention.h) against the CPU reference (CpuOps::
// DecodeAttention) on fresh random batches: lengths 1..9000 (one beyond
// kDecodeMaxSplits * kDecodeMinSplitKeys keys, so splits grow), GQA groups
// 1..8 (3: a group below its kernel's), D 64 and 128, block sizes 16, 24 (not
// a power of two) and 32, sliding windows, f32, bf16 and fp8 caches (fp8:
// the CPU runs on the same e4m3 bytes and per-head scales); the cache's
// unused slots are NaN, so a read of a wrong slot fails loudly. Padded
// sequences (seq_len 0, block table -1: attention_metadata.h, graph-safe steps
// 2) must come out as zeros. Graph safety: the same launch with a larger
// grid_max_seq_len, and each sequence in a smaller batch, give bitwise the same
// output. Through CudaOps: the dispatch (split decode for bf16 D 128, the old
// kernel for f32 D 96) against the CPU after ReserveStepScratch, at a graph's
// grid bound. The dispatch rule and the launcher's argument checks run without
// a GPU too.
#include "kernels/cuda/attention/decode_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention_metadata.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/cuda_ops_fixture.h"
#include "kernels/cuda/testing/device_array.h"
#include "runtime/core/dtype.h"
#include "runtime/core/memory.h"

namespace tessera {
namespace {

using cuda::KvDType;
using testing_cuda::DeviceArray;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

#define ASSERT_CUDA_OK(expr)                                 \
  do {                                                       \
    const cudaError_t cuda_error_ = (expr);                  \
    ASSERT_EQ(cuda_error_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(cuda_error_); \
  } while (0)

uint16_t ToBf16Bits(float x) {  // Round to nearest even; NaN stays NaN.
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if (std::isnan(x)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float Bf16ToFloat(uint16_t bits);
float RoundToBf16(float x) { return Bf16ToFloat(ToBf16Bits(x)); }
float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

struct Config {
  int32_t heads = 32;
  int32_t kv_heads = 8;
  int32_t dim = 128;
  int32_t block_size = 16;
  int64_t window = 0;
  KvDType dtype = KvDType::kBF16;
  float softcap = 0.0f;  // 0: none.
  std::string ToString() const {
    return absl::StrCat("heads=", heads, " kv_heads=", kv_heads, " D=", dim,
                        " block=", block_size, " window=", window, " cache=",
                        dtype == KvDType::kBF16     ? "bf16"
                        : dtype == KvDType::kF8E4M3 ? "fp8"
                                                    : "f32",
                        " softcap=", softcap);
  }
};

cuda::DeviceKvLayer Layer(const Config& c, void* k, void* v, int64_t num_slots,
                          float* k_scale = nullptr, float* v_scale = nullptr) {
  cuda::DeviceKvLayer l;
  l.k = k;
  l.v = v;
  l.k_scale = k_scale;
  l.v_scale = v_scale;
  l.dtype = c.dtype;
  l.num_slots = num_slots;
  l.num_kv_heads = c.kv_heads;
  l.head_dim = c.dim;
  l.head_dim_v = c.dim;
  return l;
}

// A decode step of real sequences (seq_len = context + 1) followed by
// `padded` sequences of seq_len 0, on both sides.
class DecodeStep {
 public:
  DecodeStep(const Config& c, const std::vector<int64_t>& contexts,
             int32_t padded, std::mt19937& rng)
      : c_(c), real_(static_cast<int32_t>(contexts.size())), padded_(padded) {
    int64_t blocks = 0;
    for (int64_t ctx : contexts) blocks += ctx / c.block_size + 1;
    num_blocks_ = blocks + 5;
    std::vector<int32_t> ids(num_blocks_);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<std::vector<int32_t>> tables;
    size_t next = 0;
    for (int64_t ctx : contexts) {
      const int64_t n = ctx / c.block_size + 1;
      tables.emplace_back(ids.begin() + next, ids.begin() + next + n);
      next += n;
    }
    std::vector<SequenceSlice> slices;
    for (int32_t s = 0; s < real_; ++s)
      slices.push_back({contexts[s], 1, tables[s]});
    auto m = BuildAttentionMetadata(slices, c.block_size, num_blocks_);
    EXPECT_TRUE(m.ok()) << m.status();
    m_ = *std::move(m);
    host_view_ = m_.View();

    // The cache: every position of a sequence random, the rest NaN.
    num_slots_ = num_blocks_ * c.block_size;
    const int64_t row = int64_t{c.kv_heads} * c.dim;
    kf_.assign(num_slots_ * row, kNaN);
    vf_.assign(num_slots_ * row, kNaN);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int32_t s = 0; s < real_; ++s) {
      for (int64_t p = 0; p < m_.seq_lens[s]; ++p) {
        const int64_t slot = m_.Slot(s, p);
        for (int64_t i = 0; i < row; ++i) {
          kf_[slot * row + i] = 2.0f * normal(rng);
          vf_[slot * row + i] = normal(rng);
        }
      }
    }
    if (c.dtype == KvDType::kF8E4M3) {
      // e4m3 bytes under per-head scales (not powers of two), as a store
      // writes them (F32ToFp8E4M3(x / scale), the CUDA store's bits:
      // attention_kernels_test); unused slots hold NaN's 0x7f. Both sides
      // read these bytes.
      for (int32_t h = 0; h < c.kv_heads; ++h) {
        ks_.push_back(0.3f + 0.4f * static_cast<float>(h % 5));
        vs_.push_back(1.9f - 0.3f * static_cast<float>(h % 4));
      }
      k8_.resize(kf_.size());
      v8_.resize(vf_.size());
      for (size_t i = 0; i < kf_.size(); ++i) {
        const size_t h = (i / c.dim) % c.kv_heads;
        k8_[i] = F32ToFp8E4M3(kf_[i] / ks_[h]);
        v8_[i] = F32ToFp8E4M3(vf_[i] / vs_[h]);
      }
      dk8_ = std::make_unique<DeviceArray<uint8_t>>(k8_);
      dv8_ = std::make_unique<DeviceArray<uint8_t>>(v8_);
      dks_ = std::make_unique<DeviceArray<float>>(ks_);
      dvs_ = std::make_unique<DeviceArray<float>>(vs_);
      device_cache_ = Layer(c, dk8_->get(), dv8_->get(), num_slots_,
                            dks_->get(), dvs_->get());
    } else if (c.dtype == KvDType::kBF16) {
      std::vector<uint16_t> kb(kf_.size()), vb(vf_.size());
      for (size_t i = 0; i < kf_.size(); ++i) {
        kb[i] = ToBf16Bits(kf_[i]);
        vb[i] = ToBf16Bits(vf_[i]);
        kf_[i] = Bf16ToFloat(kb[i]);  // The CPU sees the rounded values.
        vf_[i] = Bf16ToFloat(vb[i]);
      }
      dk16_ = std::make_unique<DeviceArray<uint16_t>>(kb);
      dv16_ = std::make_unique<DeviceArray<uint16_t>>(vb);
      device_cache_ = Layer(c, dk16_->get(), dv16_->get(), num_slots_);
    } else {
      dk32_ = std::make_unique<DeviceArray<float>>(kf_);
      dv32_ = std::make_unique<DeviceArray<float>>(vf_);
      device_cache_ = Layer(c, dk32_->get(), dv32_->get(), num_slots_);
    }

    // Queries for every row, padded ones too.
    q_.resize(int64_t{total()} * c.heads * c.dim);
    for (float& x : q_) x = normal(rng);
    dq_ = std::make_unique<DeviceArray<float>>(q_);

    // Device metadata: the real sequences, then the padded ones.
    std::vector<int32_t> qsl = m_.query_start_loc, ctx = m_.context_lens,
                         lens = m_.seq_lens, bt = m_.block_tables;
    for (int32_t i = 0; i < padded_; ++i) {
      qsl.push_back(qsl.back() + 1);
      ctx.push_back(0);
      lens.push_back(0);
      bt.insert(bt.end(), m_.max_blocks_per_seq, -1);
    }
    dqsl_ = std::make_unique<DeviceArray<int32_t>>(qsl);
    dctx_ = std::make_unique<DeviceArray<int32_t>>(ctx);
    dlens_ = std::make_unique<DeviceArray<int32_t>>(lens);
    dbt_ = std::make_unique<DeviceArray<int32_t>>(bt);
    dm_.query_start_loc = dqsl_->get();
    dm_.context_lens = dctx_->get();
    dm_.seq_lens = dlens_->get();
    dm_.block_tables = dbt_->get();
    dm_.max_blocks_per_seq = m_.max_blocks_per_seq;
    dm_.block_size = c.block_size;
    dm_.num_seqs = total();
    dm_.num_tokens = total();
    dm_.max_query_len = 1;
    dm_.max_seq_len = m_.max_seq_len;
  }

  int32_t total() const { return real_ + padded_; }
  int32_t real() const { return real_; }
  int64_t row_floats() const { return int64_t{c_.heads} * c_.dim; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c_.dim)); }

  // The CPU's output rows of the real sequences.
  std::vector<float> Reference() {
    std::vector<float> out(int64_t{real_} * row_floats(), kNaN);
    const int64_t kvh = c_.kv_heads;
    PagedAttentionArgs a;
    a.q = TensorView(q_.data(), DType::kF32, {m_.num_tokens, c_.heads, c_.dim});
    a.cache.k = TensorView(kf_.data(), DType::kF32, {num_slots_, kvh, c_.dim});
    a.cache.v = TensorView(vf_.data(), DType::kF32, {num_slots_, kvh, c_.dim});
    if (c_.dtype == KvDType::kF8E4M3) {  // The CPU's own fp8 cache.
      a.cache.k =
          TensorView(k8_.data(), DType::kF8E4M3, {num_slots_, kvh, c_.dim});
      a.cache.v =
          TensorView(v8_.data(), DType::kF8E4M3, {num_slots_, kvh, c_.dim});
      a.cache.k_scale = TensorView(ks_.data(), DType::kF32, {kvh});
      a.cache.v_scale = TensorView(vs_.data(), DType::kF32, {kvh});
    }
    a.metadata = &host_view_;
    a.first_seq = 0;
    a.end_seq = real_;
    a.out =
        TensorView(out.data(), DType::kF32, {m_.num_tokens, c_.heads, c_.dim});
    a.sliding_window = c_.window;
    a.scale = scale();
    a.softcap = c_.softcap;
    const absl::Status st = cpu_.DecodeAttention(a);
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  // The device's output of sequences [first, end) (all rows; the others
  // stay NaN) under grid bound `grid_max` (0: max_seq_len).
  std::vector<float> Run(int32_t first, int32_t end, int32_t grid_max) {
    cuda::DeviceAttentionMetadata dm = dm_;
    dm.grid_max_seq_len = grid_max;
    int64_t max_keys = grid_max > 0 ? grid_max : dm.max_seq_len;
    if (c_.window > 0 && c_.window < max_keys) max_keys = c_.window;
    const size_t ws_bytes = cuda::DecodeSplitWorkspaceBytes(
        end - first, c_.heads, c_.dim, max_keys);
    DeviceArray<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
    DeviceArray<float> out(
        std::vector<float>(int64_t{total()} * row_floats(), kNaN));
    const cudaError_t e = cuda::LaunchSplitDecodeAttention(
        dq_->get(), c_.heads, device_cache_, dm, first, end, c_.window, scale(),
        c_.softcap, out.get(), ws.get(), ws_bytes, nullptr);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    return out.Download();
  }

 private:
  Config c_;
  int32_t real_, padded_;
  int64_t num_blocks_ = 0, num_slots_ = 0;
  HostAttentionMetadata m_;
  AttentionMetadata host_view_;
  std::vector<float> kf_, vf_, q_;
  std::vector<uint8_t> k8_, v8_;  // fp8: the cache's bytes ...
  std::vector<float> ks_, vs_;    // ... and per-head scales.
  std::unique_ptr<DeviceArray<uint8_t>> dk8_, dv8_;
  std::unique_ptr<DeviceArray<float>> dks_, dvs_;
  std::unique_ptr<DeviceArray<uint16_t>> dk16_, dv16_;
  std::unique_ptr<DeviceArray<float>> dk32_, dv32_, dq_;
  std::unique_ptr<DeviceArray<int32_t>> dqsl_, dctx_, dlens_, dbt_;
  cuda::DeviceKvLayer device_cache_;
  cuda::DeviceAttentionMetadata dm_;
  CpuOps cpu_;
};

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

class DecodeAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }

  // The fp8 tests draw fresh inputs each run (the others keep their fixed
  // seed); the seed is printed so that a failure can be reproduced.
  void FreshSeed() {
    const uint32_t seed = std::random_device{}();
    rng_.seed(seed);
    RecordProperty("seed", std::to_string(seed));
    std::cerr << "seed " << seed << "\n";
  }

  void Check(const Config& c, std::vector<int64_t> contexts, int32_t padded) {
    SCOPED_TRACE(c.ToString());
    DecodeStep step(c, contexts, padded, rng_);
    const std::vector<float> want = step.Reference();
    const std::vector<float> got = step.Run(0, step.total(), 0);
    const int64_t rf = step.row_floats();
    // f32 sums against f32 sums of the same values (bf16 and fp8: the CPU
    // reads the same stored numbers), in another order and base 2 with an
    // approximate exp2: 2e-4 of the output's scale.
    const float tol = 2e-4f;
    int64_t bad = 0;
    for (int64_t i = 0; i < int64_t{step.real()} * rf; ++i) {
      const float err = std::fabs(got[i] - want[i]);
      if (!(err <= tol * std::max(1.0f, std::fabs(want[i]))) && ++bad <= 5) {
        ADD_FAILURE() << "seq " << i / rf << " (context " << contexts[i / rf]
                      << ") out[" << i % rf << "] = " << got[i] << ", CPU "
                      << want[i];
      }
    }
    EXPECT_EQ(bad, 0) << bad << " outputs differ from the CPU";
    for (int64_t i = int64_t{step.real()} * rf; i < int64_t{step.total()} * rf;
         ++i) {
      if (!SameBits(got[i], 0.0f) && ++bad <= 5) {
        ADD_FAILURE() << "padded row " << i / rf << " out[" << i % rf
                      << "] = " << got[i] << ", want 0";
      }
    }
    EXPECT_EQ(bad, 0);
    // A larger grid bound (a graph captured for the rank's max context):
    // bitwise the same.
    const int32_t max_len = static_cast<int32_t>(
        *std::max_element(contexts.begin(), contexts.end()) + 1);
    const std::vector<float> wide =
        step.Run(0, step.total(), 3 * max_len + 777);
    int64_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += !SameBits(got[i], wide[i]);
    EXPECT_EQ(diff, 0) << "grid_max_seq_len changed " << diff << " outputs";
    // Each sequence in a smaller batch (the second half, alone): bitwise the
    // same rows, and the rows outside untouched.
    const int32_t first = step.real() / 2;
    const std::vector<float> part = step.Run(first, step.real(), 0);
    diff = 0;
    for (int64_t i = 0; i < int64_t{step.total()} * rf; ++i) {
      const bool inside = i >= first * rf && i < int64_t{step.real()} * rf;
      diff += inside ? !SameBits(got[i], part[i]) : !std::isnan(part[i]);
    }
    EXPECT_EQ(diff, 0) << "a smaller batch changed " << diff << " outputs";
  }

  std::vector<int64_t> RandomContexts(int n, int64_t max_ctx) {
    std::uniform_int_distribution<int64_t> len(0, max_ctx);
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(len(rng_));
    return out;
  }

  std::mt19937 rng_{20261201};
};

Config Make(int32_t heads, int32_t kv_heads, int32_t dim, int32_t block,
            KvDType dtype, int64_t window = 0) {
  Config c;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.dim = dim;
  c.block_size = block;
  c.dtype = dtype;
  c.window = window;
  return c;
}

TEST_F(DecodeAttentionTest, Bf16GroupsAndDims) {
  for (int32_t dim : {64, 128}) {
    for (auto [h, kvh] : std::vector<std::pair<int32_t, int32_t>>{
             {8, 8}, {16, 8}, {32, 8}, {32, 4}, {6, 2}}) {
      std::vector<int64_t> ctx = RandomContexts(5, 5000);
      ctx.push_back(0);    // One key.
      ctx.push_back(255);  // Exactly one split.
      ctx.push_back(256);  // Two.
      Check(Make(h, kvh, dim, 16, KvDType::kBF16), ctx, /*padded=*/3);
    }
  }
}

// fp8 (e4m3, per-head scales): every GQA kernel and both dims, contexts of
// one key, one split and two, padded rows.
TEST_F(DecodeAttentionTest, Fp8GroupsAndDims) {
  FreshSeed();
  for (int32_t dim : {64, 128}) {
    for (auto [h, kvh] : std::vector<std::pair<int32_t, int32_t>>{
             {8, 8}, {16, 8}, {32, 8}, {32, 4}, {6, 2}, {64, 8}}) {
      std::vector<int64_t> ctx = RandomContexts(5, 5000);
      ctx.push_back(0);
      ctx.push_back(255);
      ctx.push_back(256);
      Check(Make(h, kvh, dim, 16, KvDType::kF8E4M3), ctx, /*padded=*/3);
    }
  }
}

TEST_F(DecodeAttentionTest, F32GroupsAndDims) {
  for (int32_t dim : {64, 128}) {
    for (auto [h, kvh] :
         std::vector<std::pair<int32_t, int32_t>>{{4, 4}, {16, 4}, {16, 2}}) {
      Check(Make(h, kvh, dim, 32, KvDType::kF32), RandomContexts(6, 5000), 2);
    }
  }
}

TEST_F(DecodeAttentionTest, BlockSizesAndWindows) {
  for (int32_t block : {16, 24, 32}) {
    for (int64_t window : {0, 1, 300, 1000}) {
      Check(Make(16, 4, 128, block, KvDType::kBF16, window),
            RandomContexts(5, 3000), 1);
    }
  }
  Check(Make(8, 2, 64, 24, KvDType::kF32, 700), RandomContexts(5, 3000), 1);
  for (int32_t block : {16, 24}) {
    for (int64_t window : {0, 1, 300}) {
      Check(Make(16, 4, 128, block, KvDType::kF8E4M3, window),
            RandomContexts(5, 3000), 1);
    }
  }
}

// Gemma 2's attention logit soft cap, small enough to bind (scaled scores
// here are of order 2): every GQA kernel, both dims and caches, windows, and
// contexts of many splits.
TEST_F(DecodeAttentionTest, Softcap) {
  for (float cap : {0.5f, 4.0f}) {
    for (int32_t dim : {64, 128}) {
      Config c = Make(16, 4, dim, 16, KvDType::kBF16);
      c.softcap = cap;
      Check(c, RandomContexts(5, 5000), /*padded=*/2);
      c = Make(8, 8, dim, 24, KvDType::kF32, /*window=*/300);
      c.softcap = cap;
      Check(c, RandomContexts(4, 3000), 1);
    }
  }
  Config c = Make(32, 8, 128, 16, KvDType::kBF16);
  c.softcap = 1.0f;
  Check(c, {8192, 9000, 100, 4095}, 1);
  c = Make(16, 4, 64, 16, KvDType::kF8E4M3, /*window=*/300);
  c.softcap = 0.5f;
  Check(c, RandomContexts(5, 5000), 1);
}

TEST_F(DecodeAttentionTest, LongContextsGrowTheSplits) {
  // 8193+ keys: splits of 512 and more keys (at most kDecodeMaxSplits).
  Check(Make(32, 8, 128, 16, KvDType::kBF16), {8192, 9000, 100, 4095}, 2);
  Check(Make(8, 1, 64, 32, KvDType::kF32), {8192, 8191, 1}, 0);
  Check(Make(32, 8, 128, 16, KvDType::kF8E4M3), {8192, 9000, 100, 4095}, 2);
}

TEST_F(DecodeAttentionTest, OnlyPaddedSequences) {
  DecodeStep step(Make(32, 8, 128, 16, KvDType::kBF16), {5}, 4, rng_);
  const std::vector<float> got = step.Run(1, step.total(), 0);
  const int64_t rf = step.row_floats();
  int64_t bad = 0;
  for (int64_t i = rf; i < int64_t{step.total()} * rf; ++i)
    bad += !SameBits(got[i], 0.0f);
  EXPECT_EQ(bad, 0);
}

// Through CudaOps::DecodeAttention (the dispatch rule): a bf16 or fp8 cache of
// D 128 takes the split decode, an f32 or fp8 cache of D 96 the old kernel
// (fp8 through the KvCacheLayer's per-head scales); all against
// CpuOps, after ReserveStepScratch sized the decode workspace for the rank's
// limits and with a graph's grid bound (the limits' context), so a step at
// the bound needs no workspace growth.
class CudaOpsDecodeTest : public testing_cuda::CudaOpsFixture {
 protected:
  std::mt19937 rng_{77};
};

TEST_F(CudaOpsDecodeTest, DispatchMatchesCpu) {
  constexpr int32_t kHeads = 16, kKvHeads = 4, kBlock = 16, kLimit = 8192;
  StepLimits limits;
  limits.max_tokens = 8;
  limits.max_seqs = 8;
  limits.max_seq_len = kLimit;
  limits.max_heads = kHeads;
  limits.max_head_dim = 128;
  limits.max_linear_in = 64;
  limits.vocab_size = 64;
  ASSERT_TRUE(gpu_->ReserveStepScratch(limits).ok());
  for (auto [dim, dtype, softcap] :
       std::vector<std::tuple<int32_t, DType, float>>{
           {128, DType::kBF16, 0.0f},
           {96, DType::kF32, 0.0f},
           {128, DType::kBF16, 0.7f},
           {96, DType::kF32, 0.7f},
           {128, DType::kF8E4M3, 0.0f},
           {96, DType::kF8E4M3, 0.7f}}) {
    SCOPED_TRACE(absl::StrCat("D=", dim, " cache=", DTypeName(dtype),
                              " softcap=", softcap));
    const std::vector<int64_t> contexts = {3000, 17, 900, 0, 5000};
    int64_t blocks = 0;
    std::vector<std::vector<int32_t>> tables;
    for (int64_t ctx : contexts) {
      const int64_t n = ctx / kBlock + 1;
      std::vector<int32_t> t(n);
      std::iota(t.begin(), t.end(), static_cast<int32_t>(blocks));
      std::shuffle(t.begin(), t.end(), rng_);
      blocks += n;
      tables.push_back(std::move(t));
    }
    std::vector<SequenceSlice> slices;
    for (size_t s = 0; s < contexts.size(); ++s)
      slices.push_back({contexts[s], 1, tables[s]});
    auto built = BuildAttentionMetadata(slices, kBlock, blocks);
    ASSERT_TRUE(built.ok()) << built.status();
    const HostAttentionMetadata& m = *built;
    const AttentionMetadata host_view = m.View();
    const int64_t slots = blocks * kBlock;
    const int64_t t = m.num_tokens;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> k(slots * kKvHeads * dim), v(k.size()),
        q(t * kHeads * dim);
    for (float& x : k)
      x = dtype == DType::kBF16 ? RoundToBf16(normal(rng_)) : normal(rng_);
    for (float& x : v)
      x = dtype == DType::kBF16 ? RoundToBf16(normal(rng_)) : normal(rng_);
    for (float& x : q) x = normal(rng_);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));

    std::vector<float> want(q.size(), kNaN);
    PagedAttentionArgs a;
    a.q = TensorView(q.data(), DType::kF32, {t, kHeads, dim});
    a.cache.k = TensorView(k.data(), DType::kF32, {slots, kKvHeads, dim});
    a.cache.v = TensorView(v.data(), DType::kF32, {slots, kKvHeads, dim});
    // fp8: both sides on the same bytes and per-head scales.
    const bool fp8 = dtype == DType::kF8E4M3;
    std::vector<uint8_t> k8, v8;
    std::vector<float> ks, vs;
    if (fp8) {
      for (int32_t h = 0; h < kKvHeads; ++h) {
        ks.push_back(0.6f + 0.3f * static_cast<float>(h));
        vs.push_back(1.3f - 0.2f * static_cast<float>(h));
      }
      for (size_t i = 0; i < k.size(); ++i) {
        const size_t h = (i / dim) % kKvHeads;
        k8.push_back(F32ToFp8E4M3(k[i] / ks[h]));
        v8.push_back(F32ToFp8E4M3(v[i] / vs[h]));
      }
      a.cache.k = TensorView(k8.data(), DType::kF8E4M3, {slots, kKvHeads, dim});
      a.cache.v = TensorView(v8.data(), DType::kF8E4M3, {slots, kKvHeads, dim});
      a.cache.k_scale = TensorView(ks.data(), DType::kF32, {kKvHeads});
      a.cache.v_scale = TensorView(vs.data(), DType::kF32, {kKvHeads});
    }
    a.metadata = &host_view;
    a.end_seq = m.num_seqs;
    a.out = TensorView(want.data(), DType::kF32, {t, kHeads, dim});
    a.scale = scale;
    a.softcap = softcap;
    ASSERT_TRUE(CpuOps().DecodeAttention(a).ok());

    // fp8 is no Upload dtype: its bytes and scales are copied as they are.
    const TensorView f32_k(k.data(), DType::kF32, {slots, kKvHeads, dim});
    const TensorView f32_v(v.data(), DType::kF32, {slots, kKvHeads, dim});
    auto dk = gpu_->Upload(f32_k, fp8 ? DType::kF32 : dtype);
    auto dv = gpu_->Upload(f32_v, fp8 ? DType::kF32 : dtype);
    DeviceArray<uint8_t> dk8(fp8 ? k8 : std::vector<uint8_t>(1));
    DeviceArray<uint8_t> dv8(fp8 ? v8 : std::vector<uint8_t>(1));
    DeviceArray<float> dks(fp8 ? ks : std::vector<float>(1));
    DeviceArray<float> dvs(fp8 ? vs : std::vector<float>(1));
    auto dq = gpu_->Upload(a.q, DType::kF32);
    std::vector<float> nan(q.size(), kNaN);
    auto dout = gpu_->Upload(  // NaN: every row must be written.
        TensorView(nan.data(), DType::kF32, {t, kHeads, dim}), DType::kF32);
    ASSERT_TRUE(dk.ok() && dv.ok() && dq.ok() && dout.ok());
    DeviceArray<int32_t> qsl(m.query_start_loc), ctx(m.context_lens),
        lens(m.seq_lens), pos(m.positions), bt(m.block_tables);
    DeviceArray<int64_t> slot_mapping(m.slot_mapping);
    AttentionMetadata dm = host_view;
    auto dev = [](const TensorView& like, void* p) {
      return TensorView(p, like.dtype(), like.shape());
    };
    dm.query_start_loc = dev(host_view.query_start_loc, qsl.get());
    dm.context_lens = dev(host_view.context_lens, ctx.get());
    dm.seq_lens = dev(host_view.seq_lens, lens.get());
    dm.positions = dev(host_view.positions, pos.get());
    dm.slot_mapping = dev(host_view.slot_mapping, slot_mapping.get());
    dm.block_tables = dev(host_view.block_tables, bt.get());
    dm.grid_max_seq_len = kLimit;  // A graph's bound.
    PagedAttentionArgs g = a;
    g.q = dq->view();
    g.cache.k = dk->view();
    g.cache.v = dv->view();
    if (fp8) {
      g.cache.k = TensorView(dk8.get(), DType::kF8E4M3, a.cache.k.shape());
      g.cache.v = TensorView(dv8.get(), DType::kF8E4M3, a.cache.v.shape());
      g.cache.k_scale = TensorView(dks.get(), DType::kF32, {kKvHeads});
      g.cache.v_scale = TensorView(dvs.get(), DType::kF32, {kKvHeads});
    }
    g.metadata = &dm;
    g.out = dout->view();
    const absl::Status st = gpu_->DecodeAttention(g);
    ASSERT_TRUE(st.ok()) << st;
    std::vector<float> got(q.size());
    ASSERT_TRUE(gpu_->CopyToHost(g.out, got.data()).ok());
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float err = std::fabs(got[i] - want[i]);
      if (!(err <= 2e-4f * std::max(1.0f, std::fabs(want[i]))) && ++bad <= 5)
        ADD_FAILURE() << "out[" << i << "] = " << got[i] << ", CPU " << want[i];
    }
    EXPECT_EQ(bad, 0);
  }
}

// Without a GPU too.
TEST(DecodeAttentionRuleTest, SplitSizes) {
  EXPECT_EQ(cuda::DecodeNumSplits(0), 0);
  EXPECT_EQ(cuda::DecodeNumSplits(1), 1);
  EXPECT_EQ(cuda::DecodeNumSplits(256), 1);
  EXPECT_EQ(cuda::DecodeNumSplits(257), 2);
  EXPECT_EQ(cuda::DecodeNumSplits(4096), 16);
  EXPECT_EQ(cuda::DecodeSplitKeys(8193), 512);
  for (int64_t n = 1; n <= 100000; n += 7) {
    const int64_t c = cuda::DecodeSplitKeys(n);
    const int32_t s = cuda::DecodeNumSplits(n);
    ASSERT_GE(s, 1);
    ASSERT_LE(s, cuda::kDecodeMaxSplits);
    ASSERT_LE(s, cuda::DecodeMaxSplits(n));
    ASSERT_LE(s, cuda::DecodeMaxSplits(n + 5000)) << n;
    ASSERT_GE(c * s, n);
    ASSERT_LT(c * (s - 1), n);
  }
}

TEST(DecodeAttentionRuleTest, DispatchRule) {
  cuda::DeviceKvLayer l;
  int dummy = 0;
  l.k = l.v = &dummy;
  l.num_slots = 16;
  l.num_kv_heads = 8;
  l.head_dim = l.head_dim_v = 128;
  for (KvDType d : {KvDType::kF32, KvDType::kBF16}) {
    l.dtype = d;
    EXPECT_TRUE(cuda::DecodeAttentionSupported(l, 32));
    EXPECT_TRUE(cuda::DecodeAttentionSupported(l, 64));    // Group 8.
    EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 128));  // Group 16.
    EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 12));   // Not a multiple.
  }
  l.dtype = KvDType::kI8;  // int8 stays on the old kernel.
  EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 32));
  float scales[8] = {};
  l.dtype = KvDType::kF8E4M3;  // fp8 needs its scales.
  EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 32));
  l.k_scale = l.v_scale = scales;
  EXPECT_TRUE(cuda::DecodeAttentionSupported(l, 32));
  EXPECT_TRUE(cuda::DecodeAttentionSupported(l, 64));
  EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 128));
  l.k_scale = l.v_scale = nullptr;
  l.dtype = KvDType::kBF16;
  l.head_dim = l.head_dim_v = 96;
  EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 32));
  l.head_dim = l.head_dim_v = 256;
  EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 32));
  l.head_dim = 128;
  l.head_dim_v = 64;
  EXPECT_FALSE(cuda::DecodeAttentionSupported(l, 32));
  l.head_dim_v = 64;
  l.head_dim = 64;
  EXPECT_TRUE(cuda::DecodeAttentionSupported(l, 8));
}

TEST(DecodeAttentionRuleTest, LauncherRefusesUnsupportedAndSmallWorkspace) {
  alignas(16) static float buf[64];
  cuda::DeviceKvLayer l;
  l.k = l.v = buf;
  l.num_slots = 16;
  l.num_kv_heads = 2;
  l.head_dim = l.head_dim_v = 128;
  l.dtype = KvDType::kI8;
  cuda::DeviceAttentionMetadata m;
  m.num_seqs = 2;
  m.block_size = 16;
  m.max_blocks_per_seq = 1;
  m.max_seq_len = 4096;
  m.query_start_loc = m.seq_lens = m.block_tables = m.context_lens =
      reinterpret_cast<const int32_t*>(buf);
  EXPECT_EQ(cuda::LaunchSplitDecodeAttention(buf, 8, l, m, 0, 2, 0, 1.0f, 0.0f,
                                             buf, buf, sizeof(buf), nullptr),
            cudaErrorInvalidValue);
  l.dtype = KvDType::kBF16;
  // 16 splits of 4096 keys need far more than 256 bytes.
  EXPECT_EQ(cuda::LaunchSplitDecodeAttention(buf, 8, l, m, 0, 2, 0, 1.0f, 0.0f,
                                             buf, buf, sizeof(buf), nullptr),
            cudaErrorInvalidValue);
  // Misaligned q.
  EXPECT_EQ(cuda::LaunchSplitDecodeAttention(buf + 1, 8, l, m, 0, 2, 0, 1.0f,
                                             0.0f, buf, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::DecodeSplitWorkspaceBytes(2, 8, 128, 256), 0u);
  EXPECT_EQ(cuda::DecodeSplitWorkspaceBytes(2, 8, 128, 4096),
            2u * 8 * 16 * (8 + 128 * 4));
  // The grid bound, not max_seq_len, sizes the workspace.
  m.grid_max_seq_len = 32768;
  m.max_seq_len = 10;
  EXPECT_EQ(cuda::LaunchSplitDecodeAttention(buf, 8, l, m, 0, 2, 0, 1.0f, 0.0f,
                                             buf, buf, sizeof(buf), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tessera
