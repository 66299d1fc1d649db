// Engine: rank 0's serving loop. Requests are submitted at any time; each
// Step() asks the scheduler what to run, turns that into one StepPlan
// (sequences, tokens, positions, block tables, sampling parameters; plan.h
// says what it holds), has a StepExecutor run it (this process, or every rank
// of a parallel job), and hands each sampled token to its request: finish
// checks (EOS, stop ids, stop strings, max_tokens, context), streaming text,
// logprobs.
//
// Stop strings need a tokenizer: the engine detokenizes every request
// incrementally and holds back the last (longest stop string - 1) bytes of
// text until they can no longer start a stop string, so streamed text never
// contains one. The text ends before the stop string (after it with
// include_stop_str_in_output, and then nothing is held back); output_ids
// include the token that completed it. The text of a token that ends the
// sequence as EOS or a stop token id is dropped unless
// include_stop_str_in_output (vLLM). With min_tokens, EOS and stop ids are
// masked in the sampler until min_tokens are generated, and stop strings are
// looked for only in text that a later token adds (vLLM).
//
// Failures: anything that goes wrong with one request during a step (its
// detokenizer, a token its tokenizer cannot decode, its scheduler state)
// ends that request alone: its callback gets a last event with `error` set,
// TakeResult returns the error, and every other request carries on. Only a
// failure of the executor (the job) is Step()'s error.
//
// Thread safety: none; one thread drives Submit/Cancel/Step.
#ifndef TESSERA_RUNTIME_ENGINE_ENGINE_H_
#define TESSERA_RUNTIME_ENGINE_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/op_timer.h"
#include "proto/tessera.pb.h"
#include "runtime/core/ids.h"
#include "runtime/core/trace_ring.h"
#include "runtime/engine/generator.h"
#include "runtime/engine/scheduler.h"
#include "runtime/executor/memory_breakdown.h"
#include "runtime/kv/block_manager.h"
#include "runtime/kv/kv_layout.h"
#include "runtime/model/config.h"
#include "runtime/text/detokenizer.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

// Runs StepPlans across the job.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual const ModelConfig& config() const = 0;
  virtual AllocatorStats memory_stats() const = 0;
  // Where this process's rank's memory goes (a parallel job: rank 0's; every
  // rank's is in the coordinator's rank reports).
  virtual MemoryBreakdown memory_breakdown() const = 0;
  virtual KvLayout kv_layout() const = 0;
  // The most tokens and sampled sequences one step may hold (the model's
  // scratch is sized for them on every rank).
  virtual int64_t max_step_tokens() const = 0;
  virtual int64_t max_step_seqs() const = 0;
  // The most top log-probabilities the sampling rank's backend ranks per
  // token (OpSupport::max_top_logprobs; the CUDA sampler: 20).
  virtual int32_t max_top_logprobs() const {
    return std::numeric_limits<int32_t>::max();
  }
  // The decode batch sizes this process's rank replays as CUDA graphs
  // (runtime/executor/graph_runner.h), ascending; empty when its decode
  // steps run eagerly (the CPU, --no-graphs, parallel ranks for now).
  virtual std::vector<int32_t> decode_graph_buckets() const { return {}; }
  // Runs `plan` on every rank; `result` gets the sampling rank's result.
  virtual absl::Status Execute(const proto::StepPlan& plan,
                               proto::StepResult* result) = 0;
  // Any thread, while Execute may be running on another: false once a step
  // cannot finish (a parallel job's step ran past its deadline: a rank
  // stalled), before Execute returns the error. A server's /health answers
  // 503 from then on.
  virtual bool making_progress() const { return true; }
  // Called between steps while there is no work (a server's idle loop, at
  // least every 100 ms): a parallel executor tells the other ranks that it is
  // alive. An error is the job's, as Execute's.
  virtual absl::Status Idle() { return absl::OkStatus(); }

  // Records each step's forward on this process's rank ("forward" events,
  // pid = the rank) in `ring` (runtime/core/trace_ring.h); null stops. The
  // ring must outlive the executor or the next call. The default: an executor
  // without a rank in this process has nothing to record.
  virtual absl::Status SetTrace(TraceRing* ring) {
    (void)ring;
    return absl::UnimplementedError("--trace needs a rank in this process");
  }
  // The events the job's other processes recorded since SetTrace (a parallel
  // job: every rank but this one's "forward" events, their clocks aligned to
  // this process's TraceClockNs), and how many processes the trace names
  // ("rank 0" ..). A single process: none, and 1.
  virtual absl::StatusOr<std::vector<TraceEvent>> CollectRemoteTrace() {
    return std::vector<TraceEvent>{};
  }
  virtual int32_t trace_processes() const { return 1; }

  // Op profiling (kernels/op_timer.h; tessera bench --profile-ops): while on,
  // the ops of every step are timed on the device, and TakeOpProfile returns
  // the totals per op label since the last take and starts over. Turn it on
  // and off between steps. Eager steps only: an executor whose decode steps
  // replay CUDA graphs refuses (FailedPrecondition). The default: an executor
  // without ops in this process has nothing to time.
  virtual absl::Status SetOpProfiling(bool on) {
    (void)on;
    return absl::UnimplementedError(
        "op profiling needs the ops in this process (a single-process "
        "executor, or rank 0's ops of a parallel job)");
  }
  virtual absl::StatusOr<std::vector<OpTimeTotal>> TakeOpProfile() {
    return absl::UnimplementedError(
        "op profiling needs the ops in this process (a single-process "
        "executor, or rank 0's ops of a parallel job)");
  }
  // Whose ops the profile times, for a report's header ("this process's
  // ops", "rank 0's ops").
  virtual std::string op_profile_scope() const { return "this process's ops"; }
};

