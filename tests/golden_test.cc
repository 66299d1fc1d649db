// Golden tests: the CPU engine against Hugging Face transformers.
//
// tools/make_golden_fixtures.py (run on the GPU machine, where transformers is
// installed) wrote tiny random-weight checkpoints of each architecture with
// transformers' greedy tokens and prefill logits, and transformers' greedy
// story for the real demo checkpoint. Every token must match; logits must agree
// to f32 rounding.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/engine/generator.h"
#include "runtime/model/llama.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

using json = nlohmann::json;

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// ‖got − want‖ / ‖want‖ over the whole vector, plus the largest elementwise
// gap.
void ExpectLogitsClose(const std::vector<float>& got, const json& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff_sq = 0, ref_sq = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    diff_sq += (got[i] - w) * (got[i] - w);
    ref_sq += w * w;
    max_abs = std::max(max_abs, std::fabs(got[i] - w));
  }
  EXPECT_LT(std::sqrt(diff_sq / ref_sq), 1e-4)
      << what << " (max abs diff " << max_abs << ")";
}

std::vector<int32_t> Ids(const json& j) {
  return j.get<std::vector<int32_t>>();
}

class GoldenFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenFixtureTest, GreedyTokensAndLogitsMatchTransformers) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  CpuOps ops;
  auto model = LlamaModel::Load(dir, &ops);
  ASSERT_TRUE(model.ok()) << model.status();
  const json golden = ReadJson(dir + "/golden.json");
  Generator generator(model->get(), (*model)->config().eos_token_ids);
  ASSERT_FALSE(golden["cases"].empty());
  for (const json& c : golden["cases"]) {
    GenerationRequest request;
    request.prompt_ids = Ids(c["prompt_ids"]);
    request.max_tokens = c["max_new_tokens"].get<int64_t>();
    request.sampling.temperature = 0.0f;
    auto result = generator.Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::string what =
        GetParam() + " prompt of " + std::to_string(request.prompt_ids.size());
    EXPECT_EQ(result->output_ids, Ids(c["output_ids"])) << what;
    EXPECT_EQ(FinishReasonName(result->finish_reason),
              c["finish_reason"].get<std::string>())
        << what;
    ExpectLogitsClose(result->prefill_logits, c["prefill_logits"], what);
  }
}

std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(GoldenDir())) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Chunked prefill: a prompt run in steps of 7 tokens (the scratch sized for 7)
// fills the same cache and gives the same tokens and logits as one step.
TEST_P(GoldenFixtureTest, ChunkedPrefillMatchesTransformers) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  CpuOps ops;
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  const ShardSpec shard = FullModel(*config);
  auto weights = LoadLlamaWeights(**ckpt, *config, shard);
  ASSERT_TRUE(weights.ok());
  auto model = LlamaModel::Create(*config, shard, *std::move(weights), &ops,
                                  nullptr, nullptr,
                                  /*max_step_tokens=*/7);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->max_step_tokens(), 7);
  const json golden = ReadJson(dir + "/golden.json");
  Generator generator(model->get(), (*model)->config().eos_token_ids);
  for (const json& c : golden["cases"]) {
    GenerationRequest request;
    request.prompt_ids = Ids(c["prompt_ids"]);
    request.max_tokens = c["max_new_tokens"].get<int64_t>();
    request.sampling.temperature = 0.0f;
    auto result = generator.Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output_ids, Ids(c["output_ids"])) << GetParam();
    ExpectLogitsClose(result->prefill_logits, c["prefill_logits"],
                      GetParam() + " chunked");
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GoldenFixtureTest,
                         ::testing::ValuesIn(FixtureNames()),
                         [](const auto& info) { return info.param; });

TEST(GoldenFixtures, EveryArchitectureIsCovered) {
  const std::vector<std::string> names = FixtureNames();
  for (const char* required : {"llama", "llama3_rope", "llama_linear_rope",
                               "mistral_1kv", "qwen2", "qwen3"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), required), names.end())
        << required;
  }
}

// The real TinyStories model: transformers' greedy story for "Once upon a
// time", token for token.
TEST(DemoCheckpoint, ReproducesTransformersGreedyStory) {
  CpuOps ops;
  auto model = LlamaModel::Load(DemoModelDir(), &ops);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tokenizer =
      LoadTokenizer(DemoModelDir(), (*model)->config().bos_token_id);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const json golden = ReadJson(FixturesDir() + "/stories260K_golden.json");
  std::vector<json> cases = {golden};
  for (const json& c : golden["more_cases"]) cases.push_back(c);
  Generator generator(model->get(), (*model)->config().eos_token_ids);
  for (const json& c : cases) {
    // The tokenizer reproduces the reference prompt ids (BOS + pieces).
    auto ids = (*tokenizer)->Encode(c["prompt"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    ASSERT_TRUE((*tokenizer)->add_bos());
    ids->insert(ids->begin(), (*model)->config().bos_token_id);
    ASSERT_EQ(*ids, Ids(c["prompt_ids"])) << c["prompt"];

    GenerationRequest request;
    request.prompt_ids = *ids;
    request.max_tokens = static_cast<int64_t>(c["output_ids"].size());
    request.sampling.temperature = 0.0f;
    auto result = generator.Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output_ids, Ids(c["output_ids"])) << c["prompt"];
    ExpectLogitsClose(result->prefill_logits, c["prefill_logits"], c["prompt"]);
    auto text = (*tokenizer)->Decode(result->output_ids);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, c["text"].get<std::string>());
  }
}

}  // namespace
}  // namespace tessera
