// CudaOps' fused ops against the CPU reference (CpuOps) on fresh random
// inputs: QkvRopeStore (f32, bf16, int8 and fp8 caches, q/k norms on and off,
// GQA and MQA, head dims 64/128 and a small one, padded tokens with slot -1
// that must leave their slots untouched), its RoPE variants (partial rotary,
// a cos/sin factor, per-sequence dynamic NTK and LongRoPE in a mixed batch)
// and GatedActivation. Prints the fused prologue's time beside the unfused
// ops' at a decode shape. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_metadata.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/cuda_ops_fixture.h"
#include "kernels/cuda/testing/device_array.h"
#include "kernels/testing/step_arrays.h"

namespace tessera {
namespace {

using testing_cuda::DeviceArray;

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float RoundBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

class FusedOpsTest : public testing_cuda::CudaOpsFixture {
 protected:
  std::vector<float> Random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  static TensorView View(const std::vector<float>& v, Shape shape) {
    return TensorView(const_cast<float*>(v.data()), DType::kF32,
                      std::move(shape));
  }
  template <typename T>
  static TensorView DView(const DeviceArray<T>& a, DType dtype, Shape shape) {
    return TensorView(a.get(), dtype, std::move(shape));
  }

  // Fresh inputs every run; QkvRopeStoreMatchesTheCpu prints the seed.
  uint32_t seed_ = std::random_device{}();
  std::mt19937 rng_{seed_};
  CpuOps cpu_;
};

struct QkvCase {
  int64_t heads, kv_heads, dim;
  bool norm;
  DType cache;
};

constexpr uint8_t kSentinel = 0x5a;

TEST_F(FusedOpsTest, QkvRopeStoreMatchesTheCpu) {
  std::cerr << "seed " << seed_ << "\n";
  RecordProperty("seed", std::to_string(seed_));
  const QkvCase cases[] = {
      {32, 8, 128, false, DType::kF32},   {32, 8, 128, true, DType::kBF16},
      {32, 8, 128, true, DType::kI8},     {8, 8, 64, true, DType::kF32},
      {8, 1, 64, false, DType::kBF16},    {16, 2, 64, false, DType::kI8},
      {4, 2, 8, true, DType::kI8},        {16, 8, 128, false, DType::kBF16},
      {32, 8, 128, true, DType::kF8E4M3}, {8, 1, 64, false, DType::kF8E4M3},
      {4, 2, 8, true, DType::kF8E4M3},
  };
  for (const QkvCase& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << c.heads << "/" << c.kv_heads << " D " << c.dim << " norm "
                 << c.norm << " " << DTypeName(c.cache));
    const int64_t T = 37, S = 96, H = c.heads, Hkv = c.kv_heads, D = c.dim;
    const int64_t row = (H + 2 * Hkv) * D;
    const std::vector<float> qkv = Random(static_cast<size_t>(T * row), 2.0f);
    std::vector<float> q_norm = Random(D), k_norm = Random(D);
    std::vector<float> inv_freq(D / 2);
    for (int64_t i = 0; i < D / 2; ++i) {
      inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
    }
    std::vector<int32_t> positions(T);
    std::uniform_int_distribution<int32_t> pos_dist(0, 5000);
    for (int32_t& p : positions) p = pos_dist(rng_);
    // Distinct slots; every fifth token is padding (-1).
    std::vector<int64_t> order(S);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);
    std::vector<int64_t> slots(T);
    for (int64_t t = 0; t < T; ++t) slots[t] = t % 5 == 3 ? -1 : order[t];

