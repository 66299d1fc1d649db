// CudaOps against the CPU reference (CpuOps) on fresh random inputs: the
// cuBLASLt matrix products (f32, and bf16 weights with f32 accumulation), the
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

TEST_F(CudaOpsTest, LinearRefusesAScaledWeight) {
  Tensor dx = Device(Random({2, 4})), dw = Device(Random({3, 4}));
  Tensor dscale = Device(Random({3})), out = DeviceEmpty({2, 3});
  WeightView scaled = dw;
  scaled.scale = dscale.view();
  const absl::Status st = gpu_->Linear(dx.view(), scaled, nullptr, out.view());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("weight scale"), absl::string_view::npos) << st;
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

}  // namespace
}  // namespace tessera
