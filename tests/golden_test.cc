// Golden tests: the CPU engine against Hugging Face transformers.
//
// tools/make_golden_fixtures.py (run on the GPU machine, where transformers is
// installed) wrote tiny random-weight checkpoints of each architecture with
// transformers' greedy tokens and prefill logits, and transformers' greedy
// story for the real demo checkpoint. Every token must match; logits must agree
// to f32 rounding.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/generator.h"
#include "runtime/executor/local_executor.h"
#include "runtime/model/registry.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_paths.h"
#include "tests/testing/golden_cases.h"

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

// An engine over a model folder in this process.
std::unique_ptr<LocalEngine> LoadEngine(const std::string& dir, Ops* ops,
                                        const EngineOptions& options = {},
                                        const KvCacheOptions& kv = {}) {
  KvCacheOptions sized = kv;
  if (sized.num_blocks == 0 && sized.memory_bytes == 0) {
    sized.memory_bytes = int64_t{64} << 20;
  }
  auto engine = LocalEngine::Load(dir, ops, options, sized);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

GenerationRequest GreedyRequest(const json& c) {
  GenerationRequest request;
  request.prompt_ids = Ids(c["prompt_ids"]);
  request.max_tokens = c["max_new_tokens"].get<int64_t>();
  request.sampling.temperature = 0.0f;
  request.return_prefill_logits = true;
  return request;
}

class GoldenFixtureTest : public ::testing::TestWithParam<std::string> {};

// Dynamic NTK and LongRoPE rotate each token for its sequence's length at
// the step that writes it, as transformers' generate() does at batch 1
// (kernels/ops.h RopeLengthScaling). A prompt prefilled in chunks, a
// preempted sequence recomputed, or a prompt re-prefilled with its own
// output writes keys rotated for other lengths than transformers' one
// prefill: the tests that do that have no transformers reference for these
// fixtures.
bool LengthDependentRope(const std::string& dir) {
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() && (config->rope.scaling == RopeScaling::kDynamic ||
                         config->rope.scaling == RopeScaling::kLongRope);
}

// The greedy tokens a case must give (tests/testing/golden_cases.h).
std::vector<int32_t> WantOutputIds(const std::string& dir, const json& c) {
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? GoldenOutputIds(*config, c) : Ids(c["output_ids"]);
}

TEST_P(GoldenFixtureTest, GreedyTokensAndLogitsMatchTransformers) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = LoadEngine(dir, &ops);
  ASSERT_NE(local, nullptr);
  const json golden = ReadJson(dir + "/golden.json");
  ASSERT_FALSE(golden["cases"].empty());
  for (const json& c : golden["cases"]) {
    const GenerationRequest request = GreedyRequest(c);
    auto result = local->engine().Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::string what =
        GetParam() + " prompt of " + std::to_string(request.prompt_ids.size());
    EXPECT_EQ(result->output_ids, WantOutputIds(dir, c)) << what;
    EXPECT_EQ(FinishReasonName(result->finish_reason),
              c["finish_reason"].get<std::string>())
        << what;
    ExpectLogitsClose(result->prefill_logits, c["prefill_logits"], what);
  }
}

