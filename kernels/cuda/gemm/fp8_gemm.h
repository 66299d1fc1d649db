// FP8 (OCP e4m3fn) matrix products and conversions on the GPU:
//
//  - A skinny weight-only product for decode: out[t, n] = sum_k x[t, k] *
//    w_real[n, k] (+ bias[n]) for 1 <= t <= kMaxFp8SkinnyRows, x f32 and kept
//    in f32, the weights read as e4m3 with 16-byte loads (16 weights a load)
//    and widened exactly in registers (cvt.rn.f16x2.e4m3x2, then to f32).
//    Like the bf16 kernel (skinny_gemm.h) it is a pass over the weights at
//    the memory bandwidth, at half the bytes: each lane keeps its slice of x
//    in registers across the rows of its warp, sums meet in warp shuffles,
//    narrow products split k across a block's four warps, the weight stream
//    starts before the kernel ahead has finished (PDL, launch.cuh), and the
//    gated forms compute act(gate) * up in the same pass.
//    The weight's scale (kernels/ops.h WeightView):
//      block == 0: per-channel, w_real[n, k] = w[n, k] * scale[n]; the scale
//                  multiplies each output's sum once.
//      block == B: w_real[n, k] = w[n, k] * scale[n / B, k / B] with scale
//                  f32 [ceil(N / B), ceil(K / B)] row-major (the checkpoint's
//                  layout); each 16-weight chunk's partial sum is multiplied
//                  by its block's scale (B % 16 == 0, so a chunk never
//                  straddles two blocks).
//    Results: f32 accumulation in a fixed order (the same inputs give bitwise
//    the same output), each row t depending only on x row t.
//    Measured on an H200 (weights' bytes over the time, back-to-back PDL
//    launches, card copy rate 4.25 TB/s), Llama-3-8B qkv / o / gate_up / down:
//    1 row 2.7 / 2.1 / 3.8 / 2.6 TB/s; 2 rows 2.2 / 1.7 / 2.8 / 1.9; 4 rows
//    1.5 / 1.1 / 2.2 / 1.7; 8 rows 0.8 / 0.7 / 1.2 / 1.2 (from 5 rows on the
//    f32 FMAs, T per weight, not the bytes, are the limit), which is why
//    CudaOps times this kernel against the tensor-core path per shape.
//
//  - Activation quantization for the tensor-core path (gemm_plans.h
//    MatmulFp8): f32 x [t, k] -> e4m3 q [t, k] plus f32 scales, with
//      s = max|x| / 448 over the scale's group (a row, or a 1x128 slice),
//          or 1 where that is not a positive finite f32 (an all-zero row);
//          static: s = *static_scale as given;
//      q = F32ToFp8E4M3(x / s) (runtime/core/dtype.h: round to nearest even,
//          saturated to ±448, NaN kept NaN),
//    each division one IEEE f32 division and max|x| taken with fmaxf (a NaN
//    element does not count), so a host emulation with the same operations is
//    bit-exact (fp8_gemm_test.cc checks it).
//
//  - Online weight quantization (Ops::QuantizeWeightFp8): bf16 or f32 w
//    [n, k] -> e4m3 [n, k] + per-channel scale [n], with the formula above
//    per row (an all-zero row gets scale 1).
//
// Every launcher returns cudaErrorInvalidValue for arguments outside its
// contract (stated per function) and otherwise the launch's error.
#ifndef TESSERA_KERNELS_CUDA_GEMM_FP8_GEMM_H_
#define TESSERA_KERNELS_CUDA_GEMM_FP8_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// The most rows (t) the skinny fp8 kernel takes.
inline constexpr int64_t kMaxFp8SkinnyRows = 8;

// The width of an activation group of kDynamicPerBlock (cuBLASLt's
// VEC128_32F scaling).
inline constexpr int64_t kFp8ActivationGroup = 128;

// Whether the skinny fp8 kernel takes this product: 1 <= t <=
// kMaxFp8SkinnyRows, n >= 1, k a positive multiple of 16 (16 weights a load),
// block 0 (per-channel) or a positive multiple of 16, x and w 16-byte aligned
// (so every row of each, given k), scale non-null.
bool Fp8SkinnyGemmApplies(int64_t t, int64_t n, int64_t k, int64_t block,
                          const void* x, const void* w, const float* scale);

