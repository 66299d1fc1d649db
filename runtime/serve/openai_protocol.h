// The OpenAI-compatible HTTP API's protocol layer: request bodies of
// POST /v1/completions and POST /v1/chat/completions parsed and validated into
// a CompletionRequest, mapped onto the engine's GenerationRequest, and the
// response, streaming-chunk, model-list and error bodies built as JSON text.
// Pure functions: no HTTP, no engine, no tokenizer.
//
//   ParseOptions options;  // options.max_logprobs = --max-logprobs
//   auto parsed = ParseChatRequest(body, options);
//   if (const ApiError* error = std::get_if<ApiError>(&parsed)) {
//     Reply(error->http_status, ErrorBody(*error));
//   }
//   const CompletionRequest& request = std::get<CompletionRequest>(parsed);
//   if (std::string w = IgnoredFieldsWarning(request); !w.empty()) Warn(w);
//   ... render request.messages with ChatTemplateContext(request) and
//       request.add_generation_prompt, then ContinueFinalMessage if
//       request.continue_final_message; tokenize ...
//   if (auto e = CheckContextLength(request, defaults, ids.size(), len)) ...
//   GenerationRequest g = ToGenerationRequest(request, ids, choice, defaults);
//
// Field policy (vLLM's OpenAI server is the reference; nothing a client sends
// is dropped without a word):
//  - Implemented fields work as in vLLM (the list is CompletionRequest's
//    members below).
//  - Fields vLLM implements and Tessera does not are a 400 naming the field
//    with code "unsupported_parameter": any non-null value of
//    prompt_embeds, prompt_logprobs (0 too: it asks for the prompt's),
//    truncate_prompt_tokens, allowed_token_ids, cache_salt,
//    guided_whitespace_pattern, structural_tag, and
//    chat's chat_template (a per-request template); any value but the no-op
//    one (null, false, 0, an empty list or object) of use_beam_search,
//    bad_words, logits_processors, return_tokens_as_token_ids,
//    return_token_ids, kv_transfer_params, priority (no priority
//    scheduling) and stream_options.continuous_usage_stats; and best_of > n,
//    a non-empty suffix or logit_bias, response_format structural_tag, echo
//    with logprobs (prompt log-probabilities), chat's tool_choice "auto" on
//    a server without a tool-call parser, and content parts other than
//    text.
//  - Structured output, on both endpoints: response_format json_object /
//    json_schema (name, schema, strict), structured_outputs {json, regex,
//    choice, grammar, json_object}, guided_json / guided_regex /
//    guided_choice / guided_grammar; at most one per request; a bad schema,
//    regex or grammar is a 400 naming the field (CompletionRequest::grammar).
//    guided_decoding_backend is accepted and ignored (vLLM deprecated it).
//  - Fields vLLM accepts and ignores (user, length_penalty without beam
//    search, reasoning_effort, mm_processor_kwargs, vllm_xargs) and unknown
//    fields (store, metadata, service_tier, functions, ...: whatever the
//    endpoint does not know, also the other endpoint's fields, and unknown keys
//    of stream_options as "stream_options.KEY") are accepted and listed in
//    CompletionRequest::ignored_fields, in body order; the server logs
//    IgnoredFieldsWarning() as vLLM does.
//
// Other choices:
//  - A body nested deeper than kMaxJsonDepth (runtime/core/json_limits.h) is
//    a 400 before it is parsed, so nothing downstream (copies, the chat
//    template) recurses deeper than that.
//  - A field set to JSON null means "not given" (its default applies).
//  - Sampling fields the request leaves unset stay unset (std::optional) so
//    that ToGenerationRequest can apply generation_config.json's defaults to
//    them only (vLLM's --generation-config auto), else the API's own:
//    temperature 1, top_p 1, top_k 0 (off), min_p 0, repetition_penalty 1;
//    max_tokens: completions 16 when absent (null: until the context is
//    full), chat until the context is full.
//  - Integer fields accept integral numbers written as floats (16.0), as
//    vLLM's pydantic models do; 16.5 is a 400. Booleans are never numbers.
//  - Wrong JSON types and out-of-range values are 400 invalid_request_error
//    with `param` naming the field (array elements as "stop.[1]", message
//    fields as "messages.[0].content", OpenAI's spelling) and `code`
//    "invalid_type" / "invalid_value" / "missing_required_parameter" /
//    "unsupported_parameter"; a body that is not a JSON object is a 400 with
//    no param. Messages quote the value, cut to 100 bytes.
//  - Ranges (vLLM's where it is looser than OpenAI's legacy API):
//    temperature >= 0 and finite as a float; top_p (0, 1]; top_k -1 or 0 =
//    off, else >= 1 (values above 2^31-1 are clamped, which is the same as
//    off); min_p [0, 1]; presence/frequency_penalty [-2, 2];
//    repetition_penalty > 0 and finite; n >= 1 (up to 2^31-1: the server
//    bounds n times the prompts itself); best_of >= n; max_tokens /
//    max_completion_tokens >= 1; min_tokens >= 0 and <= max_tokens when
//    that is given; seed any int64; stop a string or an array of any number
//    of non-empty strings (the engine bounds their total bytes,
//    kMaxStopStringBytes); stop_token_ids ids >= 0 (at most
//    kMaxStopTokenIds, the engine's check); completions' logprobs and
//    chat's top_logprobs 0..ParseOptions::max_logprobs, chat's top_logprobs
//    > 0 only with logprobs true (vLLM's rule); request_id a string of at
//    most 256 bytes, non-empty. Float ranges are checked after the conversion
//    to float, so the values handed on always pass SamplingParams::Validate().
//  - `stream_options` is only allowed with `stream` true (OpenAI's rule).
//  - Chat: `max_completion_tokens` wins over the deprecated `max_tokens` when
//    both are given (both are validated). Every message's content becomes a
//    string: content parts [{"type": "text", "text": ...}, ...] are joined
//    with "\n" (vLLM's "string" content format), and null or absent content
//    is "" (as vLLM renders it, so an assistant message with tool_calls and
//    content null works with templates that concatenate content). Assistant
//    tool_calls' function.arguments given as a JSON string are parsed into
//    the object templates expect (vLLM does the same); bad JSON there is a
//    400 naming the field. Every other field of a message is kept as given.
//    `tools` (array of {"type": "function", "function": {"name", ...}}),
//    `documents` (array) and `chat_template_kwargs` (object) are kept for
//    the chat template. Tools (vLLM's rules): tool_choice absent is "auto"
//    when there are tools and ParseOptions::auto_tool_choice, else "none";
//    "auto" needs auto_tool_choice (a 400 otherwise, vLLM's); "required"
//    and a named function are enforced through the structured-output engine
//    (tool_choice.h; request.grammar is set, so neither may be combined with
//    response_format or guided_*), a name not among the tools is a 400, and
//    a tool's parameters schema the engine refuses is a 400 naming
//    "tools.[i].function.parameters"; parallel_tool_calls false allows one
//    call. include_reasoning (vLLM) is read for the reasoning parser.
//    add_generation_prompt and continue_final_message both true is a 400
//    (vLLM's rule; add_generation_prompt defaults to true), and
//    continue_final_message needs a final assistant message. `echo` (vLLM): the
//    reply starts with the final message's content when that message is the
//    assistant's (see echo_text); the reply's role is always "assistant".
//  - Completions with several prompts and n > 1: choice index
//    prompt_index * n + j, as OpenAI numbers them. ToGenerationRequest seeds
//    choice i with seed + i (wrapping), so n > 1 choices differ and repeat.
//  - finish_reason: "stop", "length", and "abort" for FinishReason::kAbort
//    (vLLM's name; OpenAI has no such value); null in chunks before the last.
//    stop_reason (vLLM): the stop string or stop token id that ended the
//    choice, else null; in every response choice and completions chunk, and
//    in the final chat chunk of a choice (vLLM's chat chunks omit it before).
//  - Log-probabilities that are -inf (impossible tokens) are written as
//    -9999.0, as vLLM does: JSON has no infinity. Completions' text_offset
//    counts Unicode code points (Python's len(), as vLLM; CountCodePoints),
//    and duplicate token texts in a top_logprobs dict keep the first (most
//    likely). Chat's `bytes` are the token text's raw bytes. Invalid UTF-8 in
//    any text is written as U+FFFD.
#ifndef TESSERA_RUNTIME_SERVE_OPENAI_PROTOCOL_H_
#define TESSERA_RUNTIME_SERVE_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/generation_defaults.h"
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

