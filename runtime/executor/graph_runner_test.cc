#include "runtime/executor/graph_runner.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

using Buckets = std::vector<int32_t>;

TEST(DecodeGraphBucketsTest, PowersOfTwoToEightThenStepsOfEight) {
  EXPECT_EQ(DecodeGraphBuckets(0), Buckets{});
  EXPECT_EQ(DecodeGraphBuckets(1), (Buckets{1}));
  EXPECT_EQ(DecodeGraphBuckets(2), (Buckets{1, 2}));
  // A cap that is no bucket is a bucket itself: every batch up to it has one.
  EXPECT_EQ(DecodeGraphBuckets(3), (Buckets{1, 2, 3}));
  EXPECT_EQ(DecodeGraphBuckets(4), (Buckets{1, 2, 4}));
  EXPECT_EQ(DecodeGraphBuckets(8), (Buckets{1, 2, 4, 8}));
  EXPECT_EQ(DecodeGraphBuckets(12), (Buckets{1, 2, 4, 8, 12}));
  EXPECT_EQ(DecodeGraphBuckets(24), (Buckets{1, 2, 4, 8, 16, 24}));
  const Buckets full = DecodeGraphBuckets(256);
  ASSERT_EQ(full.size(), 3u + 32u);
  for (size_t i = 3; i < full.size(); ++i) {
    EXPECT_EQ(full[i], static_cast<int32_t>(8 * (i - 2)));
  }
  // Capped at 256 sequences whatever the rank runs.
  EXPECT_EQ(DecodeGraphBuckets(1 << 20), full);
  EXPECT_EQ(DecodeGraphBuckets(300), full);
}

TEST(DecodeGraphBucketsTest, ABatchTakesTheSmallestBucketThatHoldsIt) {
  const Buckets b = DecodeGraphBuckets(64);
  EXPECT_EQ(DecodeGraphBucket(b, 0), 0);
  EXPECT_EQ(DecodeGraphBucket(b, -3), 0);
  EXPECT_EQ(DecodeGraphBucket(b, 1), 1);
  EXPECT_EQ(DecodeGraphBucket(b, 2), 2);
  EXPECT_EQ(DecodeGraphBucket(b, 3), 4);
  EXPECT_EQ(DecodeGraphBucket(b, 5), 8);
  EXPECT_EQ(DecodeGraphBucket(b, 8), 8);
  EXPECT_EQ(DecodeGraphBucket(b, 9), 16);
  EXPECT_EQ(DecodeGraphBucket(b, 57), 64);
  EXPECT_EQ(DecodeGraphBucket(b, 64), 64);
  EXPECT_EQ(DecodeGraphBucket(b, 65), 0);  // Eager.
  EXPECT_EQ(DecodeGraphBucket({}, 1), 0);
}

}  // namespace
}  // namespace tessera
