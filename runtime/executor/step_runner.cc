#include "runtime/executor/step_runner.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/sampler/sampling_params_proto.h"

namespace tessera {

StepRunner::SequenceState::SequenceState(const SamplingParams& p)
    : params(p),
      seed(p.seed.has_value()
               ? *p.seed
               : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                     std::random_device{}()) {}

absl::StatusOr<std::unique_ptr<StepRunner>> StepRunner::Create(
    Model* model, KvPool pool, AttentionBackend backend, bool samples) {
  ASSIGN_OR_RETURN(std::unique_ptr<StepInputs> inputs,
                   Reserve(model, pool.block_size()));
  return Create(model, std::move(pool), backend, samples, std::move(inputs));
}

absl::StatusOr<std::unique_ptr<StepRunner>> StepRunner::Create(
    Model* model, KvPool pool, AttentionBackend backend, bool samples,
    std::unique_ptr<StepInputs> reserved) {
  if (reserved == nullptr ||
      reserved->limits().max_blocks_per_seq !=
          BlocksPerSequence(model->config().max_position_embeddings,
                            pool.block_size())) {
    return absl::InvalidArgumentError(
        "StepRunner: the step buffers were not reserved for this pool's "
        "block size");
  }
  return std::unique_ptr<StepRunner>(new StepRunner(
      model, std::move(pool), backend, samples, std::move(reserved)));
}

absl::StatusOr<std::unique_ptr<StepInputs>> StepRunner::Reserve(
    Model* model, int64_t block_size) {
  const ModelConfig& c = model->config();
  const ShardSpec& shard = model->shard();
  StepInputsLimits limits;
  limits.max_tokens = model->max_step_tokens();
  limits.max_seqs = static_cast<int32_t>(
      std::min<int64_t>(model->max_logit_rows(), INT32_MAX));
  limits.max_logit_rows = limits.max_seqs;
  limits.max_blocks_per_seq =
      BlocksPerSequence(c.max_position_embeddings, block_size);
  limits.vocab_size = c.vocab_size;
  limits.max_seq_len = c.max_position_embeddings;
  ASSIGN_OR_RETURN(std::unique_ptr<StepInputs> inputs,
                   StepInputs::Create(model->ops(), limits));
  StepLimits scratch;
  scratch.max_tokens = limits.max_tokens;
  scratch.max_seqs = limits.max_seqs;
  scratch.max_seq_len = c.max_position_embeddings;
  scratch.max_heads = static_cast<int32_t>(shard.local_heads);
  scratch.max_head_dim = static_cast<int32_t>(c.head_dim);
  scratch.max_linear_in = std::max<int64_t>(
      {c.hidden_size, shard.local_heads * c.head_dim, shard.local_intermediate,
       shard.local_shared_intermediate});
  scratch.vocab_size = c.vocab_size;
  RETURN_IF_ERROR(model->ops()->ReserveStepScratch(scratch));
  return inputs;
}

StepRunner::StepRunner(Model* model, KvPool pool, AttentionBackend backend,
                       bool samples, std::unique_ptr<StepInputs> inputs)
    : model_(model),
      pool_(std::move(pool)),
      backend_(backend),
      samples_(samples),
      inputs_(std::move(inputs)) {}

absl::Status StepRunner::Run(const proto::StepPlan& plan,
                             proto::StepResult* result) {
  result->Clear();
  if (plan.kind() == proto::StepPlan::VOCABULARY) {
    return SetVocabulary(plan.vocabulary());
  }
  // Nothing of the last step's masks may be running when states go.
  if (mask_pool_ != nullptr) mask_pool_->Wait();
  for (uint64_t id : plan.released()) seqs_.erase(id);
  if (plan.seqs_size() == 0) return absl::OkStatus();
  ScopedTrace trace(trace_, "forward", "rank", trace_pid_, "sequences",
                    plan.seqs_size());

  slices_.clear();
  tokens_.clear();
  logit_rows_.clear();
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (step.tokens_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step plan: sequence ", step.sequence_id(), " has no tokens"));
    }
    SequenceSlice slice;
    slice.context_len = step.context_len();
    slice.query_len = step.tokens_size();
    slice.block_table =
        absl::MakeConstSpan(step.block_table().data(), step.block_table_size());
    slices_.push_back(slice);
    tokens_.insert(tokens_.end(), step.tokens().begin(), step.tokens().end());
    if (step.sample()) {
      logit_rows_.push_back(static_cast<int32_t>(tokens_.size()) - 1);
    }
    if (samples_ && step.start()) {
      auto state =
          std::make_unique<SequenceState>(SamplingFromProto(step.sampling()));
      state->prompt.assign(step.prompt().begin(), step.prompt().end());
      state->min_tokens = step.sampling().min_tokens();
      state->min_tokens_stop_ids.assign(
          step.sampling().min_tokens_stop_ids().begin(),
          step.sampling().min_tokens_stop_ids().end());
      if (!step.grammar().empty()) {
        if (grammars_ == nullptr) {
          state->grammar_status = absl::FailedPreconditionError(
              "structured output: the sampling rank has no vocabulary (no "
              "tokenizer was loaded)");
        } else if (auto g = grammars_->Get(step.grammar()); !g.ok()) {
          state->grammar_status = g.status();
        } else {
          state->matcher = std::make_unique<grammar::GrammarMatcher>(
              *std::move(g),
              std::vector<int32_t>(step.grammar_end_ids().begin(),
                                   step.grammar_end_ids().end()));
          state->allowed.assign(state->matcher->mask_words(), 0u);
        }
      }
      seqs_[step.sequence_id()] = std::move(state);
    }
  }
  if (samples_) StartGrammarMasks(plan);
  // Whatever returns from here on, the masks' threads are done first.
  const absl::Cleanup wait_for_masks = [this] {
    if (mask_pool_ != nullptr) mask_pool_->Wait();
  };
  const int32_t bucket = GraphBucket(plan);
  RETURN_IF_ERROR(inputs_->Fill(
      slices_, static_cast<int32_t>(pool_.block_size()), pool_.num_blocks(),
      tokens_, logit_rows_, /*pad_to=*/bucket));
  TensorView logits;
  if (bucket > 0) {
    // The padded rows follow the real ones; only those are sampled.
    RETURN_IF_ERROR(graphs_->Replay(bucket));
    logits = graphs_->logits(bucket);
  } else {
    StepBatch batch;
    batch.tokens = inputs_->tokens();
    batch.metadata = &inputs_->metadata();
    batch.backend = backend_;
    batch.logit_rows = inputs_->logit_rows();
    // The logits stay where the backend computed them (step_logits()).
    RETURN_IF_ERROR(model_->ForwardBatch(batch, pool_, /*logits=*/nullptr));
    logits = model_->step_logits();
  }
  if (!samples_) return absl::OkStatus();
  return Sample(plan, logits, result);
}

