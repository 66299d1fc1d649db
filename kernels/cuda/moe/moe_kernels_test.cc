// CudaOps' mixture-of-experts ops against the CPU reference (CpuOps) on
// fresh random inputs:
//  - MoeRoute: the same experts (exactly) and weights (f32 rounding) for
//    1..128 experts, top 1..8, with and without renormalisation, ties by the
//    lower id;
//  - MoeExperts: bf16 weights (the CPU given the same bf16-rounded values in
//    f32) and f32 weights, decode shapes (1, 4, 64 tokens over 128 experts,
//    top 8) and prefill shapes (hundreds of rows per expert), experts without
//    rows, expert parallelism's foreign ids, sizes that are not multiples of
//    8 (the scalar path); tolerance: f32 accumulation in another order;
//  - determinism and batch invariance: a token's output is bitwise the same
//    run twice and run alone or among 63 others;
//  - graph safety: routing and experts captured once in a CUDA graph and
//    replayed on new inputs (other routings) give the eager results;
//  - SigmoidGatedAdd.
// Skips itself without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/testing/cuda_ops_fixture.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

float RoundBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

class MoeKernelsTest : public testing_cuda::CudaOpsFixture {
 protected:
  Tensor Random(Shape shape, float scale = 1.0f) {
    Tensor t = *Tensor::Empty(DType::kF32, std::move(shape));
    std::normal_distribution<float> dist(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng_);
    return t;
  }
  // A device copy of `host` stored as `dtype`.
  Tensor Device(const Tensor& host, DType dtype = DType::kF32) {
    absl::StatusOr<Tensor> t = gpu_->Upload(host.view(), dtype);
    EXPECT_TRUE(t.ok()) << t.status();
    return *std::move(t);
  }
  // A device int32 tensor with `host`'s values.
  Tensor DeviceInts(const Tensor& host) {
    Tensor t = DeviceBytes(host.nbytes(), host.shape(), DType::kI32);
    EXPECT_TRUE(CudaStatus(cudaMemcpy(t.data(), host.data(), host.nbytes(),
                                      cudaMemcpyHostToDevice),
                           "cudaMemcpy", "uploading ids")
                    .ok());
    return t;
  }
  // Device memory of `shape` (f32 unless said), contents unspecified.
  Tensor DeviceEmpty(Shape shape, DType dtype = DType::kF32) {
    return DeviceBytes(shape.numel() * 4, shape, dtype);
  }
  Tensor DeviceBytes(int64_t bytes, Shape shape, DType dtype) {
    void* p = nullptr;
    EXPECT_TRUE(CudaStatus(cudaMalloc(&p, std::max<int64_t>(bytes, 16)),
                           "cudaMalloc", "a test buffer")
                    .ok());
    return Tensor::Adopt(p, dtype, std::move(shape),
                         [](void* q) { cudaFree(q); });
  }
  template <typename T>
  std::vector<T> Host(const TensorView& v) {
    std::vector<T> out(static_cast<size_t>(v.numel()));
    EXPECT_TRUE(gpu_->CopyToHost(v, out.data()).ok());
    return out;
  }
  // Routing of k distinct experts among `global` per token, positive weights.
  void RandomRouting(int64_t tokens, int64_t k, int64_t global, Tensor* ids,
                     Tensor* weights) {
    *ids = *Tensor::Empty(DType::kI32, {tokens, k});
    *weights = *Tensor::Empty(DType::kF32, {tokens, k});
    std::vector<int32_t> all(global);
    std::iota(all.begin(), all.end(), 0);
    std::uniform_real_distribution<float> w(0.05f, 1.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng_);
      for (int64_t j = 0; j < k; ++j) {
        ids->data_as<int32_t>()[t * k + j] = all[j];
        weights->data_as<float>()[t * k + j] = w(rng_);
      }
    }
  }

  std::mt19937 rng_{std::random_device{}()};
  CpuOps cpu_;
};

