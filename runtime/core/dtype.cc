#include "runtime/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// Element i of an array of T at `bytes`, which may be unaligned for T.
template <typename T>
T Load(const unsigned char* bytes, size_t i) {
  T value;
  std::memcpy(&value, bytes + i * sizeof(T), sizeof(T));
  return value;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF64:
      return "f64";
    case DType::kI64:
      return "i64";
    case DType::kI32:
      return "i32";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kF8E5M2:
      return "f8_e5m2";
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F64") return DType::kF64;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  if (name == "I8") return DType::kI8;
  if (name == "U8") return DType::kU8;
  if (name == "BOOL") return DType::kBool;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "F8_E5M2") return DType::kF8E5M2;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported safetensors dtype \"", name, "\""));
}

absl::string_view DTypeToSafetensors(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "unknown";
}

bool IsFloatConvertible(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 ||
         dtype == DType::kF16 || dtype == DType::kF64 ||
         dtype == DType::kF8E4M3;
}

float Fp8E4M3ToF32(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 0xfu && mantissa == 0x7u) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {  // Subnormal: mantissa * 2^-9.
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f,
                           static_cast<int>(exponent) - 7);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t F32ToFp8E4M3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80u : 0x00u;
  const float a = std::fabs(value);
  if (a >= kFp8E4M3Max) return sign | 0x7eu;  // Saturated: 448.
  // a's binade [2^e, 2^(e+1)), e >= -6 (below, the subnormals share the
  // spacing of the lowest binade): 8 steps of 2^(e-3) each.
  int frexp_exponent = 0;
  std::frexp(a, &frexp_exponent);  // a = f * 2^x, f in [0.5, 1).
  int e = std::max(frexp_exponent - 1, -6);
  // Ties to even (the default rounding mode); q in [0, 16].
  int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));
  if (q == 16) {  // Rounded up into the next binade.
    ++e;
    q = 8;
  }
  if (q < 8) return sign | static_cast<uint8_t>(q);  // Subnormal (e = -6).
  const int code = ((e + 7) << 3) | (q - 8);
  if (code > 0x7e) return sign | 0x7eu;  // Would be NaN's code: saturate.
  return sign | static_cast<uint8_t>(code);
}

float F16ToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // Subnormal: value = mantissa * 2^-24.
      float value = std::ldexp(static_cast<float>(mantissa), -24);
      std::memcpy(&out, &value, sizeof(out));
      out |= sign;
    }
  } else if (exponent == 0x1f) {  // Inf or NaN.
    out = sign | 0x7f800000u | (mantissa << 13);
  } else {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float result;
  std::memcpy(&result, &out, sizeof(result));
  return result;
}

uint16_t F32ToF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;  // NaN.
  if (abs_bits >= 0x477ff000u)
    return sign | 0x7c00u;       // Overflow (rounds to) Inf.
  if (abs_bits < 0x38800000u) {  // Subnormal or zero in f16.
    float magnitude;
    std::memcpy(&magnitude, &abs_bits, sizeof(magnitude));
    // nearbyint uses round-half-even in the default rounding mode.
    return sign |
           static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  // Normal: rebias the exponent and round the mantissa to nearest even.
  const uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

absl::Status ConvertToF32(DType dtype, const void* src, size_t count,
                          float* dst) {
  // Elements are read with memcpy: a safetensors tensor may start at any byte
  // offset of the mapped file, so `src` need not be aligned for its dtype
  // (dereferencing it as uint16_t*/double* would be undefined behaviour).
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (dtype) {
    case DType::kF32:
      // memcpy with a null pointer is undefined even for 0 bytes, and an empty
      // tensor's data may be null.
      if (count > 0) std::memcpy(dst, src, count * sizeof(float));
      return absl::OkStatus();
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        dst[i] = Bf16ToF32(Load<uint16_t>(bytes, i));
      }
      return absl::OkStatus();
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        dst[i] = F16ToF32(Load<uint16_t>(bytes, i));
      }
      return absl::OkStatus();
    case DType::kF64:
      for (size_t i = 0; i < count; ++i) {
        dst[i] = static_cast<float>(Load<double>(bytes, i));
      }
      return absl::OkStatus();
    case DType::kF8E4M3:
      for (size_t i = 0; i < count; ++i) dst[i] = Fp8E4M3ToF32(bytes[i]);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot convert ", DTypeName(dtype), " to f32"));
  }
}

}  // namespace tessera
