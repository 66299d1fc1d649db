// The serving engine end to end on the real demo checkpoint (stories260K):
// continuous batching under memory pressure, prefix caching, int8 KV,
// per-request sampling inside a batch, stop strings, logprobs, cancellation.
// Reference outputs come from the same engine run one request at a time with
// plenty of memory (which the golden tests tie to transformers).
#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_sampling.h"
#include "runtime/executor/local_executor.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_paths.h"
#include "tests/testing/delegating_executor.h"

namespace tessera {
namespace {

struct EngineSetup {
  int64_t budget = 2048;
  int max_num_seqs = 256;
  int64_t block_size = 16;
  int64_t num_blocks = 0;  // 0: 64 MiB.
  bool prefix_cache = true;
  DType kv_dtype = DType::kF32;
  AttentionBackend backend = AttentionBackend::kPaged;
  const Tokenizer* tokenizer = nullptr;
};

std::unique_ptr<LocalEngine> DemoEngine(Ops* ops, const EngineSetup& s) {
  EngineOptions options;
  options.scheduler.max_num_batched_tokens = s.budget;
  options.scheduler.max_num_seqs = s.max_num_seqs;
  options.enable_prefix_caching = s.prefix_cache;
  KvCacheOptions kv;
  kv.block_size = s.block_size;
  kv.num_blocks = s.num_blocks;
  if (s.num_blocks == 0) kv.memory_bytes = int64_t{64} << 20;
  kv.dtype = s.kv_dtype;
  kv.backend = s.backend;
  auto local = LocalEngine::Load(DemoModelDir(), ops, options, kv, s.tokenizer);
  EXPECT_TRUE(local.ok()) << local.status();
  return local.ok() ? *std::move(local) : nullptr;
}

// Submits every request at once and runs the engine dry.
std::vector<GenerationResult> RunAll(
    Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::vector<int64_t> ids;
  for (const GenerationRequest& r : requests) {
    auto id = engine.Submit(r);
    EXPECT_TRUE(id.ok()) << id.status();
    ids.push_back(id.ok() ? *id : -1);
  }
  const absl::Status ran = engine.RunUntilIdle();
  EXPECT_TRUE(ran.ok()) << ran;
  std::vector<GenerationResult> results;
  for (int64_t id : ids) {
    auto r = engine.TakeResult(id);
    EXPECT_TRUE(r.ok()) << r.status();
    results.push_back(r.ok() ? *std::move(r) : GenerationResult{});
  }
  return results;
}

std::vector<GenerationResult> RunOneByOne(
    Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::vector<GenerationResult> results;
  for (const GenerationRequest& r : requests) {
    auto result = engine.Generate(r);
    EXPECT_TRUE(result.ok()) << result.status();
    results.push_back(result.ok() ? *std::move(result) : GenerationResult{});
  }
  return results;
}

// A random prompt of the demo vocabulary: BOS, then ids >= 3.
std::vector<int32_t> RandomPrompt(std::mt19937& rng, int length) {
  std::uniform_int_distribution<int32_t> id(3, 511);
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < length; ++i) prompt.push_back(id(rng));
  return prompt;
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

// Acceptance (2): 200 requests of random lengths through a KV pool far too
// small for all of them at once. Every request completes, with the tokens a
// large pool gives, and sequences were preempted (and recomputed) on the way.
TEST(EngineStress, TinyPoolPreemptsAndLosesNothing) {
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> prompt_len(1, 120);
  std::uniform_int_distribution<int> output_len(1, 64);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 200; ++i) {
    GenerationRequest r =
        Greedy(RandomPrompt(rng, prompt_len(rng)), output_len(rng));
    r.ignore_eos = i % 3 != 0;  // Some stop early at EOS.
    requests.push_back(std::move(r));
  }
  CpuOps ops;
  std::unique_ptr<LocalEngine> large = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(large, nullptr);
  const std::vector<GenerationResult> want = RunAll(large->engine(), requests);
  EXPECT_EQ(large->engine().stats().scheduler.preemptions, 0);

  EngineSetup tiny;
  tiny.block_size = 8;
  tiny.num_blocks = 40;  // 320 tokens: about three long requests.
  tiny.budget = 64;
  tiny.max_num_seqs = 32;
  std::unique_ptr<LocalEngine> small = DemoEngine(&ops, tiny);
  ASSERT_NE(small, nullptr);
  const std::vector<GenerationResult> got = RunAll(small->engine(), requests);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].output_ids, want[i].output_ids) << "request " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "request " << i;
  }
  const Engine::Stats stats = small->engine().stats();
  EXPECT_GT(stats.scheduler.preemptions, 0);
  EXPECT_LE(stats.scheduler.max_batch, 32);
  // Everything was given back.
  EXPECT_EQ(stats.blocks.num_used_blocks, 0);
  EXPECT_EQ(stats.blocks.num_free_blocks, 40);
}

