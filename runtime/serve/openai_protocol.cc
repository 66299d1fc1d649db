#include "runtime/serve/openai_protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/core/json_limits.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/structured_output.h"
#include "runtime/serve/tool_choice.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

constexpr int64_t kDefaultCompletionMaxTokens = 16;
constexpr size_t kMaxRequestIdBytes = 256;
constexpr size_t kMaxQuotedValueBytes = 100;
constexpr size_t kMaxWarnedFieldBytes = 64;
constexpr size_t kMaxWarnedFields = 16;
constexpr size_t kMaxQuotedPathBytes = 200;
constexpr double kMinLogprob = -9999.0;
// Containers a tool call's arguments sit in within `messages`: the array,
// the message, tool_calls, the call and its function.
constexpr int kArgumentsNesting = 5;

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false,
                   Json::error_handler_t::replace);
}

// `text` cut to at most `max_bytes` at a UTF-8 character boundary, with
// "..." when cut.
std::string Cut(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
    --end;
  }
  return absl::StrCat(text.substr(0, end), "...");
}

// A value as quoted in an error message: its JSON, cut.
std::string Quote(const Json& value) {
  return Cut(Dump(value), kMaxQuotedValueBytes);
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
                   ", but got ", Quote(value), " instead."),
      param, "invalid_value");
}

ApiError Unsupported(const std::string& param, absl::string_view what) {
  return InvalidRequest(absl::StrCat(what, " is not supported."), param,
                        "unsupported_parameter");
}

ApiError Missing(const std::string& param) {
  return InvalidRequest(
      absl::StrCat("Missing required parameter: '", param, "'."), param,
      "missing_required_parameter");
}

