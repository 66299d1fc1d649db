#include "launch/startup_summary.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(StartupSummaryTest, GpuWithGraphs) {
  StartupFacts f;
  f.device = "cuda";
  f.weight_dtype = "bfloat16";
  f.kv_dtype = "int8";
  f.weight_bytes = 16060522496;
  f.kv_bytes = int64_t{1} << 30;
  f.num_kv_blocks = 2048;
  f.block_size = 16;
  f.max_model_len = 4096;
  f.graph_buckets = {1, 2, 4, 8, 16};
  const std::vector<std::string> lines = StartupSummaryLines(f);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "[tessera] model: bfloat16 weights, 14.96 GiB (16060522496 bytes) "
            "on cuda; context 4096 tokens");
  EXPECT_EQ(lines[1],
            "[tessera] KV cache: 2048 blocks x 16 tokens = 32768 tokens (int8, "
            "1.00 GiB); Maximum concurrency for 4096 tokens per request: "
            "8.00x");
  EXPECT_EQ(lines[2],
            "[tessera] decode CUDA graphs: 5 batch sizes: 1 2 4 8 16");
  f.quantization = "fp8 (compressed-tensors)";
  EXPECT_EQ(StartupSummaryLines(f)[0],
            "[tessera] model: bfloat16 weights, linear layers fp8 "
            "(compressed-tensors), 14.96 GiB (16060522496 bytes) on cuda; "
            "context 4096 tokens");
  // An fp8 cache: twice the blocks of the same bytes at bf16.
  f.kv_dtype = "fp8";
  f.num_kv_blocks = 4096;
  EXPECT_EQ(StartupSummaryLines(f)[1],
            "[tessera] KV cache: 4096 blocks x 16 tokens = 65536 tokens (fp8 "
            "e4m3, scales 1, 1.00 GiB); Maximum concurrency for 4096 tokens "
            "per request: 16.00x");
  f.kv_checkpoint_scales = true;
  EXPECT_NE(StartupSummaryLines(f)[1].find(
                "(fp8 e4m3, the checkpoint's scales, 1.00 GiB)"),
            std::string::npos);
}

TEST(StartupSummaryTest, CpuParallelAndStaticLayouts) {
  StartupFacts f;
  f.weight_bytes = 1081344;
  f.kv_bytes = 3 << 20;
  f.num_kv_blocks = 100;
  f.block_size = 16;
  f.max_model_len = 512;
  f.ranks = 2;
  f.no_graphs_reason = "CPU";
  std::vector<std::string> lines = StartupSummaryLines(f);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "[tessera] model: float32 weights, 1.03 MiB (1081344 bytes) on "
            "rank 0 of 2 on cpu; context 512 tokens");
  EXPECT_EQ(lines[1],
            "[tessera] KV cache: 100 blocks x 16 tokens = 1600 tokens "
            "(float32, 3.00 MiB on rank 0 of 2); Maximum concurrency for 512 "
            "tokens per request: 3.12x");
  EXPECT_EQ(lines[2], "[tessera] decode CUDA graphs: none (CPU)");
  // The static layout: a block per sequence.
  f.ranks = 1;
  f.static_layout = true;
  f.num_kv_blocks = 4;
  f.block_size = 512;
  f.no_graphs_reason = "";
  lines = StartupSummaryLines(f);
  EXPECT_EQ(lines[1],
            "[tessera] KV cache: 4 sequence slots x 512 tokens = 2048 tokens "
            "(float32, 3.00 MiB); Maximum concurrency for 512 tokens per "
            "request: 4.00x");
  EXPECT_EQ(lines[2], "[tessera] decode CUDA graphs: none");
}

}  // namespace
}  // namespace tessera
