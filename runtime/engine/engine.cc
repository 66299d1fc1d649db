#include "runtime/engine/engine.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/engine/plan.h"

namespace tessera {
namespace {

// The longest prefix of `text` that ends on a UTF-8 character boundary and is
// at most `limit` bytes.
size_t Utf8Floor(const std::string& text, size_t limit) {
  if (limit >= text.size()) return text.size();
  while (limit > 0 && (static_cast<unsigned char>(text[limit]) & 0xC0) == 0x80)
    --limit;
  return limit;
}

}  // namespace

Engine::Engine(StepExecutor* executor, EngineOptions options,
               const Tokenizer* tokenizer, BlockManager blocks)
    : executor_(executor),
      options_(options),
      tokenizer_(tokenizer),
      blocks_(std::make_unique<BlockManager>(std::move(blocks))) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    StepExecutor* executor, EngineOptions options, const Tokenizer* tokenizer) {
  if (options.scheduler.max_num_batched_tokens > executor->max_step_tokens() ||
      options.scheduler.max_num_seqs > executor->max_step_seqs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the scheduler may run ", options.scheduler.max_num_batched_tokens,
        " tokens of ", options.scheduler.max_num_seqs,
        " sequences per step; the model's steps hold ",
        executor->max_step_tokens(), " tokens of ", executor->max_step_seqs(),
        " sequences"));
  }
  const KvLayout layout = executor->kv_layout();
  if (layout.num_blocks < 1 || layout.num_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool of ", layout.num_blocks, " blocks"));
  }
  BlockManager::Options bm;
  bm.num_blocks = static_cast<int>(layout.num_blocks);
  bm.block_size = static_cast<int>(layout.block_size);
  // A static layout gives each sequence a block of its own: nothing to share.
  // With dynamic NTK or LongRoPE a block's keys are rotated for the length of
  // the request that wrote them (kernels/ops.h RopeLengthScaling): reusing
  // them would make a request's tokens depend on what ran before it.
  const ModelConfig& config = executor->config();
  const bool length_scaled_rope =
      config.rope.scaling == RopeScaling::kDynamic ||
      config.rope.scaling == RopeScaling::kLongRope;
  bm.enable_prefix_caching = options.enable_prefix_caching &&
                             !layout.static_layout && !length_scaled_rope;
  options.scheduler.recompute_at_length = config.recompute_at_length;
  ASSIGN_OR_RETURN(BlockManager blocks, BlockManager::Create(bm));
  std::unique_ptr<Engine> engine(
      new Engine(executor, options, tokenizer, std::move(blocks)));
  ASSIGN_OR_RETURN(Scheduler scheduler,
                   Scheduler::Create(options.scheduler, engine->blocks_.get()));
  engine->scheduler_ = std::make_unique<Scheduler>(std::move(scheduler));
  return engine;
}

absl::Status Engine::CheckRequest(const GenerationRequest& request) const {
  const ModelConfig& config = executor_->config();
  RETURN_IF_ERROR(ValidateRequest(config, request));
  if (!request.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(
        "stop strings need a tokenizer, and the model folder has none");
  }
  if (!request.grammar.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(
        "structured output needs a tokenizer, and the model folder has none");
  }
  if (request.top_logprobs > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs ", request.top_logprobs,
                     " exceeds the vocabulary of ", config.vocab_size));
  }
  if (request.top_logprobs > executor_->max_top_logprobs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_logprobs ", request.top_logprobs, " exceeds the ",
        executor_->max_top_logprobs(), " this backend's sampler ranks"));
  }
  // The pool must be able to hold the request whole (the scheduler checks
  // the same when it is added); block counts never change after creation.
  const int64_t max_total = static_cast<int64_t>(request.prompt_ids.size()) +
                            MaxNewTokens(config, request) - 1;
  const int64_t block_size = blocks_->block_size();
  const int64_t blocks = (max_total + block_size - 1) / block_size;
  if (blocks > blocks_->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request may hold ", max_total, " tokens, which need ", blocks,
        " KV blocks of ", block_size, " tokens, but the pool has only ",
        blocks_->num_blocks(), "; lower max_tokens or the prompt"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SeqId> Engine::Submit(const GenerationRequest& request,
                                     TokenCallback on_token) {
  const ModelConfig& config = executor_->config();
  RETURN_IF_ERROR(CheckRequest(request));
  const SeqId id = next_id_++;
  Request r;
  r.params = request;
  r.on_token = std::move(on_token);
  r.max_new_tokens = MaxNewTokens(config, request);
  r.submitted = Clock::now();
  // The last sampled token is never run, so it needs no KV.
  const int64_t max_total =
      static_cast<int64_t>(request.prompt_ids.size()) + r.max_new_tokens - 1;
  RETURN_IF_ERROR(scheduler_->Add(id, request.prompt_ids, max_total));
  if (!request.grammar.empty()) need_vocabulary_ = true;
  if (tokenizer_ != nullptr) {
    DecodeOptions decode;
    decode.skip_special_tokens = request.skip_special_tokens;
    decode.spaces_between_special_tokens =
        request.spaces_between_special_tokens;
    r.detokenizer.emplace(tokenizer_, request.prompt_ids, decode);
    for (const std::string& s : request.stop)
      r.max_stop_len = std::max(r.max_stop_len, s.size());
    // A stop string that stays in the text need not be kept from the
    // stream (vLLM holds nothing back then either).
    if (r.max_stop_len > 0 && !request.include_stop_str_in_output) {
      r.hold_back = r.max_stop_len - 1;
    }
    r.result.text.emplace();
  }
  requests_.emplace(id, std::move(r));
  return id;
}

absl::Status Engine::Cancel(SeqId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request ", id, " is not running or waiting"));
  }
  Finish(id, it->second, FinishReason::kAbort);
  return absl::OkStatus();
}