// The field `key` of `body`, or nullptr when absent or null.
const Json* Field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}
Json* MutableField(Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// A value that asks for nothing: null, false, 0, "", [] or {}.
bool IsNoOp(const Json& value) {
  if (value.is_null()) return true;
  if (value.is_boolean()) return !value.get<bool>();
  if (value.is_number()) return value.get<double>() == 0.0;
  if (value.is_string()) return value.get_ref<const std::string&>().empty();
  return value.empty();  // Arrays and objects.
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
                     absl::string_view range, std::optional<float>* out) {
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
// array of arrays of token ids. Strings are moved out of the body.
MaybeError ParsePrompt(Json& body, CompletionRequest* request) {
  Json* prompt = MutableField(body, "prompt");
  if (prompt == nullptr) {
    return InvalidRequest("you must provide a prompt parameter", "prompt",
                          "missing_required_parameter");
  }
  if (prompt->is_string()) {
    request->prompts.emplace_back(std::move(prompt->get_ref<std::string&>()));
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
    }
    request->prompts.reserve(prompt->size());
    for (Json& element : *prompt) {
      request->prompts.emplace_back(std::move(element.get_ref<std::string&>()));
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
  std::vector<absl::string_view> texts;
  for (size_t j = 0; j < parts.size(); ++j) {
    const Json& part = parts[j];
    const std::string part_param = absl::StrCat(param, ".[", j, "]");
    if (!part.is_object()) return TypeError(part_param, "an object", part);
    const Json* type = Field(part, "type");
    if (type == nullptr) return Missing(part_param + ".type");
    if (!type->is_string()) {
      return TypeError(part_param + ".type", "a string", *type);
    }
    if (type->get_ref<const std::string&>() != "text") {
      return Unsupported(part_param + ".type",
                         absl::StrCat("Content part type ", Quote(*type),
                                      " (only \"text\" parts are supported)"));
    }
    const Json* text = Field(part, "text");
    if (text == nullptr) return Missing(part_param + ".text");
    if (!text->is_string()) {
      return TypeError(part_param + ".text", "a string", *text);
    }
    texts.push_back(text->get_ref<const std::string&>());
  }
  *out = absl::StrJoin(texts, "\n");
  return std::nullopt;
}

// An assistant message's tool_calls: function.arguments given as a JSON
// string (OpenAI's shape) become the JSON value it holds (what chat templates
// iterate over), bounded so that the messages stay within kMaxJsonDepth.
MaybeError ParseToolCalls(Json& tool_calls, const std::string& param) {
  if (!tool_calls.is_array()) {
    return TypeError(param, "an array of tool calls", tool_calls);
  }
  for (size_t j = 0; j < tool_calls.size(); ++j) {
    Json& call = tool_calls[j];
    const std::string call_param = absl::StrCat(param, ".[", j, "]");
    if (!call.is_object()) return TypeError(call_param, "an object", call);
    Json* function = MutableField(call, "function");
    if (function == nullptr) continue;
    if (!function->is_object()) {
      return TypeError(call_param + ".function", "an object", *function);
    }
    Json* arguments = MutableField(*function, "arguments");
    if (arguments == nullptr || !arguments->is_string()) continue;
    const std::string arguments_param = call_param + ".function.arguments";
    const std::string& text = arguments->get_ref<const std::string&>();
    if (absl::Status nesting =
            CheckJsonNesting(text, kMaxJsonDepth - kArgumentsNesting);
        !nesting.ok()) {
      return InvalidRequest(absl::StrCat("Invalid value for '", arguments_param,
                                         "': ", nesting.message(), "."),
                            arguments_param, "invalid_value");
    }
    Json parsed = Json::parse(text, /*cb=*/nullptr,
                              /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return InvalidRequest(
          absl::StrCat("Invalid value for '", arguments_param,
                       "': expected a string holding JSON, but got ",
                       Quote(*arguments), " instead."),
          arguments_param, "invalid_value");
    }
    *arguments = std::move(parsed);
  }
  return std::nullopt;
}

// The messages, moved out of the body and normalised in place.
MaybeError ParseMessages(Json& body, CompletionRequest* request) {
  Json* messages = MutableField(body, "messages");
  if (messages == nullptr) return Missing("messages");
  if (!messages->is_array()) {
    return TypeError("messages", "an array", *messages);
  }
  if (messages->empty()) {
    return ValueError("messages", "a non-empty array", *messages);
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    Json& message = (*messages)[i];
    const std::string param = absl::StrCat("messages.[", i, "]");
    if (!message.is_object()) return TypeError(param, "an object", message);
    const Json* role = Field(message, "role");
    if (role == nullptr) return Missing(param + ".role");
    if (!role->is_string()) {
      return TypeError(param + ".role", "a string", *role);
    }
    const bool assistant = role->get_ref<const std::string&>() == "assistant";
    Json& content = message["content"];  // Added ("" below) when absent.
    if (content.is_null()) {
      content = "";
    } else if (content.is_array()) {
      std::string text;
      TESSERA_API_RETURN_IF_ERROR(
          FlattenContent(content, param + ".content", &text));
      content = std::move(text);
    } else if (!content.is_string()) {
      return TypeError(param + ".content",
                       "a string, null or an array of content parts", content);
    }
    if (assistant) {
      if (Json* tool_calls = MutableField(message, "tool_calls")) {
        TESSERA_API_RETURN_IF_ERROR(
            ParseToolCalls(*tool_calls, param + ".tool_calls"));
      }
    }
  }
  request->messages = std::move(*messages);
  return std::nullopt;
}

MaybeError ParseStop(Json& body, CompletionRequest* request) {
  Json* stop = MutableField(body, "stop");
  if (stop == nullptr) return std::nullopt;
  if (stop->is_string()) {
    if (stop->get_ref<const std::string&>().empty()) {
      return ValueError("stop", "a non-empty string", *stop);
    }
    request->stop.push_back(std::move(stop->get_ref<std::string&>()));
    return std::nullopt;
  }
  if (!stop->is_array()) {
    return TypeError("stop", "a string or an array of strings", *stop);
  }
  for (size_t i = 0; i < stop->size(); ++i) {
    const Json& element = (*stop)[i];
    const std::string param = absl::StrCat("stop.[", i, "]");
    if (!element.is_string()) return TypeError(param, "a string", element);
    if (element.get_ref<const std::string&>().empty()) {
      return ValueError(param, "a non-empty string", element);
    }
  }
  request->stop.reserve(stop->size());
  for (Json& element : *stop) {
    request->stop.push_back(std::move(element.get_ref<std::string&>()));
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

// A grammar spec's EBNF, or a 400 naming `param` with the converter's
// message (an invalid schema, regex or grammar).
MaybeError ToGrammar(const grammar::StructuredOutput& spec,
                     const std::string& param, CompletionRequest* request) {
  absl::StatusOr<std::string> ebnf = grammar::StructuredOutputEbnf(spec);
  if (!ebnf.ok()) {
    return InvalidRequest(absl::StrCat("Invalid value for '", param,
                                       "': ", ebnf.status().message()),
                          param, "invalid_value");
  }
  request->grammar = *std::move(ebnf);
  return std::nullopt;
}

// A schema given as an object or as its JSON text (vLLM takes both).
MaybeError ReadSchema(const Json& value, const std::string& param,
                      grammar::StructuredOutput* spec) {
  spec->kind = grammar::StructuredOutput::Kind::kJsonSchema;
  if (value.is_object() || value.is_boolean()) {
    spec->schema = value;
    return std::nullopt;
  }
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (!CheckJsonNesting(text).ok()) {
      return ValueError(param, "a JSON schema nested at most 64 levels", value);
    }
    spec->schema = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (spec->schema.is_discarded()) {
      return ValueError(param, "a JSON schema (its text is not JSON)", value);
    }
    return std::nullopt;
  }
  return TypeError(param, "a JSON schema (an object or its JSON text)", value);
}

MaybeError ReadChoices(const Json& value, const std::string& param,
                       grammar::StructuredOutput* spec) {
  if (!value.is_array() || value.empty()) {
    return TypeError(param, "a non-empty array of strings", value);
  }
  spec->kind = grammar::StructuredOutput::Kind::kChoice;
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string() ||
        value[i].get_ref<const std::string&>().empty()) {
      return TypeError(absl::StrCat(param, ".[", i, "]"), "a non-empty string",
                       value[i]);
    }
    spec->choices.push_back(value[i].get<std::string>());
  }
  return std::nullopt;
}

MaybeError ReadText(const Json& value, const std::string& param,
                    grammar::StructuredOutput::Kind kind,
                    grammar::StructuredOutput* spec) {
  if (!value.is_string() || value.get_ref<const std::string&>().empty()) {
    return TypeError(param, "a non-empty string", value);
  }
  spec->kind = kind;
  spec->text = value.get<std::string>();
  return std::nullopt;
}

// Structured output, in any of the three spellings clients use (at most one
// per request): OpenAI's response_format (json_object, json_schema with
// name / schema / strict), vLLM's structured_outputs object (json, regex,
// choice, grammar, json_object) and its older guided_json / guided_regex /
// guided_choice / guided_grammar fields. Sets request->grammar.
MaybeError ParseStructuredOutput(const Json& body, CompletionRequest* request) {
  std::vector<std::pair<std::string, grammar::StructuredOutput>> specs;
  if (const Json* format = Field(body, "response_format")) {
    if (!format->is_object()) {
      return TypeError("response_format", "an object", *format);
    }
    const Json* type = Field(*format, "type");
    if (type == nullptr) return Missing("response_format.type");
    if (!type->is_string()) {
      return TypeError("response_format.type", "a string", *type);
    }
    const std::string& name = type->get_ref<const std::string&>();
    grammar::StructuredOutput spec;
    if (name == "json_object") {
      spec.kind = grammar::StructuredOutput::Kind::kJsonObject;
      specs.push_back({"response_format", spec});
    } else if (name == "json_schema") {
      const Json* js = Field(*format, "json_schema");
      if (js == nullptr) return Missing("response_format.json_schema");
      if (!js->is_object()) {
        return TypeError("response_format.json_schema", "an object", *js);
      }
      if (const Json* strict = Field(*js, "strict");
          strict != nullptr && !strict->is_boolean()) {
        return TypeError("response_format.json_schema.strict", "a boolean",
                         *strict);
      }
      // strict or not, the output follows the schema exactly (xgrammar's
      // behaviour in vLLM); no schema means any JSON value.
      const Json* schema = Field(*js, "schema");
      TESSERA_API_RETURN_IF_ERROR(
          ReadSchema(schema != nullptr ? *schema : Json(true),
                     "response_format.json_schema.schema", &spec));
      specs.push_back({"response_format.json_schema.schema", spec});
    } else if (name == "structural_tag") {
      return Unsupported("response_format",
                         "response_format \"structural_tag\"");
    } else if (name != "text") {
      return ValueError("response_format.type",
                        "\"text\", \"json_object\", \"json_schema\" or "
                        "\"structural_tag\"",
                        *type);
    }
  }
  using Kind = grammar::StructuredOutput::Kind;
  bool compact = false;
  if (const Json* so = Field(body, "structured_outputs")) {
    if (!so->is_object()) {
      return TypeError("structured_outputs", "an object", *so);
    }
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it->is_null()) continue;
      const std::string param = "structured_outputs." + it.key();
      grammar::StructuredOutput spec;
      if (it.key() == "json") {
        TESSERA_API_RETURN_IF_ERROR(ReadSchema(*it, param, &spec));
      } else if (it.key() == "regex") {
        TESSERA_API_RETURN_IF_ERROR(ReadText(*it, param, Kind::kRegex, &spec));
      } else if (it.key() == "choice") {
        TESSERA_API_RETURN_IF_ERROR(ReadChoices(*it, param, &spec));
      } else if (it.key() == "grammar") {
        TESSERA_API_RETURN_IF_ERROR(
            ReadText(*it, param, Kind::kGrammar, &spec));
      } else if (it.key() == "json_object") {
        if (!it->is_boolean()) return TypeError(param, "a boolean", *it);
        if (!it->get<bool>()) continue;
        spec.kind = Kind::kJsonObject;
      } else if (it.key() == "disable_any_whitespace") {
        if (!it->is_boolean()) return TypeError(param, "a boolean", *it);
        compact = it->get<bool>();
        continue;
      } else if (it.key() == "disable_fallback" ||
                 it.key() == "disable_additional_properties") {
        // Tessera never falls back to another backend, and allows no
        // undeclared property unless the schema says so.
        if (!it->is_boolean()) return TypeError(param, "a boolean", *it);
        continue;
      } else {
        return Unsupported(param, absl::StrCat("'", param, "'"));
      }
      specs.push_back({param, spec});
    }
  }
  for (const char* key :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    const Json* value = Field(body, key);
    if (value == nullptr) continue;
    grammar::StructuredOutput spec;
    const std::string k = key;
    if (k == "guided_json") {
      TESSERA_API_RETURN_IF_ERROR(ReadSchema(*value, k, &spec));
    } else if (k == "guided_regex") {
      TESSERA_API_RETURN_IF_ERROR(ReadText(*value, k, Kind::kRegex, &spec));
    } else if (k == "guided_choice") {
      TESSERA_API_RETURN_IF_ERROR(ReadChoices(*value, k, &spec));
    } else {
      TESSERA_API_RETURN_IF_ERROR(ReadText(*value, k, Kind::kGrammar, &spec));
    }
    specs.push_back({k, spec});
  }
  if (specs.empty()) return std::nullopt;
  specs[0].second.any_whitespace = !compact;
  if (specs.size() > 1) {
    return InvalidRequest(
        absl::StrCat("Only one kind of structured output may be given per "
                     "request; got '",
                     specs[0].first, "' and '", specs[1].first, "'."),
        specs[1].first, "invalid_value");
  }
  return ToGrammar(specs[0].second, specs[0].first, request);
}