// Acceptance (1) on the real checkpoint: prompts scheduled together give what
// each gives alone, for the paged and the static backends.
TEST(EngineBatching, TogetherEqualsAlone) {
  std::mt19937 rng(7);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 24; ++i) {
    requests.push_back(Greedy(RandomPrompt(rng, 1 + 9 * i), 40));
  }
  CpuOps ops;
  EngineSetup one;
  one.max_num_seqs = 1;
  std::unique_ptr<LocalEngine> alone = DemoEngine(&ops, one);
  ASSERT_NE(alone, nullptr);
  const std::vector<GenerationResult> want =
      RunOneByOne(alone->engine(), requests);
  for (AttentionBackend backend :
       {AttentionBackend::kPaged, AttentionBackend::kStatic}) {
    EngineSetup together;
    together.backend = backend;
    together.budget = 96;  // Chunked prefills share steps with decodes.
    std::unique_ptr<LocalEngine> batched = DemoEngine(&ops, together);
    ASSERT_NE(batched, nullptr);
    const std::vector<GenerationResult> got =
        RunAll(batched->engine(), requests);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].output_ids, want[i].output_ids)
          << "request " << i
          << (backend == AttentionBackend::kStatic ? " static" : " paged");
    }
    EXPECT_GT(batched->engine().stats().scheduler.max_batch, 8);
  }
}

// Acceptance (3): a prefix shared by many prompts is computed once; the
// outputs are those of an engine without the prefix cache.
TEST(EnginePrefixCache, SharedPrefixComputedOnceOutputsUnchanged) {
  std::mt19937 rng(11);
  const std::vector<int32_t> prefix = RandomPrompt(rng, 64);  // 4 blocks.
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt = prefix;
    for (int32_t t : RandomPrompt(rng, 5 + i)) {
      if (t != 1) prompt.push_back(t);
    }
    requests.push_back(Greedy(prompt, 24));
  }
  CpuOps ops;
  EngineSetup off;
  off.prefix_cache = false;
  std::unique_ptr<LocalEngine> uncached = DemoEngine(&ops, off);
  ASSERT_NE(uncached, nullptr);
  const std::vector<GenerationResult> want =
      RunAll(uncached->engine(), requests);
  EXPECT_EQ(uncached->engine().stats().blocks.hit_tokens, 0);

  std::unique_ptr<LocalEngine> cached = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(cached, nullptr);
  // The first request alone fills the cache; the others then arrive together.
  const std::vector<GenerationResult> first =
      RunAll(cached->engine(), {requests[0]});
  EXPECT_EQ(first[0].output_ids, want[0].output_ids);
  const std::vector<GenerationResult> rest = RunAll(
      cached->engine(),
      std::vector<GenerationRequest>(requests.begin() + 1, requests.end()));
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].output_ids, want[i + 1].output_ids) << "request " << i;
    EXPECT_EQ(rest[i].cached_prompt_tokens, 64) << "request " << i;
  }
  const Engine::Stats stats = cached->engine().stats();
  // 9 requests x 4 full blocks of the shared prefix.
  EXPECT_EQ(stats.blocks.hit_tokens, 9 * 64);
  int64_t queried = 0;
  for (const GenerationRequest& r : requests) queried += r.prompt_ids.size();
  EXPECT_EQ(stats.blocks.queried_tokens, queried);
  // Prompt work counts what steps computed (the hits are not), generation
  // every sampled token; without the cache, every prompt token.
  int64_t generated = 0;
  for (const GenerationResult& r : want) generated += r.output_ids.size();
  EXPECT_EQ(stats.prompt_tokens, queried - 9 * 64);
  EXPECT_EQ(stats.generation_tokens, generated);
  EXPECT_EQ(uncached->engine().stats().prompt_tokens, queried);
  EXPECT_EQ(uncached->engine().stats().generation_tokens, generated);
}