void Engine::Finish(SeqId id, Request& r, FinishReason reason) {
  scheduler_->Remove(id).IgnoreError();  // Present until now by construction.
  if (r.runner_started) released_.push_back(id);
  r.result.finish_reason = reason;
  if (r.result.text.has_value()) *r.result.text = r.text;
  const Clock::time_point now = Clock::now();
  if (!r.scheduled) {
    r.result.queue_seconds =
        std::chrono::duration<double>(now - r.submitted).count();
  }
  if (r.result.output_ids.empty()) {
    r.result.prefill_seconds =
        std::chrono::duration<double>(now - r.submitted).count();
  } else {
    r.result.decode_seconds =
        std::chrono::duration<double>(now - r.first_token).count();
  }
  finished_.emplace(id, std::move(r.result));
  requests_.erase(id);
}

absl::Status Engine::Step() {
  if (!scheduler_->HasWork() && released_.empty()) return absl::OkStatus();
  ScopedTrace step_trace(trace_, "step", "engine", trace_pid_, "running",
                         scheduler_->num_running());
  std::optional<ScopedTrace> phase;
  phase.emplace(trace_, "schedule", "engine", trace_pid_);
  ASSIGN_OR_RETURN(SchedulerOutput out, scheduler_->Schedule());
  if (out.seqs.empty() && !out.preempted.empty()) {
    // The only sequence that needed blocks gave its own back (no admission
    // in a step that preempts); the next call readmits it.
    ASSIGN_OR_RETURN(out, scheduler_->Schedule());
  }
  if (out.seqs.empty() && scheduler_->HasWork()) {
    return absl::InternalError(absl::StrCat(
        "the scheduler found nothing to run with ", scheduler_->num_waiting(),
        " waiting and ", scheduler_->num_running(), " running sequences"));
  }
  RETURN_IF_ERROR(BuildStepPlan(
      out, released_, executor_->config().eos_token_ids,
      [this](const ScheduledSequence& s) -> absl::StatusOr<PlanSequence> {
        auto it = requests_.find(s.seq_id);
        if (it == requests_.end()) {
          return absl::InternalError(absl::StrCat("the scheduler ran sequence ",
                                                  s.seq_id,
                                                  ", which has no request"));
        }
        const Request& r = it->second;
        PlanSequence seq;
        ASSIGN_OR_RETURN(seq.tokens, scheduler_->Tokens(s.seq_id));
        ASSIGN_OR_RETURN(seq.block_table, scheduler_->BlockTable(s.seq_id));
        seq.request = &r.params;
        seq.start = !r.runner_started;
        seq.prefill = r.result.output_ids.empty();
        return seq;
      },
      &plan_));
  released_.clear();
  // What the plan implies for the requests (BuildStepPlan changes none).
  const Clock::time_point scheduled_at = Clock::now();
  last_step_tokens_ = out.num_tokens;
  for (const ScheduledSequence& s : out.seqs) {
    Request& r = requests_.find(s.seq_id)->second;  // Looked up above.
    if (!r.scheduled) {
      r.scheduled = true;
      r.result.queue_seconds =
          std::chrono::duration<double>(scheduled_at - r.submitted).count();
    }
    if (s.first_chunk && r.result.output_ids.empty()) {
      r.result.cached_prompt_tokens = s.context_len;
    }
    r.runner_started = true;
    // A decode feeds back the one token sampled last; anything else is
    // prompt work (a prefill chunk, a preempted sequence's recompute).
    const bool decode = s.num_tokens == 1 && !r.result.output_ids.empty();
    if (!decode) prompt_tokens_ += s.num_tokens;
  }
  if (need_vocabulary_ && !vocabulary_sent_) RETURN_IF_ERROR(SendVocabulary());
  phase.emplace(trace_, "execute", "engine", trace_pid_, "sequences",
                plan_.seqs_size());
  RETURN_IF_ERROR(executor_->Execute(plan_, &result_));
  generation_tokens_ += result_.tokens_size();
  phase.emplace(trace_, "apply", "engine", trace_pid_, "sampled",
                result_.tokens_size());
  for (const proto::SampledToken& sampled : result_.tokens()) {
    RETURN_IF_ERROR(
        OnSampled(static_cast<SeqId>(sampled.sequence_id()), sampled));
  }
  return absl::OkStatus();
}