// `tools`: an array of {"type": "function", "function": {"name",
// "description", "parameters", "strict"}}, the shape OpenAI and vLLM take.
MaybeError CheckTools(const Json& tools) {
  if (!tools.is_array()) return TypeError("tools", "an array", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = absl::StrCat("tools.[", i, "]");
    if (!tool.is_object()) return TypeError(param, "an object", tool);
    const Json* type = Field(tool, "type");
    if (type != nullptr && *type != "function") {
      return ValueError(param + ".type", "\"function\"", *type);
    }
    const Json* function = Field(tool, "function");
    if (function == nullptr) return Missing(param + ".function");
    if (!function->is_object()) {
      return TypeError(param + ".function", "an object", *function);
    }
    const Json* name = Field(*function, "name");
    if (name == nullptr) return Missing(param + ".function.name");
    if (!name->is_string() || name->get_ref<const std::string&>().empty()) {
      return TypeError(param + ".function.name", "a non-empty string", *name);
    }
    const Json* parameters = Field(*function, "parameters");
    if (parameters != nullptr && !parameters->is_object() &&
        !parameters->is_boolean()) {
      return TypeError(param + ".function.parameters",
                       "a JSON schema (an object)", *parameters);
    }
  }
  return std::nullopt;
}

// A schema-constrained tool_choice's grammar: each tool's parameters schema
// is converted on its own first, so that a bad one is a 400 naming it.
MaybeError ToolChoiceGrammar(const std::vector<size_t>& tools, Json schema,
                             CompletionRequest* request) {
  for (size_t i : tools) {
    absl::StatusOr<std::string> ebnf =
        grammar::JsonSchemaToEbnf(ToolParametersSchema(request->tools[i]));
    if (!ebnf.ok()) {
      const std::string param =
          absl::StrCat("tools.[", i, "].function.parameters");
      return InvalidRequest(absl::StrCat("Invalid value for '", param,
                                         "': ", ebnf.status().message()),
                            param, "invalid_value");
    }
  }
  grammar::StructuredOutput spec;
  spec.kind = grammar::StructuredOutput::Kind::kJsonSchema;
  spec.schema = std::move(schema);
  return ToGrammar(spec, "tool_choice", request);
}