// out [t, n] = x [t, k] (f32) · w_real [n, k]ᵀ + bias [n] (f32, or null),
// w e4m3 with `scale` as `block` says (see the top of this file).
// cudaErrorInvalidValue unless Fp8SkinnyGemmApplies(t, n, k, block, x, w,
// scale) and out is non-null.
cudaError_t LaunchFp8SkinnyGemm(int64_t t, int64_t n, int64_t k, const float* x,
                                const void* w, const float* scale,
                                int64_t block, const float* bias, float* out,
                                cudaStream_t stream);

// The gated MLP's input in one pass: out [t, n] = silu(g) * u with
// g = x · gate_up_real[0:n]ᵀ + bias[0:n] and u = x · gate_up_real[n:2n]ᵀ +
// bias[n:2n] (gate_up e4m3 [2n, k], the gate rows then the up rows; its scale
// [2n] or [ceil(2n / B), ceil(k / B)], indexed by the stacked row; bias [2n]
// or null). Each output is bitwise what LaunchFp8SkinnyGemm into a [t, 2n]
// buffer followed by LaunchGatedSilu computes. cudaErrorInvalidValue unless
// Fp8SkinnyGemmApplies(t, 2n, k, block, x, gate_up, scale) and out is
// non-null.
cudaError_t LaunchFp8SkinnyGatedSilu(int64_t t, int64_t n, int64_t k,
                                     const float* x, const void* gate_up,
                                     const float* scale, int64_t block,
                                     const float* bias, float* out,
                                     cudaStream_t stream);

// The same with GeGLU's activation: bitwise LaunchFp8SkinnyGemm followed by
// LaunchGatedGeluTanh.
cudaError_t LaunchFp8SkinnyGatedGeluTanh(int64_t t, int64_t n, int64_t k,
                                         const float* x, const void* gate_up,
                                         const float* scale, int64_t block,
                                         const float* bias, float* out,
                                         cudaStream_t stream);

// How LaunchQuantizeFp8Activations scales x.
enum class Fp8Quantization {
  kDynamicPerToken,  // s[t] = max|x[t, :]| / 448.
  kStatic,           // s = *static_scale for every row.
  kDynamicPerGroup,  // s[t, g] = max|x[t, 128 g : 128 g + 128]| / 448.
};

// How LaunchQuantizeFp8Activations lays out its scales (cuBLASLt's layouts,
// gemm_plans.h):
//  kPerRow:   scales[r], t floats (OUTER_VEC_32F). kDynamicPerGroup cannot.
//  kPerGroup: scales[g * t + r] for the ceil(k / 128) groups g of row r,
//             t * ceil(k / 128) floats, token-contiguous (VEC128_32F). Per
//             token and static scales repeat the row's scale in every group.
enum class Fp8ScaleLayout { kPerRow, kPerGroup };

// x f32 [t, k] -> q e4m3 [t, k] and `scales` (see the top of this file for
// the formula). static_scale: a device f32, read for kStatic only (null
// otherwise). cudaErrorInvalidValue unless t >= 1, k >= 1, x, q and scales
// are non-null, static_scale is non-null exactly for kStatic, and the layout
// can hold the quantization's scales. Reads x only after the kernel ahead has
// finished (PDL).
cudaError_t LaunchQuantizeFp8Activations(Fp8Quantization quantization,
                                         Fp8ScaleLayout layout, int64_t t,
                                         int64_t k, const float* x,
                                         const float* static_scale, void* q,
                                         float* scales, cudaStream_t stream);

// w [n, k] (bf16 when w_bf16, else f32) -> q e4m3 [n, k] and scale f32 [n],
// per row by the dynamic formula (an all-zero row gets scale 1).
// cudaErrorInvalidValue unless n >= 1, k >= 1 and the pointers are non-null.
cudaError_t LaunchQuantizeFp8Weights(bool w_bf16, int64_t n, int64_t k,
                                     const void* w, void* q, float* scale,
                                     cudaStream_t stream);

// dst[r * dst_ld + c] = src[r * src_ld + c] widened from bf16 (exact) for
// r < rows, c < cols: a bf16 product's output into its f32 place.
// cudaErrorInvalidValue unless rows, cols >= 1, src_ld, dst_ld >= cols and
// the pointers are non-null.
cudaError_t LaunchWidenBf16Rows(int64_t rows, int64_t cols, const void* src,
                                int64_t src_ld, float* dst, int64_t dst_ld,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_GEMM_FP8_GEMM_H_
