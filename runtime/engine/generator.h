// Generation requests and results, and the TokenGenerator interface that the
// commands drive (the Engine, engine.h, implements it over the scheduler).
#ifndef TESSERA_RUNTIME_ENGINE_GENERATOR_H_
#define TESSERA_RUNTIME_ENGINE_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/core/ids.h"
#include "runtime/core/memory.h"
#include "runtime/model/config.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {

enum class FinishReason {
  kLength,  // max_tokens generated, or the context is full.
  kStop,    // An end-of-sequence token, a stop token id or a stop string was
            // generated (the token is included in output_ids).
  kAbort,   // Cancelled.
};

// "length" / "stop" / "abort"
absl::string_view FinishReasonName(FinishReason reason);

// The most bytes a request's stop strings may hold together: every generated
// token is looked for in each of them (within the last few bytes of text), so
// this bounds what one request adds to every step of the engine, whatever the
// number of strings (any number fits, as in vLLM, while they are this short).
inline constexpr size_t kMaxStopStringBytes = 16 << 10;

// The most stop_token_ids a request may give: each generated token is looked
// up among them, and they are masked on the sampling rank under min_tokens.
inline constexpr size_t kMaxStopTokenIds = 1024;

struct GenerationRequest {
  std::vector<TokenId> prompt_ids;  // Used as given: no BOS is added here.
  int64_t max_tokens = 256;         // >= 1.
  SamplingParams sampling;
  bool ignore_eos = false;
  // More ids that end the sequence like EOS (finish_reason "stop", the id
  // included in output_ids); they apply even with ignore_eos.
  std::vector<TokenId> stop_token_ids;
  // Texts that end the sequence (finish_reason "stop") as soon as the output
  // text contains one; the text is cut before it. Needs a tokenizer. At most
  // kMaxStopStringBytes in all.
  std::vector<std::string> stop;
  // Report the log-probabilities of this many most likely tokens at each step
  // (the sampled token's own log-probability is always reported).
  int32_t top_logprobs = 0;
  // Return the next-token logits after the prompt (tests, debugging).
  bool return_prefill_logits = false;
  // EOS and stop_token_ids cannot end the sequence before this many tokens
  // are generated: the sampler masks their logits to -inf until then
  // (transformers' min_new_tokens, vLLM's min_tokens), and stop strings are
  // not looked for before it either (vLLM). 0 <= min_tokens <= max_tokens.
  int64_t min_tokens = 0;
  // Keep the stop string that ended the sequence at the end of the text
  // (vLLM's include_stop_str_in_output).
  bool include_stop_str_in_output = false;
  // The text drops special tokens (BOS, EOS, <|im_end|>, ...) unless this is
  // false; kept special tokens are separated from the text around them by
  // spaces when spaces_between_special_tokens is true, as Hugging Face's
  // slow tokenizers (and vLLM) decode them.
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;
  // Structured output: every token must continue this grammar (EBNF,
  // runtime/grammar/grammar.h; what a JSON schema, regex or choice became),
  // and EOS / stop_token_ids are allowed exactly when it is complete. Needs
  // a tokenizer. Empty: unconstrained.
  std::string grammar;
};

// What ended a sequence with finish_reason "stop", when it was not EOS:
// the stop string or the stop token id (vLLM's stop_reason).
using StopReason = std::variant<std::string, TokenId>;

struct GenerationResult {
  std::vector<TokenId> output_ids;
  FinishReason finish_reason = FinishReason::kLength;
  // The continuation's text (special tokens skipped, cut before a stop
  // string); set when the engine has a tokenizer.
  std::optional<std::string> text;
  // Set when a stop string or one of the request's stop_token_ids ended the
  // sequence; unset for EOS, length and abort.
  std::optional<StopReason> stop_reason;
  std::vector<float> logprobs;  // Of each output token.
  // With top_logprobs > 0: the most likely (id, log-probability) pairs at
  // each step.
  std::vector<std::vector<std::pair<TokenId, float>>> top_logprobs;
  // With return_prefill_logits: next-token logits after the prompt [vocab].
  std::vector<float> prefill_logits;
  int64_t cached_prompt_tokens = 0;  // Served from the prefix cache.
  double prefill_seconds = 0.0;      // Submission to the first token.
  // Submission to the first step that ran the request (vLLM's queue time; a
  // part of prefill_seconds, so scheduled to first token is their
  // difference). A request that ended before it ran: submission to its end.
  double queue_seconds = 0.0;
  double decode_seconds = 0.0;  // First token to the last.
};

// Something that turns a request into generated tokens.
class TokenGenerator {
 public:
  virtual ~TokenGenerator() = default;
  virtual const ModelConfig& config() const = 0;
  // The working-memory allocator's statistics (rank 0's in a parallel job).
  virtual AllocatorStats memory_stats() const = 0;
  // Runs one request to completion. InvalidArgument for an empty prompt, a
  // token id outside the vocabulary, bad sampling parameters or max_tokens <
  // 1; OutOfRange for a prompt longer than the context. `on_token`, when set,
  // sees each generated token as soon as it is sampled.
  virtual absl::StatusOr<GenerationResult> Generate(
      const GenerationRequest& request,
      const std::function<void(TokenId)>& on_token = {}) = 0;
};

// The checks every TokenGenerator makes before running a request: a non-empty
// prompt of ids inside the model's vocabulary (config.vocab_size, which may
// exceed the tokenizer's: such ids decode to no text) that fits the context
// (config.max_position_embeddings, lowered to --max-model-len when given),
// max_tokens >= 1, 0 <= min_tokens <= max_tokens, valid sampling
// parameters.
absl::Status ValidateRequest(const ModelConfig& config,
                             const GenerationRequest& request);

// How many tokens the request may generate: max_tokens, capped by the context
// (the last sampled token needs no forward pass, so a full context still
// yields one).
int64_t MaxNewTokens(const ModelConfig& config,
                     const GenerationRequest& request);

// Whether `token` ends a sequence.
bool IsEos(const std::vector<int64_t>& eos_ids, TokenId token);

// Whether `token` ends `request`'s sequence: an EOS id (unless ignore_eos) or
// one of its stop_token_ids.
bool IsStopToken(const GenerationRequest& request,
                 const std::vector<int64_t>& eos_ids, TokenId token);

// The ids that min_tokens keeps from being sampled: the EOS ids (unless
// ignore_eos) and the request's stop_token_ids, distinct, ascending.
std::vector<TokenId> StopTokenIds(const GenerationRequest& request,
                                  const std::vector<int64_t>& eos_ids);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_ENGINE_GENERATOR_H_