// The greedy next token after each prefix prompt + text[0, i), i < n, as
// `engine` predicts it (one short prefill each over the prefix cache).
std::vector<int32_t> TeacherForcedTokens(Engine& engine,
                                         const std::vector<int32_t>& prompt,
                                         const std::vector<int32_t>& text) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < text.size(); ++i) {
    GenerationRequest r;
    r.prompt_ids = prompt;
    r.prompt_ids.insert(r.prompt_ids.end(), text.begin(), text.begin() + i);
    r.max_tokens = 1;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    auto result = engine.Generate(r);
    EXPECT_TRUE(result.ok()) << result.status();
    out.push_back(result.ok() && result->output_ids.size() == 1
                      ? result->output_ids[0]
                      : -1);
  }
  return out;
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
  if (LengthDependentRope(dir)) {
    GTEST_SKIP() << GetParam() << ": chunks rotate for their own lengths";
  }
  CpuOps ops;
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  const ShardSpec shard = FullModel(*config);
  WeightLoadOptions load;
  load.device = &ops;
  auto weights = LoadShardWeights(**ckpt, *config, shard, load);
  ASSERT_TRUE(weights.ok());
  ModelContext context;
  context.ops = &ops;
  context.max_step_tokens = 7;
  auto model = CreateModel(*config, shard, *std::move(weights), context);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->max_step_tokens(), 7);
  const json golden = ReadJson(dir + "/golden.json");
  EngineOptions options;
  options.scheduler.max_num_batched_tokens = 7;
  options.scheduler.max_num_seqs = 1;
  KvCacheOptions kv;
  kv.memory_bytes = int64_t{16} << 20;
  auto local = LocalEngine::Create(*std::move(model), options, kv);
  ASSERT_TRUE(local.ok()) << local.status();
  for (const json& c : golden["cases"]) {
    auto result = (*local)->engine().Generate(GreedyRequest(c));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output_ids, WantOutputIds(dir, c)) << GetParam();
    ExpectLogitsClose(result->prefill_logits, c["prefill_logits"],
                      GetParam() + " chunked");
  }
}

// Continuous batching: every golden case submitted at once (twice, so equal
// prompts share cached blocks), under several engine configurations —
// paged/static attention, tiny token budgets that mix chunked prefills with
// decodes, block sizes 1 and 5, a KV pool so small that sequences are
// preempted and recomputed — gives transformers' tokens and logits for each,
// exactly as each prompt run alone does.
struct BatchConfig {
  const char* name;
  AttentionBackend backend;
  int64_t budget;
  int64_t block_size;
  int64_t num_blocks;  // 0: plenty.
  bool prefix_cache;
};

TEST_P(GoldenFixtureTest, BatchedRequestsMatchTransformers) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  const json golden = ReadJson(dir + "/golden.json");
  std::vector<json> cases;
  for (int copy = 0; copy < 2; ++copy) {
    for (const json& c : golden["cases"]) cases.push_back(c);
  }
  int64_t longest = 0;
  for (const json& c : cases) {
    longest = std::max<int64_t>(
        longest, c["prompt_ids"].size() + c["max_new_tokens"].get<int64_t>());
  }
  const BatchConfig configs[] = {
      {"paged", AttentionBackend::kPaged, 2048, 16, 0, true},
      {"paged_no_prefix_cache", AttentionBackend::kPaged, 2048, 16, 0, false},
      {"static", AttentionBackend::kStatic, 2048, 16, 0, false},
      {"budget5_block1", AttentionBackend::kPaged, 5, 1, 0, true},
      {"budget16_block5", AttentionBackend::kPaged, 16, 5, 0, true},
      // Room for about two sequences: the rest wait or are preempted.
      {"tiny_pool", AttentionBackend::kPaged, 32, 4, (2 * longest + 3) / 4,
       true},
  };
  const bool length_dependent = LengthDependentRope(dir);
  for (const BatchConfig& config : configs) {
    SCOPED_TRACE(config.name);
    // Budgets that chunk prefills, and a pool that preempts, change which
    // lengths keys are rotated for (LengthDependentRope).
    if (length_dependent && (config.budget < 2048 || config.num_blocks > 0)) {
      continue;
    }
    CpuOps ops;
    EngineOptions options;
    options.scheduler.max_num_batched_tokens = config.budget;
    options.scheduler.max_num_seqs = 8;
    options.enable_prefix_caching = config.prefix_cache;
    KvCacheOptions kv;
    kv.backend = config.backend;
    kv.block_size = config.block_size;
    kv.num_blocks = config.num_blocks;
    std::unique_ptr<LocalEngine> local = LoadEngine(dir, &ops, options, kv);
    ASSERT_NE(local, nullptr);
    Engine& engine = local->engine();
    std::vector<int64_t> ids;
    for (const json& c : cases) {
      auto id = engine.Submit(GreedyRequest(c));
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    ASSERT_TRUE(engine.RunUntilIdle().ok());
    for (size_t i = 0; i < cases.size(); ++i) {
      auto result = engine.TakeResult(ids[i]);
      ASSERT_TRUE(result.ok()) << result.status();
      const std::string what =
          absl::StrCat(GetParam(), " ", config.name, " request ", i);
      EXPECT_EQ(result->output_ids, WantOutputIds(dir, cases[i])) << what;
      ExpectLogitsClose(result->prefill_logits, cases[i]["prefill_logits"],
                        what);
    }
    const Engine::Stats stats = engine.stats();
    EXPECT_GT(stats.scheduler.max_batch, 1) << config.name;
    if (config.num_blocks > 0) {
      EXPECT_GT(stats.scheduler.preemptions, 0) << config.name;
    }
    if (config.prefix_cache && config.num_blocks == 0 &&
        config.block_size <= 5) {
      // The second copy of each prompt finds the first's full blocks.
      EXPECT_GT(stats.blocks.hit_tokens, 0) << config.name;
    }
  }
}