    // CPU: an f32 cache stands in for bf16 (rounded when compared).
    const bool int8 = c.cache == DType::kI8;
    const bool fp8 = c.cache == DType::kF8E4M3;
    const DType cpu_dtype = int8 || fp8 ? c.cache : DType::kF32;
    Tensor ck = *Tensor::Zeros(cpu_dtype, {S, Hkv, D});
    Tensor cv = *Tensor::Zeros(cpu_dtype, {S, Hkv, D});
    Tensor cks = *Tensor::Zeros(DType::kF32, {S, Hkv});
    Tensor cvs = *Tensor::Zeros(DType::kF32, {S, Hkv});
    // fp8: the layer's per-head scales (the same on both sides, read only).
    std::vector<float> fks, fvs;
    for (int64_t h = 0; h < Hkv; ++h) {
      fks.push_back(0.4f + 0.3f * static_cast<float>(h % 4));
      fvs.push_back(1.7f - 0.2f * static_cast<float>(h % 5));
    }
    std::vector<float> cq(static_cast<size_t>(T * H * D));
    const TensorView qn = View(q_norm, {D}), kn = View(k_norm, {D});
    QkvRopeStoreArgs a;
    a.qkv = View(qkv, {T, row});
    a.q_norm = c.norm ? &qn : nullptr;
    a.k_norm = c.norm ? &kn : nullptr;
    a.eps = 1e-6f;
    a.positions = StepArray(positions);
    a.inv_freq = View(inv_freq, {D / 2});
    a.slot_mapping = StepArray(slots);
    a.cache = {ck.view(), cv.view(), int8 ? cks.view() : TensorView(),
               int8 ? cvs.view() : TensorView()};
    if (fp8) {
      a.cache.k_scale = View(fks, {Hkv});
      a.cache.v_scale = View(fvs, {Hkv});
    }
    a.q_out = View(cq, {T, H, D});
    ASSERT_TRUE(cpu_.QkvRopeStore(a).ok());

    // GPU.
    const size_t elems = static_cast<size_t>(S * Hkv * D);
    const size_t elem_bytes = DTypeSize(c.cache);
    DeviceArray<uint8_t> gk(
        std::vector<uint8_t>(elems * elem_bytes, kSentinel));
    DeviceArray<uint8_t> gv(
        std::vector<uint8_t>(elems * elem_bytes, kSentinel));
    DeviceArray<float> gks(static_cast<size_t>(S * Hkv));
    DeviceArray<float> gvs(static_cast<size_t>(S * Hkv));
    DeviceArray<float> g_fks(fks), g_fvs(fvs);
    DeviceArray<float> g_qkv(qkv), g_qn(q_norm), g_kn(k_norm), g_freq(inv_freq);
    DeviceArray<int32_t> g_pos(positions);
    DeviceArray<int64_t> g_slots(slots);
    DeviceArray<float> g_q(static_cast<size_t>(T * H * D));
    const TensorView gqn = DView(g_qn, DType::kF32, {D});
    const TensorView gkn = DView(g_kn, DType::kF32, {D});
    QkvRopeStoreArgs g = a;
    g.qkv = DView(g_qkv, DType::kF32, {T, row});
    g.q_norm = c.norm ? &gqn : nullptr;
    g.k_norm = c.norm ? &gkn : nullptr;
    g.positions = DView(g_pos, DType::kI32, {T});
    g.inv_freq = DView(g_freq, DType::kF32, {D / 2});
    g.slot_mapping = DView(g_slots, DType::kI64, {T});
    g.cache = {DView(gk, c.cache, {S, Hkv, D}), DView(gv, c.cache, {S, Hkv, D}),
               int8 ? DView(gks, DType::kF32, {S, Hkv}) : TensorView(),
               int8 ? DView(gvs, DType::kF32, {S, Hkv}) : TensorView()};
    if (fp8) {
      g.cache.k_scale = DView(g_fks, DType::kF32, {Hkv});
      g.cache.v_scale = DView(g_fvs, DType::kF32, {Hkv});
    }
    g.q_out = DView(g_q, DType::kF32, {T, H, D});
    ASSERT_TRUE(gpu_->QkvRopeStore(g).ok());

