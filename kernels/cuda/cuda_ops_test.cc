// CudaOps against the CPU reference (CpuOps) on fresh random inputs: the
// cuBLASLt matrix products (f32, and bf16 weights with f32 accumulation), fp8
// weights (Linear and GatedLinear at few and many rows, per-channel and block
// scales, every activation scaling, against host references from the same
// e4m3 bytes; QuantizeWeightFp8; fp8 uploads; the refusals; no allocation
// after ReserveStepScratch; capture and replay), the
// bf16 embedding, the fused residual norm, the vocabulary shard concatenation,
// row gathers, uploads, Sample (greedy = argmax, log-probabilities =
// log-softmax, top-n best first) and graph capture and replay. Skips without
// a GPU.
#include "kernels/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_memory_source.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/cuda_ops_fixture.h"
#include "kernels/cuda/testing/device_array.h"
#include "kernels/cuda/testing/fp8_reference.h"
#include "kernels/testing/step_arrays.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

using testing_cuda::DeviceArray;

// A device copy of host ids as a step array.
TensorView View(const DeviceArray<int32_t>& a) {
  return TensorView(a.get(), DType::kI32, {static_cast<int64_t>(a.size())});
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

class CudaOpsTest : public testing_cuda::CudaOpsFixture {
 protected:
  Tensor Random(Shape shape, float scale = 1.0f) {
    Tensor t = *Tensor::Empty(DType::kF32, shape);
    std::normal_distribution<float> dist(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng_);
    return t;
  }
  Tensor Device(const Tensor& host, DType dtype = DType::kF32) {
    auto t = gpu_->Upload(host.view(), dtype);
    EXPECT_TRUE(t.ok()) << t.status();
    return *std::move(t);
  }
  std::vector<float> Host(const TensorView& device) {
    std::vector<float> out(device.numel());
    EXPECT_TRUE(gpu_->CopyToHost(device, out.data()).ok());
    return out;
  }
  Tensor DeviceEmpty(Shape shape) {
    return Device(*Tensor::Zeros(DType::kF32, std::move(shape)));
  }
  static void ExpectClose(const std::vector<float>& got, const Tensor& want,
                          double rel) {
    ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel());
    double max_ref = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      max_ref = std::max(max_ref, std::fabs(double(want.data_as<float>()[i])));
    }
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_NEAR(got[i], want.data_as<float>()[i],
                  rel * std::max(1.0, max_ref))
          << "element " << i;
    }
  }

  std::mt19937 rng_{1234};
  CpuOps cpu_;
};

