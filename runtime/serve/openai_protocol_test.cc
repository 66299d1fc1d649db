#include "runtime/serve/openai_protocol.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/generator.h"
#include "runtime/sampler/sampler.h"

namespace tessera {
namespace serve {
namespace {

using ::nlohmann::ordered_json;

// A completions body with model and prompt plus `extra` fields.
std::string CompletionBody(const std::string& extra = "") {
  return absl::StrCat(R"({"model": "m", "prompt": "hi")",
                      extra.empty() ? "" : ", ", extra, "}");
}

// A chat body with model and one user message plus `extra` fields.
std::string ChatBody(const std::string& extra = "") {
  return absl::StrCat(
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])",
      extra.empty() ? "" : ", ", extra, "}");
}

CompletionRequest Ok(const ParseResult& result) {
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "unexpected error: " << ErrorBody(*error);
    return {};
  }
  return std::get<CompletionRequest>(result);
}

ApiError Err(const ParseResult& result) {
  if (std::holds_alternative<CompletionRequest>(result)) {
    ADD_FAILURE() << "expected an error, got a request";
    return {};
  }
  return std::get<ApiError>(result);
}

// Key names of a JSON object in order.
std::vector<std::string> Keys(const ordered_json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) {
    keys.push_back(it.key());
  }
  return keys;
}

using Keys_ = std::vector<std::string>;

// ---------------------------------------------------------------------------
// Errors.

TEST(ErrorBodyTest, OpenAiShapeWithNulls) {
  ApiError error = InvalidRequest("bad", "", "");
  ordered_json body = ordered_json::parse(ErrorBody(error));
  EXPECT_EQ(Keys(body), Keys_({"error"}));
  EXPECT_EQ(Keys(body["error"]), Keys_({"message", "type", "param", "code"}));
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(error.http_status, 400);
}

TEST(ErrorBodyTest, ParamAndCode) {
  EXPECT_EQ(
      ErrorBody(InvalidRequest("x \"q\"", "temperature", "invalid_value")),
      R"({"error":{"message":"x \"q\"","type":"invalid_request_error",)"
      R"("param":"temperature","code":"invalid_value"}})");
}

TEST(ErrorBodyTest, ModelNotFound) {
  ApiError error = ModelNotFound("gpt-4");
  EXPECT_EQ(error.http_status, 404);
  EXPECT_EQ(error.param, "model");
  EXPECT_EQ(error.code, "model_not_found");
  EXPECT_EQ(error.message, "The model `gpt-4` does not exist.");
}

TEST(ErrorBodyTest, FromStatus) {
  EXPECT_EQ(ApiErrorFromStatus(absl::InvalidArgumentError("a")).http_status,
            400);
  EXPECT_EQ(ApiErrorFromStatus(absl::OutOfRangeError("long")).http_status, 400);
  EXPECT_EQ(ApiErrorFromStatus(absl::OutOfRangeError("long")).message, "long");
  EXPECT_EQ(ApiErrorFromStatus(absl::NotFoundError("a")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(absl::ResourceExhaustedError("a")).http_status,
            429);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("a")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(absl::CancelledError("a")).http_status, 499);
  ApiError internal = ApiErrorFromStatus(absl::InternalError("boom"));
  EXPECT_EQ(internal.http_status, 500);
  EXPECT_EQ(internal.type, "server_error");
}

// ---------------------------------------------------------------------------
// Body-level parsing.

TEST(ParseTest, MalformedJsonIs400WithoutParam) {
  for (const char* body :
       {"", "{", "{\"model\": }", "not json", "{\"model\": \"m\",}",
        // Numbers beyond double's range do not parse.
        "{\"model\": \"m\", \"temperature\": 1e400}"}) {
    for (bool chat : {false, true}) {
      ApiError error =
          Err(chat ? ParseChatRequest(body) : ParseCompletionRequest(body));
      EXPECT_EQ(error.http_status, 400) << body;
      EXPECT_EQ(error.type, "invalid_request_error");
      EXPECT_EQ(error.param, "") << body;
      EXPECT_NE(error.message.find("parse the JSON body"), std::string::npos);
    }
  }
}

TEST(ParseTest, NonObjectBodyIs400) {
  for (const char* body :
       {"[]", "[{\"model\": \"m\"}]", "3", "\"x\"", "null", "true"}) {
    ApiError error = Err(ParseCompletionRequest(body));
    EXPECT_EQ(error.http_status, 400) << body;
    EXPECT_EQ(error.param, "") << body;
    EXPECT_NE(error.message.find("JSON object"), std::string::npos) << body;
    EXPECT_EQ(Err(ParseChatRequest(body)).http_status, 400) << body;
  }
}

TEST(ParseTest, ModelRequired) {
  ApiError missing = Err(ParseCompletionRequest(R"({"prompt": "x"})"));
  EXPECT_EQ(missing.param, "model");
  EXPECT_EQ(missing.code, "missing_required_parameter");
  EXPECT_EQ(
      Err(ParseCompletionRequest(R"({"model": null, "prompt": "x"})")).param,
      "model");
  ApiError wrong =
      Err(ParseCompletionRequest(R"({"model": 3, "prompt": "x"})"));
  EXPECT_EQ(wrong.param, "model");
  EXPECT_EQ(wrong.code, "invalid_type");
  EXPECT_EQ(wrong.message,
            "Invalid type for 'model': expected a string, but got number "
            "instead.");
  ApiError empty = Err(ParseChatRequest(
      R"({"model": "", "messages": [{"role": "user", "content": "x"}]})"));
  EXPECT_EQ(empty.param, "model");
  EXPECT_EQ(empty.code, "invalid_value");
  EXPECT_EQ(Ok(ParseChatRequest(ChatBody())).model, "m");
}

TEST(ParseTest, CompletionDefaults) {
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody()));
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.model, "m");
  ASSERT_TRUE(r.max_tokens.has_value());
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.top_p, 1.0f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.min_p, 0.0f);
  EXPECT_EQ(r.presence_penalty, 0.0f);
  EXPECT_EQ(r.frequency_penalty, 0.0f);
  EXPECT_EQ(r.repetition_penalty, 1.0f);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_TRUE(r.stop_token_ids.empty());
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
}

