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
// fp8 (e4m3) weights, beside bf16, for the Llama-3-8B projections (qkv, o,
// gate_up, down): the skinny weight-only kernel (fp8_gemm.h) at 1..8 rows,
// and cuBLASLt's fp8 tensor cores (GemmPlans::MatmulFp8; inputs already
// quantized) at 1, 64 and 4096 rows with per-token x per-channel scales
// ("Fp8CublasLt") and 64 and 4096 rows with 1x128 x 128x128 block scales
// ("Fp8CublasLtBlock"); the activation quantization the tensor-core path
// adds is its own case ("Fp8Quantize", per token and per 1x128 group). Every
// product reports `weight_GBps` (the weights' bytes, 1 per fp8 weight) and
// `TFLOPs` (2 t n k per product); compare with `copy_GBps` (~4.3 TB/s on an
// H200) and the card's ~990 dense fp8 (~495 bf16) TFLOP/s.
//
//   bazel run -c opt //kernels/cuda:gemm_bench   (on a GPU machine)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/gemm/fp8_gemm.h"
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

// Random-ish e4m3 weights, never NaN (0x7f / 0xff): magnitudes up to 2.
void FillFp8Weights(void* w, size_t count) {
  std::vector<uint8_t> host(count);
  uint32_t s = 12345;
  for (uint8_t& v : host) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<uint8_t>((s >> 24) & 0xbf);  // Exponent field <= 7.
  }
  cudaMemcpy(w, host.data(), count, cudaMemcpyHostToDevice);
}

// A device f32 array of `count` copies of `value`.
bool FillF32(void* p, size_t count, float value) {
  std::vector<float> host(count, value);
  return cudaMemcpy(p, host.data(), count * 4, cudaMemcpyHostToDevice) ==
         cudaSuccess;
}

// kSkinnyGated: the gate/up product fused with SiLU (its n / 2 outputs).
enum class Path {
  kSkinny,
  kSkinnyGated,
  kCublasLt,
  kFp8Skinny,
  kFp8CublasLt,
  kFp8CublasLtBlock,
};

bool IsFp8(Path path) {
  return path == Path::kFp8Skinny || path == Path::kFp8CublasLt ||
         path == Path::kFp8CublasLtBlock;
}

