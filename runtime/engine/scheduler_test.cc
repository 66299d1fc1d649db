#include "runtime/engine/scheduler.h"

#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "runtime/kv/block_manager.h"

namespace tessera {

// For EXPECT_EQ on whole steps (found by argument-dependent lookup).
bool operator==(const ScheduledSequence& a, const ScheduledSequence& b) {
  return a.seq_id == b.seq_id && a.context_len == b.context_len &&
         a.num_tokens == b.num_tokens && a.sample == b.sample &&
         a.first_chunk == b.first_chunk;
}

void PrintTo(const ScheduledSequence& s, std::ostream* os) {
  *os << "{seq " << s.seq_id << ": [" << s.context_len << ", +" << s.num_tokens
      << ")" << (s.sample ? " sample" : "") << (s.first_chunk ? " first" : "")
      << "}";
}

namespace {

using Seqs = std::vector<ScheduledSequence>;

ScheduledSequence S(int64_t id, int64_t context_len, int64_t num_tokens,
                    bool sample, bool first_chunk = false) {
  ScheduledSequence s;
  s.seq_id = id;
  s.context_len = context_len;
  s.num_tokens = num_tokens;
  s.sample = sample;
  s.first_chunk = first_chunk;
  return s;
}

// Tokens start, start+1, ..., start+n-1.
std::vector<int32_t> Range(int start, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a,
                            const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Heap-allocated so that the scheduler's pointer stays valid.
std::unique_ptr<BlockManager> MakePool(int num_blocks, int block_size,
                                       bool prefix_caching = true) {
  BlockManager::Options options;
  options.num_blocks = num_blocks;
  options.block_size = block_size;
  options.enable_prefix_caching = prefix_caching;
  auto bm = BlockManager::Create(std::move(options));
  EXPECT_TRUE(bm.ok()) << bm.status();
  return std::make_unique<BlockManager>(std::move(bm).value());
}

Scheduler MakeScheduler(BlockManager* blocks, int max_num_seqs,
                        int64_t max_num_batched_tokens) {
  SchedulerConfig config;
  config.max_num_seqs = max_num_seqs;
  config.max_num_batched_tokens = max_num_batched_tokens;
  auto s = Scheduler::Create(config, blocks);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

SchedulerOutput Step(Scheduler& s) {
  auto out = s.Schedule();
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(s.block_manager().CheckConsistency().ok())
      << s.block_manager().CheckConsistency();
  if (!out.ok()) return {};
  int64_t sum = 0;
  for (const auto& seq : out->seqs) sum += seq.num_tokens;
  EXPECT_EQ(out->num_tokens, sum);
  return std::move(out).value();
}

std::vector<int32_t> Table(const Scheduler& s, int64_t id) {
  auto t = s.BlockTable(id);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  return std::vector<int32_t>(t->begin(), t->end());
}

std::vector<int32_t> TokensOf(const Scheduler& s, int64_t id) {
  auto t = s.Tokens(id);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  return std::vector<int32_t>(t->begin(), t->end());
}

TEST(SchedulerTest, CreateRejectsBadConfig) {
  auto bm = MakePool(8, 4);
  SchedulerConfig config;
  config.max_num_seqs = 0;
  EXPECT_EQ(Scheduler::Create(config, bm.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.max_num_seqs = 1;
  config.max_num_batched_tokens = 0;
  EXPECT_EQ(Scheduler::Create(config, bm.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.max_num_batched_tokens = 1;
  EXPECT_TRUE(Scheduler::Create(config, bm.get()).ok());
  EXPECT_EQ(Scheduler::Create(config, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, AddRejectsBadSequences) {
  auto bm = MakePool(10, 4);
  Scheduler s = MakeScheduler(bm.get(), 8, 100);
  EXPECT_EQ(s.Add(1, {}, 10).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(1, Range(0, 5), 4).code(),
            absl::StatusCode::kInvalidArgument);
  // 41 tokens need 11 blocks of 4; the pool has 10.
  const absl::Status too_long = s.Add(1, Range(0, 5), 41);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("11"), absl::string_view::npos) << too_long;
  EXPECT_NE(too_long.message().find("10"), absl::string_view::npos) << too_long;
  EXPECT_FALSE(s.Contains(1));
  EXPECT_EQ(s.num_waiting(), 0);
  ASSERT_TRUE(s.Add(1, Range(0, 5), 40).ok());  // Exactly the pool.
  EXPECT_EQ(s.Add(1, Range(0, 3), 10).code(),
            absl::StatusCode::kInvalidArgument);  // Duplicate, waiting.
  Step(s);
  ASSERT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.Add(1, Range(0, 3), 10).code(),
            absl::StatusCode::kInvalidArgument);  // Duplicate, running.
  EXPECT_EQ(TokensOf(s, 1), Range(0, 5));
}

TEST(SchedulerTest, AdmissionIsFifoAndStopsAtTheFirstMisfit) {
  auto bm = MakePool(10, 4, /*prefix_caching=*/false);
  Scheduler s = MakeScheduler(bm.get(), 8, 1000);
  ASSERT_TRUE(s.Add(1, Range(0, 16), 16).ok());    // 4 blocks.
  ASSERT_TRUE(s.Add(2, Range(100, 28), 28).ok());  // 7 blocks: no room.
  ASSERT_TRUE(s.Add(3, Range(200, 4), 4).ok());    // Would fit; must wait.
  SchedulerOutput out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 0, 16, true, true)}));
  EXPECT_EQ(out.num_tokens, 16);
  EXPECT_EQ(s.num_waiting(), 2);
  EXPECT_TRUE(Table(s, 3).empty());
  ASSERT_TRUE(s.Remove(1).ok());
  out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(2, 0, 28, true, true), S(3, 0, 4, true, true)}));
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_EQ(s.num_running(), 2);
}

TEST(SchedulerTest, ChunkedPrefillFollowsTheBudget) {
  auto bm = MakePool(64, 16);
  Scheduler s = MakeScheduler(bm.get(), 8, 32);
  ASSERT_TRUE(s.Add(1, Range(0, 100), 200).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 0, 32, false, true)}));
  // Not sampled: no token may be appended.
  EXPECT_EQ(s.AppendToken(1, 5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 32, 32, false)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 64, 32, false)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 96, 4, true)}));
  EXPECT_EQ(Table(s, 1).size(), 7u);  // ceil(100 / 16).
  // Sampled, but no token appended yet: nothing to run.
  SchedulerOutput idle = Step(s);
  EXPECT_TRUE(idle.seqs.empty());
  EXPECT_EQ(s.stats().steps, 4);
  ASSERT_TRUE(s.AppendToken(1, 7).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 100, 1, true)}));
  EXPECT_EQ(TokensOf(s, 1).back(), 7);
  EXPECT_EQ(s.stats().steps, 5);
}