    // q: f32 on both sides (f32 norm sums on the GPU, double on the CPU).
    const std::vector<float> got_q = g_q.Download();
    for (size_t i = 0; i < cq.size(); ++i) {
      ASSERT_NEAR(got_q[i], cq[i], 2e-5 * (1.0 + std::fabs(cq[i])))
          << "q " << i;
    }
    // The cache: each written slot against the CPU's, each padded token's
    // slot never touched.
    const std::vector<uint8_t> hk = gk.Download(), hv = gv.Download();
    const std::vector<float> hks = gks.Download(), hvs = gvs.Download();
    std::vector<bool> written(S, false);
    for (int64_t t = 0; t < T; ++t) {
      if (slots[t] >= 0) written[slots[t]] = true;
    }
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t e = 0; e < Hkv * D; ++e) {
        const size_t i = static_cast<size_t>(s * Hkv * D + e);
        for (int side = 0; side < 2; ++side) {
          const std::vector<uint8_t>& h = side == 0 ? hk : hv;
          const Tensor& ref = side == 0 ? ck : cv;
          if (!written[s]) {
            for (size_t b = 0; b < elem_bytes; ++b) {
              ASSERT_EQ(h[i * elem_bytes + b], kSentinel)
                  << "slot " << s << " was written";
            }
            continue;
          }
          if (c.cache == DType::kF32) {
            float got;
            std::memcpy(&got, &h[i * 4], 4);
            const float want = ref.data_as<float>()[i];
            ASSERT_NEAR(got, want, 2e-5 * (1.0 + std::fabs(want)))
                << side << " slot " << s << " elem " << e;
          } else if (fp8) {
            const uint8_t got = h[i];
            const uint8_t want = ref.data_as<uint8_t>()[i];
            if (side == 1) {
              // v passes through unchanged: the quotient is the same f32 on
              // both sides, so the bytes are (StoreKvCache's rule).
              ASSERT_EQ(got, want) << "v slot " << s << " elem " << e;
            } else {
              // k is normed and rotated first (f32 on the GPU, its own
              // sums and cos/sin on the CPU: last-bit differences), so a
              // value near a rounding boundary may land one e4m3 step away:
              // same sign, adjacent magnitude codes (monotonic in e4m3).
              const bool same_sign = (got & 0x80) == (want & 0x80) ||
                                     (got & 0x7f) == 0 || (want & 0x7f) == 0;
              ASSERT_TRUE(same_sign &&
                          std::abs(int{got & 0x7f} - int{want & 0x7f}) <= 1)
                  << "k slot " << s << " elem " << e << ": 0x" << std::hex
                  << int{got} << " vs CPU 0x" << int{want} << std::dec;
            }
          } else if (c.cache == DType::kBF16) {
            uint16_t bits;
            std::memcpy(&bits, &h[i * 2], 2);
            const float want = RoundBf16(ref.data_as<float>()[i]);
            ASSERT_NEAR(Bf16ToFloat(bits), want, std::fabs(want) / 128 + 1e-6)
                << side << " slot " << s << " elem " << e;
          } else {
            const int64_t head = e / D;
            const float got_scale = (side == 0 ? hks : hvs)[s * Hkv + head];
            const float want_scale =
                (side == 0 ? cks : cvs).data_as<float>()[s * Hkv + head];
            ASSERT_NEAR(got_scale, want_scale, 2e-5 * want_scale + 1e-12);
            const float got = static_cast<int8_t>(h[i]) * got_scale;
            const float want = ref.data_as<int8_t>()[i] * want_scale;
            // One quantization step apart at most (the pre-rounding values
            // differ in their last bits).
            ASSERT_NEAR(got, want, 1.01f * want_scale + 1e-6)
                << side << " slot " << s << " elem " << e;
          }
        }
      }
    }
    if (fp8) {  // The scales are read, never written.
      EXPECT_EQ(g_fks.Download(), fks);
      EXPECT_EQ(g_fvs.Download(), fvs);
    }
  }
}