// min_tokens is transformers' min_new_tokens: greedy decoding where, while
// fewer than min_new_tokens tokens are generated, every EOS logit is -inf
// (MinNewTokensLengthLogitsProcessor), and an EOS ends the sequence (it is
// kept). The reference applies exactly that to the model's next-token logits
// (tied to transformers above), one prompt extension at a time; the EOS set
// is the config's EOS plus a token that greedy decoding produces early (in
// Tessera a stop_token_id), so without min_tokens the sequence would end at
// once. f32 on the CPU, token for token.
TEST_P(GoldenFixtureTest, MinTokensIsTransformersMinNewTokens) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  if (LengthDependentRope(dir)) {
    // The reference re-prefills each extended prompt whole.
    GTEST_SKIP() << GetParam() << ": the reference re-prefills";
  }
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = LoadEngine(dir, &ops);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  const std::vector<int64_t>& eos = engine.config().eos_token_ids;
  const json golden = ReadJson(dir + "/golden.json");
  constexpr int64_t kMinTokens = 8;
  for (const json& c : golden["cases"]) {
    const std::vector<int32_t> ref = Ids(c["output_ids"]);
    const std::vector<int32_t> prompt = Ids(c["prompt_ids"]);
    size_t early = 1;
    while (early < ref.size() &&
           std::find(eos.begin(), eos.end(), ref[early]) != eos.end()) {
      ++early;
    }
    ASSERT_LT(early, ref.size());
    const int32_t stop = ref[early];
    std::vector<int32_t> ends(eos.begin(), eos.end());
    ends.push_back(stop);
    auto is_end = [&](int32_t t) {
      return std::find(ends.begin(), ends.end(), t) != ends.end();
    };

    GenerationRequest request = GreedyRequest(c);
    request.return_prefill_logits = false;
    request.stop_token_ids = {stop};
    auto unmasked = engine.Generate(request);
    ASSERT_TRUE(unmasked.ok()) << unmasked.status();
    ASSERT_LE(unmasked->output_ids.size(), early + 1);
    EXPECT_EQ(unmasked->finish_reason, FinishReason::kStop);

    std::vector<int32_t> want;
    std::vector<int32_t> ids = prompt;
    while (static_cast<int64_t>(want.size()) < request.max_tokens) {
      GenerationRequest next;
      next.prompt_ids = ids;
      next.max_tokens = 1;
      next.sampling.temperature = 0.0f;
      next.ignore_eos = true;
      next.return_prefill_logits = true;
      auto step = engine.Generate(next);
      ASSERT_TRUE(step.ok()) << step.status();
      std::vector<float> logits = step->prefill_logits;
      if (static_cast<int64_t>(want.size()) < kMinTokens) {
        for (int32_t e : ends) logits[e] = -INFINITY;
      }
      const int32_t token = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
      want.push_back(token);
      if (is_end(token)) break;
      ids.push_back(token);
    }
    request.min_tokens = kMinTokens;
    auto got = engine.Generate(request);
    ASSERT_TRUE(got.ok()) << got.status();
    const std::string what = GetParam() + " prompt of " +
                             std::to_string(prompt.size()) + ", stop " +
                             std::to_string(stop);
    EXPECT_EQ(got->output_ids, want) << what;
    EXPECT_EQ(got->finish_reason,
              is_end(want.back()) ? FinishReason::kStop : FinishReason::kLength)
        << what;
    EXPECT_GT(got->output_ids.size(), static_cast<size_t>(kMinTokens)) << what;
  }
}

