// Google Benchmark for the CPU reference ops at the shapes a decode step uses.
//   bazel run //kernels/cpu:cpu_ops_benchmark -- --benchmark_filter=Linear
// Reports bytes/s for the weight-streaming ops so the number can be compared
// with the machine's memory bandwidth.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/attention_metadata.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/testing/step_arrays.h"

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

// A paged step: `num_seqs` sequences, each running `query_len` tokens after
// `context_len` cached ones, over a cache of 16-slot blocks in shuffled order
// (f32 or int8). Heads 8, KV heads 4, D = Dv = 64.
class PagedStep {
 public:
  static constexpr int64_t kHeads = 8, kKvHeads = 4, kDim = 64;
  static constexpr int32_t kBlockSize = 16;

  PagedStep(int64_t num_seqs, int64_t context_len, int64_t query_len,
            bool int8) {
    const int64_t blocks_per_seq =
        (context_len + query_len + kBlockSize - 1) / kBlockSize;
    const int64_t num_blocks = num_seqs * blocks_per_seq;
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(3));
    std::vector<SequenceSlice> slices;
    for (int64_t s = 0; s < num_seqs; ++s) {
      slices.push_back({context_len, query_len,
                        absl::MakeConstSpan(pool.data() + s * blocks_per_seq,
                                            blocks_per_seq)});
    }
    metadata_ = *BuildAttentionMetadata(slices, kBlockSize, num_blocks);
    view_ = metadata_.View();
    const int64_t slots = num_blocks * kBlockSize;
    q_ = RandomTensor({metadata_.num_tokens, kHeads, kDim});
    out_ = *Tensor::Empty(DType::kF32, {metadata_.num_tokens, kHeads, kDim});
    const DType dtype = int8 ? DType::kI8 : DType::kF32;
    k_ = *Tensor::Empty(dtype, {slots, kKvHeads, kDim});
    v_ = *Tensor::Empty(dtype, {slots, kKvHeads, kDim});
    cache_.k = k_.view();
    cache_.v = v_.view();
    if (int8) {
      k_scale_ = *Tensor::Empty(DType::kF32, {slots, kKvHeads});
      v_scale_ = *Tensor::Empty(DType::kF32, {slots, kKvHeads});
      cache_.k_scale = k_scale_.view();
      cache_.v_scale = v_scale_.view();
    }
    // Fill every slot of the cache through StoreKvCache.
    std::vector<int64_t> all_slots(slots);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    Tensor k = RandomTensor({slots, kKvHeads, kDim});
    Tensor v = RandomTensor({slots, kKvHeads, kDim});
    if (!ops_.StoreKvCache(k.view(), v.view(), StepArray(all_slots), cache_)
             .ok()) {
      std::abort();
    }
  }

  PagedAttentionArgs Args() const {
    PagedAttentionArgs args;
    args.q = q_.view();
    args.cache = cache_;
    args.metadata = &view_;
    args.first_seq = 0;
    args.end_seq = metadata_.num_seqs;
    args.out = out_.view();
    args.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    return args;
  }
  // Bytes of K and V one pass over every sequence's cache reads.
  int64_t KvBytes() const {
    int64_t positions = 0;
    for (int32_t len : metadata_.seq_lens) positions += len;
    return 2 * positions * kKvHeads * kDim * DTypeSize(k_.dtype());
  }
  CpuOps& ops() { return ops_; }

 private:
  CpuOps ops_;
  HostAttentionMetadata metadata_;
  AttentionMetadata view_;  // Of metadata_.
  Tensor q_, out_, k_, v_, k_scale_, v_scale_;
  KvCacheLayer cache_;
};

// Decode step: args: batch, context (including the new token), int8.
void BM_PagedDecodeAttention(benchmark::State& state) {
  PagedStep step(state.range(0), state.range(1) - 1, 1, state.range(2) != 0);
  const PagedAttentionArgs args = step.Args();
  for (auto _ : state) {
    benchmark::DoNotOptimize(step.ops().DecodeAttention(args));
  }
  state.SetBytesProcessed(state.iterations() * step.KvBytes());
  state.SetLabel(state.range(2) ? "int8" : "f32");
}
BENCHMARK(BM_PagedDecodeAttention)
    ->ArgNames({"batch", "ctx", "int8"})
    ->Args({64, 256, 0})
    ->Args({64, 256, 1})
    ->UseRealTime();

// Prefill step from an empty cache: args: sequences, tokens each, int8.
void BM_PagedPrefillAttention(benchmark::State& state) {
  PagedStep step(state.range(0), 0, state.range(1), state.range(2) != 0);
  const PagedAttentionArgs args = step.Args();
  for (auto _ : state) {
    benchmark::DoNotOptimize(step.ops().PrefillAttention(args));
  }
  // Causal: token i attends i + 1 keys, (D + Dv) multiply-adds per key and
  // head.
  const int64_t n = state.range(1);
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * state.range(0) * n * (n + 1) / 2 * PagedStep::kHeads * 2 *
          PagedStep::kDim * state.iterations(),
      benchmark::Counter::kIsRate);
  state.SetLabel(state.range(2) ? "int8" : "f32");
}
BENCHMARK(BM_PagedPrefillAttention)
    ->ArgNames({"seqs", "tokens", "int8"})
    ->Args({4, 128, 0})
    ->Args({4, 128, 1})
    ->UseRealTime();

// Writing one decode step's keys and values (batch 64) into the cache.
void BM_StoreKvCache(benchmark::State& state) {
  const bool int8 = state.range(0) != 0;
  PagedStep step(64, 255, 1, int8);
  const AttentionMetadata& m = *step.Args().metadata;
  Tensor k = RandomTensor({64, PagedStep::kKvHeads, PagedStep::kDim});
  Tensor v = RandomTensor({64, PagedStep::kKvHeads, PagedStep::kDim});
  const KvCacheLayer cache = step.Args().cache;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        step.ops().StoreKvCache(k.view(), v.view(), m.slot_mapping, cache));
  }
  state.SetLabel(int8 ? "int8" : "f32");
}
BENCHMARK(BM_StoreKvCache)->ArgName("int8")->Arg(0)->Arg(1);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