// The RoPE variants of QkvRopeStore (kernels/ops.h RopeOptions) against the
// CPU on one mixed batch: decodes and prefills whose lengths after the step
// fall below, at and beyond the original context (63, 64, 65, a prefill
// crossing it, a long one), with a static table (a yarn-like blend), partial
// rotary with a cos/sin factor, dynamic NTK (per-sequence theta, computed on
// the device from seq_lens) and LongRoPE (per-sequence table), with and
// without q/k norms. q and the k cache (f32) are compared, and the dims
// beyond the rotary ones must be the input's, exactly.
TEST_F(FusedOpsTest, QkvRopeStoreRopeVariantsMatchTheCpu) {
  struct Case {
    const char* name;
    int64_t heads, kv_heads, dim, rotary;
    RopeLengthScaling scaling;
    float cos_sin_scale;
    bool norm;
  };
  const Case cases[] = {
      {"static yarn-like table", 8, 2, 128, 128, RopeLengthScaling::kNone, 1.0f,
       false},
      {"partial 96/128, scaled", 8, 2, 128, 96, RopeLengthScaling::kNone, 1.19f,
       true},
      {"dynamic NTK", 8, 2, 128, 128, RopeLengthScaling::kDynamicNtk, 1.0f,
       true},
      {"dynamic NTK, D 64", 4, 4, 64, 64, RopeLengthScaling::kDynamicNtk, 1.0f,
       false},
      {"longrope", 8, 2, 96, 96, RopeLengthScaling::kLongRope, 1.0f, false},
      {"longrope, partial 96/128, scaled", 6, 2, 128, 96,
       RopeLengthScaling::kLongRope, 1.2f, true},
  };
  constexpr int32_t kOriginal = 64;
  constexpr int32_t kBlock = 16;
  // (context, query) per sequence, decodes first.
  const std::vector<std::pair<int64_t, int64_t>> shape = {
      {100, 1}, {62, 1}, {63, 1}, {64, 1}, {0, 30}, {50, 20}, {3000, 7}};
  std::vector<std::vector<int32_t>> tables;
  int32_t next_block = 0;
  for (const auto& [context, query] : shape) {
    std::vector<int32_t> t((context + query + kBlock - 1) / kBlock);
    for (int32_t& b : t) b = next_block++;
    tables.push_back(std::move(t));
  }
  std::vector<SequenceSlice> seqs;
  for (size_t s = 0; s < shape.size(); ++s) {
    seqs.push_back({shape[s].first, shape[s].second, tables[s]});
  }
  auto meta = BuildAttentionMetadata(seqs, kBlock, next_block);
  ASSERT_TRUE(meta.ok()) << meta.status();
  const AttentionMetadata host_meta = meta->View();
  const int64_t T = meta->num_tokens;
  const int64_t S = int64_t{next_block} * kBlock;
  DeviceArray<int32_t> g_starts(meta->query_start_loc);
  DeviceArray<int32_t> g_lens(meta->seq_lens);
  DeviceArray<int32_t> g_pos(meta->positions);
  DeviceArray<int64_t> g_slots(meta->slot_mapping);
  AttentionMetadata gpu_meta = host_meta;
  gpu_meta.query_start_loc = DView(g_starts, DType::kI32, {meta->num_seqs + 1});
  gpu_meta.seq_lens = DView(g_lens, DType::kI32, {meta->num_seqs});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t H = c.heads, Hkv = c.kv_heads, D = c.dim, half = c.rotary / 2;
    const int64_t row = (H + 2 * Hkv) * D;
    const std::vector<float> qkv = Random(static_cast<size_t>(T * row), 2.0f);
    std::vector<float> q_norm = Random(D), k_norm = Random(D);
    std::vector<float> inv_freq(half), long_freq(half);
    for (int64_t i = 0; i < half; ++i) {
      const float plain = std::pow(10000.0f, -2.0f * i / c.rotary);
      // A yarn-like blend: the low dims kept, the high ones / 4.
      const float ramp = std::min(1.0f, std::max(0.0f, (i - 4.0f) / 20.0f));
      inv_freq[i] = c.scaling == RopeLengthScaling::kNone
                        ? plain * (1.0f - ramp) + plain / 4.0f * ramp
                        : plain / (1.0f + 0.01f * i);
      long_freq[i] = plain / (1.0f + 0.5f * i);
    }
    RopeOptions rope;
    rope.length_scaling = c.scaling;
    rope.cos_sin_scale = c.cos_sin_scale;
    if (c.scaling != RopeLengthScaling::kNone) {
      rope.original_max_len = kOriginal;
    }
    rope.base = 10000.0f;
    rope.factor = 3.0f;
    rope.factor_minus_one = 2.0f;
    rope.exponent = static_cast<float>(c.rotary / (c.rotary - 2.0));

    Tensor ck = *Tensor::Zeros(DType::kF32, {S, Hkv, D});
    Tensor cv = *Tensor::Zeros(DType::kF32, {S, Hkv, D});
    std::vector<float> cq(static_cast<size_t>(T * H * D));
    const TensorView qn = View(q_norm, {D}), kn = View(k_norm, {D});
    QkvRopeStoreArgs a;
    a.qkv = View(qkv, {T, row});
    a.q_norm = c.norm ? &qn : nullptr;
    a.k_norm = c.norm ? &kn : nullptr;
    a.positions = StepArray(meta->positions);
    a.inv_freq = View(inv_freq, {half});
    a.rope = rope;
    a.rope.long_inv_freq = View(long_freq, {half});
    a.metadata = &host_meta;
    a.slot_mapping = StepArray(meta->slot_mapping);
    a.cache = {ck.view(), cv.view(), TensorView(), TensorView()};
    a.q_out = View(cq, {T, H, D});
    ASSERT_TRUE(cpu_.QkvRopeStore(a).ok());

    DeviceArray<float> g_qkv(qkv), g_qn(q_norm), g_kn(k_norm);
    DeviceArray<float> g_freq(inv_freq), g_long(long_freq);
    DeviceArray<float> gk(static_cast<size_t>(S * Hkv * D));
    DeviceArray<float> gv(static_cast<size_t>(S * Hkv * D));
    DeviceArray<float> g_q(static_cast<size_t>(T * H * D));
    const TensorView gqn = DView(g_qn, DType::kF32, {D});
    const TensorView gkn = DView(g_kn, DType::kF32, {D});
    QkvRopeStoreArgs g = a;
    g.qkv = DView(g_qkv, DType::kF32, {T, row});
    g.q_norm = c.norm ? &gqn : nullptr;
    g.k_norm = c.norm ? &gkn : nullptr;
    g.positions = DView(g_pos, DType::kI32, {T});
    g.inv_freq = DView(g_freq, DType::kF32, {half});
    g.rope.long_inv_freq = DView(g_long, DType::kF32, {half});
    g.metadata = &gpu_meta;
    g.slot_mapping = DView(g_slots, DType::kI64, {T});
    g.cache = {DView(gk, DType::kF32, {S, Hkv, D}),
               DView(gv, DType::kF32, {S, Hkv, D}), TensorView(), TensorView()};
    g.q_out = DView(g_q, DType::kF32, {T, H, D});
    ASSERT_TRUE(gpu_->QkvRopeStore(g).ok());

    // Static tables give both sides the same angles; dynamic NTK's
    // frequencies come from powf on each side (a few ulp apart), which a
    // position of ~3000 turns into ~1e-4 of angle.
    const double tol =
        c.scaling == RopeLengthScaling::kDynamicNtk ? 1e-3 : 2e-5;
    const std::vector<float> got_q = g_q.Download();
    const std::vector<float> got_k = gk.Download();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H + Hkv; ++h) {
        const float* want =
            h < H ? cq.data() + (t * H + h) * D
                  : ck.data_as<float>() +
                        (meta->slot_mapping[t] * Hkv + (h - H)) * D;
        const float* got =
            h < H ? got_q.data() + (t * H + h) * D
                  : got_k.data() + (meta->slot_mapping[t] * Hkv + (h - H)) * D;
        for (int64_t i = 0; i < D; ++i) {
          if (i >= c.rotary && !c.norm) {
            ASSERT_EQ(got[i], qkv[t * row + h * D + i])
                << "pass-through: token " << t << " head " << h << " " << i;
          }
          ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i])))
              << "token " << t << " head " << h << " dim " << i;
        }
      }
    }
  }
}