enum class Endpoint { kCompletions, kChat };

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
// A chat template's failure (a template's own raise_exception, a feature it
// uses that is not supported, a render resource limit) as an error reply:
// always 400 invalid_request_error, param "messages" — the request is what
// the template rejected, and a 429 would make clients retry it (vLLM answers
// template errors with 400 too).
ApiError ApiErrorFromTemplateStatus(const absl::Status& status);
// 404 for a path the server does not serve: OpenAI's "Invalid URL (METHOD
// /path)" (the path cut to 200 bytes), type invalid_request_error, code
// "not_found".
ApiError RouteNotFound(absl::string_view method, absl::string_view path);
// 405 for a served path with another method: "Method GET is not allowed for
// /v1/completions (allowed: POST).", code "method_not_allowed". The server
// also sends an Allow header.
ApiError MethodNotAllowed(absl::string_view method, absl::string_view path,
                          absl::string_view allowed);

// vLLM's context-length errors (400 invalid_request_error, param
// "messages" for chat and "prompt" for completions, code
// "context_length_exceeded"), in vLLM's words:
// a prompt that leaves no room for a token:
//   "This model's maximum context length is N tokens. However, you requested
//   P tokens in the messages, Please reduce the length of the messages."
// a requested max_tokens that does not fit after the prompt:
//   "This model's maximum context length is N tokens. However, you requested
//   M tokens (P in the messages, C in the completion). Please reduce the
//   length of the messages or completion."  (M = P + C)
ApiError PromptTooLong(Endpoint endpoint, int64_t max_model_len,
                       int64_t prompt_tokens);