TEST(ParseTest, ChatDefaults) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody()));
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_TRUE(r.prompts.empty());
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(r.chat_template_kwargs.is_null());
}

TEST(ParseTest, NullMeansDefault) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(
      R"("temperature": null, "top_p": null, "top_k": null, "n": null,
         "seed": null, "stop": null, "logprobs": null, "top_logprobs": null,
         "stream": null, "stream_options": null, "max_tokens": null,
         "max_completion_tokens": null, "presence_penalty": null,
         "logit_bias": null, "response_format": null, "tools": null)")));
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.stream);
}

TEST(ParseTest, UnknownFieldsIgnored) {
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody(
      R"("user": "me", "metadata": {"a": 1}, "whatever": [1, "x"],
         "service_tier": "auto", "temperature": 0.5)")));
  EXPECT_EQ(r.temperature, 0.5f);
  Ok(ParseChatRequest(ChatBody(R"("user": 7, "parallel_tool_calls": true,
                                   "tool_choice": "none", "echo": "x")")));
}

// ---------------------------------------------------------------------------
// Fields: happy paths.

TEST(FieldTest, SamplingFieldsParsed) {
  for (bool chat : {false, true}) {
    const std::string extra =
        R"("temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
           "presence_penalty": -1.5, "frequency_penalty": 2,
           "repetition_penalty": 1.1, "n": 3, "seed": -42,
           "ignore_eos": true, "stop_token_ids": [2, 7])";
    CompletionRequest r =
        Ok(chat ? ParseChatRequest(ChatBody(extra))
                : ParseCompletionRequest(CompletionBody(extra)));
    EXPECT_FLOAT_EQ(r.temperature, 0.7f);
    EXPECT_FLOAT_EQ(r.top_p, 0.9f);
    EXPECT_EQ(r.top_k, 40);
    EXPECT_FLOAT_EQ(r.min_p, 0.05f);
    EXPECT_FLOAT_EQ(r.presence_penalty, -1.5f);
    EXPECT_FLOAT_EQ(r.frequency_penalty, 2.0f);
    EXPECT_FLOAT_EQ(r.repetition_penalty, 1.1f);
    EXPECT_EQ(r.n, 3);
    ASSERT_TRUE(r.seed.has_value());
    EXPECT_EQ(*r.seed, -42);
    EXPECT_TRUE(r.ignore_eos);
    EXPECT_EQ(r.stop_token_ids, std::vector<int32_t>({2, 7}));
  }
}

TEST(FieldTest, BoundaryValuesAccepted) {
  // The edges of every range, each of which must also pass
  // SamplingParams::Validate() once mapped.
  for (const char* extra : {
           R"("temperature": 0, "top_p": 1, "min_p": 0)",
           R"("temperature": 2, "top_p": 1e-6, "min_p": 1)",
           R"("presence_penalty": -2, "frequency_penalty": 2)",
           R"("presence_penalty": 2, "frequency_penalty": -2)",
           R"("repetition_penalty": 1e-6)",
           R"("repetition_penalty": 1e30)",
           R"("n": 1)",
           R"("n": 128)",
           R"("top_k": -1)",
           R"("top_k": 0)",
           R"("top_k": 1)",
           R"("top_k": 99999999999)",
           R"("seed": 9223372036854775807)",
           R"("seed": -9223372036854775808)",
           R"("max_tokens": 1)",
           R"("max_tokens": 9223372036854775807)",
       }) {
    CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody(extra)));
    GenerationRequest g = ToGenerationRequest(r, {1, 2}, 5);
    EXPECT_TRUE(g.sampling.Validate().ok())
        << extra << ": " << g.sampling.Validate();
    EXPECT_GE(g.max_tokens, 1) << extra;
  }
}

TEST(FieldTest, TopKNormalised) {
  EXPECT_EQ(Ok(ParseCompletionRequest(CompletionBody(R"("top_k": -1)"))).top_k,
            0);
  EXPECT_EQ(
      Ok(ParseCompletionRequest(CompletionBody(R"("top_k": 99999999999)")))
          .top_k,
      std::numeric_limits<int32_t>::max());
}

TEST(FieldTest, IntegralFloatsAcceptedAsIntegers) {
  CompletionRequest r = Ok(ParseCompletionRequest(
      CompletionBody(R"("n": 2.0, "max_tokens": 8.0, "top_k": 5.0,
                        "seed": 3.0, "logprobs": 2.0)")));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(*r.max_tokens, 8);
  EXPECT_EQ(r.top_k, 5);
  EXPECT_EQ(*r.seed, 3);
  EXPECT_EQ(r.top_logprobs, 2);
}

TEST(FieldTest, Stop) {
  EXPECT_EQ(Ok(ParseCompletionRequest(CompletionBody(R"("stop": "\n")"))).stop,
            std::vector<std::string>({"\n"}));
  EXPECT_EQ(
      Ok(ParseChatRequest(ChatBody(R"("stop": ["a", "bb", "ccc", "</s>"])")))
          .stop,
      std::vector<std::string>({"a", "bb", "ccc", "</s>"}));
  EXPECT_TRUE(
      Ok(ParseCompletionRequest(CompletionBody(R"("stop": [])"))).stop.empty());
}

TEST(FieldTest, MaxTokensCompletions) {
  EXPECT_EQ(*Ok(ParseCompletionRequest(CompletionBody(R"("max_tokens": 100)")))
                 .max_tokens,
            100);
  // Explicit null: no limit (vLLM), unlike absent (16).
  EXPECT_FALSE(
      Ok(ParseCompletionRequest(CompletionBody(R"("max_tokens": null)")))
          .max_tokens.has_value());
  // max_completion_tokens is a chat field; completions ignore it.
  EXPECT_EQ(*Ok(ParseCompletionRequest(
                    CompletionBody(R"("max_completion_tokens": 5)")))
                 .max_tokens,
            16);
}

TEST(FieldTest, MaxTokensChat) {
  EXPECT_EQ(*Ok(ParseChatRequest(ChatBody(R"("max_tokens": 7)"))).max_tokens,
            7);
  EXPECT_EQ(*Ok(ParseChatRequest(ChatBody(R"("max_completion_tokens": 9)")))
                 .max_tokens,
            9);
  EXPECT_EQ(*Ok(ParseChatRequest(
                    ChatBody(R"("max_tokens": 7, "max_completion_tokens": 9)")))
                 .max_tokens,
            9);
  EXPECT_EQ(*Ok(ParseChatRequest(
                    ChatBody(R"("max_completion_tokens": 9, "max_tokens": 7)")))
                 .max_tokens,
            9);
  EXPECT_EQ(*Ok(ParseChatRequest(ChatBody(
                    R"("max_tokens": 7, "max_completion_tokens": null)")))
                 .max_tokens,
            7);
  // Both are validated even when one wins.
  EXPECT_EQ(Err(ParseChatRequest(
                    ChatBody(R"("max_tokens": 0, "max_completion_tokens": 9)")))
                .param,
            "max_tokens");
}

TEST(FieldTest, CompletionLogprobs) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(CompletionBody(R"("logprobs": 3)")));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  r = Ok(ParseCompletionRequest(CompletionBody(R"("logprobs": 0)")));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  r = Ok(ParseCompletionRequest(CompletionBody(R"("logprobs": 5)")));
  EXPECT_EQ(r.top_logprobs, 5);
  // Chat's top_logprobs means nothing to completions.
  r = Ok(ParseCompletionRequest(CompletionBody(R"("top_logprobs": 3)")));
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
}

