// Skinny matrix products for decode steps: out[t, n] = x[t, k] · w[n, k]ᵀ
// (+ bias[n]) for a few rows t, bf16 weights, f32 activations and output.
//
// Why by hand: at a handful of rows the product is a pass over the weights
// (2 bytes per weight, ~1 FLOP per byte), so its time is the weights' bytes
// over the memory bandwidth. cuBLASLt needs its input in the weights' dtype
// (a cast kernel and a scratch buffer per product), launches one kernel per
// product plus a separate bias add, and at one row its heuristic picks tiles
// built for larger products. This kernel reads the f32 activations as they
// are, streams every weight row once with 16-byte loads (each lane keeps its
// slice of x in registers across the rows of its warp), reduces across the
// warp with shuffles, and adds the bias in the same pass. It also starts
// streaming its weights before the kernel ahead of it has finished
// (programmatic dependent launch: the weights never depend on that kernel;
// the launch contract is kernels/cuda/common/launch.cuh's). Narrow products
// (fewer than ~1024 warps' worth of columns) split k across a block's warps
// so that enough loads are in flight; the gate/up form computes the gated
// activation in the same pass.
//
// Results: f32 accumulation in a fixed order (the same inputs give bitwise
// the same outputs, whatever else runs), not the same rounding as cuBLASLt.
// Each output row t depends only on x row t (no mixing across rows).
#ifndef TESSERA_KERNELS_CUDA_GEMM_SKINNY_GEMM_H_
#define TESSERA_KERNELS_CUDA_GEMM_SKINNY_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// The most rows (t) the skinny kernel takes.
inline constexpr int64_t kMaxSkinnyRows = 4;

// Whether LaunchSkinnyGemm takes this product: 1 <= t <= kMaxSkinnyRows,
// n >= 1, k a positive multiple of 8 (each lane reads 8 weights at a time),
// x and w 16-byte aligned (and so every row of each, given k). CudaOps::Linear
// sends exactly these products here and every other one to cuBLASLt.
bool SkinnyGemmApplies(int64_t t, int64_t n, int64_t k, const void* x,
                       const void* w);

// out [t, n] = x [t, k] (f32) · w [n, k]ᵀ (bf16) + bias [n] (f32, or null).
// cudaErrorInvalidValue unless SkinnyGemmApplies(t, n, k, x, w) and out is
// non-null; otherwise the launch's error.
cudaError_t LaunchSkinnyGemm(int64_t t, int64_t n, int64_t k, const float* x,
                             const void* w, const float* bias, float* out,
                             cudaStream_t stream);

// The gated MLP's input in one pass: out [t, n] = silu(g) * u with
// g = x · gate_up[0:n]ᵀ + bias[0:n] and u = x · gate_up[n:2n]ᵀ + bias[n:2n]
// (gate_up [2n, k] bf16, the gate rows then the up rows; bias [2n] f32 or
// null). Each output is bitwise what LaunchSkinnyGemm into a [t, 2n] buffer
// followed by LaunchGatedSilu computes, without that buffer.
// cudaErrorInvalidValue unless SkinnyGemmApplies(t, 2n, k, x, gate_up) and out
// is non-null; otherwise the launch's error.
cudaError_t LaunchSkinnyGatedSilu(int64_t t, int64_t n, int64_t k,
                                  const float* x, const void* gate_up,
                                  const float* bias, float* out,
                                  cudaStream_t stream);

// The same with GeGLU's activation: out = gelu_tanh(g) * u, bitwise what
// LaunchSkinnyGemm followed by LaunchGatedGeluTanh computes.
cudaError_t LaunchSkinnyGatedGeluTanh(int64_t t, int64_t n, int64_t k,
                                      const float* x, const void* gate_up,
                                      const float* bias, float* out,
                                      cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_GEMM_SKINNY_GEMM_H_