ApiError MaxTokensTooLarge(Endpoint endpoint, int64_t max_model_len,
                           int64_t prompt_tokens, int64_t max_tokens);

// One prompt of /v1/completions: text to tokenize, or token ids as given.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

// What the parse functions take from the server's configuration.
struct ParseOptions {
  // The most log-probabilities per token a request may ask for (completions'
  // logprobs, chat's top_logprobs): vLLM's --max-logprobs. Negative: no limit.
  int32_t max_logprobs = 20;
  // The server parses tool calls out of chat output (--tool-call-parser):
  // tool_choice "auto" is allowed, and the default when tools are given.
  bool auto_tool_choice = false;
};

// Chat's tool_choice (ParseChatRequest says how it is resolved).
enum class ToolChoice {
  kNone,      // No tool calls: the output is content.
  kAuto,      // Calls parsed out of the output by the server's parser.
  kRequired,  // The output is forced to be a JSON array of calls.
  kNamed,     // The output is forced to be tool_name's arguments.
};

// A parsed and validated request of either endpoint.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;

  // Completions: one or more prompts (never empty). An empty string is kept
  // (the tokenizer may add BOS); an empty id list is a 400.
  std::vector<Prompt> prompts;
  // Chat: the messages array (non-empty), each an object with a string
  // "role" and a string "content" (parts flattened; null or absent is ""),
  // assistant tool_calls' arguments as objects; other fields as given.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null or an array.
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_name;            // kNamed: the function.
  bool parallel_tool_calls = true;  // false: at most one call.
  // vLLM's include_reasoning: with a reasoning parser, whether the reply
  // carries reasoning_content (false: the reasoning is dropped).
  bool include_reasoning = true;
  nlohmann::ordered_json documents;             // null or an array (vLLM).
  nlohmann::ordered_json chat_template_kwargs;  // null or an object (vLLM).
  // Chat (vLLM): render with the template's generation prompt (default
  // true); or leave the final (assistant) message open for the model to
  // continue (default false; needs add_generation_prompt false).
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  // Add the tokenizer's special tokens (BOS) to the prompt: completions
  // default true, chat default false (the template adds them), as vLLM.
  bool add_special_tokens = true;

  // The client's limit on generated tokens: completions' max_tokens, chat's
  // max_completion_tokens else max_tokens; unset when absent or null.
  std::optional<int64_t> max_tokens;
  // The endpoint's own default when max_tokens is unset and
  // generation_config gives none: 16 for completions whose max_tokens was
  // absent (OpenAI's), unset (until the context is full) otherwise.
  std::optional<int64_t> default_max_tokens;
  int64_t min_tokens = 0;  // vLLM: EOS and stop ids cannot end it before.
  // Unset: generation_config's value, else the API's default (see above).
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;  // 0 = off (-1 is normalised to 0).
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t n = 1;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;    // vLLM.
  bool skip_special_tokens = true;            // vLLM.
  bool spaces_between_special_tokens = true;  // vLLM.

  // Whether log-probabilities are returned (completions: logprobs not null;
  // chat: logprobs true), and how many alternatives per token (completions:
  // logprobs; chat: top_logprobs, default 0).
  bool logprobs = false;
  int32_t top_logprobs = 0;

  // Completions: the reply starts with the prompt text. Chat (vLLM): the
  // reply starts with echo_text.
  bool echo = false;
  // Chat with echo: the final message's content when its role is
  // "assistant" (the reply's role), else empty. Empty for completions.
  std::string echo_text;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage.
  // vLLM's request_id: the response id is the endpoint's prefix plus it
  // (ResponseId).
  std::optional<std::string> request_id;

  // Fields present in the body that have no effect (see the policy above),
  // in body order.
  std::vector<std::string> ignored_fields;
  // Structured output (response_format json_object / json_schema,
  // structured_outputs, guided_json / guided_regex / guided_choice /
  // guided_grammar): the grammar every choice's output follows, as EBNF
  // (runtime/grammar); empty when the request has none.
  std::string grammar;
};

