// The step plan: one scheduling decision (SchedulerOutput) as the wire carries
// it to every rank (proto::StepPlan, see proto/tessera.proto).
//
// BuildStepPlan is the one place that decides what a SequenceStep holds:
//  - for every scheduled sequence, in the scheduler's order (decodes first):
//    its id, context_len, the tokens run now (tokens[context_len,
//    context_len + num_tokens)), its whole block table, whether the row is
//    sampled, how many top log-probabilities to report, and whether to send
//    the logits back (return_prefill_logits, on the sampled prompt chunk
//    only);
//  - the first time the sampling rank sees a sequence (`start`): its sampling
//    parameters, with min_tokens and the ids min_tokens masks (StopTokenIds:
//    EOS unless ignore_eos, and the request's stop_token_ids, distinct and
//    ascending), and the prompt when a penalty needs it. A sequence resumed
//    after preemption is not started again (its sampler, and its random
//    stream, carry on);
//  - the sequences released since the last plan, whose samplers the sampling
//    rank drops.
//
// It reads the engine's requests through `sequence` and changes nothing of
// them: the engine records what the plan implies (the sampler started, the
// cached prompt tokens) once it is built.
//
// Allocation: `plan` is cleared and refilled in place. Protobuf keeps the
// cleared SequenceStep objects and the capacity of their repeated fields, so a
// plan object reused from step to step allocates nothing once it has held a
// step as large (a decode step in steady state). Only a starting row
// allocates, once per request (its sampling parameters and prompt).
#ifndef TESSERA_RUNTIME_ENGINE_PLAN_H_
#define TESSERA_RUNTIME_ENGINE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/tessera.pb.h"
#include "runtime/core/ids.h"
#include "runtime/engine/generator.h"
#include "runtime/engine/scheduler.h"

namespace tessera {

// What the plan needs to know of one scheduled sequence beyond the
// scheduler's entry. The spans and the request must stay valid until
// BuildStepPlan returns.
struct PlanSequence {
  // Every token the sequence has (prompt, then each generated token): the
  // scheduler's Tokens().
  absl::Span<const TokenId> tokens;
  // The blocks it holds now (the scheduler's BlockTable()).
  absl::Span<const BlockId> block_table;
  // Its request: sampling, min_tokens, ignore_eos, stop_token_ids,
  // prompt_ids (for penalties), top_logprobs, return_prefill_logits.
  const GenerationRequest* request = nullptr;
  // The sampling rank has no sampler for it yet.
  bool start = false;
  // No token has been generated for it yet (a sampled row is then the
  // prompt's last chunk: return_prefill_logits applies).
  bool prefill = false;
};

// Looks up a scheduled sequence; called once per entry of output.seqs, in
// order. An error it returns is BuildStepPlan's.
using PlanSequenceFn =
    absl::FunctionRef<absl::StatusOr<PlanSequence>(const ScheduledSequence&)>;

// Overwrites `plan` with a FORWARD plan for `output`, releasing `released`.
// `eos_ids` are the model's (ModelConfig::eos_token_ids). Internal error,
// with `plan` in an unspecified state, for an entry the sequence does not
// match: a negative id, context_len < 0, num_tokens < 1, a token range past
// the sequence's tokens, or no request.
absl::Status BuildStepPlan(const SchedulerOutput& output,
                           absl::Span<const SeqId> released,
                           const std::vector<int64_t>& eos_ids,
                           PlanSequenceFn sequence, proto::StepPlan* plan);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_ENGINE_PLAN_H_
