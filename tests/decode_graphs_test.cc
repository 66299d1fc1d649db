// Decode CUDA graphs (runtime/executor/graph_runner.h) on a GPU, f32 weights
// and an f32 cache (the golden mode): for batches of 1 to 16 sequences whose
// lengths grow across the decode kernel's 512-key partition boundary, the
// replay of a padded decode step gives bit for bit the logits of the same
// padded step run eagerly (every row, the padding's included), and the real
// rows agree with the unpadded eager step (a different GEMM shape: close,
// and the same greedy token). Neither replays nor eager steps allocate. Also
// prints decode ms/step with and without graphs. The replay check runs again
// with dynamic NTK and LongRoPE, whose frequencies change as the lengths
// cross their switch between replays. Skips without a GPU, but for the CPU's
// refusal of graphs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "proto/tessera.pb.h"
#include "runtime/core/status.h"
#include "runtime/executor/graph_runner.h"
#include "runtime/executor/rank.h"
#include "runtime/executor/step_inputs.h"
#include "runtime/executor/step_runner.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/model.h"
#include "runtime/model/registry.h"
#include "tests/test_paths.h"
#include "tests/testing/long_context_model.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kContext = 1100;  // Three partitions of 512 keys.
constexpr int64_t kBlockSize = 16;
constexpr int32_t kMaxBatch = 16;
constexpr int64_t kBlocksPerSeq = (kContext + kBlockSize - 1) / kBlockSize;

std::string LongContextModel() {
  return LongContextDemoModel("graphs_long_context", kContext);
}

class DecodeGraphsTest : public ::testing::Test {
 protected:
  // The model folder the fixture loads (its context is kContext).
  virtual std::string ModelDir() { return LongContextModel(); }