// recompute_at_length L (Phi-3's LongRoPE): the step that would decode token
// L + 1 recomputes the whole sequence instead, once, through admission (so in
// this very step, chunked to the budget), with a fresh block table; later
// decodes are ordinary. Other sequences are not touched.
TEST(SchedulerTest, RecomputesASequenceOnceAtRecomputeAtLength) {
  auto bm = MakePool(32, 2, /*prefix_caching=*/false);
  SchedulerConfig config;
  config.max_num_seqs = 4;
  config.max_num_batched_tokens = 8;
  config.recompute_at_length = 4;
  auto created = Scheduler::Create(config, bm.get());
  ASSERT_TRUE(created.ok()) << created.status();
  Scheduler s = std::move(created).value();
  ASSERT_TRUE(s.Add(1, Range(0, 3), 20).ok());
  ASSERT_TRUE(s.Add(2, Range(50, 6), 20).ok());  // Already past L.
  EXPECT_EQ(Step(s).seqs,
            (Seqs{S(1, 0, 3, true, true), S(2, 0, 5, false, true)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 5, 1, true)}));
  ASSERT_TRUE(s.AppendToken(1, 3).ok());  // 4 tokens: an ordinary decode.
  ASSERT_TRUE(s.AppendToken(2, 56).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 3, 1, true), S(2, 6, 1, true)}));
  ASSERT_TRUE(s.AppendToken(1, 4).ok());  // 5 tokens: recompute all of them.
  ASSERT_TRUE(s.AppendToken(2, 57).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 7, 1, true), S(1, 0, 5, true, true)}));
  EXPECT_EQ(s.stats().recomputes, 1);
  EXPECT_EQ(s.stats().preemptions, 0);
  ASSERT_TRUE(s.AppendToken(1, 5).ok());
  ASSERT_TRUE(s.AppendToken(2, 58).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 8, 1, true), S(1, 5, 1, true)}));
  EXPECT_EQ(s.stats().recomputes, 1);
}