absl::Status Engine::SendVocabulary() {
  // Submit refuses a grammar without a tokenizer.
  const int64_t vocab = executor_->config().vocab_size;
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::VOCABULARY);
  proto::TokenVocabulary* v = plan.mutable_vocabulary();
  v->mutable_tokens()->Reserve(static_cast<int>(vocab));
  for (int64_t id = 0; id < vocab; ++id) {
    const int32_t i = static_cast<int32_t>(id);
    // Ids past the tokenizer's (a padded embedding) stay empty: never
    // allowed.
    const bool known = i < tokenizer_->vocab_size();
    v->add_tokens(known ? tokenizer_->TokenBytes(i) : std::string());
    if (known && tokenizer_->IsSpecial(i)) v->add_excluded_ids(i);
  }
  proto::StepResult ignored;
  RETURN_IF_ERROR(executor_->Execute(plan, &ignored));
  vocabulary_sent_ = true;
  return absl::OkStatus();
}

bool Engine::AddText(Request& r, const std::string& piece, bool check) {
  const size_t old_size = r.text.size();
  r.text += piece;
  if (!check || r.max_stop_len == 0 || piece.empty()) return false;
  // A stop string that ends in the new piece starts at most
  // max_stop_len - 1 bytes before it.
  const size_t from =
      old_size >= r.max_stop_len ? old_size - (r.max_stop_len - 1) : 0;
  size_t at = std::string::npos;
  const std::string* found = nullptr;
  for (const std::string& stop : r.params.stop) {
    const size_t pos = r.text.find(stop, from);
    if (pos != std::string::npos && (found == nullptr || pos < at)) {
      at = pos;
      found = &stop;
    }
  }
  if (found == nullptr) return false;
  r.result.stop_reason = *found;
  r.text.resize(r.params.include_stop_str_in_output ? at + found->size() : at);
  return true;
}

std::string Engine::ReleaseText(Request& r, bool finishing) {
  size_t end = r.text.size();
  if (!finishing && r.hold_back > 0) {
    // Hold back what could still be the start of a stop string.
    end = Utf8Floor(
        r.text, r.text.size() >= r.hold_back ? r.text.size() - r.hold_back : 0);
  }
  if (end <= r.delivered) return std::string();
  std::string out = r.text.substr(r.delivered, end - r.delivered);
  r.delivered = end;
  return out;
}