// The same against transformers' own numbers: with the greedy first token as
// a stop id and min_tokens = 1, the first token is the argmax of
// transformers' prefill logits (golden.json) with that id and EOS at -inf,
// as MinNewTokensLengthLogitsProcessor leaves them.
TEST_P(GoldenFixtureTest, MinTokensFirstTokenIsTheMaskedArgmaxOfHfLogits) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = LoadEngine(dir, &ops);
  ASSERT_NE(local, nullptr);
  const std::vector<int64_t>& eos = local->engine().config().eos_token_ids;
  const json golden = ReadJson(dir + "/golden.json");
  size_t checked = 0;
  for (const json& c : golden["cases"]) {
    const std::vector<int32_t> ref = Ids(c["output_ids"]);
    std::vector<float> hf = c["prefill_logits"].get<std::vector<float>>();
    hf[ref[0]] = -INFINITY;
    for (int64_t e : eos) hf[e] = -INFINITY;
    std::vector<float> sorted = hf;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    // A near-tie that f32 rounding could flip proves nothing either way.
    if (sorted[0] - sorted[1] < 1e-3f) continue;
    GenerationRequest request = GreedyRequest(c);
    request.stop_token_ids = {ref[0]};
    request.min_tokens = 1;
    request.max_tokens = 2;
    auto got = local->engine().Generate(request);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->output_ids[0],
              std::max_element(hf.begin(), hf.end()) - hf.begin())
        << GetParam() << " prompt of " << c["prompt_ids"].size();
    EXPECT_NE(got->output_ids[0], ref[0]);
    ++checked;
  }
  EXPECT_GE(checked, golden["cases"].size() - 1) << "too many near-ties";
}

// min_tokens against transformers' min_new_tokens
// (tools/make_min_tokens_golden.py, where a fixture has min_tokens.json): an
// early greedy token is made a stop token, so without min_tokens the sequence
// ends after two tokens; with them EOS and the stop token are masked until
// min_new_tokens tokens exist.
TEST_P(GoldenFixtureTest, MinTokensMatchTransformersMinNewTokens) {
  const std::string dir = GoldenDir() + "/" + GetParam();
  if (!std::filesystem::exists(dir + "/min_tokens.json")) {
    GTEST_SKIP() << GetParam() << " has no min_tokens.json";
  }
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = LoadEngine(dir, &ops);
  ASSERT_NE(local, nullptr);
  const json golden = ReadJson(dir + "/min_tokens.json");
  ASSERT_FALSE(golden["cases"].empty());
  for (const json& c : golden["cases"]) {
    GenerationRequest request;
    request.prompt_ids = Ids(c["prompt_ids"]);
    request.max_tokens = golden["max_new_tokens"].get<int64_t>();
    request.min_tokens = golden["min_new_tokens"].get<int64_t>();
    request.stop_token_ids = {c["stop_token_id"].get<int32_t>()};
    request.sampling.temperature = 0.0f;
    const std::string what = GetParam() + " prompt " + c["prompt_ids"].dump();
    auto result = local->engine().Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output_ids, WantOutputIds(dir, c)) << what;
    EXPECT_EQ(FinishReasonName(result->finish_reason),
              c["finish_reason"].get<std::string>())
        << what;
    // Without min_tokens the stop token ends it early, as in transformers.
    request.min_tokens = 0;
    auto early = local->engine().Generate(request);
    ASSERT_TRUE(early.ok()) << early.status();
    EXPECT_EQ(early->output_ids, Ids(c["output_ids_without_min"])) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GoldenFixtureTest,
                         ::testing::ValuesIn(FixtureNames()),
                         [](const auto& info) { return info.param; });