// Acceptance (4): the int8 cache (per slot and head scales, read inside the
// attention kernels) against the f32 cache on the demo checkpoint.
//  - Greedy tokens: "Once upon a time" continues identically for 64 tokens;
//    the other golden story prompts for at least their first 32 (measured:
//    64, 40, 63, 64 of 64).
//  - Teacher-forced along the f32 cache's 200-token story: the int8 cache's
//    next-token logits are within 2.5% (relative L2) of the f32 cache's on
//    average and 12% at worst (measured 1.5%, 9.3%), and their argmax agrees
//    at >= 97% of positions (measured 197 of 200; the 3 misses are near-ties
//    of this tiny model, top-2 gaps 0.004-0.12).
TEST(EngineInt8Kv, AgreesWithF32Cache) {
  auto tokenizer = LoadTokenizer(DemoModelDir(), 1);
  ASSERT_TRUE(tokenizer.ok());
  CpuOps ops;
  std::unique_ptr<LocalEngine> f32 = DemoEngine(&ops, EngineSetup{});
  EngineSetup q;
  q.kv_dtype = DType::kI8;
  std::unique_ptr<LocalEngine> i8 = DemoEngine(&ops, q);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(i8, nullptr);

  std::vector<GenerationRequest> stories;
  for (const char* prompt :
       {"Once upon a time", "Lily and Ben", "The cat", "One day"}) {
    auto ids = (*tokenizer)->Encode(prompt);
    ASSERT_TRUE(ids.ok());
    ids->insert(ids->begin(), 1);
    stories.push_back(Greedy(*ids, 64));
  }
  const std::vector<GenerationResult> want = RunAll(f32->engine(), stories);
  const std::vector<GenerationResult> got = RunAll(i8->engine(), stories);
  for (size_t i = 0; i < got.size(); ++i) {
    size_t same = 0;
    while (same < got[i].output_ids.size() &&
           got[i].output_ids[same] == want[i].output_ids[same]) {
      ++same;
    }
    std::cerr << "story " << i << ": the first " << same
              << " greedy tokens equal\n";
    EXPECT_GE(same, 32u) << "story " << i;
  }
  // The demo's own prompt ("Once upon a time") is identical throughout.
  EXPECT_EQ(got[0].output_ids, want[0].output_ids);

  GenerationRequest long_story = stories[0];
  long_story.max_tokens = 200;
  long_story.ignore_eos = true;
  auto reference = f32->engine().Generate(long_story);
  ASSERT_TRUE(reference.ok());
  std::vector<int32_t> text = long_story.prompt_ids;
  text.insert(text.end(), reference->output_ids.begin(),
              reference->output_ids.end());
  // Each prefix of the story as a prompt: the prefix cache makes each one a
  // short prefill over the cached (here: int8) KV of the earlier ones.
  std::vector<GenerationRequest> positions;
  for (size_t n = long_story.prompt_ids.size(); n < text.size(); ++n) {
    GenerationRequest r =
        Greedy(std::vector<int32_t>(text.begin(), text.begin() + n), 1);
    r.return_prefill_logits = true;
    positions.push_back(std::move(r));
  }
  const std::vector<GenerationResult> a = RunOneByOne(i8->engine(), positions);
  const std::vector<GenerationResult> b = RunOneByOne(f32->engine(), positions);
  int agree = 0;
  double worst = 0, total = 0;
  for (size_t p = 0; p < positions.size(); ++p) {
    agree += a[p].output_ids == b[p].output_ids;
    const std::vector<float>& x = a[p].prefill_logits;
    const std::vector<float>& y = b[p].prefill_logits;
    ASSERT_EQ(x.size(), y.size());
    double diff = 0, ref = 0;
    for (size_t v = 0; v < x.size(); ++v) {
      diff += (x[v] - y[v]) * (x[v] - y[v]);
      ref += y[v] * y[v];
    }
    worst = std::max(worst, std::sqrt(diff / ref));
    total += std::sqrt(diff / ref);
  }
  const double mean = total / positions.size();
  std::cerr << "int8 KV: argmax agrees at " << agree << " of "
            << positions.size() << " positions; relative L2 of the logits "
            << mean << " on average, " << worst << " at worst\n";
  EXPECT_LT(mean, 2.5e-2);
  EXPECT_LT(worst, 0.12);
  EXPECT_GE(agree, static_cast<int>(0.97 * positions.size()));
  EXPECT_GT(i8->engine().stats().blocks.hit_tokens, 0);
}

// A seeded request draws the same tokens alone and in a batch of others with
// different parameters (each sequence has its own sampler).
TEST(EngineSampling, SeededRequestIsReproducibleInsideABatch) {
  std::mt19937 rng(3);
  GenerationRequest probe;
  probe.prompt_ids = RandomPrompt(rng, 12);
  probe.max_tokens = 48;
  probe.ignore_eos = true;
  probe.sampling.temperature = 0.9f;
  probe.sampling.top_p = 0.95f;
  probe.sampling.top_k = 40;
  probe.sampling.min_p = 0.02f;
  probe.sampling.repetition_penalty = 1.1f;
  probe.sampling.presence_penalty = 0.3f;
  probe.sampling.frequency_penalty = 0.2f;
  probe.sampling.seed = 1234;
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(local, nullptr);
  auto alone = local->engine().Generate(probe);
  ASSERT_TRUE(alone.ok()) << alone.status();

  std::vector<GenerationRequest> batch;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest other;
    other.prompt_ids = RandomPrompt(rng, 3 + 7 * i);
    other.max_tokens = 10 + 5 * i;
    other.sampling.temperature = 0.3f * (i % 4);
    other.sampling.seed = 99 + i;
    batch.push_back(other);
    if (i == 5) batch.push_back(probe);
  }
  const std::vector<GenerationResult> results = RunAll(local->engine(), batch);
  EXPECT_EQ(results[6].output_ids, alone->output_ids);
  // And a different seed draws differently.
  probe.sampling.seed = 4321;
  auto other_seed = local->engine().Generate(probe);
  ASSERT_TRUE(other_seed.ok());
  EXPECT_NE(other_seed->output_ids, alone->output_ids);
}