TEST(FieldTest, ChatLogprobs) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(R"("logprobs": true)")));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  r = Ok(ParseChatRequest(ChatBody(R"("logprobs": true, "top_logprobs": 20)")));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 20);
  r = Ok(ParseChatRequest(ChatBody(R"("top_logprobs": 4, "logprobs": true)")));
  EXPECT_EQ(r.top_logprobs, 4);
  r = Ok(ParseChatRequest(ChatBody(R"("logprobs": false)")));
  EXPECT_FALSE(r.logprobs);
}

TEST(FieldTest, EchoAndStream) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(CompletionBody(R"("echo": true)")));
  EXPECT_TRUE(r.echo);
  r = Ok(ParseCompletionRequest(CompletionBody(
      R"("stream": true, "stream_options": {"include_usage": true})")));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  r = Ok(ParseChatRequest(ChatBody(
      R"("stream": true, "stream_options": {"include_usage": false})")));
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
  r = Ok(ParseChatRequest(ChatBody(R"("stream": true, "stream_options": {})")));
  EXPECT_FALSE(r.include_usage);
  r = Ok(ParseChatRequest(ChatBody(R"("stream": false)")));
  EXPECT_FALSE(r.stream);
  // Chat has no echo of its own (vLLM's chat echo is a different feature).
  EXPECT_FALSE(Ok(ParseChatRequest(ChatBody(R"("echo": true)"))).echo);
}

TEST(FieldTest, SupportedValuesOfUnsupportedFeatures) {
  Ok(ParseCompletionRequest(CompletionBody(R"("best_of": 1)")));
  Ok(ParseCompletionRequest(CompletionBody(R"("n": 2, "best_of": 2)")));
  Ok(ParseCompletionRequest(CompletionBody(R"("logit_bias": {})")));
  Ok(ParseCompletionRequest(CompletionBody(R"("suffix": "")")));
  Ok(ParseCompletionRequest(CompletionBody(R"("suffix": null)")));
  Ok(ParseChatRequest(ChatBody(R"("response_format": {"type": "text"})")));
}

TEST(FieldTest, ToolsAndTemplateKwargsKept) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(
      R"("tools": [{"type": "function", "function": {"name": "f"}}],
         "chat_template_kwargs": {"enable_thinking": false})")));
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tools[0]["function"]["name"], "f");
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
}

// ---------------------------------------------------------------------------
// Fields: every invalid type and range names its param.

struct BadCase {
  const char* extra;
  const char* param;
  const char* code;
};

void ExpectBad(bool chat, const BadCase& c) {
  const std::string body = chat ? ChatBody(c.extra) : CompletionBody(c.extra);
  ParseResult result =
      chat ? ParseChatRequest(body) : ParseCompletionRequest(body);
  ASSERT_TRUE(std::holds_alternative<ApiError>(result))
      << (chat ? "chat: " : "completions: ") << c.extra;
  const ApiError& error = std::get<ApiError>(result);
  EXPECT_EQ(error.http_status, 400) << c.extra;
  EXPECT_EQ(error.type, "invalid_request_error") << c.extra;
  EXPECT_EQ(error.param, c.param) << c.extra << ": " << error.message;
  EXPECT_EQ(error.code, c.code) << c.extra << ": " << error.message;
  EXPECT_NE(error.message.find(c.param), std::string::npos) << error.message;
}

