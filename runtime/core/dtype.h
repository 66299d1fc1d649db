// Element types of tensors, with the byte sizes and names that checkpoints use.
#ifndef TESSERA_RUNTIME_CORE_DTYPE_H_
#define TESSERA_RUNTIME_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

enum class DType : uint8_t {
  kF32,     // IEEE binary32.
  kBF16,    // bfloat16: the top 16 bits of a binary32.
  kF16,     // IEEE binary16.
  kF64,     // IEEE binary64 (read from checkpoints, never computed in).
  kI64,     // Signed 64-bit integer.
  kI32,     // Signed 32-bit integer (token ids, positions).
  kI8,      // Signed 8-bit integer (quantized values).
  kU8,      // Unsigned 8-bit integer (packed quantized values).
  kBool,    // One byte, 0 or 1.
  kF8E4M3,  // OCP fp8 e4m3fn: fp8 weights (with a scale, WeightView).
  kF8E5M2,  // OCP fp8 e5m2 (recognised in checkpoints; not computed in yet).
};

// Bytes per element.
size_t DTypeSize(DType dtype);

// Lower-case name used in messages: "f32", "bf16", ...
absl::string_view DTypeName(DType dtype);

// The dtype spelled as in a safetensors header ("F32", "BF16", "F16", "I8",
// ...).
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name);

// The inverse: "F32", "BF16", ... as a safetensors header spells the dtype.
absl::string_view DTypeToSafetensors(DType dtype);

// Whether values of this dtype can be widened to f32 by ConvertToF32.
bool IsFloatConvertible(DType dtype);

inline float Bf16ToF32(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &widened, sizeof(out));
  return out;
}

// Round-to-nearest-even, NaN kept quiet.
inline uint16_t F32ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

// OCP fp8 e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities, 0x7f/0xff NaN; largest finite 448): exact widening, and
// rounding to nearest even with values beyond ±448 saturated to ±448 (as
// torch's `to(float8_e4m3fn)` after a clamp, the quantization formulas of
// every fp8 checkpoint format), NaN kept NaN.
inline constexpr float kFp8E4M3Max = 448.0f;
float Fp8E4M3ToF32(uint8_t bits);
uint8_t F32ToFp8E4M3(float value);

// Widens `count` elements of `dtype` at `src` into `dst` (f32, f16, bf16, f64,
// f8_e4m3 sources). Returns InvalidArgument for any other dtype.
absl::Status ConvertToF32(DType dtype, const void* src, size_t count,
                          float* dst);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_DTYPE_H_