// Chat's tools, tool_choice and parallel_tool_calls (vLLM's rules):
//  - tool_choice absent: "auto" when there are tools and the server parses
//    tool calls (--tool-call-parser), else "none" (the template still
//    renders the tools; the output is content);
//  - "none", or "auto" / "required" with an empty tools array: no calls;
//  - "auto": calls parsed out of the output, which needs the server's tool
//    call parser (vLLM's 400 otherwise);
//  - "required" and a named function: the output is forced through the
//    structured-output engine (tool_choice.h), so they cannot be combined
//    with another structured output;
//  - tool_choice with tools absent is a 400 (OpenAI's).
MaybeError ParseTools(Json& body, const ParseOptions& options,
                      CompletionRequest* request) {
  if (Json* tools = MutableField(body, "tools")) {
    TESSERA_API_RETURN_IF_ERROR(CheckTools(*tools));
    request->tools = std::move(*tools);
  }
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "parallel_tool_calls", &request->parallel_tool_calls));
  const bool has_tools = request->tools.is_array() && !request->tools.empty();
  const Json* choice = Field(body, "tool_choice");
  if (choice == nullptr) {
    request->tool_choice = has_tools && options.auto_tool_choice
                               ? ToolChoice::kAuto
                               : ToolChoice::kNone;
    return std::nullopt;
  }
  if (!choice->is_string() && !choice->is_object()) {
    return TypeError("tool_choice", "a string or an object", *choice);
  }
  if (choice->is_string() && *choice == "none") {
    request->tool_choice = ToolChoice::kNone;
    return std::nullopt;
  }
  if (choice->is_string() && *choice != "auto" && *choice != "required") {
    return ValueError("tool_choice",
                      "\"none\", \"auto\", \"required\" or a named function",
                      *choice);
  }
  if (!request->tools.is_array()) {
    return InvalidRequest("When using `tool_choice`, `tools` must be set.",
                          "tool_choice", "invalid_value");
  }
  if (choice->is_string() && !has_tools) {
    request->tool_choice = ToolChoice::kNone;  // Nothing to call.
    return std::nullopt;
  }
  if (*choice == "auto") {
    if (!options.auto_tool_choice) {
      return InvalidRequest(
          "\"auto\" tool_choice requires --enable-auto-tool-choice and "
          "--tool-call-parser to be set",
          "tool_choice", "unsupported_parameter");
    }
    request->tool_choice = ToolChoice::kAuto;
    return std::nullopt;
  }
  if (!request->grammar.empty()) {
    return InvalidRequest(
        "tool_choice \"required\" or a named function forces the output "
        "into tool calls; it cannot be combined with response_format or "
        "another structured output.",
        "tool_choice", "invalid_value");
  }
  if (*choice == "required") {
    request->tool_choice = ToolChoice::kRequired;
    std::vector<size_t> all(request->tools.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return ToolChoiceGrammar(
        all,
        RequiredToolCallsSchema(request->tools, request->parallel_tool_calls),
        request);
  }
  // {"type": "function", "function": {"name": "f"}}.
  const Json* type = Field(*choice, "type");
  if (type != nullptr && *type != "function") {
    return ValueError("tool_choice.type", "\"function\"", *type);
  }
  const Json* function = Field(*choice, "function");
  if (function == nullptr) return Missing("tool_choice.function");
  if (!function->is_object()) {
    return TypeError("tool_choice.function", "an object", *function);
  }
  const Json* name = Field(*function, "name");
  if (name == nullptr) return Missing("tool_choice.function.name");
  if (!name->is_string()) {
    return TypeError("tool_choice.function.name", "a string", *name);
  }
  for (size_t i = 0; i < request->tools.size(); ++i) {
    if (request->tools[i]["function"]["name"] == *name) {
      request->tool_choice = ToolChoice::kNamed;
      request->tool_name = name->get<std::string>();
      return ToolChoiceGrammar({i}, ToolParametersSchema(request->tools[i]),
                               request);
    }
  }
  return InvalidRequest(
      absl::StrCat("Invalid value for 'tool_choice.function.name': ",
                   Quote(*name), " is not the name of one of the tools."),
      "tool_choice.function.name", "invalid_value");
}

// Fields vLLM implements and Tessera does not. Flags and lists: a 400 unless
// the value asks for nothing (IsNoOp).
constexpr const char* kUnsupportedUnlessNoOp[] = {
    "use_beam_search",   "bad_words",
    "logits_processors", "return_tokens_as_token_ids",
    "return_token_ids",  "kv_transfer_params",
    "priority",
};
// The rest: a 400 for any value but null (prompt_logprobs 0 still asks for
// the prompt's log-probabilities, allowed_token_ids [] is an error in vLLM).
constexpr const char* kUnsupportedCommon[] = {
    "prompt_logprobs", "truncate_prompt_tokens",    "allowed_token_ids",
    "cache_salt",      "guided_whitespace_pattern", "structural_tag",
};
constexpr const char* kUnsupportedCompletions[] = {"prompt_embeds"};
constexpr const char* kUnsupportedChat[] = {"chat_template"};

// Fields each endpoint reads (the rest are reported as ignored).
constexpr const char* kHandledCommon[] = {
    "model",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "add_special_tokens",
    "stream",
    "stream_options",
    "best_of",
    "logit_bias",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "request_id",
    "echo",
    "max_tokens",
    "logprobs",
};
constexpr const char* kHandledCompletions[] = {"prompt", "suffix"};
constexpr const char* kHandledChat[] = {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "include_reasoning",
    "documents",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
};

// Non-null values of `names` (with `allow_no_op`: values that are not
// IsNoOp) are a 400 naming the field.
template <size_t N>
MaybeError CheckUnsupported(const Json& body, const char* const (&names)[N],
                            bool allow_no_op = false) {
  for (const char* name : names) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (allow_no_op && IsNoOp(*it)) continue;
    return Unsupported(name, absl::StrCat("'", name, "'"));
  }
  return std::nullopt;
}

const absl::flat_hash_set<absl::string_view>& HandledFields(Endpoint endpoint) {
  auto make = [](Endpoint e) {
    absl::flat_hash_set<absl::string_view> set;
    auto add = [&set](const auto& names) {
      for (const char* name : names) set.insert(name);
    };
    add(kHandledCommon);
    add(kUnsupportedUnlessNoOp);
    add(kUnsupportedCommon);
    if (e == Endpoint::kChat) {
      add(kHandledChat);
      add(kUnsupportedChat);
    } else {
      add(kHandledCompletions);
      add(kUnsupportedCompletions);
    }
    return set;
  };
  static const auto* const kCompletions =
      new absl::flat_hash_set<absl::string_view>(make(Endpoint::kCompletions));
  static const auto* const kChat =
      new absl::flat_hash_set<absl::string_view>(make(Endpoint::kChat));
  return endpoint == Endpoint::kChat ? *kChat : *kCompletions;
}

void CollectIgnored(const Json& body, CompletionRequest* request) {
  const auto& handled = HandledFields(request->endpoint);
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!handled.contains(it.key()))
      request->ignored_fields.push_back(it.key());
  }
  if (const Json* options = Field(body, "stream_options");
      options != nullptr && options->is_object()) {
    for (auto it = options->begin(); it != options->end(); ++it) {
      if (it.key() != "include_usage" && it.key() != "continuous_usage_stats") {
        request->ignored_fields.push_back("stream_options." + it.key());
      }
    }
  }
}

