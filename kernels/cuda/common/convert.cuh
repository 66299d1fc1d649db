// Element conversions between the storage dtypes and the f32 the kernels
// compute in (device code: include from .cu files only).
#ifndef TESSERA_KERNELS_CUDA_COMMON_CONVERT_CUH_
#define TESSERA_KERNELS_CUDA_COMMON_CONVERT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// Exact widening to f32 (int8: the integer value; fp8: the e4m3 value; a
// quantized cache applies its scale separately).
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float ToFloat(int8_t x) {
  return static_cast<float>(x);
}
__device__ __forceinline__ float ToFloat(__nv_fp8_e4m3 x) {
  return static_cast<float>(x);
}

// An fp8 cache element for x under its head's scale: e4m3(x / scale) with
// IEEE division, rounded to nearest even and saturated at ±448 (NaN stays
// NaN): the host's F32ToFp8E4M3(x / scale) bit for bit (checked on the host
// over every f32 against cuda_fp8.h's emulation of this conversion, and by
// the GPU tests against the CPU backend).
__device__ __forceinline__ __nv_fp8_e4m3 ToFp8E4M3(float x, float scale) {
  __nv_fp8_e4m3 q;
  q.__x = __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
  return q;
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