TEST(GoldenFixtures, EveryArchitectureIsCovered) {
  const std::vector<std::string> names = FixtureNames();
  for (const char* required :
       {"llama", "llama3_rope", "llama_linear_rope", "mistral_1kv", "qwen2",
        "qwen3", "mixtral", "qwen3_moe", "qwen2_moe", "llama_yarn",
        "qwen3_yarn", "qwen2_dynamic", "phi3", "phi3_longrope",
        // fp8 checkpoints (tools/make_fp8_fixtures.py), one per format.
        "fp8_ct_channel", "fp8_ct_tensor_static", "fp8_block", "fp8_modelopt",
        "fp8_fbgemm"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), required), names.end())
        << required;
  }
}

// --kv-dtype fp8 on the CPU: every fixture generates over an e4m3 cache (per-
// head scales of 1, what a checkpoint without kv scales gets) without error,
// and teacher-forced along transformers' tokens it predicts the f32 cache's
// next token at most positions.
//
// The bound: e4m3 keeps 3 mantissa bits (a relative rounding error of up to
// 2^-4, 3.6% RMS), and these random-weight fixtures' keys and values are
// small (RMS ~0.1, so many fall among e4m3's subnormals, below 2^-6, where
// the error is relatively larger still): measured, their prefill logits move
// 3-20% (relative L2) from the f32 cache's, while their logits are nearly
// flat (RMS ~1.6, top-2 gaps from 0.002 to 0.9). So a next token flips
// wherever the f32 gap is within that noise, and free-running greedy text
// diverges for good after its first flip (measured: 10 to 80 of 80 tokens
// equal). Teacher forcing against the f32 cache's own next tokens counts
// each position once: measured 69% (55 of 80, mixtral) to 100% per fixture,
// 87% (1179 of 1354) over all. Asserted: a clear majority (> 60%) for every
// fixture and > 75% over all of them, some flips below the worst measured
// rather than the measurement itself. The real checkpoint
// (DemoCheckpoint.Fp8KvCacheAgreesWithF32Cache) is held to far more.
// (same, total) of the fixture `name`.
std::pair<size_t, size_t> Fp8KvAgreement(const std::string& name) {
  const std::string dir = GoldenDir() + "/" + name;
  CpuOps ops;
  std::unique_ptr<LocalEngine> f32 = LoadEngine(dir, &ops);
  KvCacheOptions kv;
  kv.dtype = DType::kF8E4M3;
  std::unique_ptr<LocalEngine> fp8 = LoadEngine(dir, &ops, {}, kv);
  if (f32 == nullptr || fp8 == nullptr) return {0, 1};
  const json golden = ReadJson(dir + "/golden.json");
  size_t same = 0, total = 0;
  for (const json& c : golden["cases"]) {
    const GenerationRequest request = GreedyRequest(c);
    // Free-running: it runs to the end (tokens may differ).
    auto result = fp8->engine().Generate(request);
    EXPECT_TRUE(result.ok()) << name << ": " << result.status();
    if (!result.ok()) return {0, 1};
    EXPECT_FALSE(result->output_ids.empty()) << name;
    const std::vector<int32_t> text = WantOutputIds(dir, c);
    const std::vector<int32_t> want =
        TeacherForcedTokens(f32->engine(), request.prompt_ids, text);
    const std::vector<int32_t> got =
        TeacherForcedTokens(fp8->engine(), request.prompt_ids, text);
    size_t case_same = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      // -1: a run failed (reported by TeacherForcedTokens).
      case_same += got[i] == want[i] && want[i] >= 0;
    }
    same += case_same;
    total += want.size();
    std::cerr << name << " prompt of " << request.prompt_ids.size() << ": "
              << case_same << " of " << want.size()
              << " teacher-forced next tokens as the f32 cache's\n";
  }
  return {same, total};
}

