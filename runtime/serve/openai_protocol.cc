#include "runtime/serve/openai_protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxStops = 4;
constexpr int64_t kMaxN = 128;
constexpr int64_t kMaxCompletionLogprobs = 5;
constexpr int64_t kMaxChatTopLogprobs = 20;
constexpr int64_t kDefaultCompletionMaxTokens = 16;
constexpr double kMinLogprob = -9999.0;

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false,
                   Json::error_handler_t::replace);
}

// Errors are returned as an optional; nullopt means success.
using MaybeError = std::optional<ApiError>;

#define TESSERA_API_RETURN_IF_ERROR(expr)    \
  do {                                       \
    MaybeError tessera_api_error_ = (expr);  \
    if (tessera_api_error_.has_value()) {    \
      return std::move(*tessera_api_error_); \
    }                                        \
  } while (false)

ApiError TypeError(const std::string& param, absl::string_view expected,
                   const Json& value) {
  return InvalidRequest(
      absl::StrCat("Invalid type for '", param, "': expected ", expected,
                   ", but got ", value.type_name(), " instead."),
      param, "invalid_type");
}

ApiError ValueError(const std::string& param, absl::string_view expected,
                    const Json& value) {
  return InvalidRequest(
      absl::StrCat("Invalid value for '", param, "': expected ", expected,
                   ", but got ", Dump(value), " instead."),
      param, "invalid_value");
}

ApiError Unsupported(const std::string& param, absl::string_view what) {
  return InvalidRequest(absl::StrCat(what, " is not supported."), param,
                        "unsupported_parameter");
}

// The field `key` of `body`, or nullptr when absent or null.
const Json* Field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer, or an integral number written as a float (16.0).
MaybeError AsInt64(const Json& value, const std::string& param, int64_t* out) {
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    *out = value.get<int64_t>();
    return std::nullopt;
  }
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return ValueError(param, "a 64-bit signed integer", value);
    }
    *out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) {
      return TypeError(param, "an integer", value);
    }
    // 2^63 is exactly representable; anything at or above it overflows.
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
      return ValueError(param, "a 64-bit signed integer", value);
    }
    *out = static_cast<int64_t>(d);
    return std::nullopt;
  }
  return TypeError(param, "an integer", value);
}

// An optional integer field in [lo, hi]; untouched when absent or null.
MaybeError ReadInt(const Json& body, const char* key, int64_t lo, int64_t hi,
                   absl::string_view range, std::optional<int64_t>* out) {
  const Json* value = Field(body, key);
  if (value == nullptr) return std::nullopt;
  int64_t v = 0;
  TESSERA_API_RETURN_IF_ERROR(AsInt64(*value, key, &v));
  if (v < lo || v > hi) return ValueError(key, range, *value);
  *out = v;
  return std::nullopt;
}

// An optional number field; `check` tells whether the float value is in
// range. Untouched when absent or null.
template <typename Check>
MaybeError ReadFloat(const Json& body, const char* key, Check check,
                     absl::string_view range, float* out) {
  const Json* value = Field(body, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) return TypeError(key, "a number", *value);
  // Out of float's range is infinity (a plain cast would be undefined).
  const double d = value->get<double>();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr double kMax = std::numeric_limits<float>::max();
  const float f = d > kMax ? kInf : d < -kMax ? -kInf : static_cast<float>(d);
  if (!check(f)) return ValueError(key, range, *value);
  *out = f;
  return std::nullopt;
}

MaybeError ReadBool(const Json& body, const char* key, bool* out) {
  const Json* value = Field(body, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) return TypeError(key, "a boolean", *value);
  *out = value->get<bool>();
  return std::nullopt;
}

MaybeError ReadTokenId(const Json& value, const std::string& param,
                       int32_t* out) {
  int64_t id = 0;
  TESSERA_API_RETURN_IF_ERROR(AsInt64(value, param, &id));
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    return ValueError(param, "a token id in [0, 2147483647]", value);
  }
  *out = static_cast<int32_t>(id);
  return std::nullopt;
}

MaybeError ParseModel(const Json& body, CompletionRequest* request) {
  const Json* model = Field(body, "model");
  if (model == nullptr) {
    return InvalidRequest("you must provide a model parameter", "model",
                          "missing_required_parameter");
  }
  if (!model->is_string()) return TypeError("model", "a string", *model);
  request->model = model->get<std::string>();
  if (request->model.empty()) {
    return ValueError("model", "a non-empty string", *model);
  }
  return std::nullopt;
}