// Stop strings end the sequence with finish_reason "stop"; the text is cut
// before the stop string, and streamed text never shows any part of it.
TEST(EngineStopStrings, TextIsCutAndNeverStreamed) {
  auto tokenizer = LoadTokenizer(DemoModelDir(), 1);
  ASSERT_TRUE(tokenizer.ok());
  CpuOps ops;
  EngineSetup s;
  s.tokenizer = tokenizer->get();
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  auto ids = (*tokenizer)->Encode("Once upon a time");
  ASSERT_TRUE(ids.ok());
  ids->insert(ids->begin(), 1);
  GenerationRequest plain = Greedy(*ids, 60);
  auto full = local->engine().Generate(plain);
  ASSERT_TRUE(full.ok());
  ASSERT_TRUE(full->text.has_value());
  // "...there was a little girl named Lily. She loved to ..."
  const std::string text = *full->text;
  const size_t at = text.find("Lily");
  ASSERT_NE(at, std::string::npos) << text;

  GenerationRequest stopped = plain;
  stopped.stop = {"never appears", "Lily", "ly. S"};
  std::string streamed;
  bool finished_seen = false;
  auto id = local->engine().Submit(stopped, [&](const TokenEvent& e) {
    streamed += e.text;
    EXPECT_EQ(streamed.find("Li"), std::string::npos) << streamed;
    finished_seen = finished_seen || e.finished;
  });
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(local->engine().RunUntilIdle().ok());
  auto result = local->engine().TakeResult(*id);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(finished_seen);
  EXPECT_EQ(result->finish_reason, FinishReason::kStop);
  EXPECT_EQ(*result->text, text.substr(0, at));
  EXPECT_EQ(streamed, *result->text);
  EXPECT_LT(result->output_ids.size(), full->output_ids.size());
  // The tokens are the unstopped run's, up to the one that completed "Lily".
  EXPECT_TRUE(std::equal(result->output_ids.begin(), result->output_ids.end(),
                         full->output_ids.begin()));

  // Without a stop string the streamed pieces add up to the whole text.
  std::string all;
  auto id2 = local->engine().Submit(
      plain, [&](const TokenEvent& e) { all += e.text; });
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE(local->engine().RunUntilIdle().ok());
  EXPECT_EQ(all, text);

  // Stop strings need a tokenizer.
  std::unique_ptr<LocalEngine> bare = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(bare, nullptr);
  auto refused = bare->engine().Submit(stopped);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

// Top-n logprobs: the model's log-softmax, best first; greedy picks the top.
TEST(EngineLogprobs, TopNAreTheModelsLogSoftmax) {
  std::mt19937 rng(9);
  GenerationRequest r = Greedy(RandomPrompt(rng, 20), 6);
  r.top_logprobs = 5;
  r.return_prefill_logits = true;
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(local, nullptr);
  auto result = local->engine().Generate(r);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->top_logprobs.size(), result->output_ids.size());
  ASSERT_EQ(result->logprobs.size(), result->output_ids.size());
  // Step 0 against the prefill logits.
  const std::vector<float>& logits = result->prefill_logits;
  double z = 0;
  const float max = *std::max_element(logits.begin(), logits.end());
  for (float l : logits) z += std::exp(l - max);
  const double log_z = max + std::log(z);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ASSERT_EQ(result->top_logprobs[0].size(), 5u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(result->top_logprobs[0][k].first, order[k]);
    EXPECT_NEAR(result->top_logprobs[0][k].second, logits[order[k]] - log_z,
                1e-4);
  }
  for (size_t t = 0; t < result->output_ids.size(); ++t) {
    const auto& top = result->top_logprobs[t];
    EXPECT_EQ(top[0].first, result->output_ids[t]);
    EXPECT_FLOAT_EQ(top[0].second, result->logprobs[t]);
    for (size_t k = 1; k < top.size(); ++k) {
      EXPECT_LE(top[k].second, top[k - 1].second);
    }
    EXPECT_LE(result->logprobs[t], 0.0f);
  }
}

// Cancelling a request, waiting or running, ends it with "abort" and gives
// its KV blocks back; the others are unaffected.
TEST(EngineCancel, FreesBlocksAndLeavesOthersAlone) {
  std::mt19937 rng(13);
  CpuOps ops;
  EngineSetup s;
  s.max_num_seqs = 2;  // The third request waits.
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  GenerationRequest keep = Greedy(RandomPrompt(rng, 30), 30);
  keep.ignore_eos = true;
  auto want = engine.Generate(keep);
  ASSERT_TRUE(want.ok());

  GenerationRequest victim = Greedy(RandomPrompt(rng, 40), 100);
  victim.ignore_eos = true;
  auto a = engine.Submit(keep);
  auto b = engine.Submit(victim);
  auto c = engine.Submit(victim);  // Waiting behind the other two.
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine.Step().ok());
  EXPECT_GT(engine.stats().blocks.num_used_blocks, 0);
  EXPECT_GT(engine.NumGenerated(*b), 0);
  ASSERT_TRUE(engine.Cancel(*b).ok());
  ASSERT_TRUE(engine.Cancel(*c).ok());
  EXPECT_EQ(engine.Cancel(*c).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  auto cancelled = engine.TakeResult(*b);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->finish_reason, FinishReason::kAbort);
  EXPECT_LT(cancelled->output_ids.size(), 100u);
  auto never_ran = engine.TakeResult(*c);
  ASSERT_TRUE(never_ran.ok());
  EXPECT_EQ(never_ran->finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(never_ran->output_ids.empty());
  auto kept = engine.TakeResult(*a);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->output_ids, want->output_ids);
  EXPECT_EQ(engine.stats().blocks.num_used_blocks, 0);
}

