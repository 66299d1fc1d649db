// The OpenAI-compatible HTTP API's protocol layer: request bodies of
// POST /v1/completions and POST /v1/chat/completions parsed and validated into
// a CompletionRequest, mapped onto the engine's GenerationRequest, and the
// response, streaming-chunk, model-list and error bodies built as JSON text.
// Pure functions: no HTTP, no engine, no tokenizer.
//
//   auto parsed = ParseChatRequest(body);
//   if (const ApiError* error = std::get_if<ApiError>(&parsed)) {
//     Reply(error->http_status, ErrorBody(*error));
//   }
//   const CompletionRequest& request = std::get<CompletionRequest>(parsed);
//   ... render request.messages, tokenize ...
//   GenerationRequest g = ToGenerationRequest(request, ids, choice_index);
//
// Choices made (OpenAI's documented API first, vLLM where it extends it):
//  - Unknown fields are ignored, as OpenAI does; `user` is ignored. A field
//    set to JSON null means "not given" (its default applies), except
//    completions' `max_tokens`: absent means OpenAI's default of 16, null
//    means no limit (until the context is full; vLLM does the same).
//  - Integer fields accept integral numbers written as floats (16.0), as
//    vLLM's pydantic models do; 16.5 is a 400. Booleans are never numbers.
//  - Wrong JSON types and out-of-range values are 400 invalid_request_error
//    with `param` naming the field (array elements as "stop.[1]", message
//    fields as "messages.[0].content", OpenAI's spelling) and `code`
//    "invalid_type" / "invalid_value" / "missing_required_parameter" /
//    "unsupported_parameter"; a body that is not a JSON object is a 400 with
//    no param.
//  - Ranges: temperature [0, 2]; top_p (0, 1]; top_k -1 or 0 = off, else >= 1
//    (values above 2^31-1 are clamped, which is the same as off); min_p
//    [0, 1]; presence/frequency_penalty [-2, 2]; repetition_penalty > 0 and
//    finite; n 1..128; max_tokens / max_completion_tokens >= 1 (the engine
//    generates at least one token); seed any int64; stop a string or an array
//    of at most 4 non-empty strings; stop_token_ids (vLLM) ids >= 0;
//    completions' logprobs 0..5 (OpenAI's cap); chat's top_logprobs 0..20,
//    and only with logprobs true (any non-null top_logprobs needs it, as
//    OpenAI and vLLM say). Float ranges are checked after the conversion to
//    float, so the values handed on always pass SamplingParams::Validate().
//  - Not supported, so a 400 rather than silently different output:
//    completions' `suffix` (non-null), `echo` together with `logprobs` (the
//    engine has no prompt log-probabilities), `best_of` other than null or n,
//    a non-empty `logit_bias`, chat's `response_format` other than
//    {"type": "text"}, and message content parts other than text.
//  - `stream_options` is only allowed with `stream` true (OpenAI's rule).
//  - Chat: `max_completion_tokens` wins over the deprecated `max_tokens` when
//    both are given; neither means no limit. Content parts
//    [{"type": "text", "text": ...}, ...] are flattened into one string joined
//    with "\n" (vLLM's "string" content format); a missing content stays
//    missing.
//    `tools` (array) and `chat_template_kwargs` (object, vLLM) are kept for
//    the chat template; tool calls in the output are not parsed.
//  - Completions with several prompts and n > 1: choice index
//    prompt_index * n + j, as OpenAI numbers them. ToGenerationRequest seeds
//    choice i with seed + i (wrapping), so n > 1 choices differ and repeat.
//  - finish_reason: "stop", "length", and "abort" for FinishReason::kAbort
//    (vLLM's name; OpenAI has no such value); null in chunks before the last.
//  - Log-probabilities that are -inf (impossible tokens) are written as
//    -9999.0, as vLLM does: JSON has no infinity. Completions' text_offset
//    counts Unicode code points (Python's len(), as vLLM), and duplicate
//    token texts in a top_logprobs dict keep the first (most likely). Chat's
//    `bytes` are the token text's raw bytes. Invalid UTF-8 in any text is
//    written as U+FFFD.
#ifndef TESSERA_RUNTIME_SERVE_OPENAI_PROTOCOL_H_
#define TESSERA_RUNTIME_SERVE_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/generator.h"

namespace tessera {
namespace serve {

// An error reply: HTTP status plus OpenAI's error object.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // The offending field, or empty (written as null).
  std::string code;   // Empty is written as null.
};

// {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(const ApiError& error);

// 400 invalid_request_error.
ApiError InvalidRequest(std::string message, std::string param = "",
                        std::string code = "");
// 404 for a model other than the one served (OpenAI's wording and code
// "model_not_found", param "model").
ApiError ModelNotFound(const std::string& model);
// An engine status as an error reply: InvalidArgument / OutOfRange 400
// invalid_request_error, NotFound 404, ResourceExhausted 429,
// Unavailable 503, Cancelled 499, anything else 500 "server_error".
ApiError ApiErrorFromStatus(const absl::Status& status);

enum class Endpoint { kCompletions, kChat };

// One prompt of /v1/completions: text to tokenize, or token ids as given.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

// A parsed and validated request of either endpoint.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;