absl::Status StepRunner::SetVocabulary(
    const proto::TokenVocabulary& vocabulary) {
  if (!samples_) return absl::OkStatus();
  const int64_t vocab = model_->config().vocab_size;
  if (vocabulary.tokens_size() != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer vocabulary has ", vocabulary.tokens_size(),
                     " ids; the model's logits have ", vocab));
  }
  std::vector<std::string> bytes(vocabulary.tokens().begin(),
                                 vocabulary.tokens().end());
  std::vector<bool> excluded(bytes.size(), false);
  for (int32_t id : vocabulary.excluded_ids()) {
    if (id >= 0 && id < vocab) excluded[id] = true;
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<const grammar::TokenVocabulary> v,
      grammar::TokenVocabulary::Create(std::move(bytes), std::move(excluded)));
  grammars_ = std::make_shared<grammar::GrammarCache>(std::move(v));
  return absl::OkStatus();
}

void StepRunner::StartGrammarMasks(const proto::StepPlan& plan) {
  std::vector<GrammarMaskPool::Job> jobs;
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (!step.sample()) continue;
    auto it = seqs_.find(step.sequence_id());
    if (it == seqs_.end()) continue;  // Sample reports it.
    SequenceState& state = *it->second;
    if (state.matcher == nullptr || !state.grammar_status.ok()) continue;
    jobs.push_back({state.matcher.get(), absl::MakeSpan(state.allowed),
                    &state.grammar_status});
  }
  if (jobs.empty()) return;
  if (mask_pool_ == nullptr) {
    // A few threads: a mask is a few hundred token checks, and the forward
    // they hide behind needs the cores too on the CPU.
    const int threads = std::clamp<int>(
        static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8);
    mask_pool_ = std::make_unique<GrammarMaskPool>(threads);
  }
  mask_pool_->Start(std::move(jobs));
}