absl::Status Engine::OnSampled(SeqId id, const proto::SampledToken& sampled) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::InternalError(
        absl::StrCat("a token came back for unknown sequence ", id));
  }
  Request& r = it->second;
  TokenEvent event;
  absl::StatusOr<std::optional<FinishReason>> finish =
      Advance(id, r, sampled, event);
  if (!finish.ok()) {
    Fail(id, r, std::move(event), finish.status());
    return absl::OkStatus();
  }
  event.finished = finish->has_value();
  if (r.detokenizer) event.text = ReleaseText(r, event.finished);
  if (!event.finished) {
    if (r.on_token) r.on_token(event);
    return absl::OkStatus();
  }
  // Finish moves the request out: keep its callback for the last event.
  TokenCallback callback = std::move(r.on_token);
  Finish(id, r, **finish);
  if (callback) callback(event);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<FinishReason>> Engine::Advance(
    SeqId id, Request& r, const proto::SampledToken& sampled,
    TokenEvent& event) {
  const ModelConfig& config = executor_->config();
  if (!sampled.error().empty()) {
    // This sequence alone failed on the sampling rank (its grammar).
    return absl::FailedPreconditionError(sampled.error());
  }
  const TokenId token = sampled.token();
  GenerationResult& result = r.result;
  if (result.output_ids.empty()) {
    r.first_token = Clock::now();
    result.prefill_seconds =
        std::chrono::duration<double>(r.first_token - r.submitted).count();
    result.prefill_logits.assign(sampled.logits().begin(),
                                 sampled.logits().end());
  }
  result.output_ids.push_back(token);
  result.logprobs.push_back(sampled.logprob());
  event.token = token;
  event.logprob = sampled.logprob();
  if (r.params.top_logprobs > 0) {
    std::vector<std::pair<TokenId, float>> top;
    for (int i = 0; i < sampled.top_ids_size(); ++i) {
      top.emplace_back(sampled.top_ids(i), sampled.top_logprobs(i));
    }
    event.top_logprobs = top;
    result.top_logprobs.push_back(std::move(top));
  }
  if (token < 0 || token >= config.vocab_size) {
    return absl::InternalError(
        absl::StrCat("the model sampled token id ", token,
                     ", outside its vocabulary [0, ", config.vocab_size, ")"));
  }
  const int64_t generated = static_cast<int64_t>(result.output_ids.size());
  // vLLM: no stop check before min_tokens (EOS and stop ids are masked in
  // the sampler until then), and stop strings only in text that tokens
  // after the min_tokens-th add.
  const bool check_strings = generated > r.params.min_tokens;
  std::optional<FinishReason> finish;
  bool stop_token = false;
  if (generated >= r.params.min_tokens) {
    if (!r.params.ignore_eos && IsEos(config.eos_token_ids, token)) {
      stop_token = true;  // No stop_reason for EOS.
    } else if (std::find(r.params.stop_token_ids.begin(),
                         r.params.stop_token_ids.end(),
                         token) != r.params.stop_token_ids.end()) {
      stop_token = true;
      result.stop_reason = token;
    }
    if (stop_token) finish = FinishReason::kStop;
  }
  bool stopped_by_string = false;
  // The text of the token that ended the sequence as EOS or a stop id is
  // dropped, unless include_stop_str_in_output (vLLM).
  if (r.detokenizer && (!stop_token || r.params.include_stop_str_in_output)) {
    ASSIGN_OR_RETURN(std::string piece, r.detokenizer->Append(token));
    stopped_by_string = AddText(r, piece, check_strings);
    if (stopped_by_string) finish = FinishReason::kStop;
  }
  if (!finish && generated >= r.max_new_tokens) {
    finish = FinishReason::kLength;
  }
  if (finish && r.detokenizer && !stopped_by_string) {
    // Whatever the detokenizer still holds (an incomplete character).
    ASSIGN_OR_RETURN(std::string rest, r.detokenizer->Finish());
    if (AddText(r, rest, check_strings)) finish = FinishReason::kStop;
  }
  // The next step decodes the token; the last one is never run.
  if (!finish) RETURN_IF_ERROR(scheduler_->AppendToken(id, token));
  return finish;
}

void Engine::Fail(SeqId id, Request& r, TokenEvent event, absl::Status error) {
  TokenCallback callback = std::move(r.on_token);
  Finish(id, r, FinishReason::kAbort);  // Frees its blocks and its sampler.
  finished_.insert_or_assign(id, error);
  event.finished = true;
  event.text.clear();
  event.error = std::move(error);
  if (callback) callback(event);
}

absl::Status Engine::RunUntilIdle() {
  while (scheduler_->HasWork()) RETURN_IF_ERROR(Step());
  return absl::OkStatus();
}

absl::StatusOr<GenerationResult> Engine::TakeResult(SeqId id) {
  auto it = finished_.find(id);
  if (it == finished_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id, " has no result"));
  }
  absl::StatusOr<GenerationResult> result = std::move(it->second);
  finished_.erase(it);
  return result;
}

int64_t Engine::NumGenerated(SeqId id) const {
  if (auto it = requests_.find(id); it != requests_.end()) {
    return static_cast<int64_t>(it->second.result.output_ids.size());
  }
  if (auto it = finished_.find(id); it != finished_.end()) {
    return it->second.ok() ? static_cast<int64_t>(it->second->output_ids.size())
                           : 0;
  }
  return 0;
}

Engine::Stats Engine::stats() const {
  return Stats{
      scheduler_->stats(),       blocks_->stats(), scheduler_->num_running(),
      scheduler_->num_waiting(), prompt_tokens_,   generation_tokens_,
      last_step_tokens_};
}

absl::StatusOr<GenerationResult> Engine::Generate(
    const GenerationRequest& request,
    const std::function<void(TokenId)>& on_token) {
  TokenCallback callback;
  if (on_token) {
    callback = [&on_token](const TokenEvent& e) { on_token(e.token); };
  }
  ASSIGN_OR_RETURN(const SeqId id, Submit(request, std::move(callback)));
  while (finished_.find(id) == finished_.end()) RETURN_IF_ERROR(Step());
  return TakeResult(id);
}

}  // namespace tessera
