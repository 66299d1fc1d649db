// Decode-shaped matrix products on one GPU (Google Benchmark): the Llama-3-8B
// projections (fused qkv, o, fused gate_up, down, the LM head) and Qwen3-0.6B's
// at a few rows (and the gate/up product fused with SiLU),
// through the skinny kernel (skinny_gemm.h) and cuBLASLt (GemmPlans, whose
// small-row bf16 plans are tuned on first use), beside the card's
// device-to-device copy rate. The counter `weight_GBps` is the weights' bytes
// over the time; compare it with `copy_GBps` (read + write bytes of a
// cudaMemcpy) of the same run. Every product cycles through enough copies of
// its weights to exceed the L2 several times, so each launch reads DRAM, and
// the time is CUDA events around a batch of launches on one stream.
//
//   bazel run -c opt //kernels/cuda:gemm_bench   (on a GPU machine)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/gemm/gemm_plans.h"
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kLaunchesPerIteration = 20;
constexpr size_t kMinBytesInRotation = size_t{512} << 20;

struct Shape {
  const char* name;
  int64_t n, k;
};
constexpr Shape kShapes[] = {{"qkv", 6144, 4096},
                             {"o", 4096, 4096},
                             {"gate_up", 28672, 4096},
                             {"down", 4096, 14336},
                             {"lm_head", 128256, 4096},
                             // Qwen3-0.6B's, where launch and ramp dominate.
                             {"qwen_qkv", 4096, 1024},
                             {"qwen_o", 1024, 2048},
                             {"qwen_gate_up", 6144, 1024},
                             {"qwen_down", 1024, 3072}};

// Device buffers for one benchmark; freed at the end of it.
class Buffers {
 public:
  ~Buffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* Get(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    cudaMemset(p, 0, bytes);
    ptrs_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

// Small random-ish bf16 weights (the timing does not depend on the values,
// but NaNs and denormals could).
void FillWeights(void* w, size_t count) {
  std::vector<uint16_t> host(count);
  uint32_t s = 12345;
  for (uint16_t& v : host) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<uint16_t>(0x3c00 + (s >> 24) % 128);  // ~0.0078..0.0155
  }
  cudaMemcpy(w, host.data(), count * 2, cudaMemcpyHostToDevice);
}

// kSkinnyGated: the gate/up product fused with SiLU (its n / 2 outputs).
enum class Path { kSkinny, kSkinnyGated, kCublasLt };

void BM_Product(benchmark::State& state, Shape shape, Path path) {
  const int64_t t = state.range(0), n = shape.n, k = shape.k;
  const size_t weight_bytes = static_cast<size_t>(n * k) * 2;
  const int copies =
      static_cast<int>((kMinBytesInRotation + weight_bytes - 1) / weight_bytes);
  Buffers buffers;
  std::vector<void*> weights;
  for (int i = 0; i < copies; ++i) {
    weights.push_back(buffers.Get(weight_bytes));
    if (weights.back() == nullptr) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
    // One host fill; the other copies are device copies of it.
    if (i == 0) {
      FillWeights(weights[0], static_cast<size_t>(n * k));
    } else {
      cudaMemcpy(weights[i], weights[0], weight_bytes,
                 cudaMemcpyDeviceToDevice);
    }
  }
  float* x = static_cast<float*>(buffers.Get(t * k * 4));
  void* x_bf16 = buffers.Get(t * k * 2);
  float* out = static_cast<float*>(buffers.Get(t * n * 4));
  void* workspace = buffers.Get(GemmPlans::kWorkspaceBytes);
  if (x == nullptr || x_bf16 == nullptr || out == nullptr ||
      workspace == nullptr) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::unique_ptr<GemmPlans> plans;
  if (path == Path::kCublasLt) {
    auto made = GemmPlans::Create();
    if (!made.ok()) {
      state.SkipWithError(made.status().ToString().c_str());
      return;
    }
    plans = *std::move(made);
  }
  int next = 0;
  auto launch = [&]() -> bool {
    const void* w = weights[next];
    next = (next + 1) % copies;
    if (path == Path::kSkinny) {
      return LaunchSkinnyGemm(t, n, k, x, w, nullptr, out, stream) ==
             cudaSuccess;
    }
    if (path == Path::kSkinnyGated) {
      return LaunchSkinnyGatedSilu(t, n / 2, k, x, w, nullptr, out, stream) ==
             cudaSuccess;
    }
    return plans
        ->Matmul(t, n, k, DType::kBF16, x_bf16, w, out, workspace, stream)
        .ok();
  };
  // Warm-up: plans made and tuned, every copy touched once.
  for (int i = 0; i < copies + 2; ++i) {
    if (!launch()) {
      state.SkipWithError("the product failed");
      return;
    }
  }
  cudaStreamSynchronize(stream);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < kLaunchesPerIteration; ++i) launch();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / kLaunchesPerIteration);
  }
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("a launch failed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  state.counters["weight_GBps"] =
      benchmark::Counter(static_cast<double>(weight_bytes) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DeviceCopy(benchmark::State& state) {
  const size_t bytes = size_t{2} << 30;
  Buffers buffers;
  void* a = buffers.Get(bytes);
  void* b = buffers.Get(bytes);
  if (a == nullptr || b == nullptr) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  for (auto _ : state) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // Read + write, as ../shared/bench/hf_baseline.py counts a copy.
  state.counters["copy_GBps"] = benchmark::Counter(
      2.0 * bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void Register() {
  benchmark::RegisterBenchmark("DeviceCopy", BM_DeviceCopy)
      ->UseManualTime()
      ->Iterations(10);
  for (const Shape& shape : kShapes) {
    benchmark::RegisterBenchmark(
        (std::string("Skinny/") + shape.name).c_str(),
        [shape](benchmark::State& s) { BM_Product(s, shape, Path::kSkinny); })
        ->UseManualTime()
        ->Arg(1)
        ->Arg(kMaxSkinnyRows);
    if (std::string(shape.name).find("gate_up") != std::string::npos) {
      benchmark::RegisterBenchmark(
          (std::string("SkinnyGatedSilu/") + shape.name).c_str(),
          [shape](benchmark::State& s) {
            BM_Product(s, shape, Path::kSkinnyGated);
          })
          ->UseManualTime()
          ->Arg(1)
          ->Arg(kMaxSkinnyRows);
    }
    benchmark::RegisterBenchmark(
        (std::string("CublasLt/") + shape.name).c_str(),
        [shape](benchmark::State& s) { BM_Product(s, shape, Path::kCublasLt); })
        ->UseManualTime()
        ->Arg(1)
        ->Arg(4)
        ->Arg(64);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  tessera::cuda::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
