#include "runtime/kv/kv_layout.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A tiny model: 2 layers, 1 KV head of dim 8, f32: 128 bytes a token.
KvPoolShape TinyShape() {
  KvPoolShape shape;
  shape.num_layers = 2;
  shape.num_kv_heads = 1;
  shape.head_dim = 8;
  shape.dtype = DType::kF32;
  return shape;
}

TEST(KvLayoutTest, BytesPerSlot) {
  EXPECT_EQ(TinyShape().BytesPerSlot(), 2 * 2 * 8 * 4);
  KvPoolShape i8 = TinyShape();
  i8.dtype = DType::kI8;
  EXPECT_EQ(i8.BytesPerSlot(), 2 * 2 * (8 + 4));
  EXPECT_EQ(i8.FixedBytes(), 0);
  KvPoolShape fp8 = TinyShape();
  fp8.dtype = DType::kF8E4M3;
  // One byte an element, no per-slot scale; the per-layer scales are fixed.
  EXPECT_EQ(fp8.BytesPerSlot(), 2 * 2 * 8);
  EXPECT_EQ(fp8.FixedBytes(), 2 * 2 * 1 * 4);
  EXPECT_EQ(TinyShape().FixedBytes(), 0);
}

TEST(KvLayoutTest, ParsesEveryCacheDType) {
  EXPECT_EQ(*ParseKvDType("auto"), DType::kF32);
  EXPECT_EQ(*ParseKvDType("float32"), DType::kF32);
  EXPECT_EQ(*ParseKvDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseKvDType("int8"), DType::kI8);
  EXPECT_EQ(*ParseKvDType("fp8"), DType::kF8E4M3);
  EXPECT_EQ(*ParseKvDType("fp8_e4m3"), DType::kF8E4M3);
  const absl::StatusOr<DType> bad = ParseKvDType("fp8_e5m2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("int8 or fp8"), std::string::npos)
      << bad.status();
}

// An fp8 cache is exactly half of bf16's bytes a token (both without per-slot
// scales), so the same budget holds twice the tokens: a Llama-3-8B-shaped
// rank (32 layers, 8 KV heads of 128) under 1 GiB.
TEST(KvLayoutTest, Fp8HalvesBf16sBytesAndDoublesTheTokens) {
  KvPoolShape bf16;
  bf16.num_layers = 32;
  bf16.num_kv_heads = 8;
  bf16.head_dim = 128;
  bf16.dtype = DType::kBF16;
  KvPoolShape fp8 = bf16;
  fp8.dtype = DType::kF8E4M3;
  EXPECT_EQ(bf16.BytesPerSlot(), 32 * 2 * 8 * 128 * 2);
  EXPECT_EQ(fp8.BytesPerSlot() * 2, bf16.BytesPerSlot());
  // The scales: 32 layers x (K, V) x 8 heads x 4 bytes, far below a block.
  EXPECT_EQ(fp8.FixedBytes(), 32 * 2 * 8 * 4);
  KvCacheOptions options;
  options.memory_bytes = kGiB;
  const int64_t context = int64_t{1} << 20;  // No cap from the scheduler.
  const absl::StatusOr<KvLayout> a =
      ResolveKvLayout(options, bf16, context, 256, /*free_bytes=*/-1);
  options.dtype = DType::kF8E4M3;
  const absl::StatusOr<KvLayout> b =
      ResolveKvLayout(options, fp8, context, 256, /*free_bytes=*/-1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  // bf16: 1 GiB / (16 x 128 KiB) = 512 blocks; fp8 gets 1023 of 64 KiB each
  // (the 2 KiB of scales take the 1024th).
  EXPECT_EQ(a->num_blocks, 512);
  EXPECT_EQ(b->num_blocks, 1023);
  // A budget with room for the scales beside whole blocks: exactly twice.
  options.memory_bytes = kGiB + fp8.FixedBytes();
  const absl::StatusOr<KvLayout> c =
      ResolveKvLayout(options, fp8, context, 256, /*free_bytes=*/-1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_blocks, 2 * a->num_blocks);
}

// The default pool (a share of free memory) is capped at what the scheduler
// can ever hold: max_num_seqs whole contexts. 64 GiB free, a context of 512
// and 4 sequences: 4 x 32 blocks of 16, not 32 GiB.
TEST(KvLayoutTest, DefaultPoolIsCappedByWhatTheSchedulerCanHold) {
  KvCacheOptions options;
  absl::StatusOr<KvLayout> layout =
      ResolveKvLayout(options, TinyShape(), /*max_model_len=*/512,
                      /*max_num_seqs=*/4, /*free_bytes=*/64 * kGiB);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->block_size, 16);
  EXPECT_EQ(layout->num_blocks, 4 * 32);
  // A context that is not a whole number of blocks rounds up.
  layout = ResolveKvLayout(options, TinyShape(), 513, 4, 64 * kGiB);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_blocks, 4 * 33);
}

TEST(KvLayoutTest, DefaultPoolIsTheShareOfFreeMemoryWhenSmaller) {
  KvCacheOptions options;
  // Half of 1 MiB over 16 x 128-byte blocks: 256 blocks.
  absl::StatusOr<KvLayout> layout =
      ResolveKvLayout(options, TinyShape(), int64_t{1} << 31 >> 1, 256,
                      /*free_bytes=*/int64_t{1} << 20);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_blocks, 256);
}

TEST(KvLayoutTest, ExplicitSettingsAreKept) {
  KvCacheOptions options;
  options.num_blocks = 1000;  // More than 4 x 32 would ever use: as given.
  absl::StatusOr<KvLayout> layout =
      ResolveKvLayout(options, TinyShape(), 512, 4, 64 * kGiB);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_blocks, 1000);

  options = KvCacheOptions();
  options.memory_bytes = 16 * 128 * 10;  // Ten blocks.
  layout = ResolveKvLayout(options, TinyShape(), 512, 4, 64 * kGiB);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_blocks, 10);
}

// Before: max_num_seqs x blocks, and block_size x bytes per slot in the
// static layout, were computed without a check and wrapped for huge contexts.
TEST(KvLayoutTest, HugeContextsNeverOverflow) {
  KvCacheOptions options;
  absl::StatusOr<KvLayout> layout =
      ResolveKvLayout(options, TinyShape(), std::numeric_limits<int64_t>::max(),
                      std::numeric_limits<int>::max(), 64 * kGiB);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument)
      << layout.status();
  EXPECT_NE(layout.status().message().find("overflows"), std::string::npos);

  options.backend = AttentionBackend::kStatic;
  KvPoolShape wide = TinyShape();
  wide.num_layers = int64_t{1} << 16;
  wide.num_kv_heads = int64_t{1} << 16;
  wide.head_dim = int64_t{1} << 16;
  layout = ResolveKvLayout(options, wide, int64_t{1} << 31, 1, 64 * kGiB);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument)
      << layout.status();
  EXPECT_NE(layout.status().message().find("the bytes of one block"),
            std::string::npos);
}

TEST(KvLayoutTest, BytesPerSlotSaturates) {
  KvPoolShape shape = TinyShape();
  shape.num_layers = int64_t{1} << 40;
  shape.num_kv_heads = int64_t{1} << 20;
  EXPECT_EQ(shape.BytesPerSlot(), std::numeric_limits<int64_t>::max());
}

TEST(KvLayoutTest, BadCountsAreInvalid) {
  KvCacheOptions options;
  EXPECT_EQ(ResolveKvLayout(options, TinyShape(), 0, 4, kGiB).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveKvLayout(options, TinyShape(), 512, 0, kGiB).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