// The fields both endpoints share (everything but the input, max_tokens and
// logprobs).
MaybeError ParseCommon(Json& body, CompletionRequest* request) {
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(
      body, "temperature",
      [](float v) { return v >= 0.0f && std::isfinite(v); },
      "a finite number >= 0", &request->temperature));
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
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(body, "presence_penalty",
                                        openai_penalty, "a number in [-2, 2]",
                                        &presence_penalty));
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(body, "frequency_penalty",
                                        openai_penalty, "a number in [-2, 2]",
                                        &frequency_penalty));
  request->presence_penalty = presence_penalty.value_or(0.0f);
  request->frequency_penalty = frequency_penalty.value_or(0.0f);
  TESSERA_API_RETURN_IF_ERROR(ReadFloat(
      body, "repetition_penalty",
      [](float v) { return v > 0.0f && std::isfinite(v); },
      "a finite number > 0", &request->repetition_penalty));
  {
    std::optional<int64_t> n;
    TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "n", 1,
                                        std::numeric_limits<int32_t>::max(),
                                        "an integer >= 1", &n));
    if (n.has_value()) request->n = static_cast<int32_t>(*n);
  }
  TESSERA_API_RETURN_IF_ERROR(ReadInt(
      body, "seed", std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(), "a 64-bit integer", &request->seed));
  TESSERA_API_RETURN_IF_ERROR(ParseStop(body, request));
  TESSERA_API_RETURN_IF_ERROR(ParseStopTokenIds(body, request));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "ignore_eos", &request->ignore_eos));
  {
    std::optional<int64_t> min_tokens;
    TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "min_tokens", 0,
                                        std::numeric_limits<int64_t>::max(),
                                        "an integer >= 0", &min_tokens));
    request->min_tokens = min_tokens.value_or(0);
  }
  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "include_stop_str_in_output",
                                       &request->include_stop_str_in_output));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "skip_special_tokens", &request->skip_special_tokens));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "spaces_between_special_tokens",
               &request->spaces_between_special_tokens));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "add_special_tokens", &request->add_special_tokens));

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
    auto continuous = options->find("continuous_usage_stats");
    if (continuous != options->end() && !IsNoOp(*continuous)) {
      return Unsupported("stream_options.continuous_usage_stats",
                         "'stream_options.continuous_usage_stats' (usage in "
                         "every chunk)");
    }
  }

  if (const Json* best_of = Field(body, "best_of")) {
    int64_t v = 0;
    TESSERA_API_RETURN_IF_ERROR(AsInt64(*best_of, "best_of", &v));
    if (v < request->n) {
      return ValueError("best_of",
                        absl::StrCat("an integer >= n (", request->n, ")"),
                        *best_of);
    }
    if (v > request->n) {
      return Unsupported("best_of", "best_of greater than n");
    }
  }
  if (const Json* bias = Field(body, "logit_bias")) {
    if (!bias->is_object()) return TypeError("logit_bias", "an object", *bias);
    if (!bias->empty()) return Unsupported("logit_bias", "logit_bias");
  }
  TESSERA_API_RETURN_IF_ERROR(ParseStructuredOutput(body, request));
  if (const Json* id = Field(body, "request_id")) {
    if (!id->is_string()) return TypeError("request_id", "a string", *id);
    const std::string& text = id->get_ref<const std::string&>();
    if (text.empty() || text.size() > kMaxRequestIdBytes) {
      return ValueError("request_id", "a non-empty string of at most 256 bytes",
                        *id);
    }
    request->request_id = text;
  }
  TESSERA_API_RETURN_IF_ERROR(
      CheckUnsupported(body, kUnsupportedUnlessNoOp, /*allow_no_op=*/true));
  TESSERA_API_RETURN_IF_ERROR(CheckUnsupported(body, kUnsupportedCommon));
  return std::nullopt;
}

// min_tokens against the client's own max_tokens (vLLM's wording); defaults
// are checked once the prompt is known (CheckContextLength).
MaybeError CheckMinTokens(const CompletionRequest& request) {
  if (request.max_tokens.has_value() &&
      request.min_tokens > *request.max_tokens) {
    return InvalidRequest(
        absl::StrCat("min_tokens must be less than or equal to max_tokens=",
                     *request.max_tokens, ", got ", request.min_tokens, "."),
        "min_tokens", "invalid_value");
  }
  return std::nullopt;
}

int64_t MaxLogprobs(const ParseOptions& options) {
  return options.max_logprobs < 0 ? std::numeric_limits<int32_t>::max()
                                  : options.max_logprobs;
}

std::string LogprobsRange(const ParseOptions& options) {
  return options.max_logprobs < 0
             ? std::string("an integer >= 0")
             : absl::StrCat("an integer in [0, ", options.max_logprobs, "]");
}

Json NullIfEmpty(const std::string& s) {
  return s.empty() ? Json(nullptr) : Json(s);
}

// Checks the nesting before anything recurses over the document.
MaybeError ParseBody(absl::string_view text, Json* body) {
  if (absl::Status nesting = CheckJsonNesting(text); !nesting.ok()) {
    return InvalidRequest(absl::StrCat("The request body is not accepted: ",
                                       nesting.message(), "."),
                          "", "invalid_value");
  }
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
  return std::nullopt;
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
    offset += CountCodePoints(token.token);
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

// A chat choice's finish_reason: "tool_calls" for a choice that called
// tools and stopped (not for one cut by its length).
Json ChatFinishReasonJson(const Choice& choice) {
  if (choice.called_tools && choice.finish_reason == FinishReason::kStop) {
    return "tool_calls";
  }
  return FinishReasonJson(choice.finish_reason);
}

Json ToolCallJson(const ToolCallItem& call, bool delta) {
  Json json = Json::object();
  if (delta) json["index"] = call.index;
  if (call.id.has_value()) {
    json["id"] = *call.id;
    json["type"] = "function";
  }
  Json function = Json::object();
  if (call.name.has_value()) function["name"] = *call.name;
  function["arguments"] = call.arguments;
  json["function"] = std::move(function);
  return json;
}

Json ToolCallsJson(const std::vector<ToolCallItem>& calls, bool delta) {
  Json array = Json::array();
  for (const ToolCallItem& call : calls) {
    array.push_back(ToolCallJson(call, delta));
  }
  return array;
}

Json StopReasonJson(const std::optional<StopReason>& reason) {
  if (!reason.has_value()) return nullptr;
  if (const std::string* text = std::get_if<std::string>(&*reason)) {
    return *text;
  }
  return std::get<int32_t>(*reason);
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
  json["stop_reason"] = StopReasonJson(choice.stop_reason);
  return json;
}

Json ModelCardJson(const ModelCard& card) {
  Json json = Json::object();
  json["id"] = card.id;
  json["object"] = "model";
  json["created"] = card.created;
  json["owned_by"] = "tessera";
  json["root"] = card.root.empty() ? card.id : card.root;
  json["parent"] = nullptr;
  if (card.max_model_len.has_value()) {
    json["max_model_len"] = *card.max_model_len;
  }
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

ApiError ApiErrorFromTemplateStatus(const absl::Status& status) {
  return InvalidRequest(std::string(status.message()), "messages");
}

ApiError RouteNotFound(absl::string_view method, absl::string_view path) {
  ApiError error =
      InvalidRequest(absl::StrCat("Invalid URL (", Cut(method, 16), " ",
                                  Cut(path, kMaxQuotedPathBytes), ")"),
                     "", "not_found");
  error.http_status = 404;
  return error;
}

ApiError MethodNotAllowed(absl::string_view method, absl::string_view path,
                          absl::string_view allowed) {
  ApiError error = InvalidRequest(
      absl::StrCat("Method ", Cut(method, 16), " is not allowed for ",
                   Cut(path, kMaxQuotedPathBytes), " (allowed: ", allowed,
                   ")."),
      "", "method_not_allowed");
  error.http_status = 405;
  return error;
}

ApiError PromptTooLong(Endpoint endpoint, int64_t max_model_len,
                       int64_t prompt_tokens) {
  return InvalidRequest(
      absl::StrCat("This model's maximum context length is ", max_model_len,
                   " tokens. However, you requested ", prompt_tokens,
                   " tokens in the messages, Please reduce the length of the "
                   "messages."),
      endpoint == Endpoint::kChat ? "messages" : "prompt",
      "context_length_exceeded");
}

ApiError MaxTokensTooLarge(Endpoint endpoint, int64_t max_model_len,
                           int64_t prompt_tokens, int64_t max_tokens) {
  // Saturating: max_tokens may be as large as int64 allows.
  const int64_t total =
      max_tokens > std::numeric_limits<int64_t>::max() - prompt_tokens
          ? std::numeric_limits<int64_t>::max()
          : prompt_tokens + max_tokens;
  return InvalidRequest(
      absl::StrCat("This model's maximum context length is ", max_model_len,
                   " tokens. However, you requested ", total, " tokens (",
                   prompt_tokens, " in the messages, ", max_tokens,
                   " in the completion). Please reduce the length of the "
                   "messages or completion."),
      endpoint == Endpoint::kChat ? "messages" : "prompt",
      "context_length_exceeded");
}

ParseResult ParseCompletionRequest(absl::string_view text,
                                   const ParseOptions& options) {
  Json body;
  TESSERA_API_RETURN_IF_ERROR(ParseBody(text, &body));
  CompletionRequest request;
  request.endpoint = Endpoint::kCompletions;
  request.add_special_tokens = true;
  TESSERA_API_RETURN_IF_ERROR(ParseModel(body, &request));
  TESSERA_API_RETURN_IF_ERROR(ParsePrompt(body, &request));
  TESSERA_API_RETURN_IF_ERROR(ParseCommon(body, &request));

  // Absent: OpenAI's default of 16 (unless generation_config has one).
  // null: until the context is full.
  if (body.find("max_tokens") == body.end()) {
    request.default_max_tokens = kDefaultCompletionMaxTokens;
  }
  TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "max_tokens", 1,
                                      std::numeric_limits<int64_t>::max(),
                                      "an integer >= 1", &request.max_tokens));
  TESSERA_API_RETURN_IF_ERROR(CheckMinTokens(request));

  std::optional<int64_t> logprobs;
  TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "logprobs", 0, MaxLogprobs(options),
                                      LogprobsRange(options), &logprobs));
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
    if (!suffix->get_ref<const std::string&>().empty()) {
      return Unsupported("suffix", "suffix");
    }
  }
  TESSERA_API_RETURN_IF_ERROR(CheckUnsupported(body, kUnsupportedCompletions));
  CollectIgnored(body, &request);
  return request;
}

