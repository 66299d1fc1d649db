// Raw CUDA launchers for the element-wise part of the op set. Plain C++ types
// only: nvcc compiles the .cu side, and the abseil-facing wrappers (cuda_ops.h)
// turn the returned cudaError_t into a Status that says what was being done.
//
// Layouts match kernels/ops.h: row-major, f32, device pointers.
#ifndef TESSERA_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
#define TESSERA_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, rows x n. out may
// alias x.
cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps,
                          int64_t rows, int64_t n, float* out,
                          cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i] for i < count. out may alias gate or up.
cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count,
                          float* out, cudaStream_t stream);

// x[i] *= factor for i < count, in place (one f32 product each, as the CPU).
cudaError_t LaunchScale(float* x, int64_t count, float factor,
                        cudaStream_t stream);

// x[i] = tanh(x[i] / cap) * cap for i < count, in place (cap > 0): an IEEE
// division, accurate tanhf, one product (common/activation.cuh Softcap, the
// attention kernels' soft cap too).
cudaError_t LaunchSoftcap(float* x, int64_t count, float cap,
                          cudaStream_t stream);

// Embedding lookup, plain or vocabulary-parallel: out[t, :] =
// table[ids[t] - first_id, :] when ids[t] - first_id is in [0, table_rows),
// zeros otherwise (another rank holds that row). table [table_rows, hidden] is
// f32, or bf16 (__nv_bfloat16) when table_bf16 (widened exactly to f32). ids is
// a device array of num_tokens ids; out [num_tokens, hidden] f32. The plain
// lookup is first_id = 0, table_rows = vocabulary size (out-of-range ids then
// give zero rows instead of an error: the caller validates ids).
cudaError_t LaunchEmbedding(const void* table, bool table_bf16,
                            const int32_t* ids, int64_t num_tokens,
                            int64_t hidden, int64_t first_id,
                            int64_t table_rows, float* out,
                            cudaStream_t stream);

// out[i] = a[i] + b[i] for i < n. out may alias a or b.
cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* out,
                      cudaStream_t stream);

// Fused residual add and RmsNorm, rows x n: residual += x, then
// out = residual / sqrt(mean(residual^2) + eps) * weight (the updated
// residual, as RmsNorm computes it). out may alias x; it must not alias
// residual.
cudaError_t LaunchAddRmsNorm(float* residual, const float* x,
                             const float* weight, float eps, int64_t rows,
                             int64_t n, float* out, cudaStream_t stream);

// Rotary position embedding in place, "rotate half" (GPT-NeoX / Hugging Face)
// layout, as Ops::Rope: x [tokens, heads, dim] (dim even), positions (device,
// tokens entries), inv_freq (device, dim / 2 entries). Element i of each head
// pairs with i + dim/2 and rotates by angle = float(position) * inv_freq[i],
// computed in f32 with accurate cosf/sinf and no fused multiply-adds, so the
// result follows the CPU reference to the last bits of cos/sin.
cudaError_t LaunchRope(float* x, const int32_t* positions,
                       const float* inv_freq, int64_t tokens, int64_t heads,
                       int64_t dim, cudaStream_t stream);

// x[r, :] += bias for every row: x [rows, n], bias [n].
cudaError_t LaunchBiasAdd(float* x, const float* bias, int64_t rows, int64_t n,
                          cudaStream_t stream);

// f32 -> bf16 (__nv_bfloat16) with round-to-nearest-even, n elements. NaN stays
// NaN; values beyond bf16's range round to infinity.
cudaError_t LaunchCastF32ToBF16(const float* in, void* out_bf16, int64_t n,
                                cudaStream_t stream);

// bf16 (__nv_bfloat16) -> f32, exact, n elements.
cudaError_t LaunchCastBF16ToF32(const void* in_bf16, float* out, int64_t n,
                                cudaStream_t stream);

// dst[r, :] = src[rows[r], :] for r < num_rows; rows (device) index rows of
// src, each row_elems f32 long. dst must not overlap src.
cudaError_t LaunchGatherRows(const float* src, const int32_t* rows,
                             int64_t num_rows, int64_t row_elems, float* dst,
                             cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