// A recompute longer than the budget is chunked, and its last one-token
// chunk does not recompute again.
TEST(SchedulerTest, ARecomputeIsChunkedAndHappensOnce) {
  auto bm = MakePool(32, 2, /*prefix_caching=*/false);
  SchedulerConfig config;
  config.max_num_seqs = 2;
  config.max_num_batched_tokens = 2;
  config.recompute_at_length = 4;
  auto created = Scheduler::Create(config, bm.get());
  ASSERT_TRUE(created.ok());
  Scheduler s = std::move(created).value();
  ASSERT_TRUE(s.Add(1, Range(0, 4), 20).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 0, 2, false, true)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 2, 2, true)}));
  ASSERT_TRUE(s.AppendToken(1, 4).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 0, 2, false, true)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 2, 2, false)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 4, 1, true)}));
  EXPECT_EQ(s.stats().recomputes, 1);
  // Prefix caching would hand the recompute its own blocks back: refused.
  auto caching = MakePool(32, 2, /*prefix_caching=*/true);
  EXPECT_EQ(Scheduler::Create(config, caching.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, DecodesRunBeforeNewPrefillsAndShareTheBudget) {
  auto bm = MakePool(64, 16);
  Scheduler s = MakeScheduler(bm.get(), 8, 32);
  ASSERT_TRUE(s.Add(1, Range(0, 10), 100).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 0, 10, true, true)}));
  ASSERT_TRUE(s.AppendToken(1, 42).ok());
  ASSERT_TRUE(s.Add(2, Range(1000, 100), 200).ok());
  SchedulerOutput out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 10, 1, true), S(2, 0, 31, false, true)}));
  EXPECT_EQ(out.num_tokens, 32);
  ASSERT_TRUE(s.AppendToken(1, 43).ok());
  out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 11, 1, true), S(2, 31, 31, false)}));
  EXPECT_EQ(s.stats().max_batch, 2);
}

TEST(SchedulerTest, MaxNumSeqsLimitsRunningSequences) {
  auto bm = MakePool(64, 4);
  Scheduler s = MakeScheduler(bm.get(), 2, 1000);
  for (int id = 1; id <= 3; ++id) {
    ASSERT_TRUE(s.Add(id, Range(10 * id, 4), 20).ok());
  }
  EXPECT_EQ(Step(s).seqs,
            (Seqs{S(1, 0, 4, true, true), S(2, 0, 4, true, true)}));
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 1);
  ASSERT_TRUE(s.AppendToken(1, 0).ok());
  ASSERT_TRUE(s.AppendToken(2, 0).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 4, 1, true), S(2, 4, 1, true)}));
  EXPECT_EQ(s.num_waiting(), 1);
  ASSERT_TRUE(s.Remove(1).ok());
  ASSERT_TRUE(s.AppendToken(2, 0).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 5, 1, true), S(3, 0, 4, true, true)}));
  EXPECT_EQ(s.stats().max_batch, 2);
}