MaybeError ParseIdList(const Json& array, const std::string& param,
                       std::vector<int32_t>* ids) {
  ids->clear();
  ids->reserve(array.size());
  for (const Json& element : array) {
    int32_t id = 0;
    TESSERA_API_RETURN_IF_ERROR(ReadTokenId(element, param, &id));
    ids->push_back(id);
  }
  return std::nullopt;
}

// OpenAI's prompt: a string, an array of strings, an array of token ids or an
// array of arrays of token ids.
MaybeError ParsePrompt(const Json& body, CompletionRequest* request) {
  const Json* prompt = Field(body, "prompt");
  if (prompt == nullptr) {
    return InvalidRequest("you must provide a prompt parameter", "prompt",
                          "missing_required_parameter");
  }
  if (prompt->is_string()) {
    request->prompts.emplace_back(prompt->get<std::string>());
    return std::nullopt;
  }
  if (!prompt->is_array()) {
    return TypeError("prompt",
                     "a string, an array of strings, an array of token ids "
                     "or an array of arrays of token ids",
                     *prompt);
  }
  if (prompt->empty()) {
    return ValueError("prompt", "a non-empty array", *prompt);
  }
  const Json& first = prompt->front();
  if (first.is_string()) {
    for (const Json& element : *prompt) {
      if (!element.is_string()) {
        return InvalidRequest(
            "Invalid 'prompt': an array of strings must contain only strings.",
            "prompt", "invalid_type");
      }
      request->prompts.emplace_back(element.get<std::string>());
    }
    return std::nullopt;
  }
  if (first.is_number()) {
    std::vector<int32_t> ids;
    for (const Json& element : *prompt) {
      if (!element.is_number()) {
        return InvalidRequest(
            "Invalid 'prompt': an array of token ids must contain only "
            "integers.",
            "prompt", "invalid_type");
      }
    }
    TESSERA_API_RETURN_IF_ERROR(ParseIdList(*prompt, "prompt", &ids));
    request->prompts.emplace_back(std::move(ids));
    return std::nullopt;
  }
  if (first.is_array()) {
    for (const Json& element : *prompt) {
      if (!element.is_array()) {
        return InvalidRequest(
            "Invalid 'prompt': an array of token id arrays must contain only "
            "arrays.",
            "prompt", "invalid_type");
      }
      if (element.empty()) {
        return ValueError("prompt", "non-empty arrays of token ids", element);
      }
      for (const Json& id : element) {
        if (!id.is_number()) {
          return InvalidRequest(
              "Invalid 'prompt': an array of token ids must contain only "
              "integers.",
              "prompt", "invalid_type");
        }
      }
      std::vector<int32_t> ids;
      TESSERA_API_RETURN_IF_ERROR(ParseIdList(element, "prompt", &ids));
      request->prompts.emplace_back(std::move(ids));
    }
    return std::nullopt;
  }
  return TypeError("prompt",
                   "a string, an array of strings, an array of token ids or "
                   "an array of arrays of token ids",
                   *prompt);
}

// Flattens a message's content parts into one string.
MaybeError FlattenContent(const Json& parts, const std::string& param,
                          std::string* out) {
  std::vector<std::string> texts;
  for (size_t j = 0; j < parts.size(); ++j) {
    const Json& part = parts[j];
    const std::string part_param = absl::StrCat(param, ".[", j, "]");
    if (!part.is_object()) return TypeError(part_param, "an object", part);
    const Json* type = Field(part, "type");
    if (type == nullptr) {
      return InvalidRequest(
          absl::StrCat("Missing required parameter: '", part_param, ".type'."),
          part_param + ".type", "missing_required_parameter");
    }
    if (!type->is_string()) {
      return TypeError(part_param + ".type", "a string", *type);
    }
    if (type->get<std::string>() != "text") {
      return Unsupported(part_param + ".type",
                         absl::StrCat("Content part type ", Dump(*type),
                                      " (only \"text\" parts are supported)"));
    }
    const Json* text = Field(part, "text");
    if (text == nullptr) {
      return InvalidRequest(
          absl::StrCat("Missing required parameter: '", part_param, ".text'."),
          part_param + ".text", "missing_required_parameter");
    }
    if (!text->is_string()) {
      return TypeError(part_param + ".text", "a string", *text);
    }
    texts.push_back(text->get<std::string>());
  }
  *out = absl::StrJoin(texts, "\n");
  return std::nullopt;
}