// SwiGLU and GeGLU (the tanh GELU: accurate tanhf against the CPU's tanh,
// both in PyTorch's order, so a few f32 ulps apart).
TEST_F(FusedOpsTest, GatedActivationMatchesTheCpu) {
  for (const GatedActivationKind kind :
       {GatedActivationKind::kSilu, GatedActivationKind::kGeluTanh}) {
    for (const auto& [T, I] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 7}, {64, 1536}, {300, 2816}}) {
      SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(kind)
                                        << " T=" << T << " I=" << I);
      const std::vector<float> gate_up = Random(T * 2 * I, 3.0f);
      std::vector<float> want(T * I);
      ASSERT_TRUE(cpu_.GatedActivation(kind, View(gate_up, {T, 2 * I}),
                                       View(want, {T, I}))
                      .ok());
      DeviceArray<float> g_in(gate_up);
      DeviceArray<float> g_out(static_cast<size_t>(T * I));
      ASSERT_TRUE(gpu_->GatedActivation(kind,
                                        DView(g_in, DType::kF32, {T, 2 * I}),
                                        DView(g_out, DType::kF32, {T, I}))
                      .ok());
      const std::vector<float> got = g_out.Download();
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << i;
      }
    }
  }
}

// GatedLinear on CUDA (fused into one skinny kernel at 1..4 rows, the two ops
// above that) against the CPU's Linear + GatedActivation on the same bf16
// weights; bias or none.
TEST_F(FusedOpsTest, GatedLinearMatchesTheCpu) {
  for (const auto& [T, I, K, with_bias, kind] : std::vector<
           std::tuple<int64_t, int64_t, int64_t, bool, GatedActivationKind>>{
           {1, 3072, 1024, false, GatedActivationKind::kSilu},
           {2, 1000, 520, true, GatedActivationKind::kSilu},
           {4, 1536, 2048, true, GatedActivationKind::kSilu},
           {3, 7, 64, false, GatedActivationKind::kSilu},
           {16, 768, 512, true, GatedActivationKind::kSilu},
           {1, 3072, 1024, false, GatedActivationKind::kGeluTanh},
           {2, 1000, 520, true, GatedActivationKind::kGeluTanh},
           {4, 1536, 2048, false, GatedActivationKind::kGeluTanh},
           {3, 7, 64, true, GatedActivationKind::kGeluTanh},
           {16, 768, 512, true, GatedActivationKind::kGeluTanh}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T << " I=" << I << " K=" << K
                                      << " bias=" << with_bias
                                      << " kind=" << static_cast<int>(kind));
    const std::vector<float> x = Random(T * K);
    const std::vector<float> bias = Random(2 * I);
    // bf16 weights on the device, their exact f32 widening on the CPU
    // (which reads f32 weights only).
    std::vector<float> w = Random(2 * I * K, 0.05f);
    std::vector<uint16_t> w_bits(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = RoundBf16(w[i]);
      uint32_t bits;
      std::memcpy(&bits, &w[i], 4);
      w_bits[i] = static_cast<uint16_t>(bits >> 16);
    }
    std::vector<float> scratch(T * 2 * I), want(T * I);
    const TensorView cpu_w = View(w, {2 * I, K});
    const TensorView cpu_bias = View(bias, {2 * I});
    ASSERT_TRUE(cpu_.GatedLinear(kind, View(x, {T, K}), cpu_w,
                                 with_bias ? &cpu_bias : nullptr,
                                 View(scratch, {T, 2 * I}), View(want, {T, I}))
                    .ok());
    DeviceArray<float> dx(x), dbias(bias), dscratch(T * 2 * I), dout(T * I);
    DeviceArray<uint16_t> dw(w_bits);
    const TensorView gpu_bias = DView(dbias, DType::kF32, {2 * I});
    ASSERT_TRUE(gpu_->GatedLinear(kind, DView(dx, DType::kF32, {T, K}),
                                  DView(dw, DType::kBF16, {2 * I, K}),
                                  with_bias ? &gpu_bias : nullptr,
                                  DView(dscratch, DType::kF32, {T, 2 * I}),
                                  DView(dout, DType::kF32, {T, I}))
                    .ok());
    const std::vector<float> got = dout.Download();
    // f32 accumulation in another order (and cuBLASLt's bf16 input above 4
    // rows): the bound of a K-term sum of bf16-rounded inputs.
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-2 * (1.0 + std::fabs(want[i]))) << i;
    }
  }
}