TEST(SchedulerTest, SingleTokenChunksComeFirstInTheOutput) {
  auto bm = MakePool(64, 4);
  Scheduler s = MakeScheduler(bm.get(), 8, 10);
  ASSERT_TRUE(s.Add(1, Range(0, 9), 20).ok());
  ASSERT_TRUE(s.Add(2, Range(100, 5), 20).ok());
  // Sequence 2 was scheduled second but runs one token: it leads.
  EXPECT_EQ(Step(s).seqs,
            (Seqs{S(2, 0, 1, false, true), S(1, 0, 9, true, true)}));
  ASSERT_TRUE(s.AppendToken(1, 0).ok());
  ASSERT_TRUE(s.Add(3, Range(200, 30), 40).ok());
  // A decode, a prefill chunk, then a new prefill: decodes first, the rest
  // in scheduling order.
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 9, 1, true), S(2, 1, 4, true),
                                S(3, 0, 5, false, true)}));
  ASSERT_TRUE(s.AppendToken(1, 0).ok());
  ASSERT_TRUE(s.AppendToken(2, 0).ok());
  EXPECT_EQ(Step(s).seqs,
            (Seqs{S(1, 10, 1, true), S(2, 5, 1, true), S(3, 5, 8, false)}));
}

// Four sequences of two blocks fill a pool of eight; then each needs a third
// block. See the comments for the expected decisions.
void RunPreemptionScenario(bool prefix_caching) {
  auto bm = MakePool(8, 4, prefix_caching);
  Scheduler s = MakeScheduler(bm.get(), 8, 100);
  for (int id = 1; id <= 4; ++id) {
    ASSERT_TRUE(s.Add(id, Range(100 * id, 8), 16).ok());
  }
  ASSERT_TRUE(s.Add(5, Range(900, 4), 8).ok());  // No room: waits.
  EXPECT_EQ(Step(s).seqs,
            (Seqs{S(1, 0, 8, true, true), S(2, 0, 8, true, true),
                  S(3, 0, 8, true, true), S(4, 0, 8, true, true)}));
  EXPECT_EQ(bm->stats().num_free_blocks, 0);
  for (int id = 1; id <= 4; ++id) ASSERT_TRUE(s.AppendToken(id, -id).ok());

  // 1 needs a block: 4 (newest) is preempted, which frees two. 1 and 2 take
  // them. 3 needs one too: it is the newest left, so it preempts itself.
  SchedulerOutput out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 8, 1, true), S(2, 8, 1, true)}));
  EXPECT_EQ(out.preempted, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(s.stats().preemptions, 2);
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 3);
  EXPECT_TRUE(Table(s, 3).empty());
  EXPECT_TRUE(Table(s, 4).empty());
  EXPECT_EQ(bm->stats().num_free_blocks, 2);
  // Preemption keeps every token, the generated one included.
  EXPECT_EQ(TokensOf(s, 3), Concat(Range(300, 8), {-3}));
  EXPECT_EQ(s.AppendToken(3, 0).code(), absl::StatusCode::kFailedPrecondition);

  // 3 (now at the front) needs three blocks, two are free: nobody is
  // admitted, not even 5 (one block).
  ASSERT_TRUE(s.AppendToken(1, 0).ok());
  ASSERT_TRUE(s.AppendToken(2, 0).ok());
  out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 9, 1, true), S(2, 9, 1, true)}));
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(s.num_waiting(), 3);

  // Room for 3 again: it resumes by recomputing all nine tokens, minus
  // whatever of its own blocks is still cached (both: nothing reused them).
  ASSERT_TRUE(s.Remove(1).ok());
  ASSERT_TRUE(s.AppendToken(2, 0).ok());
  const int64_t cached = prefix_caching ? 8 : 0;
  EXPECT_EQ(bm->NumCachedTokens(TokensOf(s, 3)), cached);
  out = Step(s);
  EXPECT_EQ(out.seqs,
            (Seqs{S(2, 10, 1, true), S(3, cached, 9 - cached, true, true)}));
  EXPECT_EQ(s.num_waiting(), 2);  // 4 (needs three blocks, two left), 5.
  EXPECT_EQ(Table(s, 3).size(), 3u);

  // Once 2 and 3 finish, 4 resumes before 5.
  ASSERT_TRUE(s.Remove(2).ok());
  ASSERT_TRUE(s.Remove(3).ok());
  out = Step(s);
  ASSERT_EQ(out.seqs.size(), 2u);
  EXPECT_EQ(out.seqs[0].seq_id, 4);
  EXPECT_EQ(out.seqs[0].context_len + out.seqs[0].num_tokens, 9);
  EXPECT_TRUE(out.seqs[0].first_chunk);
  EXPECT_EQ(out.seqs[1], S(5, 0, 4, true, true));
  EXPECT_EQ(s.stats().preemptions, 2);
}