MaybeError ParseMessages(const Json& body, CompletionRequest* request) {
  const Json* messages = Field(body, "messages");
  if (messages == nullptr) {
    return InvalidRequest("Missing required parameter: 'messages'.", "messages",
                          "missing_required_parameter");
  }
  if (!messages->is_array()) {
    return TypeError("messages", "an array", *messages);
  }
  if (messages->empty()) {
    return ValueError("messages", "a non-empty array", *messages);
  }
  request->messages = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    const std::string param = absl::StrCat("messages.[", i, "]");
    if (!message.is_object()) return TypeError(param, "an object", message);
    const Json* role = Field(message, "role");
    if (role == nullptr) {
      return InvalidRequest(
          absl::StrCat("Missing required parameter: '", param, ".role'."),
          param + ".role", "missing_required_parameter");
    }
    if (!role->is_string())
      return TypeError(param + ".role", "a string", *role);
    Json copy = message;
    auto content = message.find("content");
    if (content != message.end() && !content->is_null() &&
        !content->is_string()) {
      if (!content->is_array()) {
        return TypeError(param + ".content",
                         "a string, null or an array of content parts",
                         *content);
      }
      std::string text;
      TESSERA_API_RETURN_IF_ERROR(
          FlattenContent(*content, param + ".content", &text));
      copy["content"] = std::move(text);
    }
    request->messages.push_back(std::move(copy));
  }
  return std::nullopt;
}

MaybeError ParseStop(const Json& body, CompletionRequest* request) {
  const Json* stop = Field(body, "stop");
  if (stop == nullptr) return std::nullopt;
  if (stop->is_string()) {
    if (stop->get<std::string>().empty()) {
      return ValueError("stop", "a non-empty string", *stop);
    }
    request->stop.push_back(stop->get<std::string>());
    return std::nullopt;
  }
  if (!stop->is_array()) {
    return TypeError("stop", "a string or an array of strings", *stop);
  }
  if (stop->size() > kMaxStops) {
    return ValueError("stop", "an array of at most 4 strings", *stop);
  }
  for (size_t i = 0; i < stop->size(); ++i) {
    const Json& element = (*stop)[i];
    const std::string param = absl::StrCat("stop.[", i, "]");
    if (!element.is_string()) return TypeError(param, "a string", element);
    if (element.get<std::string>().empty()) {
      return ValueError(param, "a non-empty string", element);
    }
    request->stop.push_back(element.get<std::string>());
  }
  return std::nullopt;
}

MaybeError ParseStopTokenIds(const Json& body, CompletionRequest* request) {
  const Json* ids = Field(body, "stop_token_ids");
  if (ids == nullptr) return std::nullopt;
  if (!ids->is_array()) {
    return TypeError("stop_token_ids", "an array of token ids", *ids);
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    int32_t id = 0;
    TESSERA_API_RETURN_IF_ERROR(
        ReadTokenId((*ids)[i], absl::StrCat("stop_token_ids.[", i, "]"), &id));
    request->stop_token_ids.push_back(id);
  }
  return std::nullopt;
}

