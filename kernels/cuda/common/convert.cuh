// Element conversions between the storage dtypes and the f32 the kernels
// compute in (device code: include from .cu files only).
#ifndef TESSERA_KERNELS_CUDA_COMMON_CONVERT_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_CONVERT_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// Exact widening to f32 (int8: the integer value; a quantized cache applies
// its scale separately).
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float ToFloat(int8_t x) {
  return static_cast<float>(x);
}

// Narrowing from f32, round to nearest even (as the host's F32ToBf16).
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_COMMON_CONVERT_CUH_