ParseResult ParseChatRequest(absl::string_view text,
                             const ParseOptions& options) {
  Json body;
  TESSERA_API_RETURN_IF_ERROR(ParseBody(text, &body));
  CompletionRequest request;
  request.endpoint = Endpoint::kChat;
  request.add_special_tokens = false;  // The template adds them.
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
  TESSERA_API_RETURN_IF_ERROR(CheckMinTokens(request));

  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "logprobs", &request.logprobs));
  {
    std::optional<int64_t> top_logprobs;
    TESSERA_API_RETURN_IF_ERROR(ReadInt(body, "top_logprobs", 0,
                                        MaxLogprobs(options),
                                        LogprobsRange(options), &top_logprobs));
    // vLLM's rule: asking for alternatives needs logprobs.
    if (top_logprobs.value_or(0) > 0 && !request.logprobs) {
      return InvalidRequest(
          "Invalid value for 'top_logprobs': 'logprobs' must be set to true "
          "when 'top_logprobs' is used.",
          "top_logprobs", "invalid_value");
    }
    if (request.logprobs) {
      request.top_logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
    }
  }

  TESSERA_API_RETURN_IF_ERROR(ParseTools(body, options, &request));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "include_reasoning", &request.include_reasoning));
  if (Json* documents = MutableField(body, "documents")) {
    if (!documents->is_array()) {
      return TypeError("documents", "an array of objects", *documents);
    }
    for (size_t i = 0; i < documents->size(); ++i) {
      if (!(*documents)[i].is_object()) {
        return TypeError(absl::StrCat("documents.[", i, "]"), "an object",
                         (*documents)[i]);
      }
    }
    request.documents = std::move(*documents);
  }
  if (Json* kwargs = MutableField(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return TypeError("chat_template_kwargs", "an object", *kwargs);
    }
    request.chat_template_kwargs = std::move(*kwargs);
  }

  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "add_generation_prompt", &request.add_generation_prompt));
  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "continue_final_message",
                                       &request.continue_final_message));
  const Json& last = request.messages.back();
  const bool last_is_assistant =
      last["role"].get_ref<const std::string&>() == "assistant";
  if (request.continue_final_message) {
    if (request.add_generation_prompt) {
      return InvalidRequest(
          "Cannot set both `continue_final_message` and "
          "`add_generation_prompt` to True (add_generation_prompt defaults to "
          "true; set it to false).",
          "continue_final_message", "invalid_value");
    }
    if (!last_is_assistant) {
      return InvalidRequest(
          "`continue_final_message` needs the final message to be the "
          "assistant's, to be continued.",
          "continue_final_message", "invalid_value");
    }
  }

  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "echo", &request.echo));
  if (request.echo && request.logprobs) {
    return Unsupported("echo",
                       "echo together with logprobs (prompt "
                       "log-probabilities)");
  }
  if (request.echo && last_is_assistant) {
    request.echo_text = last["content"].get<std::string>();
  }
  TESSERA_API_RETURN_IF_ERROR(CheckUnsupported(body, kUnsupportedChat));
  CollectIgnored(body, &request);
  return request;
}

std::string IgnoredFieldsWarning(const CompletionRequest& request) {
  if (request.ignored_fields.empty()) return "";
  std::vector<std::string> names;
  for (size_t i = 0; i < request.ignored_fields.size() && i < kMaxWarnedFields;
       ++i) {
    names.push_back(
        Dump(Json(Cut(request.ignored_fields[i], kMaxWarnedFieldBytes))));
  }
  std::string warning = absl::StrCat(
      "The following fields were present in the request but "
      "ignored: ",
      absl::StrJoin(names, ", "));
  if (request.ignored_fields.size() > kMaxWarnedFields) {
    absl::StrAppend(&warning, " and ",
                    request.ignored_fields.size() - kMaxWarnedFields, " more");
  }
  return warning;
}