constexpr BadCase kCommonBad[] = {
    {R"("temperature": "0.5")", "temperature", "invalid_type"},
    {R"("temperature": true)", "temperature", "invalid_type"},
    {R"("temperature": [1])", "temperature", "invalid_type"},
    {R"("temperature": -0.1)", "temperature", "invalid_value"},
    {R"("temperature": 2.01)", "temperature", "invalid_value"},
    {R"("temperature": 3.5e38)", "temperature", "invalid_value"},
    {R"("top_p": "1")", "top_p", "invalid_type"},
    {R"("top_p": 0)", "top_p", "invalid_value"},
    {R"("top_p": 1e-50)", "top_p", "invalid_value"},  // 0 as a float.
    {R"("top_p": 1.5)", "top_p", "invalid_value"},
    {R"("top_p": -0.5)", "top_p", "invalid_value"},
    {R"("top_k": 1.5)", "top_k", "invalid_type"},
    {R"("top_k": "5")", "top_k", "invalid_type"},
    {R"("top_k": false)", "top_k", "invalid_type"},
    {R"("top_k": -2)", "top_k", "invalid_value"},
    {R"("min_p": {})", "min_p", "invalid_type"},
    {R"("min_p": -0.01)", "min_p", "invalid_value"},
    {R"("min_p": 1.01)", "min_p", "invalid_value"},
    {R"("presence_penalty": "x")", "presence_penalty", "invalid_type"},
    {R"("presence_penalty": 2.5)", "presence_penalty", "invalid_value"},
    {R"("presence_penalty": -2.5)", "presence_penalty", "invalid_value"},
    {R"("frequency_penalty": 3)", "frequency_penalty", "invalid_value"},
    {R"("frequency_penalty": -3)", "frequency_penalty", "invalid_value"},
    {R"("frequency_penalty": [])", "frequency_penalty", "invalid_type"},
    {R"("repetition_penalty": 0)", "repetition_penalty", "invalid_value"},
    {R"("repetition_penalty": -1)", "repetition_penalty", "invalid_value"},
    // Finite as a double, infinite as a float.
    {R"("repetition_penalty": 3.5e38)", "repetition_penalty", "invalid_value"},
    {R"("repetition_penalty": -3.5e38)", "repetition_penalty", "invalid_value"},
    {R"("repetition_penalty": "1")", "repetition_penalty", "invalid_type"},
    {R"("n": 0)", "n", "invalid_value"},
    {R"("n": 129)", "n", "invalid_value"},
    {R"("n": -1)", "n", "invalid_value"},
    {R"("n": 1.5)", "n", "invalid_type"},
    {R"("n": "2")", "n", "invalid_type"},
    {R"("n": true)", "n", "invalid_type"},
    {R"("seed": "1")", "seed", "invalid_type"},
    {R"("seed": 1.5)", "seed", "invalid_type"},
    {R"("seed": 9223372036854775808)", "seed", "invalid_value"},
    {R"("seed": 1e19)", "seed", "invalid_value"},
    {R"("stop": 3)", "stop", "invalid_type"},
    {R"("stop": {"a": 1})", "stop", "invalid_type"},
    {R"("stop": "")", "stop", "invalid_value"},
    {R"("stop": ["a", "b", "c", "d", "e"])", "stop", "invalid_value"},
    {R"("stop": ["a", 1])", "stop.[1]", "invalid_type"},
    {R"("stop": ["a", ""])", "stop.[1]", "invalid_value"},
    {R"("stop": [null])", "stop.[0]", "invalid_type"},
    {R"("stop_token_ids": 2)", "stop_token_ids", "invalid_type"},
    {R"("stop_token_ids": [1, -2])", "stop_token_ids.[1]", "invalid_value"},
    {R"("stop_token_ids": ["2"])", "stop_token_ids.[0]", "invalid_type"},
    {R"("stop_token_ids": [3000000000])", "stop_token_ids.[0]",
     "invalid_value"},
    {R"("ignore_eos": 1)", "ignore_eos", "invalid_type"},
    {R"("ignore_eos": "true")", "ignore_eos", "invalid_type"},
    {R"("stream": 1)", "stream", "invalid_type"},
    {R"("stream": "yes")", "stream", "invalid_type"},
    {R"("stream_options": {"include_usage": true})", "stream_options",
     "invalid_value"},
    {R"("stream": false, "stream_options": {})", "stream_options",
     "invalid_value"},
    {R"("stream": true, "stream_options": true)", "stream_options",
     "invalid_type"},
    {R"("stream": true, "stream_options": {"include_usage": 1})",
     "stream_options.include_usage", "invalid_type"},
    {R"("best_of": 2)", "best_of", "unsupported_parameter"},
    {R"("best_of": "1")", "best_of", "invalid_type"},
    {R"("logit_bias": {"50256": -100})", "logit_bias", "unsupported_parameter"},
    {R"("logit_bias": [1])", "logit_bias", "invalid_type"},
    {R"("max_tokens": 0)", "max_tokens", "invalid_value"},
    {R"("max_tokens": -5)", "max_tokens", "invalid_value"},
    {R"("max_tokens": "16")", "max_tokens", "invalid_type"},
    {R"("max_tokens": 16.5)", "max_tokens", "invalid_type"},
};

TEST(FieldTest, CommonInvalidValuesCompletions) {
  for (const BadCase& c : kCommonBad) ExpectBad(/*chat=*/false, c);
}

TEST(FieldTest, CommonInvalidValuesChat) {
  for (const BadCase& c : kCommonBad) ExpectBad(/*chat=*/true, c);
}

TEST(FieldTest, CompletionOnlyInvalidValues) {
  for (const BadCase& c : std::vector<BadCase>{
           {R"("logprobs": 6)", "logprobs", "invalid_value"},
           {R"("logprobs": -1)", "logprobs", "invalid_value"},
           {R"("logprobs": true)", "logprobs", "invalid_type"},
           {R"("logprobs": 2.5)", "logprobs", "invalid_type"},
           {R"("echo": 1)", "echo", "invalid_type"},
           {R"("echo": true, "logprobs": 1)", "echo", "unsupported_parameter"},
           {R"("suffix": "tail")", "suffix", "unsupported_parameter"},
           {R"("suffix": 1)", "suffix", "invalid_type"},
       }) {
    ExpectBad(/*chat=*/false, c);
  }
}

TEST(FieldTest, ChatOnlyInvalidValues) {
  for (const BadCase& c : std::vector<BadCase>{
           {R"("logprobs": 1)", "logprobs", "invalid_type"},
           {R"("logprobs": "true")", "logprobs", "invalid_type"},
           {R"("logprobs": true, "top_logprobs": 21)", "top_logprobs",
            "invalid_value"},
           {R"("logprobs": true, "top_logprobs": -1)", "top_logprobs",
            "invalid_value"},
           {R"("logprobs": true, "top_logprobs": "2")", "top_logprobs",
            "invalid_type"},
           {R"("top_logprobs": 2)", "top_logprobs", "invalid_value"},
           {R"("top_logprobs": 0)", "top_logprobs", "invalid_value"},
           {R"("logprobs": false, "top_logprobs": 2)", "top_logprobs",
            "invalid_value"},
           {R"("max_completion_tokens": 0)", "max_completion_tokens",
            "invalid_value"},
           {R"("max_completion_tokens": "5")", "max_completion_tokens",
            "invalid_type"},
           {R"("response_format": {"type": "json_object"})", "response_format",
            "unsupported_parameter"},
           {R"("response_format": {})", "response_format",
            "unsupported_parameter"},
           {R"("response_format": "text")", "response_format", "invalid_type"},
           {R"("tools": {})", "tools", "invalid_type"},
           {R"("chat_template_kwargs": [])", "chat_template_kwargs",
            "invalid_type"},
       }) {
    ExpectBad(/*chat=*/true, c);
  }
}

