#include "runtime/engine/plan.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/tessera.pb.h"

namespace tessera {
namespace {

// One scheduled sequence as the engine would describe it.
struct FakeSequence {
  std::vector<TokenId> tokens;
  std::vector<BlockId> block_table;
  GenerationRequest request;
  bool start = false;
  bool prefill = false;
};

class Sequences {
 public:
  FakeSequence& operator[](SeqId id) { return seqs_[id]; }
  std::vector<SeqId>& looked_up() { return looked_up_; }

  absl::StatusOr<PlanSequence> Lookup(const ScheduledSequence& s) {
    looked_up_.push_back(s.seq_id);
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) return absl::NotFoundError("no such sequence");
    PlanSequence seq;
    seq.tokens = it->second.tokens;
    seq.block_table = it->second.block_table;
    seq.request = &it->second.request;
    seq.start = it->second.start;
    seq.prefill = it->second.prefill;
    return seq;
  }

 private:
  absl::flat_hash_map<SeqId, FakeSequence> seqs_;
  std::vector<SeqId> looked_up_;
};

ScheduledSequence Entry(SeqId id, int64_t context_len, int64_t num_tokens,
                        bool sample, bool first_chunk = false) {
  ScheduledSequence s;
  s.seq_id = id;
  s.context_len = context_len;
  s.num_tokens = num_tokens;
  s.sample = sample;
  s.first_chunk = first_chunk;
  return s;
}

proto::StepPlan Parse(const std::string& text) {
  proto::StepPlan plan;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &plan))
      << text;
  return plan;
}

// Whole-message equality: a field dropped, added or changed fails it.
void ExpectPlan(const proto::StepPlan& expected, const proto::StepPlan& got) {
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(expected, got)) << diff << "\ngot:\n"
                                                  << got.DebugString();
}

const std::vector<int64_t> kEos = {2, 1, -1, int64_t{1} << 40};

// A decode row (sampled, started long ago), a partial prefill chunk (not
// sampled, starting now, with penalties and min_tokens) and a whole prompt
// (sampled, starting now, sending its logits back).
void MakeStep(Sequences& seqs, SchedulerOutput& out) {
  FakeSequence& decode = seqs[7];
  decode.tokens = {10, 11, 12, 13, 14, 15};
  decode.block_table = {3, 4};
  decode.request.prompt_ids = {10, 11, 12, 13, 14};
  decode.request.top_logprobs = 2;
  decode.request.return_prefill_logits = true;  // Past the prompt: no logits.
  decode.request.sampling.repetition_penalty = 1.5f;  // Started: no prompt.
  decode.request.min_tokens = 4;  // Started: no mask ids again.

  FakeSequence& chunk = seqs[9];
  chunk.tokens = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  chunk.block_table = {8, 9};
  chunk.request.prompt_ids = chunk.tokens;
  chunk.request.sampling.temperature = 0.75f;
  chunk.request.sampling.top_k = 5;
  chunk.request.sampling.top_p = 0.875f;
  chunk.request.sampling.seed = 42;
  chunk.request.sampling.min_p = 0.0625f;
  chunk.request.sampling.repetition_penalty = 1.25f;
  chunk.request.sampling.presence_penalty = 0.5f;
  chunk.request.sampling.frequency_penalty = -0.25f;
  chunk.request.min_tokens = 3;
  chunk.request.stop_token_ids = {50, 2, 50};
  chunk.request.return_prefill_logits = true;  // Not sampled: no logits.
  chunk.start = true;
  chunk.prefill = true;

  FakeSequence& whole = seqs[11];
  whole.tokens = {30, 31};
  whole.block_table = {5};
  whole.request.prompt_ids = whole.tokens;
  whole.request.ignore_eos = true;
  whole.request.return_prefill_logits = true;
  whole.start = true;
  whole.prefill = true;

  out.seqs = {Entry(7, 5, 1, /*sample=*/true),
              Entry(9, 4, 3, /*sample=*/false, /*first_chunk=*/true),
              Entry(11, 0, 2, /*sample=*/true, /*first_chunk=*/true)};
  out.num_tokens = 6;
}

