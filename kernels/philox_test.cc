#include "kernels/philox.h"

#include <set>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// Random123's known answers (kat_vectors, philox4x32_10).
TEST(PhiloxTest, KnownAnswers) {
  struct Case {
    uint32_t ctr[4];
    uint32_t key[2];
    uint32_t want[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Case& c : cases) {
    Philox4x32 ctr = {{c.ctr[0], c.ctr[1], c.ctr[2], c.ctr[3]}};
    const Philox4x32 got = Philox4x32_10(ctr, c.key[0], c.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], c.want[i]) << i;
  }
}

// The uniform is the documented function of the first block: 27 + 26 bits.
TEST(PhiloxTest, UniformIsTheDocumentedBitsOfTheBlock) {
  const uint64_t seed = 0x299f31d0a4093822ull, step = 0x85a308d3243f6a88ull;
  const Philox4x32 block = Philox4x32_10(
      {{static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), 0, 0}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits =
      (static_cast<uint64_t>(block.v[0] >> 5) << 26) | (block.v[1] >> 6);
  EXPECT_EQ(PhiloxUniform(seed, step), static_cast<double>(bits) / 0x1p53);
}

TEST(PhiloxTest, UniformIsInRangeAndDependsOnSeedAndStep) {
  std::set<double> seen;
  double sum = 0.0;
  const int kDraws = 10000;
  for (uint64_t step = 0; step < kDraws; ++step) {
    const double u = PhiloxUniform(42, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    seen.insert(u);
    sum += u;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kDraws));
  EXPECT_NEAR(sum / kDraws, 0.5, 0.02);
  EXPECT_EQ(PhiloxUniform(7, 3), PhiloxUniform(7, 3));
  EXPECT_NE(PhiloxUniform(7, 3), PhiloxUniform(8, 3));
  EXPECT_NE(PhiloxUniform(7, 3), PhiloxUniform(7, 4));
  EXPECT_NE(PhiloxUniform(7, 1ull << 32), PhiloxUniform(7, 0));
  EXPECT_NE(PhiloxUniform(1ull << 32, 5), PhiloxUniform(0, 5));
}

}  // namespace
}  // namespace tessera