TEST(FieldTest, RangeMessageQuotesTheValue) {
  ApiError error =
      Err(ParseCompletionRequest(CompletionBody(R"("temperature": 3)")));
  EXPECT_EQ(error.message,
            "Invalid value for 'temperature': expected a number in [0, 2], "
            "but got 3 instead.");
}

// ---------------------------------------------------------------------------
// Prompts.

TEST(PromptTest, String) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(R"({"model": "m", "prompt": "Hello \u00e9"})"));
  ASSERT_EQ(r.prompts.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<std::string>(r.prompts[0]));
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "Hello \xC3\xA9");
}

TEST(PromptTest, EmptyStringKept) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(R"({"model": "m", "prompt": ""})"));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "");
}

TEST(PromptTest, ListOfStrings) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(R"({"model": "m", "prompt": ["a", "b c"]})"));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "a");
  EXPECT_EQ(std::get<std::string>(r.prompts[1]), "b c");
}

TEST(PromptTest, TokenIds) {
  CompletionRequest r = Ok(ParseCompletionRequest(
      R"({"model": "m", "prompt": [1, 2, 2147483647, 0]})"));
  ASSERT_EQ(r.prompts.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<std::vector<int32_t>>(r.prompts[0]));
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]),
            std::vector<int32_t>({1, 2, 2147483647, 0}));
}

TEST(PromptTest, ListOfTokenIdLists) {
  CompletionRequest r = Ok(ParseCompletionRequest(
      R"({"model": "m", "prompt": [[1, 2], [3], [4, 5, 6]]})"));
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]),
            std::vector<int32_t>({1, 2}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[1]),
            std::vector<int32_t>({3}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[2]),
            std::vector<int32_t>({4, 5, 6}));
}

TEST(PromptTest, Invalid) {
  struct Case {
    const char* prompt;  // JSON, or nullptr for absent.
    const char* code;
  };
  for (const Case& c : std::vector<Case>{
           {nullptr, "missing_required_parameter"},
           {"null", "missing_required_parameter"},
           {"[]", "invalid_value"},
           {"3", "invalid_type"},
           {"true", "invalid_type"},
           {"{\"text\": \"a\"}", "invalid_type"},
           {"[\"a\", 1]", "invalid_type"},
           {"[1, \"a\"]", "invalid_type"},
           {"[1, [2]]", "invalid_type"},
           {"[[1], 2]", "invalid_type"},
           {"[[1], [\"a\"]]", "invalid_type"},
           {"[[1], []]", "invalid_value"},
           {"[[]]", "invalid_value"},
           {"[\"a\", null]", "invalid_type"},
           {"[null]", "invalid_type"},
           {"[{}]", "invalid_type"},
           {"[true]", "invalid_type"},
           {"[1, -1]", "invalid_value"},
           {"[2147483648]", "invalid_value"},
           {"[1.5]", "invalid_type"},
           {"[[1, -3]]", "invalid_value"},
       }) {
    const std::string body =
        c.prompt == nullptr
            ? std::string(R"({"model": "m"})")
            : absl::StrCat(R"({"model": "m", "prompt": )", c.prompt, "}");
    ApiError error = Err(ParseCompletionRequest(body));
    EXPECT_EQ(error.http_status, 400) << body;
    EXPECT_EQ(error.param, "prompt") << body << ": " << error.message;
    EXPECT_EQ(error.code, c.code) << body << ": " << error.message;
  }
}

TEST(PromptTest, IntegralFloatIdsAccepted) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(R"({"model": "m", "prompt": [1.0, 2]})"));
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]),
            std::vector<int32_t>({1, 2}));
}

// ---------------------------------------------------------------------------
// Messages.

TEST(MessagesTest, KeptInOrderWithExtraFields) {
  CompletionRequest r = Ok(ParseChatRequest(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "name": "bob", "content": "Hi"},
      {"role": "assistant", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"},
      {"role": "assistant"}]})"));
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "Be brief.");
  EXPECT_EQ(Keys(r.messages[1]), Keys_({"role", "name", "content"}));
  EXPECT_EQ(r.messages[1]["name"], "bob");
  EXPECT_TRUE(r.messages[2]["content"].is_null());
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_FALSE(r.messages[4].contains("content"));
}

TEST(MessagesTest, ContentPartsFlattened) {
  CompletionRequest r = Ok(ParseChatRequest(R"({"model": "m", "messages": [
      {"role": "user", "content": [{"type": "text", "text": "one"},
                                   {"type": "text", "text": "two"}],
       "name": "x"},
      {"role": "user", "content": [{"type": "text", "text": "solo"}]},
      {"role": "user", "content": []}]})"));
  EXPECT_EQ(r.messages[0]["content"], "one\ntwo");
  EXPECT_EQ(Keys(r.messages[0]), Keys_({"role", "content", "name"}));
  EXPECT_EQ(r.messages[1]["content"], "solo");
  EXPECT_EQ(r.messages[2]["content"], "");
}