constexpr char kExpected[] = R"pb(
  kind: FORWARD
  released: [ 4, 5 ]
  seqs {
    sequence_id: 7
    context_len: 5
    tokens: [ 15 ]
    block_table: [ 3, 4 ]
    sample: true
    top_logprobs: 2
  }
  seqs {
    sequence_id: 9
    context_len: 4
    tokens: [ 24, 25, 26 ]
    block_table: [ 8, 9 ]
    start: true
    sampling {
      temperature: 0.75
      top_k: 5
      top_p: 0.875
      has_seed: true
      seed: 42
      min_p: 0.0625
      repetition_penalty: 1.25
      presence_penalty: 0.5
      frequency_penalty: -0.25
      min_tokens: 3
      min_tokens_stop_ids: [ 1, 2, 50 ]
    }
    prompt: [ 20, 21, 22, 23, 24, 25, 26, 27, 28, 29 ]
  }
  seqs {
    sequence_id: 11
    context_len: 0
    tokens: [ 30, 31 ]
    block_table: [ 5 ]
    sample: true
    start: true
    sampling { temperature: 1 top_p: 1 repetition_penalty: 1 }
    return_logits: true
  }
)pb";

TEST(BuildStepPlan, PrefillChunkAndDecodeRows) {
  Sequences seqs;
  SchedulerOutput out;
  MakeStep(seqs, out);
  proto::StepPlan plan;
  const std::vector<SeqId> released = {4, 5};
  ASSERT_TRUE(BuildStepPlan(
                  out, released, kEos,
                  [&](const ScheduledSequence& s) { return seqs.Lookup(s); },
                  &plan)
                  .ok());
  ExpectPlan(Parse(kExpected), plan);
  // Once per entry, in the scheduler's order.
  EXPECT_EQ(seqs.looked_up(), (std::vector<SeqId>{7, 9, 11}));
}

TEST(BuildStepPlan, MinTokensStopIdsAreStopTokenIds) {
  Sequences seqs;
  SchedulerOutput out;
  MakeStep(seqs, out);
  proto::StepPlan plan;
  ASSERT_TRUE(BuildStepPlan(
                  out, {}, kEos,
                  [&](const ScheduledSequence& s) { return seqs.Lookup(s); },
                  &plan)
                  .ok());
  const auto& ids = plan.seqs(1).sampling().min_tokens_stop_ids();
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.end()),
            StopTokenIds(seqs[9].request, kEos));
  // ignore_eos leaves only the request's own ids.
  seqs[9].request.ignore_eos = true;
  ASSERT_TRUE(BuildStepPlan(
                  out, {}, kEos,
                  [&](const ScheduledSequence& s) { return seqs.Lookup(s); },
                  &plan)
                  .ok());
  const auto& own_ids = plan.seqs(1).sampling().min_tokens_stop_ids();
  EXPECT_EQ(std::vector<TokenId>(own_ids.begin(), own_ids.end()),
            (std::vector<TokenId>{2, 50}));
}