// The per-request times the server's metrics read (vLLM's phases): queue
// (submission to the first step that ran it) is part of prefill (submission
// to the first token). With one sequence at a time, the second request waits
// for the whole of the first; one cancelled before it ran queued until then.
TEST(EngineTimes, QueueIsSubmissionToFirstScheduledStep) {
  std::mt19937 rng(21);
  CpuOps ops;
  EngineSetup s;
  s.max_num_seqs = 1;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  EXPECT_EQ(engine.stats().last_step_tokens, 0);
  GenerationRequest r = Greedy(RandomPrompt(rng, 20), 40);
  r.ignore_eos = true;
  auto first = engine.Submit(r);
  auto second = engine.Submit(r);
  auto third = engine.Submit(r);
  ASSERT_TRUE(first.ok() && second.ok() && third.ok());
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(engine.stats().last_step_tokens, 20);  // The first's prompt.
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(engine.stats().last_step_tokens, 1);  // Its first decode.
  ASSERT_TRUE(engine.Cancel(*third).ok());
  ASSERT_TRUE(engine.RunUntilIdle().ok());
  auto a = engine.TakeResult(*first);
  auto b = engine.TakeResult(*second);
  auto c = engine.TakeResult(*third);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (const GenerationResult* x : {&*a, &*b}) {
    EXPECT_GE(x->queue_seconds, 0.0);
    EXPECT_LE(x->queue_seconds, x->prefill_seconds);
    EXPECT_GT(x->decode_seconds, 0.0);
  }
  // The second waited while the first ran to its end: from its own
  // submission, which came a few microseconds after the first's (the slack).
  EXPECT_GE(b->queue_seconds, a->prefill_seconds + a->decode_seconds - 1e-3);
  EXPECT_LT(a->queue_seconds, b->queue_seconds);
  // Never ran: all of its time was queue.
  EXPECT_TRUE(c->output_ids.empty());
  EXPECT_GT(c->queue_seconds, 0.0);
  EXPECT_DOUBLE_EQ(c->queue_seconds, c->prefill_seconds);
}

// Requests the pool could never hold, or that break the rules, are refused
// at submission with a clear error; nothing is left queued.
TEST(EngineErrors, RefusedAtSubmission) {
  CpuOps ops;
  EngineSetup s;
  s.block_size = 4;
  s.num_blocks = 8;  // 32 tokens.
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  std::mt19937 rng(1);
  auto too_big = engine.Submit(Greedy(RandomPrompt(rng, 30), 10));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("blocks"), std::string::npos)
      << too_big.status();
  auto empty = engine.Submit(Greedy({}, 10));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto too_long = engine.Submit(Greedy(std::vector<int32_t>(600, 5), 1));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  GenerationRequest bad_logprobs = Greedy(RandomPrompt(rng, 3), 2);
  bad_logprobs.top_logprobs = -1;
  EXPECT_EQ(engine.Submit(bad_logprobs).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Stop strings are bounded in total bytes (each token is checked against
  // every one of them), not in number.
  GenerationRequest many_stops = Greedy(RandomPrompt(rng, 3), 2);
  many_stops.stop.assign(kMaxStopStringBytes / 8, "12345678");
  EXPECT_TRUE(ValidateRequest(local->model().config(), many_stops).ok());
  many_stops.stop.push_back("x");
  const absl::Status too_many_stops = engine.Submit(many_stops).status();
  EXPECT_EQ(too_many_stops.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many_stops.message().find("stop strings"), std::string::npos)
      << too_many_stops;
  GenerationRequest many_ids = Greedy(RandomPrompt(rng, 3), 2);
  many_ids.stop_token_ids.assign(kMaxStopTokenIds, 7);
  EXPECT_TRUE(ValidateRequest(local->model().config(), many_ids).ok());
  many_ids.stop_token_ids.push_back(7);
  EXPECT_EQ(engine.Submit(many_ids).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(engine.HasWork());
  // A request that fits still runs.
  auto ok = engine.Generate(Greedy(RandomPrompt(rng, 10), 10));
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// A tokenizer over ids alone: id i reads "<i>", an id of `special` "[i]"
// (no text with skip_special_tokens), and decoding `bad` fails, as a broken
// tokenizer file or an id it cannot render would.
class FakeTokenizer final : public Tokenizer {
 public:
  std::string TokenBytes(int32_t) const override { return std::string(); }
  explicit FakeTokenizer(int32_t vocab, int32_t bad = -1,
                         std::vector<int32_t> special = {})
      : vocab_(vocab), bad_(bad), special_(std::move(special)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view) const override {
    return absl::UnimplementedError("FakeTokenizer does not encode");
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id < 0) return absl::InvalidArgumentError("negative id");
      if (id == bad_) {
        return absl::DataLossError(absl::StrCat("cannot decode token ", id));
      }
      if (id >= vocab_) continue;
      if (IsSpecial(id)) {
        if (!skip_special_tokens) absl::StrAppend(&text, "[", id, "]");
        continue;
      }
      absl::StrAppend(&text, "<", id, ">");
    }
    return text;
  }
  int32_t vocab_size() const override { return vocab_; }
  bool IsSpecial(int32_t id) const override {
    return std::find(special_.begin(), special_.end(), id) != special_.end();
  }
  int32_t TokenToId(absl::string_view) const override { return -1; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }

 protected:
  // vLLM's rendering: a kept special token stands apart ("<5> [9] <7>")
  // with spaces_between_special_tokens.
  absl::StatusOr<std::string> DecodeWithOptions(
      absl::Span<const int32_t> ids,
      const DecodeOptions& options) const override {
    std::string text;
    for (int32_t id : ids) {
      if (!IsSpecial(id) || options.skip_special_tokens) {
        absl::StatusOr<std::string> piece =
            Decode(absl::MakeConstSpan(&id, 1), options.skip_special_tokens);
        if (!piece.ok()) return piece.status();
        text += *piece;
      } else {
        absl::StrAppend(&text, options.spaces_between_special_tokens ? " " : "",
                        "[", id, "]",
                        options.spaces_between_special_tokens ? " " : "");
      }
    }
    return text;
  }

 private:
  int32_t vocab_, bad_;
  std::vector<int32_t> special_;
};

// What FakeTokenizer renders ids[begin, end) as.
std::string FakeText(const std::vector<int32_t>& ids, size_t begin,
                     size_t end) {
  std::string text;
  for (size_t i = begin; i < end && i < ids.size(); ++i) {
    absl::StrAppend(&text, "<", ids[i], ">");
  }
  return text;
}

// Runs `request` on `engine`, collecting the streamed text and events.
struct Streamed {
  absl::StatusOr<GenerationResult> result;
  std::string text;
  std::vector<TokenEvent> events;
};
Streamed RunStreamed(Engine& engine, const GenerationRequest& request) {
  Streamed s;
  auto id = engine.Submit(request, [&s](const TokenEvent& e) {
    s.text += e.text;
    s.events.push_back(e);
  });
  if (!id.ok()) {
    s.result = id.status();
    return s;
  }
  const absl::Status ran = engine.RunUntilIdle();
  EXPECT_TRUE(ran.ok()) << ran;
  s.result = engine.TakeResult(*id);
  return s;
}

// A request whose tokenizer fails during a step ends alone, with the error
// (result and last event); the requests batched with it finish as if they
// had run alone, and the engine keeps serving.
// A backend that ranks fewer alternatives than a request asks for (the CUDA
// sampler: 20) refuses it at submission, before a step that would fail every
// sequence in it.
TEST(EngineErrors, TopLogprobsBeyondTheBackendsSamplerAreRefused) {
  class Capped : public DelegatingExecutor {
   public:
    using DelegatingExecutor::DelegatingExecutor;
    int32_t max_top_logprobs() const override { return 3; }
  };
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, EngineSetup());
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(local->executor().max_top_logprobs(),
            std::numeric_limits<int32_t>::max());
  Capped capped(&local->executor());
  auto engine = Engine::Create(&capped, EngineOptions(), nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 rng(5);
  GenerationRequest request = Greedy(RandomPrompt(rng, 4), 2);
  request.top_logprobs = 4;
  const absl::Status refused = (*engine)->Submit(request).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("sampler ranks"), std::string::npos)
      << refused;
  request.top_logprobs = 3;
  auto result = (*engine)->Generate(request);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->top_logprobs.size(), 2u);
  EXPECT_EQ(result->top_logprobs[0].size(), 3u);
}