// The fields both endpoints share (everything but the input, max_tokens and
// logprobs).
MaybeError ParseCommon(const Json& body, CompletionRequest* request) {
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(
      body, "temperature", [](float v) { return v >= 0.0f && v <= 2.0f; },
      "a number in [0, 2]", &request->temperature));
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(
      body, "top_p", [](float v) { return v > 0.0f && v <= 1.0f; },
      "a number in (0, 1]", &request->top_p));
  {
    std::optional<int64_t> top_k;
    TESSERA_API_RETURN_IF_ERROR(
        ReadInt(body, "top_k", -1, std::numeric_limits<int64_t>::max(),
                "-1 or 0 (off) or an integer >= 1", &top_k));
    if (top_k.has_value()) {
      request->top_k = *top_k <= 0
                           ? 0
                           : static_cast<int32_t>(std::min<int64_t>(
                                 *top_k, std::numeric_limits<int32_t>::max()));
    }
  }
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(
      body, "min_p", [](float v) { return v >= 0.0f && v <= 1.0f; },
      "a number in [0, 1]", &request->min_p));
  auto openai_penalty = [](float v) { return v >= -2.0f && v <= 2.0f; };
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(body, "presence_penalty",
                                        openai_penalty, "a number in [-2, 2]",
                                        &request->presence_penalty));
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(body, "frequency_penalty",
                                        openai_penalty, "a number in [-2, 2]",
                                        &request->frequency_penalty));
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(
      body, "repetition_penalty",
      [](float v) { return v > 0.0f && std::isfinite(v); },
      "a finite number > 0", &request->repetition_penalty));
  {
    std::optional<int64_t> n;
    TESSERA_API_RETURN_IF_ERROR(
        ReadInt(body, "n", 1, kMaxN, "an integer in [1, 128]", &n));
    if (n.has_value()) request->n = static_cast<int32_t>(*n);
  }
  TESSERA_API_RETURN_IF_ERROR(ReadInt(
      body, "seed", std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(), "a 64-bit integer", &request->seed));
  TESSERA_API_RETURN_IF_ERROR(ParseStop(body, request));
  TESSERA_API_RETURN_IF_ERROR(ParseStopTokenIds(body, request));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "ignore_eos", &request->ignore_eos));

  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "stream", &request->stream));
  if (const Json* options = Field(body, "stream_options")) {
    if (!options->is_object()) {
      return TypeError("stream_options", "an object", *options);
    }
    if (!request->stream) {
      return InvalidRequest(
          "The 'stream_options' parameter is only allowed when 'stream' is "
          "enabled.",
          "stream_options", "invalid_value");
    }
    if (const Json* include = Field(*options, "include_usage")) {
      if (!include->is_boolean()) {
        return TypeError("stream_options.include_usage", "a boolean", *include);
      }
      request->include_usage = include->get<bool>();
    }
  }

  if (const Json* best_of = Field(body, "best_of")) {
    int64_t v = 0;
    TESSERA_API_RETURN_IF_ERROR(AsInt64(*best_of, "best_of", &v));
    if (v != request->n) {
      return Unsupported("best_of", "best_of other than n");
    }
  }
  if (const Json* bias = Field(body, "logit_bias")) {
    if (!bias->is_object()) return TypeError("logit_bias", "an object", *bias);
    if (!bias->empty()) return Unsupported("logit_bias", "logit_bias");
  }
  return std::nullopt;
}

Json NullIfEmpty(const std::string& s) {
  return s.empty() ? Json(nullptr) : Json(s);
}

ParseResult ParseBody(absl::string_view text, Json* body) {
  *body = Json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                      /*allow_exceptions=*/false);
  if (body->is_discarded()) {
    return InvalidRequest(
        "We could not parse the JSON body of your request. (HINT: This likely "
        "means you aren't using your HTTP library correctly. The OpenAI API "
        "expects a JSON payload, but what was sent was not valid JSON.)");
  }
  if (!body->is_object()) {
    return InvalidRequest(
        absl::StrCat("The request body must be a JSON "
                     "object, but got ",
                     body->type_name(), "."));
  }
  return CompletionRequest{};
}

// A log-probability as JSON: the float's shortest decimal form (so -0.1f is
// written -0.1, not -0.10000000149011612), and -9999.0 for -inf and NaN.
Json LogprobJson(float logprob) {
  if (!(logprob >= kMinLogprob)) return kMinLogprob;
  char buffer[64];
  const auto [end, ec] =
      std::to_chars(buffer, buffer + sizeof(buffer) - 1, logprob);
  if (ec != std::errc()) return static_cast<double>(logprob);
  *end = '\0';
  return std::strtod(buffer, nullptr);
}

