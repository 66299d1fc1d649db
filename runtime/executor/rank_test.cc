#include "runtime/executor/rank.h"

#include "gtest/gtest.h"
#include "runtime/executor/rank_spec.h"
#include "runtime/kv/kv_layout.h"

namespace tessera {
namespace {

// The default KV budget's base: a given figure as it is, a measured device's
// memory as measured, and host memory shared among the node's ranks.
TEST(KvBudgetBaseBytesTest, HostMemoryIsSharedAmongTheNodesRanks) {
  RankContext given;
  given.free_bytes = 1000;
  given.host_memory_sharers = 4;
  EXPECT_EQ(KvBudgetBaseBytes(given), 1000);

  RankContext device;
  device.measure_free_bytes = [] { return int64_t{8} << 30; };
  device.host_memory_sharers = 4;
  EXPECT_EQ(KvBudgetBaseBytes(device), int64_t{8} << 30);

  const int64_t host = AvailableHostMemory();
  ASSERT_GT(host, 0) << "this test needs /proc/meminfo";
  RankContext alone;
  RankContext four;
  four.host_memory_sharers = 4;
  const int64_t one_share = KvBudgetBaseBytes(alone);
  const int64_t quarter = KvBudgetBaseBytes(four);
  // MemAvailable moves between the reads: compare within 5% of it.
  EXPECT_NEAR(static_cast<double>(one_share), static_cast<double>(host),
              0.05 * static_cast<double>(host));
  EXPECT_NEAR(static_cast<double>(quarter), static_cast<double>(host) / 4,
              0.05 * static_cast<double>(host) / 4);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(RankSpecTest, QuantizationIsFp8OnAGpuWithBf16MatricesOnly) {
  RankSpec spec;
  spec.quantization = "fp8";
  // The CPU computes with f32 weights: refused before anything loads.
  absl::Status st = CheckRankSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--quantization fp8 needs --device cuda"),
            absl::string_view::npos)
      << st;
  spec.quantization = "int4";
  st = CheckRankSpec(spec);
  EXPECT_NE(st.message().find("--quantization must be none or fp8"),
            absl::string_view::npos)
      << st;
  spec.quantization = "none";
  EXPECT_TRUE(CheckRankSpec(spec).ok());
}

// --kv-dtype fp8 (or fp8_e4m3) runs on the CPU too, and resolves to the name
// every rank of a job parses back.
TEST(RankSpecTest, KvDTypeFp8OnEitherDevice) {
  for (const char* name : {"fp8", "fp8_e4m3"}) {
    RankSpec spec;
    spec.kv_dtype = name;
    absl::StatusOr<RankSpec> resolved = ResolveRankSpec(spec);
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_EQ(resolved->kv_dtype, "fp8");
    EXPECT_EQ(*ParseKvDType(resolved->kv_dtype), DType::kF8E4M3);
    EXPECT_EQ(*RankKvDType(spec, DType::kF32), DType::kF8E4M3);
  }
  RankSpec bf16;
  bf16.kv_dtype = "bfloat16";  // Still the GPU's alone.
  EXPECT_FALSE(CheckRankSpec(bf16).ok());
}

}  // namespace
}  // namespace tessera