TEST_F(MoeKernelsTest, RouteMatchesTheCpu) {
  for (const auto& [tokens, experts, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 8, 2},
        {37, 8, 2},
        {5, 60, 4},
        {300, 128, 8},
        {3, 16, 16},
        {2, 1, 1},
        {9, 1000, 8}}) {
    for (bool renormalize : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << tokens << " tokens, " << experts << " experts, top " << k
                   << " renorm " << renormalize);
      Tensor logits = Random({tokens, experts}, 2.0f);
      Tensor ids = *Tensor::Empty(DType::kI32, {tokens, k});
      Tensor w = *Tensor::Empty(DType::kF32, {tokens, k});
      ASSERT_TRUE(
          cpu_.MoeRoute(logits.view(), renormalize, ids.view(), w.view()).ok());
      Tensor dlogits = Device(logits);
      Tensor dids = DeviceEmpty({tokens, k}, DType::kI32);
      Tensor dw = DeviceEmpty({tokens, k});
      ASSERT_TRUE(
          gpu_->MoeRoute(dlogits.view(), renormalize, dids.view(), dw.view())
              .ok());
      const std::vector<int32_t> gids = Host<int32_t>(dids.view());
      const std::vector<float> gw = Host<float>(dw.view());
      for (int64_t i = 0; i < tokens * k; ++i) {
        ASSERT_EQ(gids[i], ids.data_as<int32_t>()[i]) << i;
        const float want = w.data_as<float>()[i];
        ASSERT_NEAR(gw[i], want, 2e-6f * (1.0f + std::fabs(want))) << i;
      }
    }
  }
}

TEST_F(MoeKernelsTest, RouteBreaksTiesByTheLowerId) {
  const float rows[2][6] = {{0, 1, 1, 0, 1, -1}, {2, 2, 2, 2, 2, 2}};
  Tensor logits = *Tensor::Empty(DType::kF32, {2, 6});
  std::copy_n(&rows[0][0], 12, logits.data_as<float>());
  Tensor dlogits = Device(logits);
  Tensor dids = DeviceEmpty({2, 3}, DType::kI32);
  Tensor dw = DeviceEmpty({2, 3});
  ASSERT_TRUE(
      gpu_->MoeRoute(dlogits.view(), true, dids.view(), dw.view()).ok());
  EXPECT_EQ(Host<int32_t>(dids.view()),
            (std::vector<int32_t>{1, 2, 4, 0, 1, 2}));
}

struct ExpertsCase {
  int64_t tokens, experts, k, hidden, inter, first, global;
  DType weights;
};

