// Zero device allocations inside decode steps: a model on one backend
// (TESSERA_TEST_DEVICE: "cpu", or "cuda" in the gpu-tagged target, which skips
// without a GPU) runs one sequence that grows from 1 token to its full context
// by decode steps, and the allocator behind the model's memory (weights,
// scratch, KV pool, step buffers, the ops' step scratch) hands out nothing from
// the first step to the last. The demo checkpoint is given a context of 1,100
// positions, so that the split-K decode kernel goes from one partition of 512
// keys to three on the way (the workspace it needs grows with the sequence).
// On CUDA the same runs with decode graphs (every step a replay of the bucket
// of one sequence), and the graphs' tokens and logits follow the CPU's.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "proto/tessera.pb.h"
#include "runtime/core/status.h"
#include "runtime/executor/graph_runner.h"
#include "runtime/executor/step_runner.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/model.h"
#include "runtime/model/registry.h"
#include "tests/test_paths.h"
#include "tests/testing/long_context_model.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kContext = 1100;
constexpr int64_t kBlockSize = 16;

std::string Device() {
  const char* d = std::getenv("TESSERA_TEST_DEVICE");
  return d != nullptr ? d : "cpu";
}

std::string LongContextModel() {
  return LongContextDemoModel("long_context_model", kContext);
}