TEST(SchedulerTest, PreemptsTheNewestAndResumesItFirst) {
  RunPreemptionScenario(/*prefix_caching=*/false);
}

TEST(SchedulerTest, PreemptsTheNewestAndResumesFromTheCache) {
  RunPreemptionScenario(/*prefix_caching=*/true);
}

TEST(SchedulerTest, NewestNeedingBlocksPreemptsItselfOnly) {
  auto bm = MakePool(4, 4, /*prefix_caching=*/false);
  Scheduler s = MakeScheduler(bm.get(), 8, 100);
  ASSERT_TRUE(s.Add(1, Range(0, 8), 16).ok());
  ASSERT_TRUE(s.Add(2, Range(100, 8), 16).ok());
  Step(s);
  const auto table1 = Table(s, 1);
  ASSERT_TRUE(s.AppendToken(2, 0).ok());  // 1 waits for its token.
  SchedulerOutput out = Step(s);
  EXPECT_TRUE(out.seqs.empty());
  EXPECT_EQ(out.num_tokens, 0);
  EXPECT_EQ(out.preempted, (std::vector<int64_t>{2}));
  EXPECT_EQ(Table(s, 1), table1);  // The older one is untouched.
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.stats().steps, 1);  // An empty result is not a step.
  EXPECT_EQ(s.stats().preemptions, 1);
}

TEST(SchedulerTest, NoAdmissionInAStepThatPreempted) {
  auto bm = MakePool(3, 4, /*prefix_caching=*/false);
  Scheduler s = MakeScheduler(bm.get(), 4, 2);
  ASSERT_TRUE(s.Add(1, Range(0, 4), 8).ok());
  ASSERT_TRUE(s.Add(2, Range(100, 5), 8).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 0, 2, false, true)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 2, 2, true)}));
  // 1 waits for its token, so 2 gets the budget.
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 0, 2, false, true)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 2, 2, false)}));
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 4, 1, true)}));
  EXPECT_EQ(bm->stats().num_free_blocks, 0);
  ASSERT_TRUE(s.AppendToken(1, 0).ok());
  ASSERT_TRUE(s.AppendToken(2, 0).ok());
  // 1 needs a block: 2 is preempted. One block stays free and one token of
  // budget is left, enough for 2's first chunk, but the step preempted.
  SchedulerOutput out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 4, 1, true)}));
  EXPECT_EQ(out.preempted, (std::vector<int64_t>{2}));
  EXPECT_EQ(bm->stats().num_free_blocks, 1);
  EXPECT_EQ(s.num_waiting(), 1);
  // The next step admits it.
  ASSERT_TRUE(s.AppendToken(1, 0).ok());
  out = Step(s);
  EXPECT_EQ(out.seqs, (Seqs{S(1, 5, 1, true), S(2, 0, 1, false, true)}));
  EXPECT_TRUE(out.preempted.empty());
}

