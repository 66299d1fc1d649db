#include "runtime/engine/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/sampler/sampling_params_proto.h"

namespace tessera {
namespace {

// StopTokenIds(request, eos_ids), written straight into the wire field (no
// vector of its own per starting request).
void SetMinTokensStopIds(const GenerationRequest& request,
                         const std::vector<int64_t>& eos_ids,
                         google::protobuf::RepeatedField<int32_t>* ids) {
  ids->Clear();
  ids->Add(request.stop_token_ids.begin(), request.stop_token_ids.end());
  if (!request.ignore_eos) {
    for (int64_t id : eos_ids) {
      if (id >= 0 && id <= INT32_MAX) ids->Add(static_cast<TokenId>(id));
    }
  }
  std::sort(ids->begin(), ids->end());
  ids->Truncate(
      static_cast<int>(std::unique(ids->begin(), ids->end()) - ids->begin()));
}

absl::Status BadEntry(const ScheduledSequence& s, absl::string_view what) {
  return absl::InternalError(absl::StrCat("step plan: sequence ", s.seq_id,
                                          " (context_len ", s.context_len, ", ",
                                          s.num_tokens, " tokens): ", what));
}

}  // namespace

absl::Status BuildStepPlan(const SchedulerOutput& output,
                           absl::Span<const SeqId> released,
                           const std::vector<int64_t>& eos_ids,
                           PlanSequenceFn sequence, proto::StepPlan* plan) {
  plan->Clear();
  plan->set_kind(proto::StepPlan::FORWARD);
  for (SeqId id : released) {
    if (id < 0) {
      return absl::InternalError(
          absl::StrCat("step plan: released sequence id ", id));
    }
    plan->add_released(static_cast<uint64_t>(id));
  }
  for (const ScheduledSequence& s : output.seqs) {
    if (s.seq_id < 0) return BadEntry(s, "negative id");
    if (s.context_len < 0 || s.num_tokens < 1) {
      return BadEntry(s, "empty or negative token range");
    }
    ASSIGN_OR_RETURN(const PlanSequence seq, sequence(s));
    if (seq.request == nullptr) return BadEntry(s, "no request");
    const int64_t end = s.context_len + s.num_tokens;
    if (end > static_cast<int64_t>(seq.tokens.size())) {
      return BadEntry(s, absl::StrCat("the sequence has only ",
                                      seq.tokens.size(), " tokens"));
    }
    const GenerationRequest& request = *seq.request;
    proto::SequenceStep* step = plan->add_seqs();
    step->set_sequence_id(static_cast<uint64_t>(s.seq_id));
    step->set_context_len(s.context_len);
    step->mutable_tokens()->Add(seq.tokens.begin() + s.context_len,
                                seq.tokens.begin() + end);
    step->mutable_block_table()->Add(seq.block_table.begin(),
                                     seq.block_table.end());
    step->set_sample(s.sample);
    if (seq.start) {
      step->set_start(true);
      proto::SamplingParams* sampling = step->mutable_sampling();
      SamplingToProto(request.sampling, sampling);
      if (request.min_tokens > 0) {
        sampling->set_min_tokens(request.min_tokens);
        SetMinTokensStopIds(request, eos_ids,
                            sampling->mutable_min_tokens_stop_ids());
      }
      if (request.sampling.has_penalties()) {
        step->mutable_prompt()->Add(request.prompt_ids.begin(),
                                    request.prompt_ids.end());
      }
      if (!request.grammar.empty()) {
        step->set_grammar(request.grammar);
        // What ends the sequence ends the grammar; with ignore_eos and no
        // stop ids, EOS still closes a complete output (the engine then
        // goes on to max_tokens, each draw EOS again).
        SetMinTokensStopIds(request, eos_ids, step->mutable_grammar_end_ids());
        if (step->grammar_end_ids_size() == 0) {
          for (int64_t id : eos_ids) {
            if (id >= 0 && id <= INT32_MAX) {
              step->add_grammar_end_ids(static_cast<TokenId>(id));
            }
          }
        }
      }
    }
    step->set_top_logprobs(request.top_logprobs);
    step->set_return_logits(s.sample && request.return_prefill_logits &&
                            seq.prefill);
  }
  return absl::OkStatus();
}

}  // namespace tessera