// Unicode code points in UTF-8 text (bytes that are not continuation bytes).
int64_t CodePoints(const std::string& text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

Json Bytes(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

Json CompletionLogprobs(const Choice& choice) {
  if (!choice.logprobs.has_value()) return nullptr;
  Json tokens = Json::array();
  Json token_logprobs = Json::array();
  Json top_logprobs = Json::array();
  Json text_offset = Json::array();
  int64_t offset = choice.text_offset;
  for (const TokenLogprob& token : *choice.logprobs) {
    tokens.push_back(token.token);
    token_logprobs.push_back(LogprobJson(token.logprob));
    Json top = Json::object();
    for (const TokenAlternative& alternative : token.top) {
      if (top.contains(alternative.token)) continue;  // Keep the likelier.
      top[alternative.token] = LogprobJson(alternative.logprob);
    }
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += CodePoints(token.token);
  }
  Json logprobs = Json::object();
  logprobs["tokens"] = std::move(tokens);
  logprobs["token_logprobs"] = std::move(token_logprobs);
  logprobs["top_logprobs"] = std::move(top_logprobs);
  logprobs["text_offset"] = std::move(text_offset);
  return logprobs;
}

Json ChatLogprobEntry(const std::string& token, float logprob) {
  Json entry = Json::object();
  entry["token"] = token;
  entry["logprob"] = LogprobJson(logprob);
  entry["bytes"] = Bytes(token);
  return entry;
}

Json ChatLogprobs(const Choice& choice) {
  if (!choice.logprobs.has_value()) return nullptr;
  Json content = Json::array();
  for (const TokenLogprob& token : *choice.logprobs) {
    Json entry = ChatLogprobEntry(token.token, token.logprob);
    Json top = Json::array();
    for (const TokenAlternative& alternative : token.top) {
      top.push_back(ChatLogprobEntry(alternative.token, alternative.logprob));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  Json logprobs = Json::object();
  logprobs["content"] = std::move(content);
  return logprobs;
}

Json FinishReasonJson(const std::optional<FinishReason>& reason) {
  if (!reason.has_value()) return nullptr;
  return FinishReasonString(*reason);
}

Json UsageJson(const Usage& usage) {
  Json json = Json::object();
  json["prompt_tokens"] = usage.prompt_tokens;
  json["completion_tokens"] = usage.completion_tokens;
  json["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  if (usage.cached_tokens.has_value()) {
    Json details = Json::object();
    details["cached_tokens"] = *usage.cached_tokens;
    json["prompt_tokens_details"] = std::move(details);
  }
  return json;
}

Json Envelope(const ResponseHeader& header, absl::string_view object) {
  Json json = Json::object();
  json["id"] = header.id;
  json["object"] = object;
  json["created"] = header.created;
  json["model"] = header.model;
  return json;
}

Json CompletionChoiceJson(const Choice& choice) {
  Json json = Json::object();
  json["index"] = choice.index;
  json["text"] = choice.text;
  json["logprobs"] = CompletionLogprobs(choice);
  json["finish_reason"] = FinishReasonJson(choice.finish_reason);
  return json;
}

}  // namespace

std::string ErrorBody(const ApiError& error) {
  Json inner = Json::object();
  inner["message"] = error.message;
  inner["type"] = error.type;
  inner["param"] = NullIfEmpty(error.param);
  inner["code"] = NullIfEmpty(error.code);
  Json body = Json::object();
  body["error"] = std::move(inner);
  return Dump(body);
}

ApiError InvalidRequest(std::string message, std::string param,
                        std::string code) {
  ApiError error;
  error.http_status = 400;
  error.message = std::move(message);
  error.type = "invalid_request_error";
  error.param = std::move(param);
  error.code = std::move(code);
  return error;
}

ApiError ModelNotFound(const std::string& model) {
  ApiError error;
  error.http_status = 404;
  error.message = absl::StrCat("The model `", model, "` does not exist.");
  error.type = "invalid_request_error";
  error.param = "model";
  error.code = "model_not_found";
  return error;
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  ApiError error;
  error.message = std::string(status.message());
  error.type = "invalid_request_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      break;
    case absl::StatusCode::kResourceExhausted:
      error.http_status = 429;
      error.type = "rate_limit_error";
      break;
    case absl::StatusCode::kCancelled:
      error.http_status = 499;
      break;
    case absl::StatusCode::kUnavailable:
      error.http_status = 503;
      error.type = "server_error";
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
      break;
  }
  return error;
}

ParseResult ParseCompletionRequest(absl::string_view text) {
  Json body;
  ParseResult result = ParseBody(text, &body);
  if (std::holds_alternative<ApiError>(result)) return result;
  CompletionRequest& request = std::get<CompletionRequest>(result);
  request.endpoint = Endpoint::kCompletions;
  TESSERA_API_RETURN_IF_ERROR(ParseModel(body, &request));
  TESSERA_API_RETURN_IF_ERROR(ParsePrompt(body, &request));
  TESSERA_API_RETURN_IF_ERROR(ParseCommon(body, &request));

  // Absent: OpenAI's default of 16. null: no limit.
  auto max_tokens = body.find("max_tokens");
  if (max_tokens == body.end()) {
    request.max_tokens = kDefaultCompletionMaxTokens;
  } else {
    TESSERA_API_RETURN_IF_ERROR(
        ReadInt(body, "max_tokens", 1, std::numeric_limits<int64_t>::max(),
                "an integer >= 1", &request.max_tokens));
  }

  std::optional<int64_t> logprobs;
  TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "logprobs", 0,
                                      kMaxCompletionLogprobs,
                                      "an integer in [0, 5]", &logprobs));
  if (logprobs.has_value()) {
    request.logprobs = true;
    request.top_logprobs = static_cast<int32_t>(*logprobs);
  }
  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "echo", &request.echo));
  if (request.echo && request.logprobs) {
    return Unsupported("echo",
                       "echo together with logprobs (prompt "
                       "log-probabilities)");
  }
  if (const Json* suffix = Field(body, "suffix")) {
    if (!suffix->is_string()) return TypeError("suffix", "a string", *suffix);
    if (!suffix->get<std::string>().empty()) {
      return Unsupported("suffix", "suffix");
    }
  }
  return result;
}