TEST(EngineFailures, OneRequestFailsAloneAndTheOthersContinue) {
  std::mt19937 rng(77);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = Greedy(RandomPrompt(rng, 10 + 7 * i), 24);
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  CpuOps ops;
  FakeTokenizer plain(512);
  EngineSetup s;
  s.tokenizer = &plain;
  std::unique_ptr<LocalEngine> reference = DemoEngine(&ops, s);
  ASSERT_NE(reference, nullptr);
  const std::vector<GenerationResult> want =
      RunOneByOne(reference->engine(), requests);
  // A token that request 0 generates and no other request shows its
  // detokenizer (the last prompt tokens and the output).
  int32_t bad = -1;
  size_t bad_at = 0;
  for (size_t k = 0; k < want[0].output_ids.size() && bad < 0; ++k) {
    const int32_t t = want[0].output_ids[k];
    bool elsewhere = std::count(requests[0].prompt_ids.end() - 5,
                                requests[0].prompt_ids.end(), t) > 0;
    for (size_t i = 1; i < requests.size(); ++i) {
      elsewhere = elsewhere ||
                  std::count(want[i].output_ids.begin(),
                             want[i].output_ids.end(), t) > 0 ||
                  std::count(requests[i].prompt_ids.begin(),
                             requests[i].prompt_ids.end(), t) > 0;
    }
    if (!elsewhere) {
      bad = t;
      bad_at = k;
    }
  }
  ASSERT_GE(bad, 0) << "no token of request 0 is its own";

  FakeTokenizer failing(512, bad);
  s.tokenizer = &failing;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  std::vector<int64_t> ids;
  std::vector<std::vector<TokenEvent>> events(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine.Submit(requests[i], [&events, i](const TokenEvent& e) {
      events[i].push_back(e);
    });
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  while (engine.HasWork()) ASSERT_TRUE(engine.Step().ok());
  auto failed = engine.TakeResult(ids[0]);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss)
      << failed.status();
  ASSERT_FALSE(events[0].empty());
  EXPECT_EQ(events[0].size(), bad_at + 1);
  EXPECT_TRUE(events[0].back().finished);
  EXPECT_EQ(events[0].back().error, failed.status());
  for (size_t k = 0; k + 1 < events[0].size(); ++k) {
    EXPECT_TRUE(events[0][k].error.ok());
    EXPECT_FALSE(events[0][k].finished);
  }
  for (size_t i = 1; i < requests.size(); ++i) {
    auto got = engine.TakeResult(ids[i]);
    ASSERT_TRUE(got.ok()) << "request " << i << ": " << got.status();
    EXPECT_EQ(got->output_ids, want[i].output_ids) << "request " << i;
    EXPECT_EQ(got->text, want[i].text) << "request " << i;
    EXPECT_TRUE(events[i].back().finished);
    EXPECT_TRUE(events[i].back().error.ok());
  }
  // Its blocks and sampler were given back; the engine still serves.
  EXPECT_EQ(engine.stats().blocks.num_used_blocks, 0);
  auto again = engine.Generate(requests[1]);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->output_ids, want[1].output_ids);
  // Generate reports the failure as its result.
  EXPECT_EQ(engine.Generate(requests[0]).status().code(),
            absl::StatusCode::kDataLoss);
}

