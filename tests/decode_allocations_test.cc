// Zero device allocations inside decode steps: a model on one backend
// (TESSERA_TEST_DEVICE: "cpu", or "cuda" in the gpu-tagged target, which skips
// without a GPU) runs one sequence that grows from 1 token to its full context
// by decode steps, and the allocator behind the model's memory (weights,
// scratch, KV pool, step buffers, the ops' step scratch) hands out nothing from
// the first step to the last. The demo checkpoint is given a context of 1,100
// positions, so that the split-K decode kernel goes from one partition of 512
// keys to three on the way (the workspace it needs grows with the sequence).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "proto/tessera.pb.h"
#include "runtime/executor/step_runner.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/llama.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kContext = 1100;
constexpr int64_t kBlockSize = 16;

std::string Device() {
  const char* d = std::getenv("TESSERA_TEST_DEVICE");
  return d != nullptr ? d : "cpu";
}

// The demo checkpoint with a longer context (its RoPE does not depend on it).
std::string LongContextModel() {
  const fs::path dir = fs::path(testing::TempDir()) / "long_context_model";
  fs::create_directories(dir);
  std::ifstream in(DemoModelDir() + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  EXPECT_FALSE(config.is_discarded());
  config["max_position_embeddings"] = kContext;
  std::ofstream(dir / "config.json") << config.dump();
  const fs::path weights = dir / "model.safetensors";
  if (!fs::exists(weights)) {
    fs::create_symlink(fs::absolute(DemoModelDir() + "/model.safetensors"),
                       weights);
  }
  return dir.string();
}

TEST(DecodeAllocationsTest, GrowingSequenceAllocatesNothing) {
  const std::string device = Device();
  if (device == "cuda" && VisibleCudaDevices() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto backend = CreateBackend(device, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  LlamaModel::Placement placement;
  if (backend->is_cuda()) {
    placement.allocator = backend->allocator.get();
    placement.upload_weights = true;
    placement.matrix_dtype = DType::kBF16;  // Linear converts its input.
  }
  auto model =
      LlamaModel::Load(LongContextModel(), backend->ops.get(),
                       /*max_step_tokens=*/64, /*max_logit_rows=*/4, placement);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->config().max_position_embeddings, kContext);
  const int64_t blocks = (kContext + kBlockSize - 1) / kBlockSize;
  auto pool = KvPool::Create((*model)->kv_pool_shape(DType::kF32), blocks + 2,
                             kBlockSize, (*model)->allocator());
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto runner = StepRunner::Create(model->get(), *std::move(pool),
                                   AttentionBackend::kPaged, /*samples=*/true);
  ASSERT_TRUE(runner.ok()) << runner.status();

  PinnableBlockAllocator* allocator = (*model)->allocator();
  const AllocatorStats built = allocator->stats();
  proto::StepPlan plan;
  proto::StepResult result;
  proto::SequenceStep* step = plan.add_seqs();
  step->set_sequence_id(7);
  step->set_sample(true);
  step->mutable_sampling()->set_temperature(0.0f);  // Greedy.
  step->add_prompt(1);
  int32_t token = 1;
  for (int64_t pos = 0; pos < kContext; ++pos) {
    step->set_start(pos == 0);
    step->set_context_len(pos);
    step->clear_tokens();
    step->add_tokens(token);
    if (pos % kBlockSize == 0)
      step->add_block_table(blocks + 1 - pos / kBlockSize);
    const absl::Status st = (*runner)->Run(plan, &result);
    ASSERT_TRUE(st.ok()) << "position " << pos << ": " << st;
    ASSERT_EQ(result.tokens_size(), 1);
    token = result.tokens(0).token();
    const AllocatorStats now = allocator->stats();
    ASSERT_EQ(now.allocations, built.allocations)
        << "decode step at position " << pos
        << " allocated: " << allocator->DebugString();
    ASSERT_EQ(now.frees, built.frees) << "position " << pos;
  }
  // The sequence really reached the end of its context.
  EXPECT_EQ(step->context_len(), kContext - 1);
}

}  // namespace
}  // namespace tessera