// One rank on `device` running a single sequence, one decode step at a time.
class GrowingSequence {
 public:
  void Build(const std::string& device, DType matrix_dtype,
             bool graphs = false) {
    auto backend = CreateBackend(device, 0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    ModelPlacement placement;
    if (backend_.is_cuda()) {
      placement.allocator = backend_.allocator.get();
      placement.matrix_dtype = matrix_dtype;
    }
    auto model =
        LoadModel(LongContextModel(), backend_.ops.get(),
                  /*max_step_tokens=*/64, /*max_logit_rows=*/4, placement);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    ASSERT_EQ(model_->config().max_position_embeddings, kContext);
    auto pool = KvPool::Create(model_->kv_pool_shape(DType::kF32), kBlocks + 2,
                               kBlockSize, model_->ops(), model_->allocator());
    ASSERT_TRUE(pool.ok()) << pool.status();
    auto runner = StepRunner::Create(model_.get(), *std::move(pool),
                                     AttentionBackend::kPaged,
                                     /*samples=*/true);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    if (graphs) {
      const absl::Status captured =
          runner_->CaptureGraphs(DecodeGraphBuckets(4));
      ASSERT_TRUE(captured.ok()) << captured;
      ASSERT_NE(runner_->graphs(), nullptr);
    }
    step_ = plan_.add_seqs();
    step_->set_sequence_id(7);
    step_->set_sample(true);
    step_->mutable_sampling()->set_temperature(0.0f);  // Greedy.
    step_->mutable_sampling()->set_top_p(1.0f);
    step_->add_prompt(1);
  }

  // Runs `token` at position `pos` (blocks in descending order, so that the
  // table is no identity map); returns the greedy next token.
  absl::StatusOr<int32_t> Step(int64_t pos, int32_t token,
                               bool return_logits = false) {
    step_->set_start(pos == 0);
    step_->set_context_len(pos);
    step_->clear_tokens();
    step_->add_tokens(token);
    step_->set_return_logits(return_logits);
    if (pos % kBlockSize == 0) {
      step_->add_block_table(
          static_cast<int32_t>(kBlocks + 1 - pos / kBlockSize));
    }
    RETURN_IF_ERROR(runner_->Run(plan_, &result_));
    if (result_.tokens_size() != 1) {
      return absl::InternalError("no sampled token");
    }
    return result_.tokens(0).token();
  }

  PinnableBlockAllocator* allocator() const { return model_->allocator(); }
  const StepRunner& runner() const { return *runner_; }
  const proto::SampledToken& sampled() const { return result_.tokens(0); }

 private:
  static constexpr int64_t kBlocks = (kContext + kBlockSize - 1) / kBlockSize;
  Backend backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<StepRunner> runner_;
  proto::StepPlan plan_;
  proto::StepResult result_;
  proto::SequenceStep* step_ = nullptr;
};

bool Skip(const std::string& device) {
  return device == "cuda" && VisibleCudaDevices() == 0;
}

void GrowWithoutAllocating(bool graphs) {
  const std::string device = Device();
  if (graphs && device != "cuda") GTEST_SKIP() << "graphs need a GPU";
  if (Skip(device)) GTEST_SKIP() << "no CUDA device";
  GrowingSequence seq;
  // bf16 matrices on a GPU: Linear converts its input in reserved scratch.
  ASSERT_NO_FATAL_FAILURE(seq.Build(device, DType::kBF16, graphs));
  const AllocatorStats built = seq.allocator()->stats();
  int32_t token = 1;
  for (int64_t pos = 0; pos < kContext; ++pos) {
    auto next = seq.Step(pos, token);
    ASSERT_TRUE(next.ok()) << "position " << pos << ": " << next.status();
    token = *next;
    const AllocatorStats now = seq.allocator()->stats();
    ASSERT_EQ(now.allocations, built.allocations)
        << "decode step at position " << pos
        << " allocated: " << seq.allocator()->DebugString();
    ASSERT_EQ(now.frees, built.frees) << "position " << pos;
  }
  if (graphs) {
    // Every step was a decode of one sequence: a replay, none eager.
    EXPECT_EQ(seq.runner().graphs()->replays(), kContext);
  }
}

TEST(DecodeAllocationsTest, GrowingSequenceAllocatesNothing) {
  GrowWithoutAllocating(/*graphs=*/false);
}

TEST(DecodeAllocationsTest, GrowingSequenceWithGraphsAllocatesNothing) {
  GrowWithoutAllocating(/*graphs=*/true);
}

// The device-resident step inputs (positions, slots, block tables, query
// starts) give the CPU reference's logits at every length, across the
// split-K boundaries: f32 weights on both, the CPU's greedy tokens fed to both.
void FollowTheCpu(bool graphs) {
  const std::string device = Device();
  if (device != "cuda") GTEST_SKIP() << "the CUDA twin compares backends";
  if (Skip(device)) GTEST_SKIP() << "no CUDA device";
  GrowingSequence cpu, gpu;
  ASSERT_NO_FATAL_FAILURE(cpu.Build("cpu", DType::kF32));
  ASSERT_NO_FATAL_FAILURE(gpu.Build("cuda", DType::kF32, graphs));
  int32_t token = 1;
  for (int64_t pos = 0; pos < kContext; ++pos) {
    const bool compare = pos % 50 == 0 || pos == 511 || pos == 512 ||
                         pos == 513 || pos == 1024 || pos == kContext - 1;
    auto want = cpu.Step(pos, token, compare);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = gpu.Step(pos, token, compare);
    ASSERT_TRUE(got.ok()) << got.status();
    if (compare) {
      const auto& a = cpu.sampled().logits();
      const auto& b = gpu.sampled().logits();
      ASSERT_EQ(a.size(), b.size());
      float worst = 0.0f;
      for (int i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::abs(a[i] - b[i]));
      }
      EXPECT_LT(worst, 2e-3f) << "position " << pos;
    }
    token = *want;
  }
  if (graphs) EXPECT_EQ(gpu.runner().graphs()->replays(), kContext);
}

TEST(DecodeAllocationsTest, CudaFollowsTheCpuAsTheSequenceGrows) {
  FollowTheCpu(/*graphs=*/false);
}

TEST(DecodeAllocationsTest, CudaGraphsFollowTheCpuAsTheSequenceGrows) {
  FollowTheCpu(/*graphs=*/true);
}

}  // namespace
}  // namespace tessera