TEST_F(MoeKernelsTest, ExpertsMatchTheCpu) {
  const ExpertsCase cases[] = {
      // Decode over Qwen3-30B-A3B's routing shape (128 experts, top 8).
      {1, 128, 8, 256, 64, 0, 128, DType::kBF16},
      {4, 128, 8, 256, 64, 0, 128, DType::kBF16},
      {64, 128, 8, 256, 64, 0, 128, DType::kBF16},
      // Prefill: many rows per expert (several 8-row tiles each).
      {300, 8, 2, 128, 96, 0, 8, DType::kBF16},
      {300, 8, 2, 128, 96, 0, 8, DType::kF32},
      // Few tokens over many experts: most experts get no rows.
      {3, 64, 2, 64, 32, 0, 64, DType::kBF16},
      // Expert parallelism: experts 8..15 of 32 here.
      {50, 8, 4, 64, 48, 8, 32, DType::kBF16},
      // Sizes that are not multiples of 8: the scalar path.
      {17, 6, 2, 36, 20, 0, 6, DType::kBF16},
      {17, 6, 3, 64, 12, 0, 6, DType::kF32},
  };
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << c.tokens << " tokens, " << c.experts << " experts (first "
                 << c.first << " of " << c.global << "), top " << c.k << ", H "
                 << c.hidden << ", I " << c.inter << ", "
                 << DTypeName(c.weights));
    Tensor x = Random({c.tokens, c.hidden});
    Tensor gate_up = Random({c.experts, 2 * c.inter, c.hidden}, 0.1f);
    Tensor down = Random({c.experts, c.hidden, c.inter}, 0.1f);
    Tensor ids, w;
    RandomRouting(c.tokens, c.k, c.global, &ids, &w);
    // The device's weights; the CPU sees the same values.
    Tensor dgate_up = Device(gate_up, c.weights);
    Tensor ddown = Device(down, c.weights);
    if (c.weights == DType::kBF16) {
      for (Tensor* t : {&gate_up, &down}) {
        for (int64_t i = 0; i < t->numel(); ++i) {
          t->data_as<float>()[i] = RoundBf16(t->data_as<float>()[i]);
        }
      }
    }
    Tensor cpu_scratch = *Tensor::Empty(
        DType::kF32, {cpu_.MoeExpertsScratchBytes(c.tokens, c.k, c.experts,
                                                  c.hidden, c.inter) /
                          4 +
                      1});
    Tensor want = *Tensor::Empty(DType::kF32, {c.tokens, c.hidden});
    MoeExpertsArgs a{x.view(), ids.view(), w.view(),           gate_up,
                     down,     c.first,    cpu_scratch.view(), want.view()};
    ASSERT_TRUE(cpu_.MoeExperts(a).ok());

    Tensor dx = Device(x), dids = DeviceInts(ids), dw = Device(w);
    const int64_t bytes = gpu_->MoeExpertsScratchBytes(c.tokens, c.k, c.experts,
                                                       c.hidden, c.inter);
    Tensor dscratch = DeviceBytes(bytes, {(bytes + 3) / 4}, DType::kF32);
    Tensor dout = DeviceEmpty({c.tokens, c.hidden});
    MoeExpertsArgs g{dx.view(), dids.view(), dw.view(),       dgate_up,
                     ddown,     c.first,     dscratch.view(), dout.view()};
    ASSERT_TRUE(gpu_->MoeExperts(g).ok());
    const std::vector<float> got = Host<float>(dout.view());
    double max_ref = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      max_ref = std::max<double>(max_ref, std::fabs(want.data_as<float>()[i]));
    }
    for (int64_t i = 0; i < want.numel(); ++i) {
      const float r = want.data_as<float>()[i];
      ASSERT_NEAR(got[i], r, 1e-4 * (std::fabs(r) + max_ref * 1e-2))
          << "element " << i;
    }
    // Run again: the same bits (the sort's atomics place rows in any order
    // within an expert, which no output depends on).
    ASSERT_TRUE(gpu_->MoeExperts(g).ok());
    EXPECT_EQ(Host<float>(dout.view()), got);
  }
}

// A token's experts give the same bits alone and in a batch: each routed
// row's products depend on that row and the expert's weights only, whatever
// tile height the batch size picks.
TEST_F(MoeKernelsTest, ExpertsAreBatchInvariant) {
  const int64_t T = 64, E = 128, k = 8, H = 256, I = 64;
  Tensor x = Random({T, H});
  Tensor ids, w;
  RandomRouting(T, k, E, &ids, &w);
  Tensor dgate_up = Device(Random({E, 2 * I, H}, 0.1f), DType::kBF16);
  Tensor ddown = Device(Random({E, H, I}, 0.1f), DType::kBF16);
  const int64_t bytes = gpu_->MoeExpertsScratchBytes(T, k, E, H, I);
  Tensor dscratch = DeviceBytes(bytes, {(bytes + 3) / 4}, DType::kF32);
  Tensor dx = Device(x), dids = DeviceInts(ids), dw = Device(w);
  Tensor dout = DeviceEmpty({T, H});
  MoeExpertsArgs all{dx.view(), dids.view(), dw.view(),       dgate_up,
                     ddown,     0,           dscratch.view(), dout.view()};
  ASSERT_TRUE(gpu_->MoeExperts(all).ok());
  const std::vector<float> batch = Host<float>(dout.view());
  for (int64_t t : {int64_t{0}, int64_t{37}, T - 1}) {
    MoeExpertsArgs one = all;
    one.x = dx.view().Rows(t, t + 1);
    one.topk_ids = dids.view().Rows(t, t + 1);
    one.topk_weights = dw.view().Rows(t, t + 1);
    Tensor dsingle = DeviceEmpty({1, H});
    one.out = dsingle.view();
    ASSERT_TRUE(gpu_->MoeExperts(one).ok());
    const std::vector<float> single = Host<float>(dsingle.view());
    for (int64_t h = 0; h < H; ++h) {
      ASSERT_EQ(single[h], batch[t * H + h]) << "token " << t << " h " << h;
    }
  }
}