std::optional<int64_t> ResolveMaxTokens(const CompletionRequest& request,
                                        const GenerationDefaults& defaults) {
  if (request.max_tokens.has_value()) return request.max_tokens;
  if (defaults.max_tokens.has_value()) return defaults.max_tokens;
  return request.default_max_tokens;
}

std::optional<ApiError> CheckContextLength(const CompletionRequest& request,
                                           const GenerationDefaults& defaults,
                                           int64_t prompt_tokens,
                                           int64_t max_model_len) {
  // vLLM's order: the client's max_tokens first (its message names the
  // prompt too), then a prompt that leaves no room.
  const int64_t room = max_model_len - prompt_tokens;
  if (request.max_tokens.has_value() && *request.max_tokens > room) {
    return MaxTokensTooLarge(request.endpoint, max_model_len, prompt_tokens,
                             *request.max_tokens);
  }
  if (room <= 0) {
    return PromptTooLong(request.endpoint, max_model_len, prompt_tokens);
  }
  const int64_t limit =
      std::min(ResolveMaxTokens(request, defaults)
                   .value_or(std::numeric_limits<int64_t>::max()),
               room);
  if (request.min_tokens > limit) {
    return InvalidRequest(
        absl::StrCat("min_tokens must be less than or equal to max_tokens=",
                     limit, ", got ", request.min_tokens, "."),
        "min_tokens", "invalid_value");
  }
  return std::nullopt;
}

GenerationRequest ToGenerationRequest(const CompletionRequest& request,
                                      std::vector<int32_t> prompt_ids,
                                      int choice_index,
                                      const GenerationDefaults& defaults) {
  GenerationRequest out;
  out.prompt_ids = std::move(prompt_ids);
  out.max_tokens = ResolveMaxTokens(request, defaults)
                       .value_or(std::numeric_limits<int64_t>::max());
  SamplingParams& sampling = out.sampling;
  sampling.temperature =
      request.temperature.value_or(defaults.temperature.value_or(1.0f));
  sampling.top_k = request.top_k.value_or(defaults.top_k.value_or(0));
  sampling.top_p = request.top_p.value_or(defaults.top_p.value_or(1.0f));
  sampling.min_p = request.min_p.value_or(defaults.min_p.value_or(0.0f));
  sampling.repetition_penalty = request.repetition_penalty.value_or(
      defaults.repetition_penalty.value_or(1.0f));
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
  out.min_tokens = request.min_tokens;
  out.include_stop_str_in_output = request.include_stop_str_in_output;
  out.skip_special_tokens = request.skip_special_tokens;
  out.spaces_between_special_tokens = request.spaces_between_special_tokens;
  out.grammar = request.grammar;
  return out;
}

nlohmann::ordered_json ChatTemplateContext(const CompletionRequest& request) {
  Json context = Json::object();
  if (!request.tools.is_null()) context["tools"] = request.tools;
  if (!request.documents.is_null()) context["documents"] = request.documents;
  if (request.chat_template_kwargs.is_object()) {
    for (auto it = request.chat_template_kwargs.begin();
         it != request.chat_template_kwargs.end(); ++it) {
      context[it.key()] = it.value();
    }
  }
  return context;
}

absl::StatusOr<std::string> ContinueFinalMessage(
    absl::string_view rendered, const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty() ||
      !messages.back().is_object()) {
    return absl::InvalidArgumentError(
        "continue_final_message: there is no final message");
  }
  auto content = messages.back().find("content");
  if (content == messages.back().end() || !content->is_string()) {
    return absl::InvalidArgumentError(
        "continue_final_message: the final message has no text content");
  }
  const std::string& final_message = content->get_ref<const std::string&>();
  const absl::string_view stripped = absl::StripAsciiWhitespace(final_message);
  const absl::string_view left_stripped =
      absl::StripLeadingAsciiWhitespace(final_message);
  const size_t at = rendered.rfind(stripped);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the final message does not appear in the "
        "chat after applying the chat template (the template may alter its "
        "content)");
  }
  // Where the template kept the message's trailing whitespace, keep it too.
  if (rendered.substr(at, left_stripped.size()) == left_stripped) {
    return std::string(rendered.substr(0, at + left_stripped.size()));
  }
  return std::string(rendered.substr(0, at + stripped.size()));
}

std::string RandomResponseId(absl::string_view prefix) {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%s%016x%016x", prefix, absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

std::string ResponseId(const CompletionRequest& request) {
  const absl::string_view prefix =
      request.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  if (request.request_id.has_value()) {
    return absl::StrCat(prefix, *request.request_id);
  }
  return RandomResponseId(prefix);
}

int64_t CountCodePoints(absl::string_view text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
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
    if (choice.text.empty() && !choice.tool_calls.empty()) {
      message["content"] = nullptr;
    } else {
      message["content"] = choice.text;
    }
    if (choice.reasoning.has_value()) {
      message["reasoning_content"] = *choice.reasoning;
    }
    if (!choice.tool_calls.empty()) {
      message["tool_calls"] = ToolCallsJson(choice.tool_calls, false);
    }
    Json entry = Json::object();
    entry["index"] = choice.index;
    entry["message"] = std::move(message);
    entry["logprobs"] = ChatLogprobs(choice);
    entry["finish_reason"] = ChatFinishReasonJson(choice);
    entry["stop_reason"] = StopReasonJson(choice.stop_reason);
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
  if (choice.reasoning.has_value() && !choice.reasoning->empty()) {
    delta["reasoning_content"] = *choice.reasoning;
  }
  if (!choice.tool_calls.empty()) {
    delta["tool_calls"] = ToolCallsJson(choice.tool_calls, true);
  }
  Json entry = Json::object();
  entry["index"] = choice.index;
  entry["delta"] = std::move(delta);
  entry["logprobs"] = ChatLogprobs(choice);
  entry["finish_reason"] = ChatFinishReasonJson(choice);
  // vLLM's chat chunks carry stop_reason only where the choice ends.
  if (choice.finish_reason.has_value()) {
    entry["stop_reason"] = StopReasonJson(choice.stop_reason);
  }
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

std::string ModelsResponse(const ModelCard& card) {
  Json json = Json::object();
  json["object"] = "list";
  json["data"] = Json::array({ModelCardJson(card)});
  return Dump(json);
}

std::string ModelResponse(const ModelCard& card) {
  return Dump(ModelCardJson(card));
}

std::string ModelsResponse(const std::string& model_name, int64_t created) {
  ModelCard card;
  card.id = model_name;
  card.created = created;
  return ModelsResponse(card);
}

std::string VersionResponse(absl::string_view version) {
  Json json = Json::object();
  json["version"] = std::string(version);
  return Dump(json);
}

// ---------------------------------------------------------------------------
// POST /tokenize and POST /detokenize (vLLM's; see the header).

namespace {

constexpr const char* kTokenizePromptFields[] = {
    "model", "prompt", "add_special_tokens", "return_token_strs"};
constexpr const char* kTokenizeChatFields[] = {"model",
                                               "messages",
                                               "add_generation_prompt",
                                               "continue_final_message",
                                               "add_special_tokens",
                                               "return_token_strs",
                                               "tools",
                                               "documents",
                                               "chat_template_kwargs",
                                               "chat_template"};
constexpr const char* kDetokenizeFields[] = {"model", "tokens"};

// /tokenize's and /detokenize's "model": optional (vLLM's Optional[str]:
// absent or null is the served model), else a non-empty string.
MaybeError ReadOptionalModel(const Json& body, std::string* model) {
  const Json* value = Field(body, "model");
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) return TypeError("model", "a string", *value);
  *model = value->get<std::string>();
  if (model->empty()) return ValueError("model", "a non-empty string", *value);
  return std::nullopt;
}

template <size_t N>
void CollectUnknown(const Json& body, const char* const (&known)[N],
                    std::vector<std::string>* ignored) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    bool found = false;
    for (const char* name : known) found = found || it.key() == name;
    if (!found) ignored->push_back(it.key());
  }
}

}  // namespace