TEST(GoldenFixtures, Fp8KvCacheGeneratesAndMostlyAgrees) {
  size_t same = 0, total = 0;
  for (const std::string& name : FixtureNames()) {
    const auto [s, t] = Fp8KvAgreement(name);
    ASSERT_GT(t, 0u) << name;
    std::cerr << name << ": " << s << " of " << t << "\n";
    EXPECT_GT(static_cast<double>(s) / static_cast<double>(t), 0.6)
        << name << ": " << s << " of " << t;
    same += s;
    total += t;
  }
  EXPECT_GT(static_cast<double>(same) / static_cast<double>(total), 0.75)
      << same << " of " << total;
}

// The real TinyStories model: transformers' greedy story for "Once upon a
// time", token for token.
TEST(DemoCheckpoint, ReproducesTransformersGreedyStory) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = LoadEngine(DemoModelDir(), &ops);
  ASSERT_NE(local, nullptr);
  Model* model = &local->model();
  auto tokenizer = LoadTokenizer(DemoModelDir(), model->config().bos_token_id);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const json golden = ReadJson(FixturesDir() + "/stories260K_golden.json");
  std::vector<json> cases = {golden};
  for (const json& c : golden["more_cases"]) cases.push_back(c);
  for (const json& c : cases) {
    // The tokenizer reproduces the reference prompt ids (BOS + pieces).
    auto ids = (*tokenizer)->Encode(c["prompt"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    ASSERT_TRUE((*tokenizer)->add_bos());
    ids->insert(ids->begin(), model->config().bos_token_id);
    ASSERT_EQ(*ids, Ids(c["prompt_ids"])) << c["prompt"];

    GenerationRequest request;
    request.prompt_ids = *ids;
    request.max_tokens = static_cast<int64_t>(c["output_ids"].size());
    request.sampling.temperature = 0.0f;
    request.return_prefill_logits = true;
    auto result = local->engine().Generate(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output_ids, Ids(c["output_ids"])) << c["prompt"];
    ExpectLogitsClose(result->prefill_logits, c["prefill_logits"], c["prompt"]);
    auto text = (*tokenizer)->Decode(result->output_ids);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, c["text"].get<std::string>());
  }
}

// The real TinyStories model over an fp8 cache (scales of 1): transformers'
// greedy stories teacher-forced, the fp8 cache's next token against the f32
// cache's at every position. A trained model's keys and values sit in
// e4m3's normal range and its top-2 gaps are mostly wide, so only near-ties
// flip: measured 380 of 392 (97%; the int8 cache, EngineInt8Kv: 197 of
// 200). Asserted: >= 90%, room for a dozen more near-ties.
TEST(DemoCheckpoint, Fp8KvCacheAgreesWithF32Cache) {
  CpuOps ops;
  std::unique_ptr<LocalEngine> f32 = LoadEngine(DemoModelDir(), &ops);
  KvCacheOptions kv;
  kv.dtype = DType::kF8E4M3;
  std::unique_ptr<LocalEngine> fp8 = LoadEngine(DemoModelDir(), &ops, {}, kv);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(fp8, nullptr);
  const json golden = ReadJson(FixturesDir() + "/stories260K_golden.json");
  std::vector<json> cases = {golden};
  for (const json& c : golden["more_cases"]) cases.push_back(c);
  size_t same = 0, total = 0;
  for (const json& c : cases) {
    const std::vector<int32_t> prompt = Ids(c["prompt_ids"]);
    const std::vector<int32_t> text = Ids(c["output_ids"]);
    const std::vector<int32_t> want =
        TeacherForcedTokens(f32->engine(), prompt, text);
    const std::vector<int32_t> got =
        TeacherForcedTokens(fp8->engine(), prompt, text);
    size_t case_same = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      case_same += got[i] == want[i] && want[i] >= 0;
    }
    std::cerr << c["prompt"] << ": " << case_same << " of " << want.size()
              << "\n";
    same += case_same;
    total += want.size();
  }
  std::cerr << "stories260K: " << same << " of " << total << "\n";
  EXPECT_GE(static_cast<double>(same), 0.9 * static_cast<double>(total))
      << same << " of " << total;
}

}  // namespace
}  // namespace tessera