using ParseResult = std::variant<CompletionRequest, ApiError>;

// Parse and validate a request body of POST /v1/completions or
// POST /v1/chat/completions.
ParseResult ParseCompletionRequest(absl::string_view body,
                                   const ParseOptions& options = {});
ParseResult ParseChatRequest(absl::string_view body,
                             const ParseOptions& options = {});

// vLLM's log line for a request with ignored fields: "The following fields
// were present in the request but ignored: \"user\", \"store\"" (names as
// JSON strings, each cut to 64 bytes, at most 16 then "and N more"); empty
// when there are none.
std::string IgnoredFieldsWarning(const CompletionRequest& request);

// The limit on generated tokens a request resolves to before the context
// caps it: the client's max_tokens, else generation_config's
// max_new_tokens, else request.default_max_tokens; unset = until the
// context is full.
std::optional<int64_t> ResolveMaxTokens(const CompletionRequest& request,
                                        const GenerationDefaults& defaults);

// vLLM's length checks of one prompt of `prompt_tokens` tokens against a
// context of `max_model_len`, before it is submitted (all 400s):
//  - prompt_tokens >= max_model_len: PromptTooLong;
//  - the client's own max_tokens with prompt_tokens + max_tokens >
//    max_model_len: MaxTokensTooLarge. A default limit (16,
//    generation_config's) is capped at the room left instead;
//  - min_tokens above the limit that applies (the resolved max_tokens capped
//    at the room left): "min_tokens must be less than or equal to
//    max_tokens=X, got Y." (vLLM's), param "min_tokens".
std::optional<ApiError> CheckContextLength(const CompletionRequest& request,
                                           const GenerationDefaults& defaults,
                                           int64_t prompt_tokens,
                                           int64_t max_model_len);

// The engine request for one choice: sampling parameters (the request's,
// else `defaults`' for the fields it left unset, else the API's), stop
// strings and ids, ignore_eos, min_tokens, include_stop_str_in_output, the
// special-token options, top_logprobs (0 when logprobs are off), and
// max_tokens = ResolveMaxTokens (unset: std::numeric_limits<int64_t>::max(),
// which MaxNewTokens caps at the context). The seed, when given, becomes
// seed + choice_index (mod 2^64). The server passes the model's
// generation_config defaults (empty with --generation-config vllm).
GenerationRequest ToGenerationRequest(const CompletionRequest& request,
                                      std::vector<int32_t> prompt_ids,
                                      int choice_index,
                                      const GenerationDefaults& defaults = {});

