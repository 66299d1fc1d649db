// Google Benchmark for the CPU reference ops at the shapes a decode step uses.
//   bazel run //kernels/cpu:cpu_ops_benchmark -- --benchmark_filter=Linear
// Reports bytes/s for the weight-streaming ops so the number can be compared
// with the machine's memory bandwidth.
#include <random>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

Tensor RandomTensor(Shape shape) {
  Tensor t = *Tensor::Empty(DType::kF32, std::move(shape));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

// out[T, N] = x[T, K] · W[N, K]ᵀ; args: T, N, K.
void BM_Linear(benchmark::State& state) {
  const int64_t t = state.range(0), n = state.range(1), k = state.range(2);
  Tensor x = RandomTensor({t, k}), w = RandomTensor({n, k});
  Tensor out = *Tensor::Empty(DType::kF32, {t, n});
  CpuOps ops;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        ops.Linear(x.view(), w.view(), nullptr, out.view()));
  }
  state.SetBytesProcessed(state.iterations() * n * k *
                          static_cast<int64_t>(sizeof(float)));
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * t * n * k * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Linear)
    ->Args({1, 512, 64})
    ->Args({1, 4096, 1024})
    ->Args({1, 11008, 4096})
    ->Args({128, 4096, 1024});

// One decode token attending over `len` cached positions; args: len, heads,
// kv_heads, D.
void BM_DecodeAttention(benchmark::State& state) {
  const int64_t len = state.range(0), heads = state.range(1),
                kv = state.range(2), dim = state.range(3);
  Tensor q = RandomTensor({1, heads, dim});
  Tensor k = RandomTensor({len, kv, dim}), v = RandomTensor({len, kv, dim});
  Tensor out = *Tensor::Empty(DType::kF32, {1, heads, dim});
  CpuOps ops;
  AttentionArgs args{q.view(), k.view(), v.view(), out.view(),
                     len - 1,  0,        0.125f};
  for (auto _ : state) benchmark::DoNotOptimize(ops.Attention(args));
  state.SetBytesProcessed(state.iterations() * 2 * len * kv * dim *
                          static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_DecodeAttention)->Args({512, 8, 4, 8})->Args({4096, 32, 8, 128});

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
