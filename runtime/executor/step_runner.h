// StepRunner: executes StepPlans on one rank. The same code runs in a single
// process and on every rank of a parallel job (parallel/ broadcasts the plan
// and collects the result); it owns the rank's KV pool and, on the sampling
// rank, the sampling state of every live sequence.
//
// Per step: the plan's sequences, tokens and sampled rows are packed into the
// rank's StepInputs (fixed-capacity buffers in the backend's memory, sized
// when the runner is made, filled by one copy; their AttentionMetadata is
// shared by every layer), the model runs the whole batch, and the sampling
// rank draws a token for every sequence marked `sample` with one Ops::Sample
// call over the logits where the backend holds them (every backend, the same
// tokens). Each draw is a function of the sequence's (seed, step), so a seeded
// request draws the same tokens whatever else is in the batch.
//
// Decode graphs (CaptureGraphs, graph_runner.h): once captured, a step whose
// every sequence runs one token and samples, with at most the largest
// bucket's sequences, is padded to its bucket and replayed; every other step
// runs eagerly. The tokens are the same either way (the graph runs the same
// ops on the same buffers). The choice depends only on the plan, so every
// rank of a job makes the same one.
#ifndef TESSERA_RUNTIME_EXECUTOR_STEP_RUNNER_H_
#define TESSERA_RUNTIME_EXECUTOR_STEP_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "kernels/ops.h"
#include "proto/tessera.pb.h"
#include "runtime/core/trace_ring.h"
#include "runtime/executor/grammar_masks.h"
#include "runtime/executor/graph_runner.h"
#include "runtime/executor/step_inputs.h"
#include "runtime/grammar/matcher.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/model.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {

class StepRunner {
 public:
  // `model` must outlive the runner; `pool` must have the model's
  // kv_pool_shape. `samples`: this rank samples (the last pipeline stage's
  // tp-rank 0; the only rank in one process). Sizes the step buffers for the
  // model's largest step (max_step_tokens, max_logit_rows sequences, the
  // context in the pool's blocks) and reserves the backend's step scratch
  // for it (Ops::ReserveStepScratch), so that no step allocates.
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(
      Model* model, KvPool pool, AttentionBackend backend, bool samples);

  // The two halves of Create, for a rank that sizes its KV pool from the
  // memory left once everything else exists (DESIGN.md: KV last): Reserve
  // makes the step buffers for KV blocks of `block_size` positions and
  // reserves the backend's step scratch; Create then takes them with a pool of
  // that block size.
  static absl::StatusOr<std::unique_ptr<StepInputs>> Reserve(
      Model* model, int64_t block_size);
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(
      Model* model, KvPool pool, AttentionBackend backend, bool samples,
      std::unique_ptr<StepInputs> reserved);

  // Runs one FORWARD plan. On the sampling rank `result` receives one
  // SampledToken per sampled sequence, in plan order; elsewhere it is left
  // empty. InvalidArgument for an inconsistent plan (a block outside the pool,
  // a sampled sequence the runner has no sampler for, ...).
  //
  // Structured output: a sequence started with a grammar draws only tokens
  // that continue it (runtime/grammar/matcher.h), its mask computed on
  // GrammarMaskPool threads while the forward runs. A sequence whose grammar
  // cannot go on (no token of the vocabulary continues it, or it is too
  // ambiguous) gets SampledToken::error and fails alone. A VOCABULARY plan
  // gives the sampling rank the tokenizer's bytes the grammars match.
  absl::Status Run(const proto::StepPlan& plan, proto::StepResult* result);

  // Records each Run as a "forward" event of process `pid` (the rank) in
  // `ring` (runtime/core/trace_ring.h); null (the default) stops. The ring
  // must outlive the runner or the next call.
  void set_trace(TraceRing* ring, int32_t pid) {
    trace_ = ring;
    trace_pid_ = pid;
  }

  // Captures the decode graphs of `buckets` over this runner's pool and step
  // inputs (GraphRunner::Capture; `free_device_bytes` measures what they
  // take). Replaces graphs captured before. Errors (Unimplemented on the
  // CPU) leave the runner eager.
  absl::Status CaptureGraphs(
      absl::Span<const int32_t> buckets,
      const std::function<int64_t()>& free_device_bytes = nullptr);
  // The decode graphs, or null (eager only: the CPU, --no-graphs).
  const GraphRunner* graphs() const { return graphs_.get(); }
  // Device memory the decode graphs hold (0 without graphs).
  int64_t graph_bytes() const {
    return graphs_ != nullptr ? graphs_->graph_bytes() : 0;
  }
  // Bytes of the step buffers (the step inputs' device buffer).
  size_t step_buffer_bytes() const { return inputs_->buffer_bytes(); }

  const KvPool& pool() const { return pool_; }
  Model* model() const { return model_; }
  // Sequences with live sampler state (tests).
  size_t num_live_sequences() const { return seqs_.size(); }

 private:
  TraceRing* trace_ = nullptr;
  int32_t trace_pid_ = 0;
  struct SequenceState {
    explicit SequenceState(const SamplingParams& params);
    SamplingParams params;
    // The sampler's stream: the request's seed, or a random one. Draw n of
    // the sequence (n = output.size()) is step n of it.
    uint64_t seed;
    std::vector<int32_t> prompt;  // The penalties' view.
    std::vector<int32_t> output;
    // min_tokens: these ids are masked while output has fewer tokens.
    int64_t min_tokens = 0;
    std::vector<int32_t> min_tokens_stop_ids;
    // Structured output: the grammar's state, the next draw's allowed ids
    // and, once it cannot go on, why.
    std::unique_ptr<grammar::GrammarMatcher> matcher;
    std::vector<uint32_t> allowed;
    absl::Status grammar_status;
    // The ids masked for the next draw (empty once min_tokens are out).
    absl::Span<const int32_t> Masked() const {
      return static_cast<int64_t>(output.size()) < min_tokens
                 ? absl::Span<const int32_t>(min_tokens_stop_ids)
                 : absl::Span<const int32_t>();
    }
  };

  StepRunner(Model* model, KvPool pool, AttentionBackend backend, bool samples,
             std::unique_ptr<StepInputs> inputs);

  // Draws the next token of every sampled sequence of `plan` from the step's
  // `logits` (one row per sampled sequence, in plan order; more rows may
  // follow: a padded graph step's), in one Ops::Sample call.
  absl::Status Sample(const proto::StepPlan& plan, const TensorView& logits,
                      proto::StepResult* result);
  // The VOCABULARY plan's tokenizer bytes (the sampling rank keeps them).
  absl::Status SetVocabulary(const proto::TokenVocabulary& vocabulary);
  // Starts the masks of `plan`'s constrained sampled sequences.
  void StartGrammarMasks(const proto::StepPlan& plan);
  // The bucket a pure-decode `plan` replays, or 0 (eager).
  int32_t GraphBucket(const proto::StepPlan& plan) const;

  Model* model_;
  KvPool pool_;
  AttentionBackend backend_;
  bool samples_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<SequenceState>> seqs_;
  std::unique_ptr<StepInputs> inputs_;
  // Structured output (the sampling rank, after a VOCABULARY plan).
  std::shared_ptr<grammar::GrammarCache> grammars_;
  std::unique_ptr<GrammarMaskPool> mask_pool_;
  // After inputs_ and pool_: destroyed before them.
  std::unique_ptr<GraphRunner> graphs_;
  // Reused between steps.
  std::vector<SequenceSlice> slices_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> logit_rows_;
  std::vector<SampleRow> sample_rows_;
  std::vector<SampleResult> samples_out_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_STEP_RUNNER_H_