// Chat: the extra context for ChatTemplate::Render — "tools" and
// "documents" when given, then chat_template_kwargs' keys (which win, as in
// vLLM). An empty object when there is none.
nlohmann::ordered_json ChatTemplateContext(const CompletionRequest& request);

// continue_final_message (vLLM, after transformers): cuts `rendered` (the
// messages rendered without a generation prompt) right after the last
// occurrence of the final message's content, so that whatever the template
// puts after it (end-of-turn tokens) is dropped and the model continues the
// message. Trailing whitespace of the content is kept only where the
// template kept it. InvalidArgument when the content does not appear in the
// rendered text.
absl::StatusOr<std::string> ContinueFinalMessage(
    absl::string_view rendered, const nlohmann::ordered_json& messages);

// A response id: prefix ("cmpl-", "chatcmpl-") and 32 random hex digits.
std::string RandomResponseId(absl::string_view prefix);
// The response id of `request`: "cmpl-" / "chatcmpl-" plus its request_id
// when given (vLLM), else RandomResponseId.
std::string ResponseId(const CompletionRequest& request);

// Unicode code points in UTF-8 text (bytes that are not continuation
// bytes): Python's len() of the text, which vLLM's text_offset counts. The
// server counts streamed text with it too, so both agree.
int64_t CountCodePoints(absl::string_view text);

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

// One tool call of a chat choice, or its part in a streamed chunk:
// {"id", "type": "function", "function": {"name", "arguments"}} in a
// response; in a chunk {"index", "id", "type", "function": {"name",
// "arguments"}} for a call's first delta and {"index", "function":
// {"arguments"}} for the rest (OpenAI's and vLLM's deltas).
struct ToolCallItem {
  int index = 0;                    // Among the choice's calls.
  std::optional<std::string> id;    // Unset: a later delta of the call.
  std::optional<std::string> name;  // Set with id.
  std::string arguments;            // JSON text (a chunk: its next piece).
};

// One choice of a response, or its part in one streamed chunk.
struct Choice {
  int index = 0;
  // Completions: the text (with echo, the prompt text first). Chat: the
  // message content (in a chunk, the delta's content).
  std::string text;
  // Unset: "logprobs": null.
  std::optional<std::vector<TokenLogprob>> logprobs;
  // Completions: the text_offset of the first token above (the code points
  // of the text before it: the echoed prompt, earlier chunks).
  int64_t text_offset = 0;
  // Unset: null (a chunk that does not end the choice).
  std::optional<FinishReason> finish_reason;
  // GenerationResult::stop_reason: the stop string (a JSON string) or stop
  // token id (a JSON number); unset is null.
  std::optional<StopReason> stop_reason;
  // Chat chunks: the choice's first chunk, whose delta carries
  // "role": "assistant" (and "content", even when empty).
  bool first = false;
  // Chat with a reasoning parser: the reasoning (a chunk: its delta);
  // unset: no "reasoning_content" (a chunk: none in this delta).
  std::optional<std::string> reasoning;
  // Chat: tool calls (a chunk: the calls' deltas in it). With calls, an
  // empty text is written as "content": null.
  std::vector<ToolCallItem> tool_calls;
  // The choice ended by calling tools: finish_reason "tool_calls" where
  // the engine says "stop" (vLLM's).
  bool called_tools = false;
};

// "stop" / "length" / "abort"; a choice's finish_reason is "tool_calls"
// when it called tools and the engine says "stop".
std::string FinishReasonString(FinishReason reason);

// {"id", "object": "text_completion", "created", "model",
//  "choices": [{"index", "text", "logprobs", "finish_reason",
//               "stop_reason"}],
//  "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
// logprobs: null or {"tokens", "token_logprobs", "top_logprobs" (a list of
// {token: logprob} objects), "text_offset"}.
std::string CompletionResponse(const ResponseHeader& header,
                               const std::vector<Choice>& choices,
                               const Usage& usage);

// {"id", "object": "chat.completion", "created", "model",
//  "choices": [{"index", "message": {"role": "assistant", "content",
//                                    "reasoning_content"?, "tool_calls"?},
//               "logprobs", "finish_reason", "stop_reason"}], "usage"}
// logprobs: null or {"content": [{"token", "logprob", "bytes",
//   "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
std::string ChatResponse(const ResponseHeader& header,
                         const std::vector<Choice>& choices,
                         const Usage& usage);