ParseResult ParseChatRequest(absl::string_view text) {
  Json body;
  ParseResult result = ParseBody(text, &body);
  if (std::holds_alternative<ApiError>(result)) return result;
  CompletionRequest& request = std::get<CompletionRequest>(result);
  request.endpoint = Endpoint::kChat;
  TESSERA_API_RETURN_IF_ERROR(ParseModel(body, &request));
  TESSERA_API_RETURN_IF_ERROR(ParseMessages(body, &request));
  TESSERA_API_RETURN_IF_ERROR(ParseCommon(body, &request));

  // max_completion_tokens wins over the deprecated max_tokens; both are
  // validated.
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> max_completion_tokens;
  TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "max_tokens", 1,
                                      std::numeric_limits<int64_t>::max(),
                                      "an integer >= 1", &max_tokens));
  TESSERA_API_RETURN_IF_ERROR(ReadInt(
      body, "max_completion_tokens", 1, std::numeric_limits<int64_t>::max(),
      "an integer >= 1", &max_completion_tokens));
  request.max_tokens =
      max_completion_tokens.has_value() ? max_completion_tokens : max_tokens;

  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "logprobs", &request.logprobs));
  if (Field(body, "top_logprobs") != nullptr) {
    std::optional<int64_t> top_logprobs;
    TESSERA_API_RETURN_IF_ERROR(
        ReadInt(body, "top_logprobs", 0, kMaxChatTopLogprobs,
                "an integer in [0, 20]", &top_logprobs));
    if (!request.logprobs) {
      return InvalidRequest(
          "Invalid value for 'top_logprobs': 'logprobs' must be set to true "
          "when 'top_logprobs' is used.",
          "top_logprobs", "invalid_value");
    }
    request.top_logprobs = static_cast<int32_t>(*top_logprobs);
  }

  if (const Json* format = Field(body, "response_format")) {
    if (!format->is_object()) {
      return TypeError("response_format", "an object", *format);
    }
    const Json* type = Field(*format, "type");
    if (type == nullptr || !type->is_string() ||
        type->get<std::string>() != "text") {
      return Unsupported("response_format",
                         "response_format other than {\"type\": \"text\"}");
    }
  }
  if (const Json* tools = Field(body, "tools")) {
    if (!tools->is_array()) return TypeError("tools", "an array", *tools);
    request.tools = *tools;
  }
  if (const Json* kwargs = Field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return TypeError("chat_template_kwargs", "an object", *kwargs);
    }
    request.chat_template_kwargs = *kwargs;
  }
  return result;
}