  // Completions: one or more prompts (never empty). An empty string is kept
  // (the tokenizer may add BOS); an empty id list is a 400.
  std::vector<Prompt> prompts;
  // Chat: the messages array (non-empty), each an object with a string
  // "role" and "content" a string, null or absent (content parts flattened
  // into a string); every other field of a message is kept as given.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;                 // null or an array.
  nlohmann::ordered_json chat_template_kwargs;  // null or an object.

  // Completions: 16 unless given (null = no limit). Chat: unset unless given.
  // Unset means until the context is full.
  std::optional<int64_t> max_tokens;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 = off (-1 is normalised to 0).
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t n = 1;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;

  // Whether log-probabilities are returned (completions: logprobs not null;
  // chat: logprobs true), and how many alternatives per token (completions:
  // logprobs; chat: top_logprobs, default 0).
  bool logprobs = false;
  int32_t top_logprobs = 0;

  bool echo = false;  // Completions only.
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage.
};

using ParseResult = std::variant<CompletionRequest, ApiError>;

// Parse and validate a request body of POST /v1/completions or
// POST /v1/chat/completions.
ParseResult ParseCompletionRequest(absl::string_view body);
ParseResult ParseChatRequest(absl::string_view body);

// The engine request for one choice: sampling parameters, stop strings and
// ids, ignore_eos, top_logprobs (0 when logprobs are off), and max_tokens
// (unset: std::numeric_limits<int64_t>::max(), which MaxNewTokens caps at the
// context). The seed, when given, becomes seed + choice_index (mod 2^64).
GenerationRequest ToGenerationRequest(const CompletionRequest& request,
                                      std::vector<int32_t> prompt_ids,
                                      int choice_index);

// A response id: prefix ("cmpl-", "chatcmpl-") and 32 random hex digits.
std::string RandomResponseId(absl::string_view prefix);

// What every response and chunk of one request shares.
struct ResponseHeader {
  std::string id;
  int64_t created = 0;  // Unix seconds.
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // When set, "prompt_tokens_details": {"cached_tokens": n} is added.
  std::optional<int64_t> cached_tokens;
};

// One alternative: the token's decoded text and its log-probability.
struct TokenAlternative {
  std::string token;
  float logprob = 0.0f;
};

// One generated token's log-probabilities.
struct TokenLogprob {
  std::string token;  // Decoded text of the sampled token.
  float logprob = 0.0f;
  std::vector<TokenAlternative> top;  // Most likely first.
};

// One choice of a response, or its part in one streamed chunk.
struct Choice {
  int index = 0;
  // Completions: the text (with echo, the prompt text first). Chat: the
  // message content (in a chunk, the delta's content).
  std::string text;
  // Unset: "logprobs": null.
  std::optional<std::vector<TokenLogprob>> logprobs;
  // Completions: the text_offset of the first token above (the length of
  // the text before it: the echoed prompt, earlier chunks).
  int64_t text_offset = 0;
  // Unset: null (a chunk that does not end the choice).
  std::optional<FinishReason> finish_reason;
  // Chat chunks: the choice's first chunk, whose delta carries
  // "role": "assistant" (and "content", even when empty).
  bool first = false;
};

// "stop" / "length" / "abort".
std::string FinishReasonString(FinishReason reason);

// {"id", "object": "text_completion", "created", "model",
//  "choices": [{"index", "text", "logprobs", "finish_reason"}],
//  "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
// logprobs: null or {"tokens", "token_logprobs", "top_logprobs" (a list of
// {token: logprob} objects), "text_offset"}.
std::string CompletionResponse(const ResponseHeader& header,
                               const std::vector<Choice>& choices,
                               const Usage& usage);

// {"id", "object": "chat.completion", "created", "model",
//  "choices": [{"index", "message": {"role": "assistant", "content"},
//               "logprobs", "finish_reason"}], "usage"}
// logprobs: null or {"content": [{"token", "logprob", "bytes",
//   "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
std::string ChatResponse(const ResponseHeader& header,
                         const std::vector<Choice>& choices,
                         const Usage& usage);

// One streamed chunk carrying one choice. With `include_usage` (the request's
// stream_options.include_usage) the chunk has "usage": null, as OpenAI sends.
// Completions: {"id", "object": "text_completion", "created", "model",
//               "choices": [{"index", "text", "logprobs", "finish_reason"}]}
// Chat: {"id", "object": "chat.completion.chunk", "created", "model",
//        "choices": [{"index", "delta", "logprobs", "finish_reason"}]}
// where delta is {"role": "assistant", "content": text} for the first chunk,
// {"content": text} when text is non-empty, else {}.
std::string CompletionChunk(const ResponseHeader& header, const Choice& choice,
                            bool include_usage = false);
std::string ChatChunk(const ResponseHeader& header, const Choice& choice,
                      bool include_usage = false);

// The last chunk before [DONE] with stream_options.include_usage:
// {"id", "object", "created", "model", "choices": [], "usage": {...}} where
// object is "text_completion" or "chat.completion.chunk".
std::string UsageChunk(Endpoint endpoint, const ResponseHeader& header,
                       const Usage& usage);

// A server-sent event: "data: <json>\n\n".
std::string SseEvent(absl::string_view json);
inline constexpr absl::string_view kSseDone = "data: [DONE]\n\n";

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model",
// "created", "owned_by": "tessera"}]}.
std::string ModelsResponse(const std::string& model_name, int64_t created);

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_OPENAI_PROTOCOL_H_