TEST(MessagesTest, Invalid) {
  struct Case {
    const char* messages;  // JSON, or nullptr for absent.
    const char* param;
    const char* code;
  };
  for (const Case& c : std::vector<Case>{
           {nullptr, "messages", "missing_required_parameter"},
           {"null", "messages", "missing_required_parameter"},
           {"[]", "messages", "invalid_value"},
           {"{\"role\": \"user\"}", "messages", "invalid_type"},
           {"\"hi\"", "messages", "invalid_type"},
           {"[\"hi\"]", "messages.[0]", "invalid_type"},
           {"[{\"content\": \"x\"}]", "messages.[0].role",
            "missing_required_parameter"},
           {R"([{"role": "user", "content": "a"}, {"role": 1}])",
            "messages.[1].role", "invalid_type"},
           {R"([{"role": "user", "content": 5}])", "messages.[0].content",
            "invalid_type"},
           {R"([{"role": "user", "content": {"text": "a"}}])",
            "messages.[0].content", "invalid_type"},
           {R"([{"role": "user", "content": ["a"]}])",
            "messages.[0].content.[0]", "invalid_type"},
           {R"([{"role": "user", "content": [{"text": "a"}]}])",
            "messages.[0].content.[0].type", "missing_required_parameter"},
           {R"([{"role": "user", "content": [{"type": 1, "text": "a"}]}])",
            "messages.[0].content.[0].type", "invalid_type"},
           {R"([{"role": "user", "content": [{"type": "text", "text": "a"},
                  {"type": "image_url", "image_url": {"url": "x"}}]}])",
            "messages.[0].content.[1].type", "unsupported_parameter"},
           {R"([{"role": "user", "content": [{"type": "text"}]}])",
            "messages.[0].content.[0].text", "missing_required_parameter"},
           {R"([{"role": "user", "content": [{"type": "text", "text": 3}]}])",
            "messages.[0].content.[0].text", "invalid_type"},
       }) {
    const std::string body =
        c.messages == nullptr
            ? std::string(R"({"model": "m"})")
            : absl::StrCat(R"({"model": "m", "messages": )", c.messages, "}");
    ApiError error = Err(ParseChatRequest(body));
    EXPECT_EQ(error.http_status, 400) << body;
    EXPECT_EQ(error.param, c.param) << body << ": " << error.message;
    EXPECT_EQ(error.code, c.code) << body << ": " << error.message;
  }
}

TEST(MessagesTest, ChatIgnoresPromptAndCompletionsIgnoresMessages) {
  EXPECT_TRUE(Ok(ParseChatRequest(ChatBody(R"("prompt": 3)"))).prompts.empty());
  EXPECT_EQ(Err(ParseCompletionRequest(
                    R"({"model": "m", "messages": [{"role": "user"}]})"))
                .param,
            "prompt");
}

// ---------------------------------------------------------------------------
// ToGenerationRequest.

TEST(ToGenerationRequestTest, MapsEveryField) {
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody(
      R"("max_tokens": 33, "temperature": 0.25, "top_p": 0.5, "top_k": 7,
         "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
         "repetition_penalty": 1.2, "seed": 100, "stop": ["END", "\n\n"],
         "stop_token_ids": [9], "ignore_eos": true, "logprobs": 4)")));
  GenerationRequest g = ToGenerationRequest(r, {5, 6, 7}, 0);
  EXPECT_EQ(g.prompt_ids, std::vector<int32_t>({5, 6, 7}));
  EXPECT_EQ(g.max_tokens, 33);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.25f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.5f);
  EXPECT_EQ(g.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(g.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(g.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.2f);
  ASSERT_TRUE(g.sampling.seed.has_value());
  EXPECT_EQ(*g.sampling.seed, 100u);
  EXPECT_EQ(g.stop, std::vector<std::string>({"END", "\n\n"}));
  EXPECT_EQ(g.stop_token_ids, std::vector<int32_t>({9}));
  EXPECT_TRUE(g.ignore_eos);
  EXPECT_EQ(g.top_logprobs, 4);
  EXPECT_FALSE(g.return_prefill_logits);
  EXPECT_TRUE(g.sampling.Validate().ok());
}

TEST(ToGenerationRequestTest, SeedPlusChoiceIndex) {
  CompletionRequest r =
      Ok(ParseChatRequest(ChatBody(R"("seed": 100, "n": 3)")));
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 0).sampling.seed, 100u);
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 1).sampling.seed, 101u);
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 2).sampling.seed, 102u);
  // Reproducible: the same index gives the same seed.
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 2).sampling.seed,
            *ToGenerationRequest(r, {9, 9}, 2).sampling.seed);
}

TEST(ToGenerationRequestTest, NegativeAndMaximalSeedsWrap) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(R"("seed": -1)")));
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 0).sampling.seed,
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 1).sampling.seed, 0u);
  r = Ok(ParseChatRequest(ChatBody(R"("seed": 9223372036854775807)")));
  EXPECT_EQ(*ToGenerationRequest(r, {1}, 1).sampling.seed, uint64_t{1} << 63);
}

TEST(ToGenerationRequestTest, NoSeedStaysUnset) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(R"("n": 2)")));
  EXPECT_FALSE(ToGenerationRequest(r, {1}, 1).sampling.seed.has_value());
}

TEST(ToGenerationRequestTest, Defaults) {
  GenerationRequest g =
      ToGenerationRequest(Ok(ParseCompletionRequest(CompletionBody())), {1}, 0);
  EXPECT_EQ(g.max_tokens, 16);
  EXPECT_EQ(g.sampling.temperature, 1.0f);
  EXPECT_EQ(g.sampling.top_p, 1.0f);
  EXPECT_EQ(g.sampling.top_k, 0);
  EXPECT_EQ(g.sampling.min_p, 0.0f);
  EXPECT_FALSE(g.sampling.has_penalties());
  EXPECT_FALSE(g.ignore_eos);
  EXPECT_TRUE(g.stop.empty());
  EXPECT_TRUE(g.stop_token_ids.empty());
  EXPECT_EQ(g.top_logprobs, 0);
  EXPECT_TRUE(g.sampling.Validate().ok());

  // Chat without a limit: until the context is full.
  g = ToGenerationRequest(Ok(ParseChatRequest(ChatBody())), {1}, 0);
  EXPECT_EQ(g.max_tokens, std::numeric_limits<int64_t>::max());
  ModelConfig config;
  config.max_position_embeddings = 64;
  g.prompt_ids.assign(10, 1);
  EXPECT_EQ(MaxNewTokens(config, g), 55);
}

TEST(ToGenerationRequestTest, TopLogprobsOnlyWithLogprobs) {
  // Chat: top_logprobs with logprobs true.
  GenerationRequest g = ToGenerationRequest(
      Ok(ParseChatRequest(ChatBody(R"("logprobs": true, "top_logprobs": 3)"))),
      {1}, 0);
  EXPECT_EQ(g.top_logprobs, 3);
  // A hand-built request with logprobs off asks for none.
  CompletionRequest r;
  r.top_logprobs = 5;
  r.logprobs = false;
  EXPECT_EQ(ToGenerationRequest(r, {1}, 0).top_logprobs, 0);
}