struct EngineOptions {
  SchedulerConfig scheduler;
  bool enable_prefix_caching = true;
};

// One generated token as a request's callback sees it.
struct TokenEvent {
  TokenId token = 0;
  float logprob = 0.0f;  // Under the model's distribution.
  std::vector<std::pair<TokenId, float>> top_logprobs;  // With logprobs > 0.
  // Text that became final with this token (empty without a tokenizer); the
  // last token's event also carries whatever was held back.
  std::string text;
  bool finished = false;  // The request's last event.
  // Set (with finished) when the request failed alone during a step: its
  // result is this error (TakeResult), the other requests are unaffected.
  absl::Status error;
};
using TokenCallback = std::function<void(const TokenEvent&)>;

class Engine final : public TokenGenerator {
 public:
  struct Stats {
    Scheduler::Stats scheduler;
    BlockManager::Stats blocks;
    int64_t running = 0;  // Sequences holding KV now.
    int64_t waiting = 0;  // Queued (new or preempted).
    // Tokens steps ran as prompt work (prefill chunks, and the recompute of
    // preempted sequences; not the prefix cache's hits) and tokens sampled,
    // since creation: the throughputs of the server's stats line.
    int64_t prompt_tokens = 0;
    int64_t generation_tokens = 0;
    // Tokens the last step ran: prompt chunks plus decodes (vLLM's
    // iteration tokens); 0 before the first step.
    int64_t last_step_tokens = 0;
  };