// Not a check: the fused prologue's time beside Rope x2 + StoreKvCache at a
// decode step of 64 sequences, Llama-3-8B heads, bf16 cache.
TEST_F(FusedOpsTest, PrintsThePrologueTime) {
  const int64_t T = 64, H = 32, Hkv = 8, D = 128, S = 4096;
  const int64_t row = (H + 2 * Hkv) * D;
  DeviceArray<float> qkv(Random(T * row));
  DeviceArray<float> q(static_cast<size_t>(T * H * D));
  DeviceArray<float> k(static_cast<size_t>(T * Hkv * D));
  DeviceArray<float> v(static_cast<size_t>(T * Hkv * D));
  std::vector<float> freq_host(D / 2, 0.01f);
  DeviceArray<float> freq(freq_host);
  std::vector<int32_t> pos_host(T, 100);
  DeviceArray<int32_t> pos(pos_host);
  std::vector<int64_t> slot_host(T);
  std::iota(slot_host.begin(), slot_host.end(), 0);
  DeviceArray<int64_t> slots(slot_host);
  DeviceArray<uint16_t> ck(static_cast<size_t>(S * Hkv * D));
  DeviceArray<uint16_t> cv(static_cast<size_t>(S * Hkv * D));
  const KvCacheLayer cache{DView(ck, DType::kBF16, {S, Hkv, D}),
                           DView(cv, DType::kBF16, {S, Hkv, D}), TensorView(),
                           TensorView()};
  QkvRopeStoreArgs a;
  a.qkv = DView(qkv, DType::kF32, {T, row});
  a.positions = DView(pos, DType::kI32, {T});
  a.inv_freq = DView(freq, DType::kF32, {D / 2});
  a.slot_mapping = DView(slots, DType::kI64, {T});
  a.cache = cache;
  a.q_out = DView(q, DType::kF32, {T, H, D});
  const TensorView qv = DView(q, DType::kF32, {T, H, D});
  const TensorView kv = DView(k, DType::kF32, {T, Hkv, D});
  const TensorView vv = DView(v, DType::kF32, {T, Hkv, D});
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  auto time = [&](auto&& body) {
    for (int i = 0; i < 10; ++i) body();
    cudaEventRecord(start, gpu_->stream());
    constexpr int kIters = 200;
    for (int i = 0; i < kIters; ++i) body();
    cudaEventRecord(stop, gpu_->stream());
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return ms * 1000.0f / kIters;
  };
  const float fused = time([&] { ASSERT_TRUE(gpu_->QkvRopeStore(a).ok()); });
  // The unfused ops (without the copies a separate q/k/v GEMM would make
  // unnecessary): Rope on q and k, then StoreKvCache.
  const float unfused = time([&] {
    ASSERT_TRUE(gpu_->Rope(qv, a.positions, a.inv_freq).ok());
    ASSERT_TRUE(gpu_->Rope(kv, a.positions, a.inv_freq).ok());
    ASSERT_TRUE(gpu_->StoreKvCache(kv, vv, a.slot_mapping, cache).ok());
  });
  std::printf(
      "QkvRopeStore T=%lld H=%lld Hkv=%lld D=%lld bf16: fused %.2f us, "
      "unfused (Rope x2 + StoreKvCache) %.2f us\n",
      static_cast<long long>(T), static_cast<long long>(H),
      static_cast<long long>(Hkv), static_cast<long long>(D), fused, unfused);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace tessera