TEST(ToGenerationRequestTest, GreedyTemperatureZero) {
  GenerationRequest g = ToGenerationRequest(
      Ok(ParseCompletionRequest(CompletionBody(R"("temperature": 0)"))), {1},
      0);
  EXPECT_EQ(g.sampling.temperature, 0.0f);
  EXPECT_TRUE(g.sampling.Validate().ok());
}

// ---------------------------------------------------------------------------
// Responses.

ResponseHeader Header(const std::string& id) {
  ResponseHeader header;
  header.id = id;
  header.created = 1700000000;
  header.model = "tiny";
  return header;
}

TEST(ResponseTest, CompletionExactJson) {
  Choice choice;
  choice.index = 0;
  choice.text = "Hello";
  choice.finish_reason = FinishReason::kLength;
  Usage usage{3, 5, std::nullopt};
  EXPECT_EQ(
      CompletionResponse(Header("cmpl-1"), {choice}, usage),
      R"({"id":"cmpl-1","object":"text_completion","created":1700000000,)"
      R"("model":"tiny","choices":[{"index":0,"text":"Hello","logprobs":null,)"
      R"("finish_reason":"length"}],"usage":{"prompt_tokens":3,)"
      R"("completion_tokens":5,"total_tokens":8}})");
}

TEST(ResponseTest, CompletionWithLogprobs) {
  Choice choice;
  choice.index = 1;
  choice.text = "Say hi\xC3\xA9!";
  choice.text_offset = 4;  // An echoed prompt "Say " comes first.
  choice.logprobs = std::vector<TokenLogprob>{
      {"hi", -0.5f, {{"hi", -0.5f}, {"yo", -1.25f}, {"hi", -3.0f}}},
      {"\xC3\xA9", -0.1f, {}},
      {"!", -std::numeric_limits<float>::infinity(), {{"?", -2.0f}}},
  };
  choice.finish_reason = FinishReason::kStop;
  Usage usage{4, 3, 2};
  ordered_json json = ordered_json::parse(
      CompletionResponse(Header("cmpl-x"), {choice}, usage));
  EXPECT_EQ(Keys(json),
            Keys_({"id", "object", "created", "model", "choices", "usage"}));
  const ordered_json& c = json["choices"][0];
  EXPECT_EQ(Keys(c), Keys_({"index", "text", "logprobs", "finish_reason"}));
  EXPECT_EQ(c["index"], 1);
  EXPECT_EQ(c["finish_reason"], "stop");
  const ordered_json& lp = c["logprobs"];
  EXPECT_EQ(Keys(lp),
            Keys_({"tokens", "token_logprobs", "top_logprobs", "text_offset"}));
  EXPECT_EQ(lp["tokens"], ordered_json::parse(R"(["hi", "\u00e9", "!"])"));
  // Shortest float form: -0.1f is -0.1, not -0.10000000149011612; -inf is
  // -9999.0 as vLLM writes it.
  EXPECT_EQ(lp["token_logprobs"].dump(), "[-0.5,-0.1,-9999.0]");
  // The duplicate "hi" keeps the likelier value; key order is the caller's.
  EXPECT_EQ(lp["top_logprobs"].dump(),
            R"([{"hi":-0.5,"yo":-1.25},{},{"?":-2.0}])");
  // Offsets in code points: "hi" at 4, "é" (2 bytes, 1 code point) at 6,
  // "!" at 7.
  EXPECT_EQ(lp["text_offset"].dump(), "[4,6,7]");
  EXPECT_EQ(json["usage"].dump(),
            R"({"prompt_tokens":4,"completion_tokens":3,"total_tokens":7,)"
            R"("prompt_tokens_details":{"cached_tokens":2}})");
}

TEST(ResponseTest, ChatExactJson) {
  Choice a;
  a.index = 0;
  a.text = "Hi \"there\"\n";
  a.finish_reason = FinishReason::kStop;
  Choice b;
  b.index = 1;
  b.text = "";
  b.finish_reason = FinishReason::kAbort;
  EXPECT_EQ(
      ChatResponse(Header("chatcmpl-1"), {a, b}, Usage{10, 4, std::nullopt}),
      R"({"id":"chatcmpl-1","object":"chat.completion","created":1700000000,)"
      R"("model":"tiny","choices":[{"index":0,"message":{"role":"assistant",)"
      R"("content":"Hi \"there\"\n"},"logprobs":null,"finish_reason":"stop"},)"
      R"({"index":1,"message":{"role":"assistant","content":""},)"
      R"("logprobs":null,"finish_reason":"abort"}],"usage":)"
      R"({"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}})");
}