  // `executor` and `tokenizer` (null: no text, no stop strings) must outlive
  // the engine. InvalidArgument when the scheduler's limits exceed what the
  // executor's steps hold.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      StepExecutor* executor, EngineOptions options,
      const Tokenizer* tokenizer);

  // Queues a request (validated as ValidateRequest does, plus stop strings
  // needing a tokenizer and the pool being able to hold it) and returns its
  // id (its sequence's id too). `on_token` sees each token as it is sampled.
  absl::StatusOr<SeqId> Submit(const GenerationRequest& request,
                               TokenCallback on_token = {});
  // The checks Submit makes, without submitting: thread-safe (it reads only
  // what never changes after creation), so a server can refuse a request
  // before it streams anything.
  absl::Status CheckRequest(const GenerationRequest& request) const;
  // Ends a request wherever it is (finish reason "abort") and frees its KV
  // blocks. NotFound for an unknown or already finished id.
  absl::Status Cancel(SeqId id);

  bool HasWork() const { return scheduler_->HasWork(); }
  // One scheduling step (nothing when there is no work). An error here means
  // the job is unusable; a request's own failure is its result instead.
  absl::Status Step();
  // Steps until every submitted request has finished.
  absl::Status RunUntilIdle();
  // Tokens generated so far by a request (finished or not; 0 if unknown).
  int64_t NumGenerated(SeqId id) const;
  // The result of a finished request, once (NotFound otherwise): the error
  // that ended it when it failed alone.
  absl::StatusOr<GenerationResult> TakeResult(SeqId id);

  Stats stats() const;

  // Records every step and its phases (schedule, execute, apply) in `ring`
  // (runtime/core/trace_ring.h) as process `pid`; null (the default) stops.
  // The ring must outlive the engine or the next call.
  void set_trace(TraceRing* ring, int32_t pid = 0) {
    trace_ = ring;
    trace_pid_ = pid;
  }

  // TokenGenerator: one request alone, run to completion.
  const ModelConfig& config() const override { return executor_->config(); }
  // Any thread (StepExecutor::making_progress).
  bool executor_making_progress() const { return executor_->making_progress(); }
  // Between steps while HasWork() is false (StepExecutor::Idle).
  absl::Status Idle() { return executor_->Idle(); }
  AllocatorStats memory_stats() const override {
    return executor_->memory_stats();
  }
  absl::StatusOr<GenerationResult> Generate(
      const GenerationRequest& request,
      const std::function<void(TokenId)>& on_token = {}) override;

 private:
  TraceRing* trace_ = nullptr;
  int32_t trace_pid_ = 0;
  using Clock = std::chrono::steady_clock;
  struct Request {
    GenerationRequest params;
    TokenCallback on_token;
    int64_t max_new_tokens = 0;
    bool runner_started = false;  // The sampling rank has its sampler.
    bool scheduled = false;       // A step has run it (queue_seconds is set).
    GenerationResult result;
    Clock::time_point submitted, first_token;
    // Text (with a tokenizer): everything final so far, and how much of it
    // the callback has been given.
    std::optional<IncrementalDetokenizer> detokenizer;
    std::string text;
    size_t delivered = 0;
    size_t max_stop_len = 0;
    // Bytes of text held back from the callback: what could still be the
    // start of a stop string (max_stop_len - 1; 0 when it is kept anyway).
    size_t hold_back = 0;
  };

  Engine(StepExecutor* executor, EngineOptions options,
         const Tokenizer* tokenizer, BlockManager blocks);
  // Hands a sampled token to its request; an error here is the job's (a
  // token for an unknown sequence). The request's own failures end it alone.
  absl::Status OnSampled(SeqId id, const proto::SampledToken& sampled);
  // The per-request part of OnSampled: records the token, fills `event`
  // (but not its text) and says whether and why the request ends.
  absl::StatusOr<std::optional<FinishReason>> Advance(
      SeqId id, Request& r, const proto::SampledToken& sampled,
      TokenEvent& event);
  // Ends a request that failed alone: its result is `error`, its callback
  // gets a last event carrying it.
  void Fail(SeqId id, Request& r, TokenEvent event, absl::Status error);
  // Appends `piece` to the request's text; true when a stop string appeared
  // (the text is then cut where it starts, or where it ends with
  // include_stop_str_in_output, and it becomes the stop_reason). With
  // `check` false only appends.
  bool AddText(Request& r, const std::string& piece, bool check = true);
  // Gives the sampling rank the tokenizer's bytes per id (a VOCABULARY
  // plan), once, before the first step that runs a grammar.
  absl::Status SendVocabulary();
  // The event's text: what may be released now (all of it when finishing).
  std::string ReleaseText(Request& r, bool finishing);
  void Finish(SeqId id, Request& r, FinishReason reason);

  StepExecutor* executor_;
  EngineOptions options_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  SeqId next_id_ = 1;
  int64_t last_step_tokens_ = 0;
  absl::flat_hash_map<SeqId, Request> requests_;  // Unfinished.
  absl::flat_hash_map<SeqId, absl::StatusOr<GenerationResult>> finished_;
  std::vector<SeqId> released_;    // For the next plan.
  int64_t prompt_tokens_ = 0;      // Stats::prompt_tokens.
  int64_t generation_tokens_ = 0;  // Stats::generation_tokens.
  // Structured output: a request with a grammar was submitted / the
  // sampling rank has the vocabulary.
  bool need_vocabulary_ = false;
  bool vocabulary_sent_ = false;
  proto::StepPlan plan_;  // Reused every step (see plan.h).
  proto::StepResult result_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_ENGINE_ENGINE_H_