void BM_Product(benchmark::State& state, Shape shape, Path path) {
  const int64_t t = state.range(0), n = shape.n, k = shape.k;
  const bool fp8 = IsFp8(path);
  const bool block = path == Path::kFp8CublasLtBlock;
  const size_t weight_bytes = static_cast<size_t>(n * k) * (fp8 ? 1 : 2);
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
      if (fp8) {
        FillFp8Weights(weights[0], static_cast<size_t>(n * k));
      } else {
        FillWeights(weights[0], static_cast<size_t>(n * k));
      }
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
  // fp8: the weight's scale (per-channel [n] or block rows), the quantized
  // x (bytes of 1.0) and its scales (per token, or per 1x128 group), and the
  // bf16-output scratch a plan may ask for.
  const int64_t groups = (k + 127) / 128;
  const size_t w_scale_count =
      block ? static_cast<size_t>((n + 127) / 128 *
                                  GemmPlans::Fp8BlockScaleStride(k))
            : static_cast<size_t>(n);
  const size_t x_scale_count = static_cast<size_t>(block ? groups * t : t);
  float* w_scale = nullptr;
  float* x_scale = nullptr;
  void* x_fp8 = nullptr;
  void* bf16_scratch = nullptr;
  if (fp8) {
    w_scale = static_cast<float*>(buffers.Get(w_scale_count * 4));
    x_scale = static_cast<float*>(buffers.Get(x_scale_count * 4));
    x_fp8 = buffers.Get(static_cast<size_t>(t * k));
    bf16_scratch = buffers.Get(GemmPlans::kFp8Bf16ScratchBytes);
    if (w_scale == nullptr || x_scale == nullptr || x_fp8 == nullptr ||
        bf16_scratch == nullptr || !FillF32(w_scale, w_scale_count, 1e-2f) ||
        !FillF32(x_scale, x_scale_count, 1e-2f) ||
        cudaMemset(x_fp8, 0x38, static_cast<size_t>(t * k)) != cudaSuccess) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
  }
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::unique_ptr<GemmPlans> plans;
  if (path == Path::kCublasLt || path == Path::kFp8CublasLt ||
      path == Path::kFp8CublasLtBlock) {
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
    if (path == Path::kFp8Skinny) {
      return LaunchFp8SkinnyGemm(t, n, k, x, w, w_scale, 0, nullptr, out,
                                 stream) == cudaSuccess;
    }
    if (fp8) {
      return plans
          ->MatmulFp8(
              t, n, k,
              block ? GemmPlans::Fp8Scaling::kBlock
                    : GemmPlans::Fp8Scaling::kOuterVector,
              {x_fp8, x_scale}, {w, w_scale}, out, workspace,
              [&]() -> absl::StatusOr<void*> { return bf16_scratch; }, stream)
          .ok();
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
  state.counters["TFLOPs"] =
      benchmark::Counter(2.0 * static_cast<double>(t) * static_cast<double>(n) *
                             static_cast<double>(k) / 1e12,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// The tensor-core path's activation quantization alone: x [t, k] f32 to e4m3
// per token (OUTER_VEC's scales) or per 1x128 group (VEC128's). The counter
// `x_GBps` is the f32 input's bytes over the time.
void BM_Fp8Quantize(benchmark::State& state, int64_t k, bool per_group) {
  const int64_t t = state.range(0);
  Buffers buffers;
  float* x = static_cast<float*>(buffers.Get(t * k * 4));
  void* q = buffers.Get(t * k);
  float* scales = static_cast<float*>(buffers.Get(t * ((k + 127) / 128) * 4));
  if (x == nullptr || q == nullptr || scales == nullptr ||
      !FillF32(x, static_cast<size_t>(t * k), 0.5f)) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  auto launch = [&]() {
    return LaunchQuantizeFp8Activations(
        per_group ? Fp8Quantization::kDynamicPerGroup
                  : Fp8Quantization::kDynamicPerToken,
        per_group ? Fp8ScaleLayout::kPerGroup : Fp8ScaleLayout::kPerRow, t, k,
        x, nullptr, q, scales, stream);
  };
  if (launch() != cudaSuccess) {
    state.SkipWithError("the quantization failed");
    return;
  }
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
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  state.counters["x_GBps"] =
      benchmark::Counter(static_cast<double>(t * k) * 4 / 1e9,
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
    const std::string name = shape.name;
    const bool llama =
        name == "qkv" || name == "o" || name == "gate_up" || name == "down";
    auto* cublaslt = benchmark::RegisterBenchmark(
        (std::string("CublasLt/") + shape.name).c_str(),
        [shape](benchmark::State& s) {
          BM_Product(s, shape, Path::kCublasLt);
        });
    cublaslt->UseManualTime()->Arg(1)->Arg(4)->Arg(64);
    if (!llama) continue;
    cublaslt->Arg(4096);
    benchmark::RegisterBenchmark(
        (std::string("Fp8Skinny/") + shape.name).c_str(),
        [shape](benchmark::State& s) {
          BM_Product(s, shape, Path::kFp8Skinny);
        })
        ->UseManualTime()
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->Arg(kMaxFp8SkinnyRows);
    benchmark::RegisterBenchmark(
        (std::string("Fp8CublasLt/") + shape.name).c_str(),
        [shape](benchmark::State& s) {
          BM_Product(s, shape, Path::kFp8CublasLt);
        })
        ->UseManualTime()
        ->Arg(1)
        ->Arg(64)
        ->Arg(4096);
    benchmark::RegisterBenchmark(
        (std::string("Fp8CublasLtBlock/") + shape.name).c_str(),
        [shape](benchmark::State& s) {
          BM_Product(s, shape, Path::kFp8CublasLtBlock);
        })
        ->UseManualTime()
        ->Arg(64)
        ->Arg(4096);
  }
  for (const int64_t k : {int64_t{4096}, int64_t{14336}}) {
    for (const bool per_group : {false, true}) {
      benchmark::RegisterBenchmark(
          (std::string("Fp8Quantize/") + (per_group ? "group128" : "token") +
           "/k" + std::to_string(k))
              .c_str(),
          [k, per_group](benchmark::State& s) {
            BM_Fp8Quantize(s, k, per_group);
          })
          ->UseManualTime()
          ->Arg(64)
          ->Arg(4096);
    }
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