TokenizeParseResult ParseTokenizeRequest(absl::string_view text) {
  Json body;
  TESSERA_API_RETURN_IF_ERROR(ParseBody(text, &body));
  TokenizeRequest out;
  CompletionRequest& request = out.request;
  TESSERA_API_RETURN_IF_ERROR(ReadOptionalModel(body, &request.model));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "return_token_strs", &out.return_token_strs));
  const bool chat = body.contains("messages");
  if (chat && body.contains("prompt")) {
    return InvalidRequest(
        "Give either 'prompt' or 'messages' to tokenize, not both.", "prompt",
        "invalid_value");
  }
  if (!chat) {
    request.endpoint = Endpoint::kCompletions;
    request.add_special_tokens = true;
    Json* prompt = MutableField(body, "prompt");
    if (prompt == nullptr) {
      return InvalidRequest("you must provide a prompt parameter (or messages)",
                            "prompt", "missing_required_parameter");
    }
    if (!prompt->is_string()) {
      return TypeError("prompt", "a string", *prompt);
    }
    request.prompts.emplace_back(std::move(prompt->get_ref<std::string&>()));
    TESSERA_API_RETURN_IF_ERROR(
        ReadBool(body, "add_special_tokens", &request.add_special_tokens));
    CollectUnknown(body, kTokenizePromptFields, &request.ignored_fields);
    return out;
  }
  request.endpoint = Endpoint::kChat;
  request.add_special_tokens = false;  // The template adds them (vLLM's).
  TESSERA_API_RETURN_IF_ERROR(ParseMessages(body, &request));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "add_special_tokens", &request.add_special_tokens));
  TESSERA_API_RETURN_IF_ERROR(
      ReadBool(body, "add_generation_prompt", &request.add_generation_prompt));
  TESSERA_API_RETURN_IF_ERROR(ReadBool(body, "continue_final_message",
                                       &request.continue_final_message));
  if (Json* tools = MutableField(body, "tools")) {
    if (!tools->is_array()) return TypeError("tools", "an array", *tools);
    request.tools = std::move(*tools);
  }
  if (Json* documents = MutableField(body, "documents")) {
    if (!documents->is_array()) {
      return TypeError("documents", "an array of objects", *documents);
    }
    for (size_t i = 0; i < documents->size(); ++i) {
      if (!(*documents)[i].is_object()) {
        return TypeError(absl::StrCat("documents.[", i, "]"), "an object",
                         (*documents)[i]);
      }
    }
    request.documents = std::move(*documents);
  }
  if (Json* kwargs = MutableField(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return TypeError("chat_template_kwargs", "an object", *kwargs);
    }
    request.chat_template_kwargs = std::move(*kwargs);
  }
  if (request.continue_final_message) {
    if (request.add_generation_prompt) {
      return InvalidRequest(
          "Cannot set both `continue_final_message` and "
          "`add_generation_prompt` to True (add_generation_prompt defaults to "
          "true; set it to false).",
          "continue_final_message", "invalid_value");
    }
    const Json& last = request.messages.back();
    if (last["role"].get_ref<const std::string&>() != "assistant") {
      return InvalidRequest(
          "`continue_final_message` needs the final message to be the "
          "assistant's, to be continued.",
          "continue_final_message", "invalid_value");
    }
  }
  TESSERA_API_RETURN_IF_ERROR(CheckUnsupported(body, kUnsupportedChat));
  CollectUnknown(body, kTokenizeChatFields, &request.ignored_fields);
  return out;
}

DetokenizeParseResult ParseDetokenizeRequest(absl::string_view text,
                                             int64_t vocab_size) {
  Json body;
  TESSERA_API_RETURN_IF_ERROR(ParseBody(text, &body));
  DetokenizeRequest out;
  TESSERA_API_RETURN_IF_ERROR(ReadOptionalModel(body, &out.model));
  const Json* tokens = Field(body, "tokens");
  if (tokens == nullptr) return Missing("tokens");
  if (!tokens->is_array()) {
    return TypeError("tokens", "an array of token ids", *tokens);
  }
  out.tokens.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    const std::string param = absl::StrCat("tokens.[", i, "]");
    int64_t id = 0;
    TESSERA_API_RETURN_IF_ERROR(AsInt64((*tokens)[i], param, &id));
    if (id < 0 || id >= vocab_size) {
      return ValueError(param,
                        absl::StrCat("a token id in [0, ", vocab_size - 1, "]"),
                        (*tokens)[i]);
    }
    out.tokens.push_back(static_cast<int32_t>(id));
  }
  CollectUnknown(body, kDetokenizeFields, &out.ignored_fields);
  return out;
}

std::string TokenizeResponse(
    const std::vector<int32_t>& tokens, int64_t max_model_len,
    const std::optional<std::vector<std::string>>& token_strs) {
  Json json = Json::object();
  json["count"] = static_cast<int64_t>(tokens.size());
  json["max_model_len"] = max_model_len;
  json["tokens"] = tokens;
  json["token_strs"] = token_strs ? Json(*token_strs) : Json(nullptr);
  return Dump(json);
}

std::string DetokenizeResponse(absl::string_view prompt) {
  Json json = Json::object();
  json["prompt"] = std::string(prompt);
  return Dump(json);
}

#undef TESSERA_API_RETURN_IF_ERROR

}  // namespace serve
}  // namespace tessera