TEST(ResponseTest, ChatLogprobs) {
  Choice choice;
  choice.text = "ab";
  choice.logprobs = std::vector<TokenLogprob>{
      {"a", -0.25f, {{"a", -0.25f}, {"b", -2.5f}}},
      {"\xE2\x82", -1.0f, {}},  // Half a UTF-8 character.
  };
  choice.finish_reason = FinishReason::kLength;
  ordered_json json = ordered_json::parse(
      ChatResponse(Header("chatcmpl-2"), {choice}, Usage{1, 2, std::nullopt}));
  const ordered_json& c = json["choices"][0];
  EXPECT_EQ(Keys(c), Keys_({"index", "message", "logprobs", "finish_reason"}));
  EXPECT_EQ(Keys(c["message"]), Keys_({"role", "content"}));
  EXPECT_EQ(Keys(c["logprobs"]), Keys_({"content"}));
  const ordered_json& content = c["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(Keys(content[0]),
            Keys_({"token", "logprob", "bytes", "top_logprobs"}));
  EXPECT_EQ(content[0].dump(),
            R"({"token":"a","logprob":-0.25,"bytes":[97],"top_logprobs":[)"
            R"({"token":"a","logprob":-0.25,"bytes":[97]},)"
            R"({"token":"b","logprob":-2.5,"bytes":[98]}]})");
  // Invalid UTF-8 becomes U+FFFD in the text; bytes keep the raw bytes.
  EXPECT_EQ(content[1]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(content[1]["bytes"].dump(), "[226,130]");
  EXPECT_EQ(content[1]["top_logprobs"].dump(), "[]");
  EXPECT_EQ(c["finish_reason"], "length");
}

TEST(ResponseTest, InvalidUtf8TextReplacedNotThrown) {
  Choice choice;
  choice.text = "ok\xFF";
  choice.finish_reason = FinishReason::kStop;
  ordered_json json =
      ordered_json::parse(CompletionResponse(Header("c"), {choice}, Usage{}));
  EXPECT_EQ(json["choices"][0]["text"], "ok\xEF\xBF\xBD");
}

TEST(ResponseTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonString(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonString(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonString(FinishReason::kAbort), "abort");
}

TEST(ResponseTest, Models) {
  EXPECT_EQ(ModelsResponse("tiny-llama", 1700000000),
            R"({"object":"list","data":[{"id":"tiny-llama","object":"model",)"
            R"("created":1700000000,"owned_by":"tessera"}]})");
}

TEST(ResponseTest, RandomIds) {
  const std::string a = RandomResponseId("cmpl-");
  const std::string b = RandomResponseId("cmpl-");
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
  EXPECT_NE(a, b);
  EXPECT_EQ(RandomResponseId("chatcmpl-").rfind("chatcmpl-", 0), 0u);
}

// ---------------------------------------------------------------------------
// Streaming.

TEST(StreamTest, CompletionChunkExactJson) {
  Choice choice;
  choice.index = 2;
  choice.text = " wor";
  EXPECT_EQ(CompletionChunk(Header("cmpl-s"), choice),
            R"({"id":"cmpl-s","object":"text_completion","created":1700000000,)"
            R"("model":"tiny","choices":[{"index":2,"text":" wor",)"
            R"("logprobs":null,"finish_reason":null}]})");
  choice.text = "";
  choice.finish_reason = FinishReason::kLength;
  ordered_json json = ordered_json::parse(
      CompletionChunk(Header("cmpl-s"), choice, /*include_usage=*/true));
  EXPECT_EQ(Keys(json),
            Keys_({"id", "object", "created", "model", "choices", "usage"}));
  EXPECT_TRUE(json["usage"].is_null());
  EXPECT_EQ(json["choices"][0]["finish_reason"], "length");
}

TEST(StreamTest, CompletionChunkLogprobsContinueOffsets) {
  Choice choice;
  choice.text = "cd";
  choice.text_offset = 10;
  choice.logprobs =
      std::vector<TokenLogprob>{{"c", -1.0f, {}}, {"d", -2.0f, {}}};
  ordered_json json =
      ordered_json::parse(CompletionChunk(Header("cmpl-s"), choice));
  EXPECT_EQ(json["choices"][0]["logprobs"]["text_offset"].dump(), "[10,11]");
}

TEST(StreamTest, ChatChunkDeltas) {
  Choice first;
  first.index = 0;
  first.first = true;
  EXPECT_EQ(ChatChunk(Header("chatcmpl-s"), first),
            R"({"id":"chatcmpl-s","object":"chat.completion.chunk",)"
            R"("created":1700000000,"model":"tiny","choices":[{"index":0,)"
            R"("delta":{"role":"assistant","content":""},"logprobs":null,)"
            R"("finish_reason":null}]})");

  Choice middle;
  middle.index = 1;
  middle.text = "Hel";
  ordered_json json =
      ordered_json::parse(ChatChunk(Header("chatcmpl-s"), middle));
  const ordered_json& c = json["choices"][0];
  EXPECT_EQ(Keys(c), Keys_({"index", "delta", "logprobs", "finish_reason"}));
  EXPECT_EQ(c["index"], 1);
  EXPECT_EQ(c["delta"].dump(), R"({"content":"Hel"})");
  EXPECT_TRUE(c["finish_reason"].is_null());
  EXPECT_FALSE(json.contains("usage"));

  Choice last;
  last.finish_reason = FinishReason::kStop;
  json = ordered_json::parse(
      ChatChunk(Header("chatcmpl-s"), last, /*include_usage=*/true));
  EXPECT_EQ(json["choices"][0]["delta"].dump(), "{}");
  EXPECT_EQ(json["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(json.contains("usage"));
  EXPECT_TRUE(json["usage"].is_null());

  // A first chunk that already has text and logprobs.
  Choice both;
  both.first = true;
  both.text = "Hi";
  both.logprobs = std::vector<TokenLogprob>{{"Hi", -0.5f, {}}};
  json = ordered_json::parse(ChatChunk(Header("chatcmpl-s"), both));
  EXPECT_EQ(json["choices"][0]["delta"].dump(),
            R"({"role":"assistant","content":"Hi"})");
  EXPECT_EQ(json["choices"][0]["logprobs"].dump(),
            R"({"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],)"
            R"("top_logprobs":[]}]})");
}

TEST(StreamTest, UsageChunk) {
  EXPECT_EQ(UsageChunk(Endpoint::kChat, Header("chatcmpl-s"),
                       Usage{7, 2, std::nullopt}),
            R"({"id":"chatcmpl-s","object":"chat.completion.chunk",)"
            R"("created":1700000000,"model":"tiny","choices":[],"usage":)"
            R"({"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}})");
  ordered_json json = ordered_json::parse(
      UsageChunk(Endpoint::kCompletions, Header("cmpl-s"), Usage{1, 1, 0}));
  EXPECT_EQ(json["object"], "text_completion");
  EXPECT_TRUE(json["choices"].is_array());
  EXPECT_TRUE(json["choices"].empty());
  EXPECT_EQ(json["usage"]["total_tokens"], 2);
  EXPECT_EQ(json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(StreamTest, SseFraming) {
  EXPECT_EQ(SseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // A chunk never contains a raw newline, so one event is one data line.
  Choice choice;
  choice.text = "line1\nline2\r\n";
  const std::string event = SseEvent(ChatChunk(Header("x"), choice));
  EXPECT_EQ(event.rfind("data: ", 0), 0u);
  EXPECT_EQ(event.find('\n'), event.size() - 2);
  EXPECT_EQ(event.find('\r'), std::string::npos);
  EXPECT_EQ(
      ordered_json::parse(event.substr(6))["choices"][0]["delta"]["content"],
      "line1\nline2\r\n");
}

}  // namespace
}  // namespace serve
}  // namespace tessera