TEST(SchedulerTest, SharedPrefixHitsTheCache) {
  auto bm = MakePool(16, 16);
  Scheduler s = MakeScheduler(bm.get(), 8, 1000);
  const auto prefix = Range(0, 32);
  ASSERT_TRUE(s.Add(1, Concat(prefix, Range(100, 8)), 64).ok());
  ASSERT_TRUE(s.Add(2, Concat(prefix, Range(200, 8)), 64).ok());
  // 1's full blocks are registered as soon as it is allocated, so 2 hits
  // them in the same step.
  EXPECT_EQ(Step(s).seqs,
            (Seqs{S(1, 0, 40, true, true), S(2, 32, 8, true, true)}));
  EXPECT_EQ(bm->stats().hit_tokens, 32);
  EXPECT_EQ(bm->stats().queried_tokens, 80);
  const auto t1 = Table(s, 1);
  const auto t2 = Table(s, 2);
  ASSERT_EQ(t1.size(), 3u);
  ASSERT_EQ(t2.size(), 3u);
  EXPECT_EQ(t1[0], t2[0]);
  EXPECT_EQ(t1[1], t2[1]);
  EXPECT_NE(t1[2], t2[2]);
  EXPECT_EQ(bm->RefCount(t1[0]), 2);
  // Released blocks stay cached until reused.
  ASSERT_TRUE(s.Remove(1).ok());
  ASSERT_TRUE(s.Remove(2).ok());
  ASSERT_TRUE(s.Add(3, Concat(prefix, {7}), 64).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(3, 32, 1, true, true)}));
  EXPECT_EQ(bm->stats().hit_tokens, 64);
}

TEST(SchedulerTest, PrefillsAllocateByChunk) {
  auto bm = MakePool(16, 16);
  Scheduler s = MakeScheduler(bm.get(), 8, 20);
  const auto prefix = Range(0, 32);
  ASSERT_TRUE(s.Add(1, Concat(prefix, Range(100, 8)), 64).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(1, 0, 20, false, true)}));
  // Slots for the first chunk only: one full block (cached), one partial.
  EXPECT_EQ(*bm->NumTokens(1), 20);
  EXPECT_EQ(Table(s, 1).size(), 2u);
  EXPECT_EQ(bm->stats().num_cached_blocks, 1);
  ASSERT_TRUE(s.Remove(1).ok());
  // The cached block, then a chunk that fills the budget.
  ASSERT_TRUE(s.Add(2, Concat(prefix, Range(200, 8)), 64).ok());
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 16, 20, false, true)}));
  EXPECT_EQ(*bm->NumTokens(2), 36);
  EXPECT_EQ(bm->stats().hit_tokens, 16);
  EXPECT_EQ(Step(s).seqs, (Seqs{S(2, 36, 4, true)}));
  EXPECT_EQ(*bm->NumTokens(2), 40);
}

