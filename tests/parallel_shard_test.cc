// Tensor- and pipeline-parallel shards, run as threads of one process
// (ThreadGroup), give transformers' greedy tokens on every golden fixture: the
// sharding arithmetic (column/row splits, replicated KV heads,
// vocabulary-parallel embedding and head, stage hand-off) is exact. The MPI
// transport is tested separately under mpirun.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_sampling.h"
#include "runtime/executor/sequence_runner.h"
#include "runtime/model/registry.h"
#include "runtime/model/shard.h"
#include "tests/test_paths.h"
#include "tests/testing/golden_cases.h"
#include "tests/testing/thread_communicator.h"

namespace tessera {
namespace {

using json = nlohmann::json;

struct Layout {
  int tp;
  int pp;
};

struct RankResult {
  absl::Status status;
  std::vector<std::vector<int32_t>>
      outputs;  // Per golden case (last stage only).
  std::vector<std::vector<float>> prefill_logits;
  int64_t weight_bytes = 0;
};

// Runs every golden case of `dir` on a tp × pp grid of threads with a greedy
// loop: each rank runs Forward, the last stage's tp-rank 0 picks the next
// token, and every rank reads it after a world barrier (the role the
// coordinator's step plan plays under MPI).
std::vector<RankResult> RunGrid(const std::string& dir, const json& golden,
                                Layout layout) {
  const int world = layout.tp * layout.pp;
  std::vector<std::unique_ptr<ThreadGroup>> tp_groups, pp_groups;
  for (int s = 0; s < layout.pp; ++s)
    tp_groups.push_back(std::make_unique<ThreadGroup>(layout.tp));
  for (int r = 0; r < layout.tp; ++r)
    pp_groups.push_back(std::make_unique<ThreadGroup>(layout.pp));
  ThreadGroup everyone(world);
  std::vector<RankResult> results(world);
  std::vector<int32_t> next_token(1, 0);

  auto rank_main = [&](int rank) {
    RankResult& out = results[rank];
    const int stage = rank / layout.tp, tp_rank = rank % layout.tp;
    auto fail = [&](absl::Status s) {
      out.status = s;
      // Keep the others from waiting forever on this rank.
      std::abort();
    };
    auto config = LoadModelConfig(dir);
    if (!config.ok()) return fail(config.status());
    auto shard = MakeShardSpec(*config, tp_rank, layout.tp, stage, layout.pp);
    if (!shard.ok()) return fail(shard.status());
    auto ckpt = Checkpoint::Open(dir);
    if (!ckpt.ok()) return fail(ckpt.status());
    CpuOps ops;
    WeightLoadOptions load;
    load.device = &ops;
    auto weights = LoadShardWeights(**ckpt, *config, *shard, load);
    if (!weights.ok()) return fail(weights.status());
    ModelContext context;
    context.ops = &ops;
    context.tp = tp_groups[stage]->member(tp_rank);
    context.pp = pp_groups[tp_rank]->member(stage);
    auto model = CreateModel(*config, *shard, *std::move(weights), context);
    if (!model.ok()) return fail(model.status());
    out.weight_bytes = (*model)->weight_bytes();
    const bool picks = shard->last_stage() && tp_rank == 0;
    std::vector<float> logits(config->vocab_size);
    for (const json& c : golden["cases"]) {
      std::vector<int32_t> tokens = c["prompt_ids"];
      const int64_t max_new = c["max_new_tokens"];
      SequenceRunner runner(model->get());
      auto cache =
          runner.NewKvCache(static_cast<int64_t>(tokens.size()) + max_new);
      if (!cache.ok()) return fail(cache.status());
      std::vector<int32_t> generated;
      std::vector<int32_t> all = tokens;  // Prompt and output so far.
      for (int64_t step = 0; step < max_new; ++step) {
        // The engine's scheduler recomputes a Phi-3 LongRoPE sequence whole
        // when it reaches recompute_at_length + 1 tokens
        // (ModelConfig::recompute_at_length); so does this loop.
        const int64_t l = config->recompute_at_length;
        if (l > 0 && step > 0 && static_cast<int64_t>(all.size()) == l + 1) {
          cache = runner.NewKvCache(static_cast<int64_t>(all.size()) + max_new);
          if (!cache.ok()) return fail(cache.status());
          tokens = all;
        }
        absl::Status s = runner.Forward(
            tokens, &*cache, shard->last_stage() ? logits.data() : nullptr);
        if (!s.ok()) return fail(s);
        if (picks) {
          if (step == 0) out.prefill_logits.push_back(logits);
          next_token[0] = ArgMax(logits);
        }
        everyone.member(rank)
            ->Barrier()
            .IgnoreError();  // next_token is written.
        const int32_t token = next_token[0];
        everyone.member(rank)
            ->Barrier()
            .IgnoreError();  // Everyone has read it.
        generated.push_back(token);
        all.push_back(token);
        if (std::find(config->eos_token_ids.begin(),
                      config->eos_token_ids.end(),
                      token) != config->eos_token_ids.end()) {
          break;
        }
        tokens = {token};
      }
      if (picks) out.outputs.push_back(generated);
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  return results;
}

class ParallelShardTest
    : public ::testing::TestWithParam<std::tuple<std::string, Layout>> {};

TEST_P(ParallelShardTest, GreedyTokensMatchTransformers) {
  const auto& [name, layout] = GetParam();
  const std::string dir = GoldenDir() + "/" + name;
  std::ifstream in(dir + "/golden.json");
  const json golden = json::parse(in);
  const std::vector<RankResult> results = RunGrid(dir, golden, layout);
  for (const RankResult& r : results) ASSERT_TRUE(r.status.ok()) << r.status;
  const RankResult& picker = results[(layout.pp - 1) * layout.tp];
  ASSERT_EQ(picker.outputs.size(), golden["cases"].size());
  for (size_t i = 0; i < picker.outputs.size(); ++i) {
    const json& c = golden["cases"][i];
    const auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok());
    EXPECT_EQ(picker.outputs[i], GoldenOutputIds(*config, c))
        << name << " tp" << layout.tp << " pp" << layout.pp << " case " << i;
    double diff = 0, ref = 0;
    for (size_t v = 0; v < picker.prefill_logits[i].size(); ++v) {
      const double w = c["prefill_logits"][v].get<double>();
      diff += std::pow(picker.prefill_logits[i][v] - w, 2);
      ref += w * w;
    }
    EXPECT_LT(std::sqrt(diff / ref), 1e-4) << name << " case " << i;
  }
}

// Each rank holds only its shard: with tp ranks, the split weights (everything
// but norms and row-parallel biases) take about 1/tp of the single-process
// bytes on every rank.
TEST(ParallelShardMemory, EachRankHoldsItsShare) {
  const std::string dir = GoldenDir() + "/llama";
  std::ifstream in(dir + "/golden.json");
  json golden = json::parse(in);
  golden["cases"] = json::array();  // Load only.
  const int64_t whole = RunGrid(dir, golden, {1, 1})[0].weight_bytes;
  for (const RankResult& r : RunGrid(dir, golden, {2, 1})) {
    EXPECT_NEAR(static_cast<double>(r.weight_bytes) / whole, 0.5, 0.02)
        << r.weight_bytes;
  }
  for (const RankResult& r : RunGrid(dir, golden, {4, 1})) {
    EXPECT_NEAR(static_cast<double>(r.weight_bytes) / whole, 0.25, 0.03)
        << r.weight_bytes;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ParallelShardTest,
    ::testing::Combine(::testing::Values("llama", "llama3_rope",
                                         "llama_linear_rope", "mistral_1kv",
                                         "qwen2", "qwen3", "llama_yarn",
                                         "qwen3_yarn", "qwen2_dynamic", "phi3",
                                         "phi3_longrope", "gemma", "gemma2",
                                         "gemma3_text", "mixtral", "qwen3_moe",
                                         "qwen2_moe"),
                       ::testing::Values(Layout{2, 1}, Layout{1, 2},
                                         Layout{2, 2}, Layout{4, 1})),
    [](const auto& info) {
      const Layout layout = std::get<1>(info.param);
      return std::get<0>(info.param) + "_tp" + std::to_string(layout.tp) +
             "_pp" + std::to_string(layout.pp);
    });

TEST(ShardSpecTest, RejectsSplitsThatDoNotDivide) {
  auto config =
      LoadModelConfig(GoldenDir() + "/llama");  // 4 heads, 2 KV heads, I = 128.
  ASSERT_TRUE(config.ok());
  EXPECT_NE(MakeShardSpec(*config, 0, 3, 0, 1)
                .status()
                .message()
                .find("attention heads"),
            std::string::npos);
  EXPECT_FALSE(
      MakeShardSpec(*config, 0, 1, 0, 3).ok());  // 2 layers over 3 stages.
  EXPECT_FALSE(MakeShardSpec(*config, 0, 1, 0, 2, {2, 1}).ok());
  auto s = MakeShardSpec(*config, 3, 4, 0,
                         1);  // 2 KV heads over 4 ranks: replicated.
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->local_kv_heads, 1);
  EXPECT_EQ(s->first_kv_head, 1);
  EXPECT_EQ(s->vocab_per_rank, 128);
}

}  // namespace
}  // namespace tessera
