#include "kernels/sampling_math.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace tessera {
namespace sampling {
namespace {

// Units in the last place between two positive normal floats.
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

TEST(SampleExpTest, WithinTwoUlpOfExpOverTheWeightRange) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> any(-86.0f, 0.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? -0.001f * i : any(rng);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    ASSERT_LE(UlpDistance(SampleExp(x), want), 2) << "x=" << x;
  }
  EXPECT_EQ(SampleExp(0.0f), 1.0f);
  EXPECT_EQ(SampleExp(-86.5f), 0.0f);
  EXPECT_EQ(SampleExp(-INFINITY), 0.0f);
  EXPECT_EQ(SampleExp(NAN), 0.0f);
  EXPECT_EQ(SampleExp(89.0f), INFINITY);
  EXPECT_LE(UlpDistance(SampleExp(10.0f), std::exp(10.0f)), 2);
}

TEST(SampleMathTest, PenaltiesTemperatureAndFloor) {
  // Repetition: positive logits divided, negative multiplied; then the
  // output's count and presence.
  EXPECT_EQ(PenalizeLogit(2.0f, 0, true, 2.0f, 0.0f, 0.0f), 1.0f);
  EXPECT_EQ(PenalizeLogit(-1.0f, 1, false, 2.0f, 0.0f, 0.0f), -2.0f);
  EXPECT_EQ(PenalizeLogit(3.0f, 2, false, 1.0f, 0.4f, 0.2f),
            3.0f - (0.2f * 2.0f + 0.4f));
  EXPECT_EQ(PenalizeLogit(3.0f, 0, true, 1.0f, 0.4f, 0.2f), 3.0f);
  EXPECT_EQ(TemperLogit(NAN, 0.5f), -INFINITY);
  EXPECT_FALSE(std::signbit(TemperLogit(-0.0f, 0.5f)));
  EXPECT_EQ(TemperLogit(3.0f, 0.5f), 6.0f);
  EXPECT_EQ(MinPFloor(2.0f, MinPLog(1.0f)), 2.0f);
  EXPECT_EQ(MinPFloor(2.0f, MinPLog(0.5f)), 2.0f + std::log(0.5f));
}

}  // namespace
}  // namespace sampling
}  // namespace tessera