GenerationRequest ToGenerationRequest(const CompletionRequest& request,
                                      std::vector<int32_t> prompt_ids,
                                      int choice_index) {
  GenerationRequest out;
  out.prompt_ids = std::move(prompt_ids);
  out.max_tokens =
      request.max_tokens.value_or(std::numeric_limits<int64_t>::max());
  SamplingParams& sampling = out.sampling;
  sampling.temperature = request.temperature;
  sampling.top_k = request.top_k;
  sampling.top_p = request.top_p;
  sampling.min_p = request.min_p;
  sampling.repetition_penalty = request.repetition_penalty;
  sampling.presence_penalty = request.presence_penalty;
  sampling.frequency_penalty = request.frequency_penalty;
  if (request.seed.has_value()) {
    sampling.seed = static_cast<uint64_t>(*request.seed) +
                    static_cast<uint64_t>(static_cast<int64_t>(choice_index));
  }
  out.ignore_eos = request.ignore_eos;
  out.stop_token_ids = request.stop_token_ids;
  out.stop = request.stop;
  out.top_logprobs = request.logprobs ? request.top_logprobs : 0;
  return out;
}

std::string RandomResponseId(absl::string_view prefix) {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%s%016x%016x", prefix, absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

std::string FinishReasonString(FinishReason reason) {
  return std::string(FinishReasonName(reason));
}

std::string CompletionResponse(const ResponseHeader& header,
                               const std::vector<Choice>& choices,
                               const Usage& usage) {
  Json json = Envelope(header, "text_completion");
  Json array = Json::array();
  for (const Choice& choice : choices) {
    array.push_back(CompletionChoiceJson(choice));
  }
  json["choices"] = std::move(array);
  json["usage"] = UsageJson(usage);
  return Dump(json);
}

std::string ChatResponse(const ResponseHeader& header,
                         const std::vector<Choice>& choices,
                         const Usage& usage) {
  Json json = Envelope(header, "chat.completion");
  Json array = Json::array();
  for (const Choice& choice : choices) {
    Json message = Json::object();
    message["role"] = "assistant";
    message["content"] = choice.text;
    Json entry = Json::object();
    entry["index"] = choice.index;
    entry["message"] = std::move(message);
    entry["logprobs"] = ChatLogprobs(choice);
    entry["finish_reason"] = FinishReasonJson(choice.finish_reason);
    array.push_back(std::move(entry));
  }
  json["choices"] = std::move(array);
  json["usage"] = UsageJson(usage);
  return Dump(json);
}

std::string CompletionChunk(const ResponseHeader& header, const Choice& choice,
                            bool include_usage) {
  Json json = Envelope(header, "text_completion");
  json["choices"] = Json::array({CompletionChoiceJson(choice)});
  if (include_usage) json["usage"] = nullptr;
  return Dump(json);
}

std::string ChatChunk(const ResponseHeader& header, const Choice& choice,
                      bool include_usage) {
  Json json = Envelope(header, "chat.completion.chunk");
  Json delta = Json::object();
  if (choice.first) delta["role"] = "assistant";
  if (choice.first || !choice.text.empty()) delta["content"] = choice.text;
  Json entry = Json::object();
  entry["index"] = choice.index;
  entry["delta"] = std::move(delta);
  entry["logprobs"] = ChatLogprobs(choice);
  entry["finish_reason"] = FinishReasonJson(choice.finish_reason);
  json["choices"] = Json::array({std::move(entry)});
  if (include_usage) json["usage"] = nullptr;
  return Dump(json);
}

std::string UsageChunk(Endpoint endpoint, const ResponseHeader& header,
                       const Usage& usage) {
  Json json =
      Envelope(header, endpoint == Endpoint::kChat ? "chat.completion.chunk"
                                                   : "text_completion");
  json["choices"] = Json::array();
  json["usage"] = UsageJson(usage);
  return Dump(json);
}

std::string SseEvent(absl::string_view json) {
  return absl::StrCat("data: ", json, "\n\n");
}

std::string ModelsResponse(const std::string& model_name, int64_t created) {
  Json model = Json::object();
  model["id"] = model_name;
  model["object"] = "model";
  model["created"] = created;
  model["owned_by"] = "tessera";
  Json json = Json::object();
  json["object"] = "list";
  json["data"] = Json::array({std::move(model)});
  return Dump(json);
}

#undef TESSERA_API_RETURN_IF_ERROR

}  // namespace serve
}  // namespace tessera