// Upload of host tensors in the checkpoint's dtype: bf16 → bf16 is the bytes
// as they are (from an unaligned host pointer, as a mapping's slice may be);
// bf16/f16 → f32 and f16 → bf16 convert; large tensors cross the slices.
TEST_F(CudaOpsTest, UploadKeepsOrConvertsHostDtypes) {
  const int64_t n = (int64_t{1} << 22) + 77;  // More than one slice.
  Tensor f32 = Random({n});
  std::vector<uint16_t> bf16(n + 1), f16(n + 1);
  for (int64_t i = 0; i < n; ++i) {
    bf16[i + 1] = F32ToBf16(f32.data_as<float>()[i]);
    f16[i + 1] = F32ToF16(f32.data_as<float>()[i]);
  }
  const TensorView bf16_host(reinterpret_cast<char*>(bf16.data()) + 2,
                             DType::kBF16, {n});
  const TensorView f16_host(reinterpret_cast<char*>(f16.data()) + 2,
                            DType::kF16, {n});
  auto same = gpu_->Upload(bf16_host, DType::kBF16);
  ASSERT_TRUE(same.ok()) << same.status();
  std::vector<uint16_t> back(n);
  ASSERT_TRUE(gpu_->CopyToHost(same->view(), back.data()).ok());
  EXPECT_EQ(std::memcmp(back.data(), bf16.data() + 1, n * 2), 0);
  auto widened = gpu_->Upload(bf16_host, DType::kF32);
  ASSERT_TRUE(widened.ok()) << widened.status();
  const std::vector<float> w = Host(widened->view());
  auto narrowed = gpu_->Upload(f16_host, DType::kBF16);
  ASSERT_TRUE(narrowed.ok()) << narrowed.status();
  ASSERT_TRUE(gpu_->CopyToHost(narrowed->view(), back.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(w[i], Bf16ToF32(bf16[i + 1])) << i;
    ASSERT_EQ(back[i], F32ToBf16(F16ToF32(f16[i + 1]))) << i;
  }
  int8_t bytes[4] = {};
  EXPECT_EQ(gpu_->Upload(TensorView(bytes, DType::kI8, {4}), DType::kBF16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaOpsTest, LinearMatchesCpuInF32AndBf16) {
  for (auto [t, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 512, 64},
                         {3, 1000, 4096},
                         {7, 300, 96},
                         {64, 1024, 256},
                         {130, 129, 513}}) {
    Tensor x = Random({t, k}), w = Random({n, k}, 0.05f), b = Random({n});
    Tensor want = *Tensor::Empty(DType::kF32, {t, n});
    const TensorView bias = b.view();
    ASSERT_TRUE(cpu_.Linear(x.view(), w.view(), &bias, want.view()).ok());
    Tensor dx = Device(x), dw = Device(w), db = Device(b);
    Tensor out = DeviceEmpty({t, n});
    const TensorView dbias = db.view();
    ASSERT_TRUE(gpu_->Linear(dx.view(), dw.view(), &dbias, out.view()).ok());
    ExpectClose(Host(out.view()), want, 1e-5);

    // bf16 weights: the reference multiplies bf16-rounded inputs and weights.
    Tensor xr = Random({t, k}), wr = Random({n, k}, 0.05f);
    for (int64_t i = 0; i < xr.numel(); ++i)
      xr.data_as<float>()[i] = RoundBf16(xr.data_as<float>()[i]);
    for (int64_t i = 0; i < wr.numel(); ++i)
      wr.data_as<float>()[i] = RoundBf16(wr.data_as<float>()[i]);
    // With the bias: at few rows the skinny kernel may take it (fused).
    ASSERT_TRUE(cpu_.Linear(xr.view(), wr.view(), &bias, want.view()).ok());
    Tensor dxr = Device(xr), dwr = Device(wr, DType::kBF16);
    ASSERT_TRUE(gpu_->Linear(dxr.view(), dwr.view(), &dbias, out.view()).ok());
    ExpectClose(Host(out.view()), want, 1e-4);
  }
}

// Load-time stacking (q/k/v, gate/up) copies inside device memory, in order;
// parts whose bytes do not make up the shape are refused.
TEST_F(CudaOpsTest, StackRowsCopiesOnTheDevice) {
  Tensor a = Random({2, 5}), b = Random({3, 5});
  Tensor da = Device(a), db = Device(b);
  absl::StatusOr<Tensor> out =
      gpu_->StackRows({da.view(), db.view()}, Shape({5, 5}));
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> got = Host(out->view());
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(got[i], a.data_as<float>()[i]);
  for (int64_t i = 0; i < 15; ++i) {
    EXPECT_EQ(got[10 + i], b.data_as<float>()[i]);
  }
  EXPECT_EQ(gpu_->StackRows({da.view()}, Shape({5, 5})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaOpsTest, LinearRefusesAScaledF32Weight) {
  Tensor dx = Device(Random({2, 4})), dw = Device(Random({3, 4}));
  Tensor dscale = Device(Random({3})), out = DeviceEmpty({2, 3});
  WeightView scaled = dw;
  scaled.scale_kind = WeightScaleKind::kPerChannel;
  scaled.scale = dscale.view();
  const absl::Status st = gpu_->Linear(dx.view(), scaled, nullptr, out.view());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("take no scale"), absl::string_view::npos) << st;
}

TEST_F(CudaOpsTest, Bf16EmbeddingAndShards) {
  Tensor table = Random({100, 24});
  for (int64_t i = 0; i < table.numel(); ++i)
    table.data_as<float>()[i] = RoundBf16(table.data_as<float>()[i]);
  const std::vector<int32_t> ids = {0, 99, 5, 5, 42};
  Tensor want = *Tensor::Empty(DType::kF32, {5, 24});
  ASSERT_TRUE(cpu_.Embedding(table.view(), StepArray(ids), want.view()).ok());
  Tensor dt = Device(table, DType::kBF16), out = DeviceEmpty({5, 24});
  const DeviceArray<int32_t> d_ids(ids);
  ASSERT_TRUE(gpu_->Embedding(dt.view(), View(d_ids), out.view()).ok());
  ExpectClose(Host(out.view()), want, 0);
  ASSERT_TRUE(
      cpu_.EmbeddingShard(table.view(), StepArray(ids), 40, want.view()).ok());
  ASSERT_TRUE(
      gpu_->EmbeddingShard(dt.view(), View(d_ids), 40, out.view()).ok());
  ExpectClose(Host(out.view()), want, 0);
  // Ids are device values: their range is checked where they are filled
  // (StepInputs); a host-typed or wrongly shaped array is refused here.
  Tensor one = DeviceEmpty({1, 24});
  EXPECT_EQ(gpu_->Embedding(dt.view(), View(d_ids), one.view()).code(),
            absl::StatusCode::kInvalidArgument);
  const DeviceArray<int64_t> wide(std::vector<int64_t>{1});
  EXPECT_EQ(gpu_->Embedding(dt.view(), TensorView(wide.get(), DType::kI64, {1}),
                            one.view())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Step buffers: a fixed device address, one copy per Upload, and a staging
// block that is safe to rewrite after the next BeginWrite.
TEST_F(CudaOpsTest, UploadBufferCopiesTheStagingOnce) {
  auto buffer = gpu_->NewUploadBuffer(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  UploadBuffer& b = **buffer;
  void* const device = b.device();
  for (int32_t step = 0; step < 3; ++step) {
    auto host = b.BeginWrite();
    ASSERT_TRUE(host.ok()) << host.status();
    for (int32_t i = 0; i < 16; ++i) {
      static_cast<int32_t*>(*host)[i] = step * 100 + i;
    }
    ASSERT_TRUE(b.Upload(16 * sizeof(int32_t)).ok());
    std::vector<int32_t> back(16);
    ASSERT_TRUE(
        gpu_->CopyToHost(TensorView(b.device(), DType::kI32, {16}), back.data())
            .ok());
    EXPECT_EQ(back[5], step * 100 + 5);
    EXPECT_EQ(b.device(), device);
  }
  EXPECT_EQ(b.Upload(65).code(), absl::StatusCode::kInvalidArgument);
}

// After ReserveStepScratch the ops' scratch never grows: a step inside the
// limits allocates nothing, one beyond them fails instead of reallocating.
TEST_F(CudaOpsTest, ReservedScratchNeverGrows) {
  StepLimits limits;
  limits.max_tokens = 8;
  limits.max_seqs = 2;
  limits.max_seq_len = 64;
  limits.max_heads = 2;
  limits.max_head_dim = 8;
  limits.max_linear_in = 32;
  limits.vocab_size = 16;
  ASSERT_TRUE(gpu_->ReserveStepScratch(limits).ok());
  // 8 rows: more than the skinny kernel takes, so every product needs the
  // reserved cuBLASLt input buffer.
  Tensor x = Random({8, 32}), w = Random({8, 32});
  Tensor dx = Device(x), dw = Device(w, DType::kBF16),
         out = DeviceEmpty({8, 8});
  const int64_t before = allocator_->stats().allocations;
  ASSERT_TRUE(gpu_->Linear(dx.view(), dw.view(), nullptr, out.view()).ok());
  EXPECT_EQ(allocator_->stats().allocations, before);
  Tensor x_wide = Random({8, 64}), w_wide = Random({8, 64});
  Tensor dxw = Device(x_wide), dww = Device(w_wide, DType::kBF16);
  const int64_t before_wide = allocator_->stats().allocations;
  EXPECT_EQ(gpu_->Linear(dxw.view(), dww.view(), nullptr, out.view()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator_->stats().allocations, before_wide);
}

TEST_F(CudaOpsTest, AddRmsNormConcatShardsGatherRows) {
  Tensor residual = Random({9, 64}), x = Random({9, 64}), w = Random({64});
  Tensor want_res = *Tensor::Empty(DType::kF32, {9, 64});
  std::memcpy(want_res.data(), residual.data(), residual.nbytes());
  Tensor want = *Tensor::Empty(DType::kF32, {9, 64});
  ASSERT_TRUE(
      cpu_.AddRmsNorm(want_res.view(), x.view(), w.view(), 1e-5f, want.view())
          .ok());
  Tensor dres = Device(residual), dx = Device(x), dw = Device(w);
  ASSERT_TRUE(
      gpu_->AddRmsNorm(dres.view(), dx.view(), dw.view(), 1e-5f, dx.view())
          .ok());
  ExpectClose(Host(dres.view()), want_res, 1e-6);
  ExpectClose(Host(dx.view()), want, 1e-5);

  // Three shards of 7 columns hold a vocabulary of 19 (two columns padding).
  Tensor gathered = Random({3 * 4, 7});
  Tensor want_cat = *Tensor::Empty(DType::kF32, {4, 19});
  ASSERT_TRUE(cpu_.ConcatShards(gathered.view(), 3, want_cat.view()).ok());
  Tensor dg = Device(gathered), cat = DeviceEmpty({4, 19});
  ASSERT_TRUE(gpu_->ConcatShards(dg.view(), 3, cat.view()).ok());
  ExpectClose(Host(cat.view()), want_cat, 0);
  EXPECT_EQ(want_cat.data_as<float>()[19 + 7],
            gathered.data_as<float>()[4 * 7 + 7]);

  const std::vector<int32_t> rows = {3, 0, 3};
  Tensor want_rows = *Tensor::Empty(DType::kF32, {3, 19});
  ASSERT_TRUE(
      cpu_.GatherRows(want_cat.view(), StepArray(rows), want_rows.view()).ok());
  Tensor got_rows = DeviceEmpty({3, 19});
  const DeviceArray<int32_t> d_rows(rows);
  ASSERT_TRUE(gpu_->GatherRows(cat.view(), View(d_rows), got_rows.view()).ok());
  ExpectClose(Host(got_rows.view()), want_rows, 0);
}

// Scale (Gemma's embedding normalizer) is one f32 product, bit for bit the
// CPU's; Softcap (the final logit soft cap) within tanhf's few ulps, on logits
// both far inside and far beyond the cap.
TEST_F(CudaOpsTest, ScaleAndSoftcapMatchTheCpu) {
  for (const int64_t rows : {1, 7, 300}) {
    Tensor x = Random({rows, 1031}, 25.0f);
    Tensor want = *Tensor::Empty(DType::kF32, x.shape());
    std::memcpy(want.data(), x.data(), x.nbytes());
    ASSERT_TRUE(cpu_.Scale(want.view(), 45.254833f).ok());
    Tensor dx = Device(x);
    ASSERT_TRUE(gpu_->Scale(dx.view(), 45.254833f).ok());
    const std::vector<float> got = Host(dx.view());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);

    ASSERT_TRUE(cpu_.Softcap(want.view(), 30.0f).ok());
    ASSERT_TRUE(gpu_->Softcap(dx.view(), 30.0f).ok());
    // tanh in [-1, 1] times the cap: a few ulps of 30.
    ExpectClose(Host(dx.view()), want, 1e-6);
  }
}

// Greedy rows pick the argmax; log-probabilities are the log-softmax of the
// unmodified logits; top-n is best first; a seeded row is reproducible.
TEST_F(CudaOpsTest, SampleGreedyLogprobsAndSeeds) {
  for (int64_t vocab : {517, 151936}) {
    const int64_t n = 5;
    Tensor logits = Random({n, vocab}, 3.0f);
    Tensor d = Device(logits);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingParams hot;
    hot.temperature = 0.8f;
    hot.top_p = 0.9f;
    std::vector<SampleRow> rows(n);
    for (int64_t i = 0; i < n; ++i) {
      rows[i].params = &greedy;
      rows[i].top_logprobs = static_cast<int32_t>(i * 4);
    }
    rows[4].params = &hot;
    rows[4].seed = 77;
    rows[4].step = 3;
    std::vector<SampleResult> got;
    ASSERT_TRUE(gpu_->Sample(d.view(), rows, &got).ok());
    ASSERT_EQ(got.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const float* l = logits.data_as<float>() + i * vocab;
      int32_t best = 0;
      double z = 0;
      const float mx = *std::max_element(l, l + vocab);
      for (int64_t v = 0; v < vocab; ++v) {
        if (l[v] > l[best]) best = static_cast<int32_t>(v);
        z += std::exp(double(l[v]) - mx);
      }
      const double log_z = mx + std::log(z);
      if (i < 4) EXPECT_EQ(got[i].token, best) << "row " << i;
      EXPECT_NEAR(got[i].logprob, l[got[i].token] - log_z, 1e-4);
      ASSERT_EQ(got[i].top.size(), static_cast<size_t>(rows[i].top_logprobs));
      if (!got[i].top.empty()) EXPECT_EQ(got[i].top[0].first, best);
      for (size_t k = 1; k < got[i].top.size(); ++k) {
        EXPECT_LE(got[i].top[k].second, got[i].top[k - 1].second);
        EXPECT_NEAR(got[i].top[k].second, l[got[i].top[k].first] - log_z, 1e-4);
      }
    }
    // The seeded row draws the same token again, alone.
    std::vector<SampleResult> again;
    Tensor last = Device(*Tensor::Empty(DType::kF32, {1, vocab}));
    std::vector<float> row4(logits.data_as<float>() + 4 * vocab,
                            logits.data_as<float>() + 5 * vocab);
    Tensor host4 = *Tensor::Empty(DType::kF32, {1, vocab});
    std::memcpy(host4.data(), row4.data(), vocab * 4);
    Tensor d4 = Device(host4);
    ASSERT_TRUE(gpu_->Sample(d4.view(), {rows[4]}, &again).ok());
    EXPECT_EQ(again[0].token, got[4].token);
  }
}

// Decode CUDA graphs: a captured op sequence (norm, product, activation,
// residual add) replays on the buffers it was captured with, reading the
// inputs they hold at launch time.
TEST_F(CudaOpsTest, CapturedOpsReplayOnTheirBuffers) {
  const int64_t t = 3, h = 64, n = 96;
  Tensor dx = DeviceEmpty({t, h}), dw_norm = Device(Random({h}));
  Tensor dw = Device(Random({n, h}, 0.05f)), dw_out = Device(Random({h, n}));
  Tensor normed = DeviceEmpty({t, h}), up = DeviceEmpty({t, n});
  Tensor act = DeviceEmpty({t, n}), out = DeviceEmpty({t, h});
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        gpu_->RmsNorm(dx.view(), dw_norm.view(), 1e-5f, normed.view()));
    RETURN_IF_ERROR(gpu_->Linear(normed.view(), dw, nullptr, up.view()));
    RETURN_IF_ERROR(gpu_->SiluMul(up.view(), up.view(), act.view()));
    RETURN_IF_ERROR(gpu_->Linear(act.view(), dw_out, nullptr, out.view()));
    return gpu_->Add(out.view(), dx.view(), out.view());
  };
  // Eager once first: the matrix products plan and allocate their workspace
  // outside the capture.
  ASSERT_TRUE(run().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());

  ASSERT_TRUE(gpu_->BeginCapture().ok());
  EXPECT_EQ(gpu_->BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(run().ok());
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(gpu_->EndCapture().status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The CPU reference of the same sequence.
  Tensor w_norm = *Tensor::Empty(DType::kF32, {h});
  Tensor w = *Tensor::Empty(DType::kF32, {n, h});
  Tensor w_out = *Tensor::Empty(DType::kF32, {h, n});
  ASSERT_TRUE(gpu_->CopyToHost(dw_norm.view(), w_norm.data()).ok());
  ASSERT_TRUE(gpu_->CopyToHost(dw.view(), w.data()).ok());
  ASSERT_TRUE(gpu_->CopyToHost(dw_out.view(), w_out.data()).ok());
  auto reference = [&](const Tensor& x) {
    Tensor cn = *Tensor::Empty(DType::kF32, {t, h});
    Tensor cu = *Tensor::Empty(DType::kF32, {t, n});
    Tensor ca = *Tensor::Empty(DType::kF32, {t, n});
    Tensor co = *Tensor::Empty(DType::kF32, {t, h});
    EXPECT_TRUE(cpu_.RmsNorm(x.view(), w_norm.view(), 1e-5f, cn.view()).ok());
    EXPECT_TRUE(cpu_.Linear(cn.view(), w, nullptr, cu.view()).ok());
    EXPECT_TRUE(cpu_.SiluMul(cu.view(), cu.view(), ca.view()).ok());
    EXPECT_TRUE(cpu_.Linear(ca.view(), w_out, nullptr, co.view()).ok());
    EXPECT_TRUE(cpu_.Add(co.view(), x.view(), co.view()).ok());
    return co;
  };
  for (int replay = 0; replay < 2; ++replay) {
    // New inputs in place, then one launch.
    Tensor x = Random({t, h});
    ASSERT_TRUE(CudaStatus(cudaMemcpy(dx.data(), x.data(), x.nbytes(),
                                      cudaMemcpyHostToDevice),
                           "cudaMemcpy", "refilling the input")
                    .ok());
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    ExpectClose(Host(out.view()), reference(x), 1e-4);
  }

  // A host copy cannot be captured: the capture fails, says so, and leaves
  // the ops usable.
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  std::vector<float> sink(t * h);
  EXPECT_FALSE(gpu_->CopyToHost(out.view(), sink.data()).ok());
  absl::StatusOr<std::unique_ptr<DeviceGraph>> broken = gpu_->EndCapture();
  EXPECT_FALSE(broken.ok());
  Tensor x = Random({t, h});
  ASSERT_TRUE(CudaStatus(cudaMemcpy(dx.data(), x.data(), x.nbytes(),
                                    cudaMemcpyHostToDevice),
                         "cudaMemcpy", "refilling the input")
                  .ok());
  ASSERT_TRUE(run().ok());
  ExpectClose(Host(out.view()), reference(x), 1e-4);
}

// Op profiling on the GPU: CUDA events around each op, summed per label; a
// Collect starts over (and reuses the events); ops run while a graph is
// captured record nothing, the capture still succeeds, and a replay is not
// timed either.
TEST_F(CudaOpsTest, OpTimerTimesEagerOpsAndNothingInACapture) {
  absl::StatusOr<std::unique_ptr<OpTimer>> timer = gpu_->NewOpTimer();
  ASSERT_TRUE(timer.ok()) << timer.status();
  const int64_t t = 16, k = 256, n = 128;
  Tensor dx = Device(Random({t, k})), dw = Device(Random({n, k}, 0.05f));
  Tensor dnorm = Device(Random({n})), out = DeviceEmpty({t, n});
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(gpu_->Linear(dx.view(), dw, nullptr, out.view()));
    return gpu_->RmsNorm(out.view(), dnorm.view(), 1e-5f, out.view());
  };
  // Once untimed: the product's plan is made outside both the timing and
  // the capture below.
  ASSERT_TRUE(run().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  gpu_->set_op_timer(timer->get());

  auto collect = [&]() -> std::vector<OpTimeTotal> {
    absl::StatusOr<std::vector<OpTimeTotal>> totals = (*timer)->Collect();
    EXPECT_TRUE(totals.ok()) << totals.status();
    return totals.ok() ? *std::move(totals) : std::vector<OpTimeTotal>();
  };
  for (int round = 0; round < 2; ++round) {  // The second reuses the events.
    ASSERT_TRUE(run().ok());
    std::vector<OpTimeTotal> totals = collect();
    ASSERT_EQ(totals.size(), 2u) << round;
    std::vector<std::string> labels;
    for (const OpTimeTotal& total : totals) {
      labels.push_back(total.label);
      EXPECT_EQ(total.calls, 1) << total.label;
      EXPECT_GT(total.total_us, 0.0) << total.label;
    }
    std::sort(labels.begin(), labels.end());
    EXPECT_EQ(labels,
              (std::vector<std::string>{"Linear 128x256", "RmsNorm 128"}));
    EXPECT_TRUE(collect().empty());
  }
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(run().ok());
  for (const OpTimeTotal& total : collect()) EXPECT_EQ(total.calls, 50);

  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(run().ok());
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(collect().empty());
  ASSERT_TRUE((*graph)->Launch().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_TRUE(collect().empty());

  ASSERT_TRUE(run().ok());
  EXPECT_EQ(collect().size(), 2u);
  gpu_->set_op_timer(nullptr);
  ASSERT_TRUE(run().ok());
  EXPECT_TRUE(collect().empty());
}

// ---------------------------------------------------------------------------
// fp8 weights. Each test prints its seed (TESSERA_TEST_SEED replays it).

// An fp8 weight as the host holds it.
struct HostFp8 {
  int64_t n = 0, k = 0, block = 0;  // block 0: per-channel.
  ActivationScaleKind activations = ActivationScaleKind::kDynamicPerToken;
  float input_scale = 0.0f;  // kStatic.
  std::vector<uint8_t> data;
  std::vector<float> scale;
};

HostFp8 RandomHostFp8(std::mt19937& rng, int64_t n, int64_t k, int64_t block,
                      ActivationScaleKind activations) {
  HostFp8 h;
  h.n = n, h.k = k, h.block = block, h.activations = activations;
  h.input_scale = 0.04f;
  h.data = testing_cuda::RandomFp8(rng, n * k);
  const int64_t count =
      block > 0 ? ((n + block - 1) / block) * ((k + block - 1) / block) : n;
  h.scale = testing_cuda::RandomScales(rng, count, 1e-3f, 4e-3f);
  return h;
}

class CudaFp8OpsTest : public CudaOpsTest {
 protected:
  void SetUp() override {
    CudaOpsTest::SetUp();
    if (IsSkipped()) return;
    seed_ = testing_cuda::TestSeed();
    rng_.seed(seed_);
  }

  // The weight on the device: its bytes as f8_e4m3, its scale (and input
  // scale) as f32.
  Weight Upload(const HostFp8& h) {
    const TensorView bytes(const_cast<uint8_t*>(h.data.data()), DType::kF8E4M3,
                           {h.n, h.k});
    auto data = gpu_->Upload(bytes, DType::kF8E4M3);
    EXPECT_TRUE(data.ok()) << data.status();
    Weight w(*std::move(data));
    w.scale_kind =
        h.block > 0 ? WeightScaleKind::kBlock : WeightScaleKind::kPerChannel;
    const Shape scale_shape = h.block > 0
                                  ? Shape({(h.n + h.block - 1) / h.block,
                                           (h.k + h.block - 1) / h.block})
                                  : Shape({h.n});
    Tensor scale = *Tensor::Empty(DType::kF32, scale_shape);
    std::memcpy(scale.data(), h.scale.data(), h.scale.size() * 4);
    w.scale = Device(scale);
    w.block = static_cast<int32_t>(h.block);
    w.activations = h.activations;
    if (h.activations == ActivationScaleKind::kStatic) {
      Tensor s = *Tensor::Empty(DType::kF32, {1});
      s.data_as<float>()[0] = h.input_scale;
      w.input_scale = Device(s);
    }
    return w;
  }

  // The two results an fp8 Linear may give row by row (ops.h): x kept in f32
  // (the skinny kernel) or x quantized as the weight says (the tensor-core
  // path), each against its own bound.
  struct Fp8Want {
    testing_cuda::HostProduct f32_x, quantized_x;
    double f32_tol = 0.0;
  };
  static Fp8Want Want(const HostFp8& h, const std::vector<float>& x, int64_t t,
                      const float* bias) {
    const std::vector<double> w =
        testing_cuda::DequantizeWeight(h.data, h.n, h.k, h.scale, h.block);
    const bool groups = h.block > 0;
    const testing_cuda::HostQuantization kind =
        h.activations == ActivationScaleKind::kStatic
            ? testing_cuda::HostQuantization::kStatic
            : (h.activations == ActivationScaleKind::kDynamicPerBlock
                   ? testing_cuda::HostQuantization::kPerGroup
                   : testing_cuda::HostQuantization::kPerToken);
    const testing_cuda::HostQuantized q = testing_cuda::QuantizeFp8Host(
        kind, groups, t, h.k, x.data(), h.input_scale);
    Fp8Want want;
    want.f32_x = testing_cuda::Product(std::vector<double>(x.begin(), x.end()),
                                       w, t, h.n, h.k, bias);
    want.quantized_x = testing_cuda::Product(
        testing_cuda::DequantizeActivations(q, groups, t, h.k), w, t, h.n, h.k,
        bias);
    want.f32_tol = testing_cuda::SkinnyTolerance(h.k);
    return want;
  }

  // Rows of `got` [t, n] that match neither result (reporting a few).
  static int64_t BadRows(const std::vector<float>& got, const Fp8Want& want,
                         int64_t t, int64_t n, bool report = true) {
    int64_t bad = 0;
    for (int64_t r = 0; r < t; ++r) {
      bool f32_ok = true, quantized_ok = true;
      int64_t where = -1;
      for (int64_t j = 0; j < n; ++j) {
        const size_t i = static_cast<size_t>(r * n + j);
        const double e1 = std::fabs(got[i] - want.f32_x.out[i]);
        const double e2 = std::fabs(got[i] - want.quantized_x.out[i]);
        if (!(e1 <= want.f32_tol * want.f32_x.mag[i] + 1e-30)) f32_ok = false;
        if (!(e2 <=
              testing_cuda::kTensorCoreTolerance * want.quantized_x.mag[i] +
                  1e-30)) {
          quantized_ok = false;
          if (where < 0) where = j;
        }
      }
      if (!f32_ok && !quantized_ok && ++bad <= 3 && report) {
        const size_t i = static_cast<size_t>(r * n + where);
        ADD_FAILURE() << "row " << r << " matches neither reference; out[" << r
                      << ", " << where << "] = " << got[i] << ", x in f32 "
                      << want.f32_x.out[i] << ", x quantized "
                      << want.quantized_x.out[i];
      }
    }
    return bad;
  }

  std::vector<float> RandomX(int64_t count) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(count));
    for (float& v : x) v = normal(rng_);
    return x;
  }

  Tensor DeviceF32(const std::vector<float>& v, Shape shape) {
    Tensor t = *Tensor::Empty(DType::kF32, std::move(shape));
    std::memcpy(t.data(), v.data(), v.size() * 4);
    return Device(t);
  }

  uint32_t seed_ = 0;
};

// Linear with fp8 weights at 1..8 rows (either path), 17..300 rows (the
// tensor-core path, block weights' last t % 4 rows skinny), per-channel and
// block scales (N and K not multiples of 128, a block scale whose rows need
// padding), every activation scaling, with and without bias.
TEST_F(CudaFp8OpsTest, Fp8LinearMatchesTheHostProduct) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  using A = ActivationScaleKind;
  struct Config {
    int64_t n, k, block;
    A activations;
    bool bias;
    std::vector<int64_t> rows;
  };
  const Config configs[] = {
      {1000, 4096, 0, A::kDynamicPerToken, true, {1, 8, 17, 64}},
      {136, 272, 0, A::kStatic, false, {1, 5, 17, 300}},
      {136, 272, 128, A::kDynamicPerBlock, true, {3, 8, 17, 300}},
      {512, 1024, 128, A::kDynamicPerToken, false, {1, 4, 64, 130}},
      {256, 512, 128, A::kStatic, true, {2, 21}}};
  for (const Config& c : configs) {
    const HostFp8 h = RandomHostFp8(rng_, c.n, c.k, c.block, c.activations);
    const Weight w = Upload(h);
    const std::vector<float> bias = RandomX(c.n);
    const Tensor dbias = DeviceF32(bias, {c.n});
    const TensorView bias_view = dbias.view();
    for (const int64_t t : c.rows) {
      SCOPED_TRACE(::testing::Message()
                   << "t=" << t << " n=" << c.n << " k=" << c.k
                   << " block=" << c.block << " activations="
                   << static_cast<int>(c.activations) << " bias=" << c.bias);
      const std::vector<float> x = RandomX(t * c.k);
      const Tensor dx = DeviceF32(x, {t, c.k});
      Tensor out = DeviceEmpty({t, c.n});
      const absl::Status st =
          gpu_->Linear(dx.view(), w, c.bias ? &bias_view : nullptr, out.view());
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(BadRows(Host(out.view()),
                        Want(h, x, t, c.bias ? bias.data() : nullptr), t, c.n),
                0);
    }
  }
}

// The comparison can fail: a doubled channel scale (or block scale) is
// caught on both paths.
TEST_F(CudaFp8OpsTest, Fp8LinearWithAWrongScaleIsCaught) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (const int64_t block : {int64_t{0}, int64_t{128}}) {
    const HostFp8 h = RandomHostFp8(rng_, 256, 1024, block,
                                    ActivationScaleKind::kDynamicPerToken);
    HostFp8 wrong = h;
    wrong.scale[0] *= 2.0f;
    const Weight w = Upload(wrong);
    for (const int64_t t : {int64_t{1}, int64_t{64}}) {
      const std::vector<float> x = RandomX(t * h.k);
      const Tensor dx = DeviceF32(x, {t, h.k});
      Tensor out = DeviceEmpty({t, h.n});
      ASSERT_TRUE(gpu_->Linear(dx.view(), w, nullptr, out.view()).ok());
      EXPECT_GT(BadRows(Host(out.view()), Want(h, x, t, nullptr), t, h.n,
                        /*report=*/false),
                0)
          << "block " << block << " t " << t;
    }
  }
}

// GatedLinear with fp8 gate/up weights (fused at few rows, Linear +
// GatedActivation otherwise) against act(gate) * up of either reference.
TEST_F(CudaFp8OpsTest, Fp8GatedLinearMatchesTheHostProduct) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (const auto kind :
       {GatedActivationKind::kSilu, GatedActivationKind::kGeluTanh}) {
    for (const auto& [t, n, k, block] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1000, 1024, 0},
          {3, 640, 512, 128},
          {8, 300, 256, 0},
          {17, 1000, 1024, 0},
          {64, 640, 512, 128}}) {
      SCOPED_TRACE(::testing::Message()
                   << "t=" << t << " n=" << n << " k=" << k
                   << " block=" << block << " kind=" << static_cast<int>(kind));
      const HostFp8 h =
          RandomHostFp8(rng_, 2 * n, k, block,
                        block > 0 ? ActivationScaleKind::kDynamicPerBlock
                                  : ActivationScaleKind::kDynamicPerToken);
      const Weight w = Upload(h);
      const std::vector<float> x = RandomX(t * k), bias = RandomX(2 * n);
      const Tensor dx = DeviceF32(x, {t, k}), dbias = DeviceF32(bias, {2 * n});
      const TensorView bias_view = dbias.view();
      Tensor scratch = DeviceEmpty({t, 2 * n}), out = DeviceEmpty({t, n});
      const absl::Status st = gpu_->GatedLinear(kind, dx.view(), w, &bias_view,
                                                scratch.view(), out.view());
      ASSERT_TRUE(st.ok()) << st;
      const std::vector<float> got = Host(out.view());
      const Fp8Want want = Want(h, x, t, bias.data());
      const auto act = [&](double g) {
        if (kind == GatedActivationKind::kSilu) return g / (1.0 + std::exp(-g));
        return 0.5 * g *
               (1.0 +
                std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
      };
      int64_t bad = 0;
      for (int64_t r = 0; r < t; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          bool ok = false;
          for (int ref = 0; ref < 2 && !ok; ++ref) {
            const testing_cuda::HostProduct& p =
                ref == 0 ? want.f32_x : want.quantized_x;
            const double tol =
                ref == 0 ? want.f32_tol : testing_cuda::kTensorCoreTolerance;
            const double g = p.out[r * 2 * n + j], u = p.out[r * 2 * n + n + j];
            const double eg = tol * p.mag[r * 2 * n + j];
            const double eu = tol * p.mag[r * 2 * n + n + j];
            const double want_v = act(g) * u;
            // |d(act(g) u)| <= 1.2 |dg| |u| + (|g| + 1) |du| (|act'| <=
            // 1.13), plus the activation's own f32 rounding.
            const double bound =
                2.0 * (1.2 * eg * std::fabs(u) + (std::fabs(g) + 1.0) * eu) +
                1e-5 * std::fabs(want_v) + 1e-30;
            ok = std::fabs(got[r * n + j] - want_v) <= bound;
          }
          if (!ok && ++bad <= 3) {
            ADD_FAILURE() << "out[" << r << ", " << j
                          << "] = " << got[r * n + j];
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// f8_e4m3 host data: kept as its bytes, or widened exactly to f32 and bf16;
// quantizing on upload is refused (the scale has to come from somewhere).
TEST_F(CudaFp8OpsTest, Fp8UploadKeepsTheBytesOrWidensExactly) {
  std::vector<uint8_t> bytes(4096);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  const TensorView host(bytes.data(), DType::kF8E4M3, {64, 64});
  auto same = gpu_->Upload(host, DType::kF8E4M3);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->dtype(), DType::kF8E4M3);
  std::vector<uint8_t> back(bytes.size());
  ASSERT_TRUE(gpu_->CopyToHost(same->view(), back.data()).ok());
  EXPECT_EQ(back, bytes);
  auto f32 = gpu_->Upload(host, DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status();
  auto bf16 = gpu_->Upload(host, DType::kBF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const std::vector<float> wide = Host(f32->view());
  std::vector<uint16_t> narrow(bytes.size());
  ASSERT_TRUE(gpu_->CopyToHost(bf16->view(), narrow.data()).ok());
  for (size_t i = 0; i < bytes.size(); ++i) {
    const float v = Fp8E4M3ToF32(bytes[i]);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(wide[i])) << i;
      EXPECT_TRUE(std::isnan(Bf16ToF32(narrow[i]))) << i;
    } else {
      EXPECT_EQ(wide[i], v) << i;
      EXPECT_EQ(Bf16ToF32(narrow[i]), v) << i;  // e4m3 is a subset of bf16.
    }
  }
  Tensor f32_host = Random({4, 4});
  EXPECT_EQ(gpu_->Upload(f32_host.view(), DType::kF8E4M3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// QuantizeWeightFp8 (bf16 and f32 sources): the bytes are F32ToFp8E4M3(w /
// scale), the scale max |w[n]| / 448 (1 for an all-zero row), bit for bit;
// the Weight is per-channel with per-token activations, and Linear takes it.
TEST_F(CudaFp8OpsTest, QuantizeWeightFp8IsTheHostFormula) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  // N % 4 == 0: the tensor-core path (40 rows below) takes no other N
  // (Fp8RefusesWhatItDoesNotTake checks that refusal).
  const int64_t n = 36, k = 1040;
  Tensor w = Random({n, k}, 0.02f);
  std::fill(w.data_as<float>() + 4 * k, w.data_as<float>() + 5 * k, 0.0f);
  w.data_as<float>()[6 * k + 1] = -9.0f;  // An outlier row.
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor dw = Device(w, dtype);
    absl::StatusOr<Weight> q = gpu_->QuantizeWeightFp8(dw.view());
    ASSERT_TRUE(q.ok()) << q.status();
    ASSERT_EQ(q->data.dtype(), DType::kF8E4M3);
    ASSERT_EQ(q->data.shape(), Shape({n, k}));
    ASSERT_EQ(q->scale_kind, WeightScaleKind::kPerChannel);
    ASSERT_EQ(q->activations, ActivationScaleKind::kDynamicPerToken);
    ASSERT_TRUE(q->scale.has_value());
    std::vector<float> values(w.data_as<float>(), w.data_as<float>() + n * k);
    if (dtype == DType::kBF16) {
      for (float& v : values) v = Bf16ToF32(F32ToBf16(v));
    }
    const testing_cuda::HostQuantized want =
        testing_cuda::QuantizeFp8Host(testing_cuda::HostQuantization::kPerToken,
                                      false, n, k, values.data(), 0.0f);
    std::vector<uint8_t> bytes(n * k);
    ASSERT_TRUE(gpu_->CopyToHost(q->data.view(), bytes.data()).ok());
    const std::vector<float> scales = Host(q->scale->view());
    EXPECT_EQ(bytes, want.q);
    ASSERT_EQ(scales.size(), want.scales.size());
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(std::memcmp(&scales[r], &want.scales[r], 4), 0)
          << r << ": " << scales[r] << " vs " << want.scales[r];
    }
    EXPECT_EQ(scales[4], 1.0f);
    // Linear reads it (either path at 2 rows, the tensor cores at 40).
    HostFp8 h;
    h.n = n, h.k = k, h.data = bytes, h.scale = scales;
    for (const int64_t t : {int64_t{2}, int64_t{40}}) {
      const std::vector<float> x = RandomX(t * k);
      const Tensor dx = DeviceF32(x, {t, k});
      Tensor out = DeviceEmpty({t, n});
      ASSERT_TRUE(gpu_->Linear(dx.view(), *q, nullptr, out.view()).ok());
      EXPECT_EQ(BadRows(Host(out.view()), Want(h, x, t, nullptr), t, n), 0);
    }
  }
  Tensor bad = Random({2, 3, 4});
  EXPECT_EQ(gpu_->QuantizeWeightFp8(Device(bad).view()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The CPU reference has no fp8 products.
  const absl::Status cpu = cpu_.QuantizeWeightFp8(w.view()).status();
  EXPECT_EQ(cpu.code(), absl::StatusCode::kUnimplemented) << cpu;
}

// What no fp8 kernel takes is refused naming why, never computed some other
// way; fp8 embedding tables and fp8 data without a scale are refused too.
TEST_F(CudaFp8OpsTest, Fp8RefusesWhatItDoesNotTake) {
  const auto linear = [&](const HostFp8& h, int64_t t) {
    const Weight w = Upload(h);
    const Tensor dx = DeviceF32(RandomX(t * h.k), {t, h.k});
    Tensor out = DeviceEmpty({t, h.n});
    return gpu_->Linear(dx.view(), w, nullptr, out.view());
  };
  using A = ActivationScaleKind;
  // Per-channel weights with per-block activations: the skinny kernel at 2
  // rows, nothing at 64.
  const HostFp8 per_block =
      RandomHostFp8(rng_, 64, 256, 0, A::kDynamicPerBlock);
  EXPECT_TRUE(linear(per_block, 2).ok());
  absl::Status st = linear(per_block, 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("per-block activation"), absl::string_view::npos)
      << st;
  // K not a multiple of 16: neither kernel.
  st = linear(RandomHostFp8(rng_, 64, 40, 0, A::kDynamicPerToken), 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  // N not a multiple of 4: the skinny kernel at 2 rows, nothing at 40.
  const HostFp8 odd_n = RandomHostFp8(rng_, 37, 256, 0, A::kDynamicPerToken);
  EXPECT_TRUE(linear(odd_n, 2).ok());
  st = linear(odd_n, 40);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("N % 4 == 0"), absl::string_view::npos) << st;
  // Block 64: the skinny kernel only.
  const HostFp8 block64 = RandomHostFp8(rng_, 64, 256, 64, A::kDynamicPerToken);
  EXPECT_TRUE(linear(block64, 3).ok());
  EXPECT_EQ(linear(block64, 32).code(), absl::StatusCode::kUnimplemented);
  // fp8 data without a scale.
  const HostFp8 h = RandomHostFp8(rng_, 8, 32, 0, A::kDynamicPerToken);
  Weight unscaled = Upload(h);
  unscaled.scale_kind = WeightScaleKind::kNone;
  unscaled.scale.reset();
  const Tensor dx = DeviceF32(RandomX(32), {1, 32});
  Tensor out = DeviceEmpty({1, 8});
  EXPECT_EQ(gpu_->Linear(dx.view(), unscaled, nullptr, out.view()).code(),
            absl::StatusCode::kInvalidArgument);
  // An fp8 embedding table.
  const std::vector<int32_t> ids = {0, 3};
  const DeviceArray<int32_t> d_ids(ids);
  Tensor rows = DeviceEmpty({2, 32});
  EXPECT_EQ(
      gpu_->Embedding(unscaled.data.view(), View(d_ids), rows.view()).code(),
      absl::StatusCode::kInvalidArgument);
}

// After ReserveStepScratch, fp8 products (both scalings, the quantized input
// and its scales, a padded block scale) allocate nothing; a step beyond the
// limits fails instead of growing the scratch.
TEST_F(CudaFp8OpsTest, Fp8ProductsAllocateNothingAfterTheReservation) {
  StepLimits limits;
  limits.max_tokens = 64;
  limits.max_seqs = 8;
  limits.max_seq_len = 64;
  limits.max_heads = 2;
  limits.max_head_dim = 8;
  limits.max_linear_in = 1024;
  limits.vocab_size = 16;
  ASSERT_TRUE(gpu_->ReserveStepScratch(limits).ok());
  using A = ActivationScaleKind;
  const Weight per_channel =
      Upload(RandomHostFp8(rng_, 256, 1024, 0, A::kDynamicPerToken));
  const Weight block =
      Upload(RandomHostFp8(rng_, 256, 272, 128, A::kDynamicPerBlock));
  const Tensor x = DeviceF32(RandomX(64 * 1024), {64, 1024});
  const Tensor x_block = DeviceF32(RandomX(64 * 272), {64, 272});
  Tensor out = DeviceEmpty({64, 256});
  // Plans, paths and tuning on the first products.
  ASSERT_TRUE(gpu_->Linear(x.view(), per_channel, nullptr, out.view()).ok());
  ASSERT_TRUE(gpu_->Linear(x_block.view(), block, nullptr, out.view()).ok());
  const int64_t before = allocator_->stats().allocations;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(gpu_->Linear(x.view(), per_channel, nullptr, out.view()).ok());
    ASSERT_TRUE(gpu_->Linear(x_block.view(), block, nullptr, out.view()).ok());
  }
  EXPECT_EQ(allocator_->stats().allocations, before);
  const Weight wide =
      Upload(RandomHostFp8(rng_, 256, 2048, 0, A::kDynamicPerToken));
  const Tensor x_wide = DeviceF32(RandomX(64 * 2048), {64, 2048});
  const int64_t before_wide = allocator_->stats().allocations;
  EXPECT_EQ(gpu_->Linear(x_wide.view(), wide, nullptr, out.view()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(allocator_->stats().allocations, before_wide);
}

// fp8 products of shapes first seen while a graph is captured (the skinny
// kernel at 2 rows; the tensor-core path, planned mid-capture, at 32) replay
// on new inputs.
TEST_F(CudaFp8OpsTest, Fp8ProductsFirstSeenWhileCapturingReplay) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  StepLimits limits;
  limits.max_tokens = 32;
  limits.max_seqs = 8;
  limits.max_seq_len = 64;
  limits.max_heads = 2;
  limits.max_head_dim = 8;
  limits.max_linear_in = 512;
  limits.vocab_size = 16;
  ASSERT_TRUE(gpu_->ReserveStepScratch(limits).ok());
  const HostFp8 h =
      RandomHostFp8(rng_, 320, 512, 128, ActivationScaleKind::kDynamicPerBlock);
  const Weight w = Upload(h);
  Tensor x2 = DeviceEmpty({2, 512}), x32 = DeviceEmpty({32, 512});
  Tensor out2 = DeviceEmpty({2, 320}), out32 = DeviceEmpty({32, 320});
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(gpu_->Linear(x2.view(), w, nullptr, out2.view()).ok());
  ASSERT_TRUE(gpu_->Linear(x32.view(), w, nullptr, out32.view()).ok());
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int replay = 0; replay < 2; ++replay) {
    const std::vector<float> a = RandomX(2 * 512), b = RandomX(32 * 512);
    ASSERT_EQ(
        cudaMemcpy(x2.data(), a.data(), a.size() * 4, cudaMemcpyHostToDevice),
        cudaSuccess);
    ASSERT_EQ(
        cudaMemcpy(x32.data(), b.data(), b.size() * 4, cudaMemcpyHostToDevice),
        cudaSuccess);
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    EXPECT_EQ(BadRows(Host(out2.view()), Want(h, a, 2, nullptr), 2, 320), 0);
    EXPECT_EQ(BadRows(Host(out32.view()), Want(h, b, 32, nullptr), 32, 320), 0);
  }
}

}  // namespace
}  // namespace tessera