// Routing and experts captured once and replayed on new logits (so other
// experts, other counts) give what they give run eagerly.
TEST_F(MoeKernelsTest, CapturedRoutingAndExpertsReplayOnNewRoutings) {
  const int64_t T = 8, E = 16, k = 2, H = 64, I = 32;
  Tensor dgate_up = Device(Random({E, 2 * I, H}, 0.1f), DType::kBF16);
  Tensor ddown = Device(Random({E, H, I}, 0.1f), DType::kBF16);
  Tensor dx = DeviceEmpty({T, H}), dlogits = DeviceEmpty({T, E});
  Tensor dids = DeviceEmpty({T, k}, DType::kI32), dw = DeviceEmpty({T, k});
  const int64_t bytes = gpu_->MoeExpertsScratchBytes(T, k, E, H, I);
  Tensor dscratch = DeviceBytes(bytes, {(bytes + 3) / 4}, DType::kF32);
  Tensor dout = DeviceEmpty({T, H});
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        gpu_->MoeRoute(dlogits.view(), true, dids.view(), dw.view()));
    MoeExpertsArgs a{dx.view(), dids.view(), dw.view(),       dgate_up,
                     ddown,     0,           dscratch.view(), dout.view()};
    return gpu_->MoeExperts(a);
  };
  auto fill = [&](const Tensor& host, Tensor* dev) {
    ASSERT_TRUE(CudaStatus(cudaMemcpy(dev->data(), host.data(), host.nbytes(),
                                      cudaMemcpyHostToDevice),
                           "cudaMemcpy", "refilling an input")
                    .ok());
  };
  fill(Random({T, H}), &dx);
  fill(Random({T, E}), &dlogits);
  ASSERT_TRUE(run().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(run().ok());
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int replay = 0; replay < 3; ++replay) {
    fill(Random({T, H}), &dx);
    fill(Random({T, E}, 3.0f), &dlogits);
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    const std::vector<float> replayed = Host<float>(dout.view());
    const std::vector<int32_t> replayed_ids = Host<int32_t>(dids.view());
    ASSERT_TRUE(run().ok());
    EXPECT_EQ(Host<int32_t>(dids.view()), replayed_ids) << replay;
    EXPECT_EQ(Host<float>(dout.view()), replayed) << replay;
  }
}

TEST_F(MoeKernelsTest, SigmoidGatedAddMatchesTheCpu) {
  const int64_t T = 33, n = 200;
  Tensor gate = Random({T, 1}, 3.0f), x = Random({T, n}), out = Random({T, n});
  Tensor dgate = Device(gate), dx = Device(x), dout = Device(out);
  ASSERT_TRUE(cpu_.SigmoidGatedAdd(gate.view(), x.view(), out.view()).ok());
  ASSERT_TRUE(gpu_->SigmoidGatedAdd(dgate.view(), dx.view(), dout.view()).ok());
  const std::vector<float> got = Host<float>(dout.view());
  for (int64_t i = 0; i < T * n; ++i) {
    const float want = out.data_as<float>()[i];
    ASSERT_NEAR(got[i], want, 1e-6f * (1.0f + std::fabs(want))) << i;
  }
}

}  // namespace
}  // namespace tessera
