// Raw CUDA launchers for the fused parts of a decoder layer (kernels/ops.h
// QkvRopeStore and GatedActivation's SiLU and GeGLU). Plain C++ types only:
// nvcc compiles the .cu side, and CudaOps turns the returned cudaError_t into a
// Status.
//
// Graph-safe: every launch configuration depends only on the token count, the
// head counts and the dims (host values fixed for a batch bucket); the step
// arrays (positions, slots) are read on the device, and no launcher
// allocates or synchronizes.
#ifndef TESSERA_KERNELS_CUDA_FUSED_KERNELS_H_
#define TESSERA_KERNELS_CUDA_FUSED_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention/attention_kernels.h"

namespace tessera {
namespace cuda {

// The most head_dim QkvRopeStore takes (one head row is staged in shared
// memory).
constexpr int32_t kMaxFusedHeadDim = 1024;

// One block per (token, head) of qkv [num_tokens, (num_heads + 2 Hkv) * D]
// (Hkv and D are the cache's; D even, <= kMaxFusedHeadDim): the head is
// loaded once, RMS-normed when its weight is given (q_norm for q heads,
// k_norm for k heads; null: none), rotated by Rope (q and k; same arithmetic
// as LaunchRope) and written: q to q_out [num_tokens, num_heads, D], k and v
// to the cache slot slot_mapping[t] (f32, bf16 round-to-nearest, or int8 and
// fp8 quantized exactly as LaunchStoreKvCache). A slot outside [0, num_slots)
// (a padded token's -1) is skipped; q is always written.
cudaError_t LaunchQkvRopeStore(const float* qkv, int32_t num_heads,
                               const float* q_norm, const float* k_norm,
                               float eps, const int32_t* positions,
                               const float* inv_freq,
                               const int64_t* slot_mapping, int64_t num_tokens,
                               const DeviceKvLayer& cache, float* q_out,
                               cudaStream_t stream);

// QkvRopeStore's RoPE beyond one full-width table (kernels/ops.h
// RopeOptions), in device pointers and f32 constants.
enum class DeviceRopeLengthScaling : int32_t {
  kNone = 0,
  kDynamicNtk = 1,
  kLongRope = 2,
};
struct DeviceRope {
  // inv_freq's entries R / 2, in [1, D / 2]: dims [0, R) rotate (pairs i,
  // i + R / 2), [R, D) pass through.
  int32_t rotary_half = 0;
  DeviceRopeLengthScaling length_scaling = DeviceRopeLengthScaling::kNone;
  // Length scaling: a token of sequence s (query_start_loc[s] <= t <
  // query_start_loc[s + 1], found by binary search) whose seq_lens[s] >
  // original_max_len rotates with long_inv_freq (LongRoPE) or the dynamic
  // NTK frequencies of that length (RopeOptions' formula, f32 with IEEE
  // rounding). Rows outside the sequences keep inv_freq.
  int32_t original_max_len = 0;
  const float* long_inv_freq = nullptr;
  float base = 0.0f, factor = 1.0f, factor_minus_one = 0.0f, exponent = 1.0f;
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;         // [num_seqs]
  int32_t num_seqs = 0;        // A host value fixed for a batch bucket.
  float cos_sin_scale = 1.0f;  // Multiplies cos and sin.
};

// LaunchQkvRopeStore with `rope` (the launcher above is rope.rotary_half =
// D / 2 and nothing else). cudaErrorInvalidValue for a rotary_half outside
// [1, D / 2], or length scaling without its arrays (LongRoPE: without
// long_inv_freq).
cudaError_t LaunchQkvRopeStore(const float* qkv, int32_t num_heads,
                               const float* q_norm, const float* k_norm,
                               float eps, const int32_t* positions,
                               const float* inv_freq, const DeviceRope& rope,
                               const int64_t* slot_mapping, int64_t num_tokens,
                               const DeviceKvLayer& cache, float* q_out,
                               cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i] for r < rows,
// i < inter (SiLU as LaunchSiluMul computes it). out must not overlap
// gate_up.
cudaError_t LaunchGatedSilu(const float* gate_up, int64_t rows, int64_t inter,
                            float* out, cudaStream_t stream);

// out[r, i] = gelu_tanh(gate_up[r, i]) * gate_up[r, inter + i] (GeGLU; the
// GELU of common/activation.cuh, as the skinny fused kernel computes it).
// out must not overlap gate_up.
cudaError_t LaunchGatedGeluTanh(const float* gate_up, int64_t rows,
                                int64_t inter, float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_FUSED_KERNELS_H_