// One streamed chunk carrying one choice. With `include_usage` (the request's
// stream_options.include_usage) the chunk has "usage": null, as OpenAI sends.
// Completions: {"id", "object": "text_completion", "created", "model",
//               "choices": [{"index", "text", "logprobs", "finish_reason",
//                            "stop_reason"}]}
// Chat: {"id", "object": "chat.completion.chunk", "created", "model",
//        "choices": [{"index", "delta", "logprobs", "finish_reason"}]}
// where delta is {"role": "assistant", "content": text} for the first chunk,
// {"content": text} when text is non-empty, else {}, plus
// "reasoning_content" when the chunk has reasoning and "tool_calls" when it
// has call deltas; a chat chunk with a finish_reason (the choice's last)
// also has "stop_reason".
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

// The served model, as GET /v1/models lists it (vLLM's ModelCard).
struct ModelCard {
  std::string id;                        // The served model name.
  int64_t created = 0;                   // Unix seconds (the server's start).
  std::string root;                      // The model folder; empty: the id.
  std::optional<int64_t> max_model_len;  // Unset: not written.
};

// GET /v1/models: {"object": "list", "data": [card]} where card is
// {"id", "object": "model", "created", "owned_by": "tessera", "root",
//  "parent": null, "max_model_len"}.
std::string ModelsResponse(const ModelCard& card);
// GET /v1/models/{id}: the card alone.
std::string ModelResponse(const ModelCard& card);
// The list without max_model_len and root = id (kept for older callers).
std::string ModelsResponse(const std::string& model_name, int64_t created);

// GET /version: {"version": "<version>"} (vLLM's).
std::string VersionResponse(absl::string_view version);

// ---------------------------------------------------------------------------
// POST /tokenize and POST /detokenize: vLLM's request and response shapes
// (not part of OpenAI's API).
//
// /tokenize takes a prompt,
//   {"model", "prompt": "...", "add_special_tokens" (default true),
//    "return_token_strs" (default false)}
// or a conversation, told apart by the presence of "messages" (vLLM's union;
// both is a 400),
//   {"model", "messages", "add_generation_prompt" (default true),
//    "continue_final_message" (default false), "add_special_tokens" (default
//    false: the template adds them), "tools", "documents",
//    "chat_template_kwargs", "return_token_strs"}
// with messages, tools, documents and chat_template_kwargs checked as
// ParseChatRequest checks them (the same rules for add_generation_prompt and
// continue_final_message; "chat_template" is unsupported). "model" may be
// absent or null (vLLM's Optional: the served model). Other fields are
// listed in ignored_fields. Sizes are bounded by the request body's limit;
// the server bounds the token count (openai_server.h).
struct TokenizeRequest {
  // As the completion path (endpoint kCompletions, prompts = {prompt}) or
  // the chat path (endpoint kChat, messages and the template fields)
  // renders and tokenizes it; only the fields above are set. model: empty
  // when not given.
  CompletionRequest request;
  bool return_token_strs = false;
};
using TokenizeParseResult = std::variant<TokenizeRequest, ApiError>;
TokenizeParseResult ParseTokenizeRequest(absl::string_view body);

// /detokenize: {"model", "tokens": [ids]}; every id an integer (16.0 too) in
// [0, vocab_size), else a 400 naming "tokens.[i]". model as /tokenize's.
struct DetokenizeRequest {
  std::string model;  // Empty when not given.
  std::vector<int32_t> tokens;
  std::vector<std::string> ignored_fields;
};
using DetokenizeParseResult = std::variant<DetokenizeRequest, ApiError>;
DetokenizeParseResult ParseDetokenizeRequest(absl::string_view body,
                                             int64_t vocab_size);

// {"count", "max_model_len", "tokens": [...], "token_strs": null or [...]}
// (vLLM's TokenizeResponse, in its field order).
std::string TokenizeResponse(
    const std::vector<int32_t>& tokens, int64_t max_model_len,
    const std::optional<std::vector<std::string>>& token_strs);
// {"prompt": "..."} (vLLM's DetokenizeResponse).
std::string DetokenizeResponse(absl::string_view prompt);

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_OPENAI_PROTOCOL_H_
