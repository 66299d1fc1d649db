// Element functions of the op set that more than one kernel computes and that
// must agree bit for bit wherever they run (a fused kernel and the unfused op
// it replaces), with the CPU reference's rounding order (device code: include
// from .cu files only). The _rn intrinsics keep nvcc from contracting a
// product and a sum into one fused multiply-add, which the CPU does not do.
#ifndef TESSERA_KERNELS_CUDA_COMMON_ACTIVATION_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_ACTIVATION_CUH_

#include <cuda_runtime.h>

namespace tessera {
namespace cuda {

// GELU with the tanh approximation (GatedActivationKind::kGeluTanh), in
// PyTorch's order: 0.5 x (1 + tanh(kBeta (x + kKappa x^3))), x^3 = x * x * x,
// kBeta = sqrt(2 / pi) rounded once to f32, accurate tanhf.
__device__ __forceinline__ float GeluTanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi).
  constexpr float kKappa = 0.044715f;
  const float cube = __fmul_rn(__fmul_rn(x, x), x);
  const float inner = __fmul_rn(kBeta, __fadd_rn(x, __fmul_rn(kKappa, cube)));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

// Logit soft-capping, transformers' order: cap * tanh(x / cap) computed as
// tanh(x / cap) * cap with an IEEE division.
__device__ __forceinline__ float Softcap(float x, float cap) {
  return __fmul_rn(tanhf(__fdiv_rn(x, cap)), cap);
}

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_COMMON_ACTIVATION_CUH_