TEST(SchedulerTest, RemoveFreesBlocksWhereverTheSequenceIs) {
  auto bm = MakePool(16, 4);
  Scheduler s = MakeScheduler(bm.get(), 1, 100);
  ASSERT_TRUE(s.Add(1, Range(0, 10), 20).ok());
  ASSERT_TRUE(s.Add(2, Range(50, 6), 20).ok());
  Step(s);
  EXPECT_EQ(bm->stats().num_used_blocks, 3);
  EXPECT_EQ(s.num_waiting(), 1);
  ASSERT_TRUE(s.Remove(2).ok());  // Waiting: no blocks to free.
  EXPECT_FALSE(s.Contains(2));
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_EQ(bm->stats().num_used_blocks, 3);
  ASSERT_TRUE(s.Remove(1).ok());  // Running.
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_FALSE(s.HasWork());
  EXPECT_EQ(bm->stats().num_used_blocks, 0);
  EXPECT_EQ(bm->stats().num_free_blocks, 16);
  EXPECT_FALSE(bm->HasSequence(1));
  EXPECT_TRUE(bm->CheckConsistency().ok());
  EXPECT_EQ(s.Remove(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.Tokens(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.BlockTable(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Step(s).seqs.empty());
}

TEST(SchedulerTest, AppendTokenOnlyAfterSampling) {
  auto bm = MakePool(16, 4);
  Scheduler s = MakeScheduler(bm.get(), 1, 100);
  EXPECT_EQ(s.AppendToken(9, 0).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(s.Add(1, Range(0, 4), 6).ok());
  ASSERT_TRUE(s.Add(2, Range(0, 4), 6).ok());
  EXPECT_EQ(s.AppendToken(1, 0).code(), absl::StatusCode::kFailedPrecondition);
  Step(s);
  EXPECT_EQ(s.AppendToken(2, 0).code(),
            absl::StatusCode::kFailedPrecondition);  // Waiting.
  ASSERT_TRUE(s.AppendToken(1, 4).ok());
  EXPECT_EQ(s.AppendToken(1, 5).code(),
            absl::StatusCode::kFailedPrecondition);  // Not run yet.
  Step(s);
  ASSERT_TRUE(s.AppendToken(1, 5).ok());  // 6 tokens: its maximum.
  Step(s);
  EXPECT_EQ(s.AppendToken(1, 6).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(TokensOf(s, 1), Range(0, 6));
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// 200 sequences with random prompts (many sharing a prefix) and random output
// lengths, driven to completion through a tiny pool. The engine is simulated
// down to the KV cache: each slot holds a fingerprint of the token prefix
// whose KV it stores, written for every scheduled token and checked for every
// token a scheduled chunk attends to, so a wrong block table, a stale cache
// hit or a gap in the computed ranges all show up.
void RunSimulation(bool prefix_caching, uint32_t seed) {
  constexpr int kNumSeqs = 200;
  constexpr int kBlockSize = 4;
  constexpr int kNumBlocks = 40;
  constexpr int kMaxNumSeqs = 12;
  constexpr int64_t kBudget = 64;
  auto bm = MakePool(kNumBlocks, kBlockSize, prefix_caching);
  Scheduler s = MakeScheduler(bm.get(), kMaxNumSeqs, kBudget);
  std::mt19937 rng(seed);
  auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 3; ++p) prefixes.push_back(Range(1000 * p, 8 + 6 * p));

  struct Sim {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> fingerprints;  // Of tokens[0, p] for each p.
    int64_t computed = 0;
    int output_len = 0;
    int generated = 0;
  };
  std::map<int64_t, Sim> live;
  auto push_token = [](Sim& sim, int32_t token) {
    const uint64_t parent =
        sim.fingerprints.empty() ? 0 : sim.fingerprints.back();
    sim.tokens.push_back(token);
    sim.fingerprints.push_back(Mix(parent ^ Mix(static_cast<uint32_t>(token))));
  };
  std::vector<uint64_t> kv(kNumBlocks * kBlockSize, 0);

  int added = 0, finished = 0, empty_in_a_row = 0;
  for (int step = 0;; ++step) {
    ASSERT_LT(step, 100000) << "no progress";
    for (int k = uniform(0, 2); k > 0 && added < kNumSeqs; --k) {
      Sim sim;
      if (uniform(0, 2) > 0) {
        for (int32_t t : prefixes[uniform(0, 2)]) push_token(sim, t);
      }
      for (int n = uniform(1, 80); n > 0; --n) push_token(sim, uniform(0, 3));
      sim.output_len = uniform(1, 40);
      const int64_t max_total =
          static_cast<int64_t>(sim.tokens.size()) + sim.output_len;
      ASSERT_TRUE(s.Add(added, sim.tokens, max_total).ok());
      live.emplace(added++, std::move(sim));
    }
    if (!s.HasWork()) {
      if (added == kNumSeqs) break;
      continue;
    }

    SchedulerOutput out = Step(s);
    ASSERT_TRUE(bm->CheckConsistency().ok())
        << "step " << step << ": " << bm->CheckConsistency();
    ASSERT_LE(out.num_tokens, kBudget);
    ASSERT_LE(static_cast<int>(out.seqs.size()), kMaxNumSeqs);
    ASSERT_LE(s.num_running(), kMaxNumSeqs);
    if (out.seqs.empty()) {
      // Only a step that preempted the one sequence that could run.
      ASSERT_FALSE(out.preempted.empty()) << "step " << step;
      ASSERT_LT(++empty_in_a_row, 2) << "step " << step;
    } else {
      empty_in_a_row = 0;
    }
    std::set<int64_t> ids;
    bool seen_longer = false;
    for (const ScheduledSequence& ss : out.seqs) {
      ASSERT_TRUE(ids.insert(ss.seq_id).second) << "step " << step;
      ASSERT_GE(ss.num_tokens, 1);
      if (ss.num_tokens > 1) seen_longer = true;
      ASSERT_FALSE(seen_longer && ss.num_tokens == 1)
          << "step " << step << ": a decode after a longer chunk";
    }
    for (int64_t id : out.preempted) {
      ASSERT_EQ(ids.count(id), 0u) << "step " << step;
      ASSERT_TRUE(Table(s, id).empty());
      ASSERT_FALSE(bm->HasSequence(id));
      live.at(id).computed = 0;
    }
    // Every chunk continues where the sequence's computed tokens end (or,
    // right after admission, where its cached prefix ends).
    for (const ScheduledSequence& ss : out.seqs) {
      const Sim& sim = live.at(ss.seq_id);
      const int64_t size = static_cast<int64_t>(sim.tokens.size());
      if (ss.first_chunk) {
        ASSERT_EQ(sim.computed, 0);
        ASSERT_EQ(ss.context_len % kBlockSize, 0);
        if (!prefix_caching) ASSERT_EQ(ss.context_len, 0);
      } else {
        ASSERT_EQ(ss.context_len, sim.computed)
            << "step " << step << ", sequence " << ss.seq_id;
      }
      ASSERT_LE(ss.context_len + ss.num_tokens, size);
      ASSERT_EQ(ss.sample, ss.context_len + ss.num_tokens == size);
      ASSERT_EQ(TokensOf(s, ss.seq_id), sim.tokens);
      ASSERT_EQ(static_cast<int64_t>(Table(s, ss.seq_id).size()),
                (ss.context_len + ss.num_tokens + kBlockSize - 1) / kBlockSize);
    }
    // Every layer writes the step's KV before any attention reads it.
    auto slot = [&](int64_t id, int64_t p) {
      return Table(s, id)[p / kBlockSize] * kBlockSize + p % kBlockSize;
    };
    for (const ScheduledSequence& ss : out.seqs) {
      const Sim& sim = live.at(ss.seq_id);
      for (int64_t p = ss.context_len; p < ss.context_len + ss.num_tokens;
           ++p) {
        kv[slot(ss.seq_id, p)] = sim.fingerprints[p];
      }
    }
    for (const ScheduledSequence& ss : out.seqs) {
      Sim& sim = live.at(ss.seq_id);
      for (int64_t p = 0; p < ss.context_len + ss.num_tokens; ++p) {
        ASSERT_EQ(kv[slot(ss.seq_id, p)], sim.fingerprints[p])
            << "step " << step << ", sequence " << ss.seq_id
            << ": wrong KV at position " << p;
      }
      sim.computed = ss.context_len + ss.num_tokens;
    }
    // Sample.
    for (const ScheduledSequence& ss : out.seqs) {
      Sim& sim = live.at(ss.seq_id);
      if (!ss.sample) {
        ASSERT_EQ(s.AppendToken(ss.seq_id, 0).code(),
                  absl::StatusCode::kFailedPrecondition);
        continue;
      }
      if (++sim.generated == sim.output_len) {
        ASSERT_TRUE(s.Remove(ss.seq_id).ok());
        live.erase(ss.seq_id);
        ++finished;
        continue;
      }
      const int32_t token = uniform(0, 3);
      ASSERT_TRUE(s.AppendToken(ss.seq_id, token).ok());
      push_token(sim, token);
    }
  }
  EXPECT_EQ(finished, kNumSeqs);
  EXPECT_TRUE(live.empty());
  EXPECT_GT(s.stats().preemptions, 0);
  EXPECT_GT(s.stats().max_batch, 1);
  EXPECT_LE(s.stats().max_batch, kMaxNumSeqs);
  EXPECT_EQ(bm->stats().num_free_blocks, kNumBlocks);
  if (prefix_caching) EXPECT_GT(bm->stats().hit_tokens, 0);
  EXPECT_TRUE(bm->CheckConsistency().ok());
}

TEST(SchedulerTest, RandomizedSimulationRunsEverySequenceToCompletion) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    RunSimulation(/*prefix_caching=*/true, seed);
  }
}

TEST(SchedulerTest, RandomizedSimulationWithoutPrefixCaching) {
  RunSimulation(/*prefix_caching=*/false, 7);
}

}  // namespace
}  // namespace tessera
