#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

namespace tessera {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI8), 1u);
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(*DTypeFromSafetensors("BF16"), DType::kBF16);
  EXPECT_FALSE(DTypeFromSafetensors("Q4_K").ok());
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                  DType::kI64, DType::kI32, DType::kI8, DType::kU8,
                  DType::kBool, DType::kF8E4M3, DType::kF8E5M2}) {
    EXPECT_EQ(*DTypeFromSafetensors(DTypeToSafetensors(d)), d) << DTypeName(d);
  }
}

TEST(DTypeTest, HalfPrecisionRoundTripsExactValues) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f,
                  5.960464477539063e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(v)), v) << v;
  }
  for (float v : {0.0f, 1.0f, -3.0f, std::ldexp(1.5f, 100)})
    EXPECT_EQ(Bf16ToF32(F32ToBf16(v)), v) << v;
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
  EXPECT_TRUE(
      std::isnan(F16ToF32(F32ToF16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, HalfPrecisionRoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between f16 1.0 and 1 + 2^-10: ties go to the even
  // mantissa (1.0).
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(F16ToF32(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  // bf16: 1 + 2^-8 is halfway between 1.0 and 1 + 2^-7.
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
}

TEST(DTypeTest, Fp8E4M3RoundTripsEveryCodeAndRoundsToNearestEven) {
  // Every finite code widens and narrows back to itself (the two zeros too).
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(static_cast<uint8_t>(code))));
      continue;
    }
    const float value = Fp8E4M3ToF32(static_cast<uint8_t>(code));
    EXPECT_EQ(F32ToFp8E4M3(value), code) << code << " " << value;
  }
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // Smallest subnormal.
  EXPECT_EQ(Fp8E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // Smallest normal.
  EXPECT_EQ(Fp8E4M3ToF32(0x38), 1.0f);
  // Halfway between 1 and 1.125 goes to 1 (even), between 1.125 and 1.25 to
  // 1.25; between 15 and 16 up to 16 (the next binade).
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.0625f)), 1.0f);
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.1875f)), 1.25f);
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(15.5f)), 16.0f);
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(-0.3f)), -0.3125f);
  // Saturation, not NaN, beyond the largest finite value; NaN stays NaN.
  EXPECT_EQ(F32ToFp8E4M3(1e6f), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(-1e6f), 0xfe);
  EXPECT_EQ(F32ToFp8E4M3(464.0f), 0x7e);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(F32ToFp8E4M3(NAN))));
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(1.0f, -11)), 0x00);  // Ties to 0 (even).
  float widened[2];
  const uint8_t codes[2] = {0x38, 0xc0};
  ASSERT_TRUE(ConvertToF32(DType::kF8E4M3, codes, 2, widened).ok());
  EXPECT_EQ(widened[0], 1.0f);
  EXPECT_EQ(widened[1], -2.0f);
}

TEST(DTypeTest, ConvertToF32RejectsIntegers) {
  int32_t x = 3;
  float out;
  EXPECT_FALSE(ConvertToF32(DType::kI32, &x, 1, &out).ok());
}

TEST(TensorTest, EmptyViewRowsReshape) {
  auto t = Tensor::Zeros(DType::kF32, {3, 4});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 64, 0u);
  for (int i = 0; i < 12; ++i) t->data_as<float>()[i] = static_cast<float>(i);
  TensorView rows = t->view().Rows(1, 3);
  EXPECT_EQ(rows.shape(), Shape({2, 4}));
  EXPECT_EQ(rows.data_as<float>()[0], 4.0f);
  EXPECT_TRUE(t->view().Reshape({4, 3}).ok());
  EXPECT_FALSE(t->view().Reshape({5, 3}).ok());
  EXPECT_FALSE(Tensor::Empty(DType::kF32, {-1, 2}).ok());
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status UseMacros(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  RETURN_IF_ERROR(h > 10 ? absl::OutOfRangeError("big") : absl::OkStatus());
  *out = h;
  return absl::OkStatus();
}

TEST(StatusTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(UseMacros(8, &out).ok());
  EXPECT_EQ(out, 4);
  EXPECT_EQ(UseMacros(3, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UseMacros(30, &out).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Annotate(absl::NotFoundError("x"), "loading").message(),
            "loading: x");
}

// The rank-local mark survives the ways errors travel up: Annotate,
// RETURN_IF_ERROR and StatusOr; an unmarked error and OK are not rank-local.
absl::StatusOr<int> FailsHere() {
  return RankLocal(absl::UnavailableError("no GPU"));
}
absl::Status Outer(int* out) {
  ASSIGN_OR_RETURN(*out, FailsHere());
  return absl::OkStatus();
}

TEST(StatusTest, RankLocalMarkTravelsWithTheError) {
  EXPECT_FALSE(IsRankLocal(absl::InvalidArgumentError("bad flag")));
  EXPECT_FALSE(IsRankLocal(absl::OkStatus()));
  EXPECT_TRUE(RankLocal(absl::OkStatus()).ok());
  const absl::Status local = RankLocal(absl::UnavailableError("no GPU"));
  EXPECT_TRUE(IsRankLocal(local));
  EXPECT_EQ(local.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(local.message(), "no GPU");
  const absl::Status annotated = Annotate(local, "rank 1");
  EXPECT_TRUE(IsRankLocal(annotated));
  EXPECT_EQ(annotated.message(), "rank 1: no GPU");
  int out = 0;
  EXPECT_TRUE(IsRankLocal(Outer(&out)));
  EXPECT_FALSE(IsRankLocal(Annotate(absl::NotFoundError("x"), "loading")));
}

}  // namespace
}  // namespace tessera