int32_t StepRunner::GraphBucket(const proto::StepPlan& plan) const {
  if (graphs_ == nullptr) return 0;
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (step.tokens_size() != 1 || !step.sample()) return 0;
  }
  return graphs_->BucketFor(plan.seqs_size());
}

absl::Status StepRunner::CaptureGraphs(
    absl::Span<const int32_t> buckets,
    const std::function<int64_t()>& free_device_bytes) {
  graphs_.reset();
  ASSIGN_OR_RETURN(graphs_,
                   GraphRunner::Capture(model_, pool_, backend_, inputs_.get(),
                                        buckets, free_device_bytes));
  return absl::OkStatus();
}

absl::Status StepRunner::Sample(const proto::StepPlan& plan,
                                const TensorView& logits,
                                proto::StepResult* result) {
  if (mask_pool_ != nullptr) mask_pool_->Wait();
  sample_rows_.clear();
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (!step.sample()) continue;
    auto it = seqs_.find(step.sequence_id());
    if (it == seqs_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step plan samples sequence ", step.sequence_id(),
                       ", which was never started"));
    }
    const SequenceState& state = *it->second;
    SampleRow row;
    row.params = &state.params;
    row.seed = state.seed;
    row.step = state.output.size();
    row.prompt = state.prompt;
    row.output = state.output;
    row.masked = state.Masked();
    if (state.matcher != nullptr && state.grammar_status.ok()) {
      row.allowed = state.allowed;
    }
    row.top_logprobs = step.top_logprobs();
    sample_rows_.push_back(row);
  }
  // A step of prefill chunks only samples nothing.
  if (sample_rows_.empty()) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(sample_rows_.size());
  if (logits.shape().rank() != 2 || logits.shape()[0] < n) {
    return absl::InternalError(absl::StrCat("the step left logits ",
                                            logits.shape().ToString(), " for ",
                                            n, " sampled sequences"));
  }
  RETURN_IF_ERROR(
      model_->ops()->Sample(logits.Rows(0, n), sample_rows_, &samples_out_));
  int64_t row = 0;
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (!step.sample()) continue;
    const SampleResult& sample = samples_out_[row];
    SequenceState& state = *seqs_.at(step.sequence_id());
    state.output.push_back(sample.token);
    proto::SampledToken* out = result->add_tokens();
    out->set_sequence_id(step.sequence_id());
    if (state.matcher != nullptr && state.grammar_status.ok()) {
      state.grammar_status = state.matcher->Accept(sample.token);
    }
    if (!state.grammar_status.ok()) {
      out->set_error(
          absl::StrCat("structured output: ", state.grammar_status.message()));
    }
    out->set_token(sample.token);
    out->set_logprob(sample.logprob);
    for (const auto& [id, logprob] : sample.top) {
      out->add_top_ids(id);
      out->add_top_logprobs(logprob);
    }
    if (step.return_logits()) {
      const int vocab = static_cast<int>(model_->config().vocab_size);
      out->mutable_logits()->Resize(vocab, 0.0f);
      RETURN_IF_ERROR(model_->ops()->CopyToHost(
          logits.Rows(row, row + 1), out->mutable_logits()->mutable_data()));
    }
    ++row;
  }
  return absl::OkStatus();
}

}  // namespace tessera