  void SetUp() override {
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
    auto backend = CreateBackend("cuda", 0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    ModelPlacement placement;
    placement.allocator = backend_.allocator.get();
    placement.matrix_dtype = DType::kF32;
    auto model = LoadModel(ModelDir(), backend_.ops.get(),
                           /*max_step_tokens=*/512,
                           /*max_logit_rows=*/kMaxBatch, placement);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    ASSERT_EQ(model_->config().max_position_embeddings, kContext);
    vocab_ = model_->config().vocab_size;
    auto pool = KvPool::Create(model_->kv_pool_shape(DType::kF32),
                               kMaxBatch * kBlocksPerSeq, kBlockSize,
                               model_->ops(), model_->allocator());
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    auto inputs = StepRunner::Reserve(model_.get(), kBlockSize);
    ASSERT_TRUE(inputs.ok()) << inputs.status();
    inputs_ = *std::move(inputs);
    const Backend* device = &backend_;
    auto graphs =
        GraphRunner::Capture(model_.get(), pool_, AttentionBackend::kPaged,
                             inputs_.get(), DecodeGraphBuckets(kMaxBatch),
                             [device] { return device->FreeDeviceBytes(); });
    ASSERT_TRUE(graphs.ok()) << graphs.status();
    graphs_ = *std::move(graphs);
    std::printf("decode graphs: %zu buckets, %lld bytes\n",
                graphs_->buckets().size(),
                static_cast<long long>(graphs_->graph_bytes()));
    for (int32_t s = 0; s < kMaxBatch; ++s) {
      std::vector<int32_t> table(kBlocksPerSeq);
      // Descending blocks, so that no table is an identity map.
      for (int64_t b = 0; b < kBlocksPerSeq; ++b) {
        table[b] =
            static_cast<int32_t>((kMaxBatch - s) * kBlocksPerSeq - 1 - b);
      }
      tables_.push_back(std::move(table));
    }
  }

  int32_t Token(int64_t pos, int32_t seq) const {
    return static_cast<int32_t>((pos * 31 + seq * 7 + 3) % vocab_);
  }

  // One step over `slices` (tokens from Token()), eagerly or replayed.
  absl::Status Run(const std::vector<SequenceSlice>& slices,
                   std::vector<int32_t> rows, int32_t pad_to, bool replay,
                   std::vector<float>* logits) {
    std::vector<int32_t> tokens;
    for (size_t s = 0; s < slices.size(); ++s) {
      for (int64_t p = slices[s].context_len;
           p < slices[s].context_len + slices[s].query_len; ++p) {
        tokens.push_back(Token(p, static_cast<int32_t>(s)));
      }
    }
    RETURN_IF_ERROR(inputs_->Fill(slices, kBlockSize, pool_.num_blocks(),
                                  tokens, rows, pad_to));
    TensorView out;
    if (replay) {
      RETURN_IF_ERROR(graphs_->Replay(pad_to));
      out = graphs_->logits(pad_to);
    } else {
      StepBatch batch;
      batch.tokens = inputs_->tokens();
      batch.metadata = &inputs_->metadata();
      batch.logit_rows = inputs_->logit_rows();
      RETURN_IF_ERROR(model_->ForwardBatch(batch, pool_, nullptr));
      out = model_->step_logits();
    }
    if (logits == nullptr) return model_->ops()->Synchronize();
    logits->resize(out.numel());
    return model_->ops()->CopyToHost(out, logits->data());
  }

  // The first `n` sequences' prompts up to `start(s)` positions, one
  // sequence per step in chunks of 512 tokens.
  void Prefill(int32_t n, const std::vector<int64_t>& start) {
    for (int32_t s = 0; s < n; ++s) {
      for (int64_t at = 0; at < start[s]; at += 512) {
        const int64_t q = std::min<int64_t>(512, start[s] - at);
        // Tokens of Run() are numbered by the slice: one slice, seq 0's
        // pattern; the KV only has to be real data, not a given text.
        ASSERT_TRUE(Run({{at, q, tables_[s]}}, {}, 0, false, nullptr).ok());
      }
    }
  }

  std::vector<SequenceSlice> Slices(int32_t n,
                                    const std::vector<int64_t>& ctx) {
    std::vector<SequenceSlice> slices;
    for (int32_t s = 0; s < n; ++s) slices.push_back({ctx[s], 1, tables_[s]});
    return slices;
  }

  Backend backend_;
  std::unique_ptr<Model> model_;
  KvPool pool_;
  std::unique_ptr<StepInputs> inputs_;
  std::unique_ptr<GraphRunner> graphs_;
  std::vector<std::vector<int32_t>> tables_;
  int64_t vocab_ = 0;

  // The replay-equals-eager check of the tests below.
  void CheckReplayEqualsEager();
};

// The same model with a RoPE whose frequencies follow each sequence's length
// (dynamic NTK over an original context of 550; LongRoPE switching at 530,
// with its attention factor on the softmax scale): the lengths of the replay
// test cross the switch, so the captured QkvRopeStore must read them from
// the step's device arrays at every replay.
class RopeDecodeGraphsTest : public DecodeGraphsTest,
                             public ::testing::WithParamInterface<const char*> {
 protected:
  std::string ModelDir() override {
    const std::string dir =
        LongContextDemoModel(std::string("graphs_") + GetParam(), kContext);
    std::ifstream in(dir + "/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    in.close();
    if (std::string(GetParam()) == "dynamic") {
      config["max_position_embeddings"] = kContext / 2;  // Served: x 2.
      config["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
    } else {
      config["rope_scaling"] = {{"rope_type", "longrope"},
                                {"original_max_position_embeddings", 530},
                                {"short_factor", {1.0, 1.1, 1.3, 1.6}},
                                {"long_factor", {1.0, 2.0, 4.0, 8.0}}};
    }
    std::ofstream(dir + "/config.json") << config.dump();
    return dir;
  }
};

TEST_F(DecodeGraphsTest, ReplayEqualsEagerBitForBit) {
  CheckReplayEqualsEager();
}

TEST_P(RopeDecodeGraphsTest, ReplayEqualsEagerBitForBit) {
  CheckReplayEqualsEager();
}

INSTANTIATE_TEST_SUITE_P(LengthScaledRope, RopeDecodeGraphsTest,
                         ::testing::Values("dynamic", "longrope"));

void DecodeGraphsTest::CheckReplayEqualsEager() {
  const AllocatorStats built = model_->allocator()->stats();
  float worst_unpadded = 0.0f;
  int64_t bitwise_unpadded = 0, compared = 0;
  for (int32_t n : {1, 2, 3, 5, 8, 11, 16}) {
    SCOPED_TRACE(::testing::Message() << "batch " << n);
    const int32_t bucket = graphs_->BucketFor(n);
    ASSERT_GE(bucket, n);
    // Lengths 500..560 at the start, crossing 512 within the steps.
    std::vector<int64_t> ctx(n);
    for (int32_t s = 0; s < n; ++s) ctx[s] = 500 + (s * 5) % 60;
    ASSERT_NO_FATAL_FAILURE(Prefill(n, ctx));
    std::vector<int32_t> rows(n);
    for (int32_t s = 0; s < n; ++s) rows[s] = s;
    for (int step = 0; step < 20; ++step) {
      const std::vector<SequenceSlice> slices = Slices(n, ctx);
      std::vector<float> graph, eager, unpadded;
      ASSERT_TRUE(Run(slices, rows, bucket, /*replay=*/true, &graph).ok());
      ASSERT_TRUE(Run(slices, rows, bucket, /*replay=*/false, &eager).ok());
      ASSERT_EQ(graph.size(), static_cast<size_t>(bucket * vocab_));
      ASSERT_EQ(graph.size(), eager.size());
      for (size_t i = 0; i < graph.size(); ++i) {
        ASSERT_TRUE(std::isfinite(graph[i])) << "logit " << i;
      }
      ASSERT_EQ(0, std::memcmp(graph.data(), eager.data(),
                               graph.size() * sizeof(float)))
          << "step " << step << ": the replay differs from the eager step";
      // The unpadded eager step: another batch shape for the GEMMs.
      ASSERT_TRUE(Run(slices, rows, 0, /*replay=*/false, &unpadded).ok());
      ASSERT_EQ(unpadded.size(), static_cast<size_t>(n * vocab_));
      float worst = 0.0f;
      for (size_t i = 0; i < unpadded.size(); ++i) {
        worst = std::max(worst, std::abs(unpadded[i] - graph[i]));
      }
      worst_unpadded = std::max(worst_unpadded, worst);
      ++compared;
      if (std::memcmp(unpadded.data(), graph.data(),
                      unpadded.size() * sizeof(float)) == 0) {
        ++bitwise_unpadded;
      }
      EXPECT_LT(worst, 1e-3f) << "step " << step;
      for (int32_t s = 0; s < n; ++s) {
        const float* g = graph.data() + s * vocab_;
        const float* u = unpadded.data() + s * vocab_;
        EXPECT_EQ(std::max_element(g, g + vocab_) - g,
                  std::max_element(u, u + vocab_) - u)
            << "sequence " << s << " step " << step;
      }
      for (int64_t& c : ctx) ++c;
    }
  }
  std::printf(
      "unpadded eager vs replay: %lld of %lld steps bitwise, worst |diff| "
      "%g\n",
      static_cast<long long>(bitwise_unpadded),
      static_cast<long long>(compared), worst_unpadded);
  const AllocatorStats now = model_->allocator()->stats();
  EXPECT_EQ(now.allocations, built.allocations)
      << model_->allocator()->DebugString();
  EXPECT_EQ(graphs_->replays(), 7 * 20);
}

// A replay needs inputs padded to its bucket.
TEST_F(DecodeGraphsTest, ReplayRefusesOtherInputs) {
  std::vector<int64_t> ctx = {4, 9, 1};
  const std::vector<SequenceSlice> slices = Slices(3, ctx);
  ASSERT_TRUE(
      inputs_
          ->Fill(slices, kBlockSize, pool_.num_blocks(), {1, 2, 3}, {0, 1, 2})
          .ok());
  EXPECT_EQ(graphs_->Replay(4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(graphs_->Replay(3).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(inputs_
                  ->Fill(slices, kBlockSize, pool_.num_blocks(), {1, 2, 3},
                         {0, 1, 2}, /*pad_to=*/4)
                  .ok());
  EXPECT_EQ(graphs_->Replay(8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(graphs_->Replay(4).ok());
  EXPECT_TRUE(model_->ops()->Synchronize().ok());
}

// Decode ms/step of the demo model with and without graphs (printed; the
// launch-bound case graphs are for).
TEST_F(DecodeGraphsTest, Timing) {
  for (int32_t n : {1, 16}) {
    std::vector<int64_t> ctx(n, 100);
    std::vector<int32_t> rows(n);
    for (int32_t s = 0; s < n; ++s) rows[s] = s;
    const std::vector<SequenceSlice> slices = Slices(n, ctx);
    const int32_t bucket = graphs_->BucketFor(n);
    double ms[2];
    for (int replay = 0; replay < 2; ++replay) {
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(
            Run(slices, rows, replay ? bucket : 0, replay, nullptr).ok());
      }
      constexpr int kSteps = 200;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps; ++i) {
        ASSERT_TRUE(
            Run(slices, rows, replay ? bucket : 0, replay, nullptr).ok());
      }
      ms[replay] = std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - t0)
                       .count() /
                   kSteps;
    }
    std::printf(
        "TIMING demo model f32, batch %d (bucket %d): eager %.3f ms/step, "
        "graph %.3f ms/step (Fill + forward + sync, no sampling)\n",
        n, bucket, ms[0], ms[1]);
  }
}

// The CPU backend has no graphs: asking for them is an error before anything
// runs (no silent fallback), and the runner stays eager and correct.
TEST(DecodeGraphsCpuTest, TheCpuRefusesGraphs) {
  CpuOps ops;
  auto model = LoadModel(DemoModelDir(), &ops, /*max_step_tokens=*/64,
                         /*max_logit_rows=*/4);
  ASSERT_TRUE(model.ok()) << model.status();
  KvCacheOptions kv;
  kv.num_blocks = 16;
  RankContext context;
  context.decode_graphs = true;
  auto rank = AssembleRank(nullptr, model->get(), kv, /*max_num_seqs=*/4,
                           /*samples=*/true, context);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kUnimplemented)
      << rank.status();
  context.decode_graphs = false;
  rank = AssembleRank(nullptr, model->get(), kv, 4, true, context);
  ASSERT_TRUE(rank.ok()) << rank.status();
  StepRunner& runner = (*rank)->runner();
  EXPECT_EQ(runner.CaptureGraphs(DecodeGraphBuckets(4)).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(runner.graphs(), nullptr);
  EXPECT_EQ((*rank)->graph_bytes(), 0);
  EXPECT_FALSE((*model)->allocator()->capturing());
  proto::StepPlan plan;
  proto::SequenceStep* step = plan.add_seqs();
  step->set_sequence_id(1);
  step->set_start(true);
  step->set_sample(true);
  step->mutable_sampling()->set_temperature(0.0f);
  step->mutable_sampling()->set_top_p(1.0f);
  step->add_tokens(1);
  step->add_block_table(0);
  proto::StepResult result;
  ASSERT_TRUE(runner.Run(plan, &result).ok());
  EXPECT_EQ(result.tokens_size(), 1);
}

}  // namespace
}  // namespace tessera