// A plan object reused for the next step holds that step alone (nothing of
// the last one), in the storage the last one left.
TEST(BuildStepPlan, ReusedPlanKeepsItsStorage) {
  Sequences seqs;
  SchedulerOutput out;
  MakeStep(seqs, out);
  proto::StepPlan plan;
  ASSERT_TRUE(BuildStepPlan(
                  out, std::vector<SeqId>{4, 5}, kEos,
                  [&](const ScheduledSequence& s) { return seqs.Lookup(s); },
                  &plan)
                  .ok());
  const proto::SequenceStep* first_row = &plan.seqs(0);
  const proto::SequenceStep* second_row = &plan.seqs(1);
  const int32_t* second_tokens = plan.seqs(1).tokens().data();

  // The next step: both started sequences decode.
  seqs[9].tokens.push_back(60);
  seqs[9].start = false;
  seqs[9].prefill = false;
  seqs[11].tokens.push_back(61);
  seqs[11].start = false;
  seqs[11].prefill = false;
  out.seqs = {Entry(9, 10, 1, true), Entry(11, 2, 1, true)};
  out.num_tokens = 2;
  ASSERT_TRUE(BuildStepPlan(
                  out, {}, kEos,
                  [&](const ScheduledSequence& s) { return seqs.Lookup(s); },
                  &plan)
                  .ok());
  ExpectPlan(Parse(R"pb(
               kind: FORWARD
               seqs {
                 sequence_id: 9
                 context_len: 10
                 tokens: [ 60 ]
                 block_table: [ 8, 9 ]
                 sample: true
               }
               seqs {
                 sequence_id: 11
                 context_len: 2
                 tokens: [ 61 ]
                 block_table: [ 5 ]
                 sample: true
               }
             )pb"),
             plan);
  EXPECT_EQ(&plan.seqs(0), first_row);
  EXPECT_EQ(&plan.seqs(1), second_row);
  EXPECT_EQ(plan.seqs(1).tokens().data(), second_tokens);
}

TEST(BuildStepPlan, EmptyStepOnlyReleases) {
  proto::StepPlan plan;
  plan.add_seqs()->set_sequence_id(3);  // Left from an earlier step.
  ASSERT_TRUE(BuildStepPlan(
                  SchedulerOutput{}, std::vector<SeqId>{8}, kEos,
                  [](const ScheduledSequence&) -> absl::StatusOr<PlanSequence> {
                    return absl::InternalError("not called");
                  },
                  &plan)
                  .ok());
  ExpectPlan(Parse("kind: FORWARD released: 8"), plan);
}

TEST(BuildStepPlan, RejectsEntriesTheSequenceDoesNotMatch) {
  Sequences seqs;
  SchedulerOutput out;
  MakeStep(seqs, out);
  auto build = [&](const SchedulerOutput& o) {
    proto::StepPlan plan;
    return BuildStepPlan(
        o, {}, kEos, [&](const ScheduledSequence& s) { return seqs.Lookup(s); },
        &plan);
  };
  SchedulerOutput past_end = out;
  past_end.seqs[1].num_tokens = 7;  // 4 + 7 > 10 tokens.
  EXPECT_EQ(build(past_end).code(), absl::StatusCode::kInternal);
  SchedulerOutput empty_range = out;
  empty_range.seqs[0].num_tokens = 0;
  EXPECT_EQ(build(empty_range).code(), absl::StatusCode::kInternal);
  SchedulerOutput negative_context = out;
  negative_context.seqs[0].context_len = -1;
  EXPECT_EQ(build(negative_context).code(), absl::StatusCode::kInternal);
  SchedulerOutput negative_id = out;
  negative_id.seqs[2].seq_id = -11;
  EXPECT_EQ(build(negative_id).code(), absl::StatusCode::kInternal);
  // The lookup's own error is the plan's.
  SchedulerOutput unknown = out;
  unknown.seqs[2].seq_id = 12;
  EXPECT_EQ(build(unknown).code(), absl::StatusCode::kNotFound);
  // A released id that cannot go on the wire.
  proto::StepPlan plan;
  EXPECT_EQ(
      BuildStepPlan(
          SchedulerOutput{}, std::vector<SeqId>{-1}, kEos,
          [&](const ScheduledSequence& s) { return seqs.Lookup(s); }, &plan)
          .code(),
      absl::StatusCode::kInternal);
}

TEST(BuildStepPlan, RejectsAMissingRequest) {
  SchedulerOutput out;
  out.seqs = {Entry(1, 0, 1, true)};
  const std::vector<TokenId> tokens = {5};
  proto::StepPlan plan;
  EXPECT_EQ(BuildStepPlan(
                out, {}, kEos,
                [&](const ScheduledSequence&) -> absl::StatusOr<PlanSequence> {
                  PlanSequence seq;
                  seq.tokens = tokens;
                  return seq;
                },
                &plan)
                .code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tessera