// min_tokens masks EOS and the stop ids in the sampler until that many
// tokens are out; the reported logprob stays the unmodified logits' (vLLM's
// raw logprobs).
TEST(EngineMinTokens, EosAndStopIdsCannotEndTheSequenceEarly) {
  std::mt19937 rng(5);
  CpuOps ops;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  GenerationRequest base = Greedy(RandomPrompt(rng, 12), 16);
  base.ignore_eos = true;
  base.return_prefill_logits = true;
  auto free_run = engine.Generate(base);
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  const std::vector<int32_t>& ref = free_run->output_ids;

  // The first token as a stop id ends the sequence at once...
  GenerationRequest stop_first = base;
  stop_first.stop_token_ids = {ref[0]};
  auto stopped = engine.Generate(stop_first);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->output_ids, std::vector<int32_t>{ref[0]});
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);

  // ...but not with min_tokens: the first token is the best other than it
  // and EOS (id 2), and its logprob is under the unmodified logits.
  GenerationRequest held = stop_first;
  held.ignore_eos = false;
  held.min_tokens = 5;
  auto got = engine.Generate(held);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_GE(got->output_ids.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_NE(got->output_ids[k], ref[0]) << k;
    EXPECT_NE(got->output_ids[k], 2) << k;
  }
  const std::vector<float>& logits = got->prefill_logits;
  ASSERT_EQ(logits.size(), 512u);
  std::vector<float> masked = logits;
  masked[ref[0]] = masked[2] = -INFINITY;
  EXPECT_EQ(got->output_ids[0], ArgMax(masked));
  const float max = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(l - max);
  EXPECT_NEAR(got->logprobs[0], logits[got->output_ids[0]] - max - std::log(z),
              1e-5);
  if (got->finish_reason == FinishReason::kStop) {
    EXPECT_GT(got->output_ids.size(), 5u);
  }

  // Sampling too: no seed draws a masked id before min_tokens.
  for (uint64_t seed = 0; seed < 8; ++seed) {
    GenerationRequest sampled = held;
    sampled.sampling.temperature = 1.5f;
    sampled.sampling.seed = seed;
    sampled.stop_token_ids = {ref[0], ref[1], ref[2]};
    auto r = engine.Generate(sampled);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GE(r->output_ids.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      for (int32_t banned : {ref[0], ref[1], ref[2], 2}) {
        EXPECT_NE(r->output_ids[k], banned) << "seed " << seed << " k " << k;
      }
    }
  }

  // 0 <= min_tokens <= max_tokens.
  GenerationRequest bad = base;
  bad.min_tokens = bad.max_tokens + 1;
  EXPECT_EQ(engine.Submit(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.min_tokens = -1;
  EXPECT_EQ(engine.Submit(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.min_tokens = bad.max_tokens;
  EXPECT_TRUE(engine.Generate(bad).ok());
}

// Stop strings: stop_reason names the one that ended the sequence;
// include_stop_str_in_output keeps it at the end of the text (and then
// nothing needs holding back); before min_tokens none is looked for.
TEST(EngineStopStrings, StopReasonIncludeStopStrAndMinTokens) {
  std::mt19937 rng(21);
  CpuOps ops;
  FakeTokenizer tokenizer(512);
  EngineSetup s;
  s.tokenizer = &tokenizer;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  GenerationRequest base = Greedy(RandomPrompt(rng, 9), 20);
  base.ignore_eos = true;
  auto free_run = engine.Generate(base);
  ASSERT_TRUE(free_run.ok());
  const std::vector<int32_t>& ref = free_run->output_ids;
  ASSERT_EQ(ref.size(), 20u);
  EXPECT_EQ(*free_run->text, FakeText(ref, 0, 20));
  EXPECT_FALSE(free_run->stop_reason.has_value());  // Length.

  // The first place where ref[k] shows, for k = 6.
  const size_t k = std::find(ref.begin(), ref.end(), ref[6]) - ref.begin();
  const std::string stop = absl::StrCat("<", ref[k], ">");
  GenerationRequest r = base;
  r.stop = {"never", stop};
  Streamed cut = RunStreamed(engine, r);
  ASSERT_TRUE(cut.result.ok());
  EXPECT_EQ(cut.result->finish_reason, FinishReason::kStop);
  EXPECT_EQ(*cut.result->text, FakeText(ref, 0, k));
  EXPECT_EQ(cut.text, *cut.result->text);
  ASSERT_TRUE(cut.result->stop_reason.has_value());
  EXPECT_EQ(std::get<std::string>(*cut.result->stop_reason), stop);

  r.include_stop_str_in_output = true;
  Streamed kept = RunStreamed(engine, r);
  ASSERT_TRUE(kept.result.ok());
  EXPECT_EQ(*kept.result->text, FakeText(ref, 0, k + 1));
  EXPECT_EQ(kept.text, *kept.result->text);
  EXPECT_EQ(kept.result->output_ids, cut.result->output_ids);
  // Nothing was held back: each token's text came with it.
  ASSERT_EQ(kept.events.size(), k + 1);
  for (size_t i = 0; i <= k; ++i) {
    EXPECT_EQ(kept.events[i].text, FakeText(ref, i, i + 1)) << i;
  }

  // With min_tokens = k + 1 the stop string is only looked for in the text
  // of the tokens after the (k+1)-th: the next showing of ref[k], if any.
  r.include_stop_str_in_output = false;
  r.min_tokens = static_cast<int64_t>(k) + 1;
  Streamed late = RunStreamed(engine, r);
  ASSERT_TRUE(late.result.ok());
  const size_t next =
      std::find(ref.begin() + k + 1, ref.end(), ref[k]) - ref.begin();
  if (next < ref.size()) {
    EXPECT_EQ(late.result->finish_reason, FinishReason::kStop);
    EXPECT_EQ(*late.result->text, FakeText(ref, 0, next));
  } else {
    EXPECT_EQ(late.result->finish_reason, FinishReason::kLength);
    EXPECT_EQ(*late.result->text, FakeText(ref, 0, ref.size()));
  }
  EXPECT_EQ(late.text, *late.result->text);
}

// A stop token id: stop_reason is the id, and its text is dropped unless
// include_stop_str_in_output (vLLM).
TEST(EngineStopTokens, StopReasonIsTheIdAndItsTextIsDropped) {
  std::mt19937 rng(31);
  CpuOps ops;
  FakeTokenizer tokenizer(512);
  EngineSetup s;
  s.tokenizer = &tokenizer;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  Engine& engine = local->engine();
  GenerationRequest base = Greedy(RandomPrompt(rng, 9), 12);
  base.ignore_eos = true;
  auto free_run = engine.Generate(base);
  ASSERT_TRUE(free_run.ok());
  const std::vector<int32_t>& ref = free_run->output_ids;
  const size_t k = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();

  GenerationRequest r = base;
  r.stop_token_ids = {ref[k]};
  Streamed dropped = RunStreamed(engine, r);
  ASSERT_TRUE(dropped.result.ok());
  EXPECT_EQ(dropped.result->finish_reason, FinishReason::kStop);
  EXPECT_EQ(dropped.result->output_ids,
            std::vector<int32_t>(ref.begin(), ref.begin() + k + 1));
  EXPECT_EQ(*dropped.result->text, FakeText(ref, 0, k));
  EXPECT_EQ(dropped.text, *dropped.result->text);
  ASSERT_TRUE(dropped.result->stop_reason.has_value());
  EXPECT_EQ(std::get<int32_t>(*dropped.result->stop_reason), ref[k]);

  r.include_stop_str_in_output = true;
  Streamed kept = RunStreamed(engine, r);
  ASSERT_TRUE(kept.result.ok());
  EXPECT_EQ(*kept.result->text, FakeText(ref, 0, k + 1));
}

// skip_special_tokens and spaces_between_special_tokens reach the
// detokenizer: special tokens' text shows only when skip is false, set apart
// by spaces unless spaces_between_special_tokens is false.
TEST(EngineSpecialTokens, SkipSpecialTokensReachesTheText) {
  std::mt19937 rng(41);
  CpuOps ops;
  std::unique_ptr<LocalEngine> bare = DemoEngine(&ops, EngineSetup{});
  ASSERT_NE(bare, nullptr);
  GenerationRequest r = Greedy(RandomPrompt(rng, 9), 10);
  r.ignore_eos = true;
  auto free_run = bare->engine().Generate(r);
  ASSERT_TRUE(free_run.ok());
  const std::vector<int32_t>& ref = free_run->output_ids;
  FakeTokenizer tokenizer(512, -1, {ref[3]});
  EngineSetup s;
  s.tokenizer = &tokenizer;
  std::unique_ptr<LocalEngine> local = DemoEngine(&ops, s);
  ASSERT_NE(local, nullptr);
  auto skipped = local->engine().Generate(r);
  ASSERT_TRUE(skipped.ok());
  const std::string marker = absl::StrCat("[", ref[3], "]");
  EXPECT_EQ(skipped->text->find(marker), std::string::npos) << *skipped->text;
  r.skip_special_tokens = false;
  auto shown = local->engine().Generate(r);
  ASSERT_TRUE(shown.ok());
  EXPECT_NE(shown->text->find(" " + marker + " "), std::string::npos)
      << *shown->text;
  // spaces_between_special_tokens reaches it too.
  r.spaces_between_special_tokens = false;
  auto tight = local->engine().Generate(r);
  ASSERT_TRUE(tight.ok());
  EXPECT_NE(tight->text->find(marker), std::string::npos) << *tight->text;
  EXPECT_EQ(tight->text->find(" " + marker), std::string::npos) << *tight->text;
}

}  // namespace
}  // namespace tessera
