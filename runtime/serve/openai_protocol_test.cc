#include "runtime/serve/openai_protocol.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/generation_defaults.h"
#include "runtime/engine/generator.h"
#include "runtime/sampler/sampling_params.h"

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
  // Unset, so that generation_config defaults can apply; 16 otherwise.
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.default_max_tokens, std::optional<int64_t>(16));
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_FALSE(r.top_p.has_value());
  EXPECT_FALSE(r.top_k.has_value());
  EXPECT_FALSE(r.min_p.has_value());
  EXPECT_FALSE(r.repetition_penalty.has_value());
  EXPECT_EQ(r.presence_penalty, 0.0f);
  EXPECT_EQ(r.frequency_penalty, 0.0f);
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.min_tokens, 0);
  EXPECT_FALSE(r.include_stop_str_in_output);
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_TRUE(r.spaces_between_special_tokens);
  EXPECT_TRUE(r.add_special_tokens);
  EXPECT_FALSE(r.request_id.has_value());
  EXPECT_TRUE(r.ignored_fields.empty());
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
  EXPECT_FALSE(r.default_max_tokens.has_value());
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
  EXPECT_TRUE(r.prompts.empty());
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(r.documents.is_null());
  EXPECT_TRUE(r.chat_template_kwargs.is_null());
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.continue_final_message);
  EXPECT_FALSE(r.add_special_tokens);
  EXPECT_FALSE(r.echo);
  EXPECT_TRUE(r.echo_text.empty());
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_TRUE(r.ignored_fields.empty());
}

TEST(ParseTest, NullMeansDefault) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(
      R"("temperature": null, "top_p": null, "top_k": null, "n": null,
         "seed": null, "stop": null, "logprobs": null, "top_logprobs": null,
         "stream": null, "stream_options": null, "max_tokens": null,
         "max_completion_tokens": null, "presence_penalty": null,
         "logit_bias": null, "response_format": null, "tools": null,
         "min_tokens": null, "skip_special_tokens": null,
         "add_generation_prompt": null, "echo": null)")));
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_TRUE(r.ignored_fields.empty());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.stream);
}

TEST(ParseTest, IgnoredFieldsAreListedInBodyOrder) {
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody(
      R"("user": "me", "metadata": {"a": 1}, "whatever": [1, "x"],
         "service_tier": "auto", "temperature": 0.5, "store": true,
         "max_completion_tokens": 5, "top_logprobs": 2, "messages": [],
         "length_penalty": 2.0, "vllm_xargs": {"k": 1})")));
  EXPECT_EQ(r.temperature, std::optional<float>(0.5f));
  EXPECT_EQ(r.ignored_fields,
            std::vector<std::string>(
                {"user", "metadata", "whatever", "service_tier", "store",
                 "max_completion_tokens", "top_logprobs", "messages",
                 "length_penalty", "vllm_xargs"}));
  r = Ok(ParseChatRequest(ChatBody(
      R"("user": 7, "parallel_tool_calls": true, "tool_choice": "none",
         "prompt": 3, "suffix": "x", "reasoning_effort": "low",
         "include_reasoning": false, "mm_processor_kwargs": {},
         "functions": [], "stream": true,
         "stream_options": {"include_usage": true, "extra": 1})")));
  EXPECT_EQ(r.ignored_fields,
            std::vector<std::string>({"user", "prompt", "suffix",
                                      "reasoning_effort", "mm_processor_kwargs",
                                      "functions", "stream_options.extra"}));
  // Handled fields, including unsupported ones at their no-op value, are
  // never listed.
  r = Ok(ParseChatRequest(ChatBody(
      R"("use_beam_search": false, "guided_json": null, "priority": 0,
         "bad_words": [], "min_tokens": 0, "request_id": "x")")));
  EXPECT_TRUE(r.ignored_fields.empty());
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
    EXPECT_FLOAT_EQ(r.temperature.value(), 0.7f);
    EXPECT_FLOAT_EQ(r.top_p.value(), 0.9f);
    EXPECT_EQ(r.top_k.value(), 40);
    EXPECT_FLOAT_EQ(r.min_p.value(), 0.05f);
    EXPECT_FLOAT_EQ(r.presence_penalty, -1.5f);
    EXPECT_FLOAT_EQ(r.frequency_penalty, 2.0f);
    EXPECT_FLOAT_EQ(r.repetition_penalty.value(), 1.1f);
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
           // vLLM's limits, looser than OpenAI's legacy ones.
           R"("temperature": 2.01)",
           R"("temperature": 100)",
           R"("n": 129)",
           R"("n": 2147483647)",
           R"("stop": ["a", "b", "c", "d", "e"])",
           R"("logprobs": 20)",
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
  EXPECT_EQ(Ok(ParseCompletionRequest(CompletionBody(R"("top_k": -1)")))
                .top_k.value(),
            0);
  EXPECT_EQ(
      Ok(ParseCompletionRequest(CompletionBody(R"("top_k": 99999999999)")))
          .top_k.value(),
      std::numeric_limits<int32_t>::max());
}

TEST(FieldTest, IntegralFloatsAcceptedAsIntegers) {
  CompletionRequest r = Ok(ParseCompletionRequest(
      CompletionBody(R"("n": 2.0, "max_tokens": 8.0, "top_k": 5.0,
                        "seed": 3.0, "logprobs": 2.0)")));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(*r.max_tokens, 8);
  EXPECT_EQ(r.top_k.value(), 5);
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
  // Any number of stop strings (vLLM), not OpenAI's 4.
  std::vector<std::string> many;
  std::string json = "[";
  for (int i = 0; i < 50; ++i) {
    many.push_back(absl::StrCat("s", i));
    absl::StrAppend(&json, i ? "," : "", "\"s", i, "\"");
  }
  json += "]";
  EXPECT_EQ(
      Ok(ParseChatRequest(ChatBody(absl::StrCat(R"("stop": )", json)))).stop,
      many);
}

TEST(FieldTest, MaxTokensCompletions) {
  EXPECT_EQ(*Ok(ParseCompletionRequest(CompletionBody(R"("max_tokens": 100)")))
                 .max_tokens,
            100);
  // Explicit null: no limit (vLLM), unlike absent (16).
  CompletionRequest null_limit =
      Ok(ParseCompletionRequest(CompletionBody(R"("max_tokens": null)")));
  EXPECT_FALSE(null_limit.max_tokens.has_value());
  EXPECT_FALSE(null_limit.default_max_tokens.has_value());
  // max_completion_tokens is a chat field; completions ignore it.
  CompletionRequest other = Ok(
      ParseCompletionRequest(CompletionBody(R"("max_completion_tokens": 5)")));
  EXPECT_FALSE(other.max_tokens.has_value());
  EXPECT_EQ(other.default_max_tokens, std::optional<int64_t>(16));
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
  // Up to vLLM's --max-logprobs (20 by default), not OpenAI's 5.
  r = Ok(ParseCompletionRequest(CompletionBody(R"("logprobs": 20)")));
  EXPECT_EQ(r.top_logprobs, 20);
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
  // vLLM's rule: top_logprobs 0 asks for nothing, so it needs no logprobs.
  r = Ok(ParseChatRequest(ChatBody(R"("top_logprobs": 0)")));
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
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
  // Chat's echo (vLLM): set, with nothing to echo after a user message.
  r = Ok(ParseChatRequest(ChatBody(R"("echo": true)")));
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.echo_text, "");
}

TEST(FieldTest, SupportedValuesOfUnsupportedFeatures) {
  Ok(ParseCompletionRequest(CompletionBody(R"("best_of": 1)")));
  Ok(ParseCompletionRequest(CompletionBody(R"("n": 2, "best_of": 2)")));
  Ok(ParseCompletionRequest(CompletionBody(R"("logit_bias": {})")));
  Ok(ParseCompletionRequest(CompletionBody(R"("suffix": "")")));
  Ok(ParseCompletionRequest(CompletionBody(R"("suffix": null)")));
  Ok(ParseChatRequest(ChatBody(R"("response_format": {"type": "text"})")));
  Ok(ParseCompletionRequest(
      CompletionBody(R"("response_format": {"type": "text"})")));
  // vLLM's fields at the value that asks for nothing.
  for (
      const char* extra : {
          R"("use_beam_search": false)",
          R"("prompt_logprobs": null)",
          R"("truncate_prompt_tokens": null)",
          R"("allowed_token_ids": null)",
          R"("bad_words": [])",
          R"("logits_processors": [])",
          R"("return_tokens_as_token_ids": false)",
          R"("cache_salt": null)",
          R"("kv_transfer_params": {})",
          R"("priority": 0)",
          R"("guided_json": null, "guided_regex": null)",
          R"("stream": true, "stream_options": {"continuous_usage_stats": false})",
      }) {
    Ok(ParseCompletionRequest(CompletionBody(extra)));
    Ok(ParseChatRequest(ChatBody(extra)));
  }
  Ok(ParseChatRequest(ChatBody(R"("chat_template": null)")));
  Ok(ParseCompletionRequest(CompletionBody(R"("prompt_embeds": null)")));
}

// Structured output: every spelling becomes the one grammar the sampler
// enforces.
TEST(FieldTest, StructuredOutputBecomesAGrammar) {
  for (
      const char* extra : {
          R"("response_format": {"type": "json_object"})",
          R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})",
          R"("guided_json": {"type": "array", "items": {"enum": [1, 2]}})",
          R"("guided_json": "{\"type\": \"string\", \"maxLength\": 3}")",
          R"("guided_regex": "[a-z]{2,4}@x\\.com")",
          R"("guided_choice": ["yes", "no"])",
          R"("guided_grammar": "root ::= \"a\" root | \"b\"")",
          R"("structured_outputs": {"json": {"type": "boolean"}})",
          R"("structured_outputs": {"regex": "[0-9]+"})",
          R"("structured_outputs": {"choice": ["x"]})",
          R"("structured_outputs": {"grammar": "root ::= [a-z]+"})",
          R"("structured_outputs": {"json_object": true})",
      }) {
    for (bool chat : {false, true}) {
      CompletionRequest r =
          Ok(chat ? ParseChatRequest(ChatBody(extra))
                  : ParseCompletionRequest(CompletionBody(extra)));
      EXPECT_NE(r.grammar.find("root ::="), std::string::npos) << extra;
      GenerationRequest g = ToGenerationRequest(r, {1, 2}, 0, {});
      EXPECT_EQ(g.grammar, r.grammar);
    }
  }
  EXPECT_TRUE(
      Ok(ParseChatRequest(ChatBody(R"("response_format": {"type": "text"})")))
          .grammar.empty());
  // The old backend selector is accepted and listed as ignored, as vLLM
  // deprecated it.
  CompletionRequest r = Ok(ParseCompletionRequest(
      CompletionBody(R"("guided_decoding_backend": "xgrammar")")));
  EXPECT_TRUE(r.grammar.empty());
  EXPECT_EQ(r.ignored_fields,
            std::vector<std::string>({"guided_decoding_backend"}));
}

// Which grammar-forced tool_choice a request resolves to, and its grammar.
TEST(FieldTest, ToolChoiceResolves) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city":
          {"type": "string"}}, "required": ["city"]}}},
          {"type": "function", "function": {"name": "now"}}])";
  ParseOptions with_parser;
  with_parser.auto_tool_choice = true;
  // Absent: "auto" with a parser, else "none" (tools only rendered).
  EXPECT_EQ(Ok(ParseChatRequest(ChatBody(tools))).tool_choice,
            ToolChoice::kNone);
  EXPECT_EQ(Ok(ParseChatRequest(ChatBody(tools), with_parser)).tool_choice,
            ToolChoice::kAuto);
  EXPECT_TRUE(
      Ok(ParseChatRequest(ChatBody(tools), with_parser)).grammar.empty());
  EXPECT_EQ(Ok(ParseChatRequest(ChatBody(tools + R"(, "tool_choice": "none")"),
                                with_parser))
                .tool_choice,
            ToolChoice::kNone);
  CompletionRequest required =
      Ok(ParseChatRequest(ChatBody(tools + R"(, "tool_choice": "required")")));
  EXPECT_EQ(required.tool_choice, ToolChoice::kRequired);
  EXPECT_TRUE(required.parallel_tool_calls);
  EXPECT_NE(required.grammar.find("root ::="), std::string::npos);
  EXPECT_EQ(ToGenerationRequest(required, {1}, 0, {}).grammar,
            required.grammar);
  CompletionRequest named = Ok(ParseChatRequest(
      ChatBody(tools + R"(, "parallel_tool_calls": false, "tool_choice":
          {"type": "function", "function": {"name": "get_weather"}})")));
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_name, "get_weather");
  EXPECT_FALSE(named.parallel_tool_calls);
  EXPECT_NE(named.grammar, required.grammar);
  EXPECT_NE(named.grammar.find("city"), std::string::npos);
  EXPECT_FALSE(Ok(ParseChatRequest(ChatBody(R"("include_reasoning": false)")))
                   .include_reasoning);
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
    {R"("n": 2147483648)", "n", "invalid_value"},
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
    {R"("n": 3, "best_of": 2)", "best_of", "invalid_value"},
    {R"("min_tokens": -1)", "min_tokens", "invalid_value"},
    {R"("min_tokens": "1")", "min_tokens", "invalid_type"},
    {R"("min_tokens": 1.5)", "min_tokens", "invalid_type"},
    {R"("max_tokens": 5, "min_tokens": 6)", "min_tokens", "invalid_value"},
    {R"("include_stop_str_in_output": 1)", "include_stop_str_in_output",
     "invalid_type"},
    {R"("skip_special_tokens": "false")", "skip_special_tokens",
     "invalid_type"},
    {R"("spaces_between_special_tokens": 0)", "spaces_between_special_tokens",
     "invalid_type"},
    {R"("add_special_tokens": "yes")", "add_special_tokens", "invalid_type"},
    {R"("echo": 1)", "echo", "invalid_type"},
    {R"("request_id": 5)", "request_id", "invalid_type"},
    {R"("request_id": "")", "request_id", "invalid_value"},
    {R"("response_format": {"type": "json_schema"})",
     "response_format.json_schema", "missing_required_parameter"},
    {R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strange"}}})",
     "response_format.json_schema.schema", "invalid_value"},
    {R"("response_format": {"type": "structural_tag"})", "response_format",
     "unsupported_parameter"},
    {R"("guided_regex": "a(b")", "guided_regex", "invalid_value"},
    {R"("guided_regex": 5)", "guided_regex", "invalid_type"},
    {R"("guided_choice": [])", "guided_choice", "invalid_type"},
    {R"("guided_choice": ["a", 1])", "guided_choice.[1]", "invalid_type"},
    {R"("guided_grammar": "root ::= undefined")", "guided_grammar",
     "invalid_value"},
    {R"("guided_json": "{not json")", "guided_json", "invalid_value"},
    {R"("structured_outputs": {"regex": "x", "choice": ["a"]})",
     "structured_outputs.choice", "invalid_value"},
    {R"("guided_json": {}, "response_format": {"type": "json_object"})",
     "guided_json", "invalid_value"},
    {R"("structured_outputs": {"whitespace_pattern": " "})",
     "structured_outputs.whitespace_pattern", "unsupported_parameter"},
    {R"("response_format": {"type": "yaml"})", "response_format.type",
     "invalid_value"},
    {R"("response_format": {})", "response_format.type",
     "missing_required_parameter"},
    {R"("response_format": "text")", "response_format", "invalid_type"},
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
           {R"("logprobs": 21)", "logprobs", "invalid_value"},
           {R"("logprobs": -1)", "logprobs", "invalid_value"},
           {R"("logprobs": true)", "logprobs", "invalid_type"},
           {R"("logprobs": 2.5)", "logprobs", "invalid_type"},
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
           {R"("logprobs": false, "top_logprobs": 2)", "top_logprobs",
            "invalid_value"},
           {R"("max_completion_tokens": 0)", "max_completion_tokens",
            "invalid_value"},
           {R"("max_completion_tokens": "5")", "max_completion_tokens",
            "invalid_type"},
           {R"("max_completion_tokens": 3, "min_tokens": 4)", "min_tokens",
            "invalid_value"},
           {R"("tools": {})", "tools", "invalid_type"},
           {R"("documents": {})", "documents", "invalid_type"},
           {R"("documents": ["a"])", "documents.[0]", "invalid_type"},
           {R"("add_generation_prompt": 0)", "add_generation_prompt",
            "invalid_type"},
           {R"("continue_final_message": "yes")", "continue_final_message",
            "invalid_type"},
           // add_generation_prompt defaults to true.
           {R"("continue_final_message": true)", "continue_final_message",
            "invalid_value"},
           {R"("continue_final_message": true, "add_generation_prompt": true)",
            "continue_final_message", "invalid_value"},
           // The final message is the user's.
           {R"("continue_final_message": true, "add_generation_prompt": false)",
            "continue_final_message", "invalid_value"},
           {R"("echo": true, "logprobs": true)", "echo",
            "unsupported_parameter"},
           {R"("tool_choice": "auto")", "tool_choice", "invalid_value"},
           {R"("tool_choice": "sometimes", "tools": [])", "tool_choice",
            "invalid_value"},
           {R"("tool_choice": 1, "tools": [])", "tool_choice", "invalid_type"},
           // "auto" needs the server's tool-call parser (not set here).
           {R"("tool_choice": "auto",
               "tools": [{"type": "function", "function": {"name": "f"}}])",
            "tool_choice", "unsupported_parameter"},
           {R"("tool_choice": {"type": "function", "function": {"name": "g"}},
               "tools": [{"type": "function", "function": {"name": "f"}}])",
            "tool_choice.function.name", "invalid_value"},
           {R"("tool_choice": {"type": "function", "function": {}},
               "tools": [{"type": "function", "function": {"name": "f"}}])",
            "tool_choice.function.name", "missing_required_parameter"},
           {R"("tool_choice": {"type": "tool", "function": {"name": "f"}},
               "tools": [{"type": "function", "function": {"name": "f"}}])",
            "tool_choice.type", "invalid_value"},
           {R"("tool_choice": {"function": {"name": "f"}})", "tool_choice",
            "invalid_value"},
           // Forced calls are a grammar: not with another structured output.
           {R"("tool_choice": "required",
               "response_format": {"type": "json_object"},
               "tools": [{"type": "function", "function": {"name": "f"}}])",
            "tool_choice", "invalid_value"},
           {R"("tools": [{"type": "function", "function": {"name": ""}}])",
            "tools.[0].function.name", "invalid_type"},
           {R"("tools": [{"type": "function"}])", "tools.[0].function",
            "missing_required_parameter"},
           {R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])",
            "tools.[0].type", "invalid_value"},
           {R"("tools": [3])", "tools.[0]", "invalid_type"},
           {R"("tools": [{"function": {"name": "f", "parameters": 3}}])",
            "tools.[0].function.parameters", "invalid_type"},
           // A parameters schema the engine refuses names the tool.
           {R"("tool_choice": "required", "tools": [
                {"function": {"name": "f"}},
                {"function": {"name": "g", "parameters":
                  {"type": "array", "uniqueItems": true}}}])",
            "tools.[1].function.parameters", "invalid_value"},
           {R"("parallel_tool_calls": 1)", "parallel_tool_calls",
            "invalid_type"},
           {R"("include_reasoning": "no")", "include_reasoning",
            "invalid_type"},
           {R"("chat_template_kwargs": [])", "chat_template_kwargs",
            "invalid_type"},
       }) {
    ExpectBad(/*chat=*/true, c);
  }
}

TEST(FieldTest, RangeMessageQuotesTheValue) {
  ApiError error = Err(ParseCompletionRequest(CompletionBody(R"("top_p": 3)")));
  EXPECT_EQ(error.message,
            "Invalid value for 'top_p': expected a number in (0, 1], "
            "but got 3 instead.");
  // A long value is quoted in part, so an error stays small.
  error = Err(ParseChatRequest(ChatBody(absl::StrCat(
      R"("tools": [], "tool_choice": ")", std::string(100000, 'x'), "\""))));
  EXPECT_EQ(error.param, "tool_choice");
  EXPECT_NE(error.message.find("but got \"xxxx"), std::string::npos);
  EXPECT_LT(error.message.size(), 300u) << error.message;
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
  // null and absent content are "" (as vLLM renders them).
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(Keys(r.messages[4]), Keys_({"role", "content"}));
  EXPECT_EQ(r.messages[4]["content"], "");
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
         "stop_token_ids": [9], "ignore_eos": true, "logprobs": 4,
         "min_tokens": 3, "include_stop_str_in_output": true,
         "skip_special_tokens": false,
         "spaces_between_special_tokens": false)")));
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
  EXPECT_EQ(g.min_tokens, 3);
  EXPECT_TRUE(g.include_stop_str_in_output);
  EXPECT_FALSE(g.skip_special_tokens);
  EXPECT_FALSE(g.spaces_between_special_tokens);
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
  EXPECT_EQ(g.min_tokens, 0);
  EXPECT_FALSE(g.include_stop_str_in_output);
  EXPECT_TRUE(g.skip_special_tokens);
  EXPECT_TRUE(g.spaces_between_special_tokens);
  EXPECT_EQ(g.sampling.repetition_penalty, 1.0f);
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
      R"("finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":3,)"
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
  EXPECT_EQ(Keys(c), Keys_({"index", "text", "logprobs", "finish_reason",
                            "stop_reason"}));
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
      R"("content":"Hi \"there\"\n"},"logprobs":null,"finish_reason":"stop",)"
      R"("stop_reason":null},{"index":1,"message":{"role":"assistant",)"
      R"("content":""},"logprobs":null,"finish_reason":"abort",)"
      R"("stop_reason":null}],"usage":)"
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
  EXPECT_EQ(Keys(c), Keys_({"index", "message", "logprobs", "finish_reason",
                            "stop_reason"}));
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
            R"("created":1700000000,"owned_by":"tessera","root":"tiny-llama",)"
            R"("parent":null}]})");
  ModelCard card;
  card.id = "tiny";
  card.created = 1700000001;
  card.root = "/models/tiny";
  card.max_model_len = 4096;
  EXPECT_EQ(ModelsResponse(card),
            R"({"object":"list","data":[{"id":"tiny","object":"model",)"
            R"("created":1700000001,"owned_by":"tessera",)"
            R"("root":"/models/tiny","parent":null,"max_model_len":4096}]})");
  EXPECT_EQ(ModelResponse(card),
            R"({"id":"tiny","object":"model","created":1700000001,)"
            R"("owned_by":"tessera","root":"/models/tiny","parent":null,)"
            R"("max_model_len":4096})");
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
            R"("logprobs":null,"finish_reason":null,"stop_reason":null}]})");
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
            R"("finish_reason":null}]})");  // No stop_reason before the end.

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
  EXPECT_EQ(Keys(json["choices"][0]), Keys_({"index", "delta", "logprobs",
                                             "finish_reason", "stop_reason"}));
  EXPECT_TRUE(json["choices"][0]["stop_reason"].is_null());
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

// ---------------------------------------------------------------------------
// Nesting: checked on the text before anything recurses over it.

TEST(NestingTest, DeepBodyIs400ThatSaysWhy) {
  const std::string body = absl::StrCat(R"({"a":)", std::string(80000, '['),
                                        std::string(80000, ']'), R"(,"b":1})");
  for (bool chat : {false, true}) {
    ApiError error =
        Err(chat ? ParseChatRequest(body) : ParseCompletionRequest(body));
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_NE(error.message.find("nested deeper than 64 levels"),
              std::string::npos)
        << error.message;
  }
}

TEST(NestingTest, DeepMessageToolsAndKwargsAre400) {
  const std::string deep =
      absl::StrCat(std::string(20000, '['), std::string(20000, ']'));
  for (const std::string& body : {
           absl::StrCat(R"({"model": "m", "messages": [{"role": "user", )",
                        R"("content": "x", "extra": )", deep, "}]}"),
           ChatBody(absl::StrCat(R"("tools": )", deep)),
           ChatBody(
               absl::StrCat(R"("chat_template_kwargs": {"a": )", deep, "}")),
       }) {
    ApiError error = Err(ParseChatRequest(body));
    EXPECT_EQ(error.http_status, 400);
    EXPECT_NE(error.message.find("nested deeper"), std::string::npos);
  }
}

TEST(NestingTest, SixtyFourLevelsAccepted) {
  // The body is level 1, chat_template_kwargs 2, then 62 arrays.
  const std::string kwargs =
      absl::StrCat(R"("chat_template_kwargs": {"a": )", std::string(62, '['),
                   std::string(62, ']'), "}");
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(kwargs)));
  EXPECT_TRUE(r.chat_template_kwargs["a"].is_array());
  const std::string too_deep =
      absl::StrCat(R"("chat_template_kwargs": {"a": )", std::string(63, '['),
                   std::string(63, ']'), "}");
  EXPECT_EQ(Err(ParseChatRequest(ChatBody(too_deep))).http_status, 400);
}

TEST(NestingTest, BracketsInStringsDoNotCount) {
  CompletionRequest r = Ok(ParseCompletionRequest(absl::StrCat(
      R"({"model": "m", "prompt": ")", std::string(1000, '['), R"("})")));
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), std::string(1000, '['));
}

// ---------------------------------------------------------------------------
// generation_config.json defaults apply to unset fields only.

GenerationDefaults QwenDefaults() {
  GenerationDefaults d;
  d.temperature = 0.6f;
  d.top_p = 0.95f;
  d.top_k = 20;
  d.min_p = 0.05f;
  d.repetition_penalty = 1.05f;
  d.max_tokens = 300;
  return d;
}

TEST(DefaultsTest, UnsetFieldsTakeGenerationConfig) {
  for (bool chat : {false, true}) {
    CompletionRequest r = Ok(chat ? ParseChatRequest(ChatBody())
                                  : ParseCompletionRequest(CompletionBody()));
    GenerationRequest g = ToGenerationRequest(r, {1}, 0, QwenDefaults());
    EXPECT_FLOAT_EQ(g.sampling.temperature, 0.6f);
    EXPECT_FLOAT_EQ(g.sampling.top_p, 0.95f);
    EXPECT_EQ(g.sampling.top_k, 20);
    EXPECT_FLOAT_EQ(g.sampling.min_p, 0.05f);
    EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.05f);
    // max_new_tokens replaces completions' 16 and chat's "until full".
    EXPECT_EQ(g.max_tokens, 300);
    EXPECT_TRUE(g.sampling.Validate().ok());
  }
}

TEST(DefaultsTest, RequestValuesWin) {
  const std::string extra =
      R"("temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0,
         "repetition_penalty": 1, "max_tokens": 7)";
  for (bool chat : {false, true}) {
    CompletionRequest r =
        Ok(chat ? ParseChatRequest(ChatBody(extra))
                : ParseCompletionRequest(CompletionBody(extra)));
    GenerationRequest g = ToGenerationRequest(r, {1}, 0, QwenDefaults());
    EXPECT_EQ(g.sampling.temperature, 0.0f);
    EXPECT_EQ(g.sampling.top_p, 1.0f);
    EXPECT_EQ(g.sampling.top_k, 0);  // -1 is "off", which is a value.
    EXPECT_EQ(g.sampling.min_p, 0.0f);
    EXPECT_EQ(g.sampling.repetition_penalty, 1.0f);
    EXPECT_EQ(g.max_tokens, 7);
  }
}

TEST(DefaultsTest, NullIsUnset) {
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody(
      R"("temperature": null, "top_k": null, "max_tokens": null)")));
  GenerationRequest g = ToGenerationRequest(r, {1}, 0, QwenDefaults());
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.6f);
  EXPECT_EQ(g.sampling.top_k, 20);
  EXPECT_EQ(g.max_tokens, 300);
}

TEST(DefaultsTest, PartialDefaultsFallBackToTheApi) {
  GenerationDefaults d;
  d.temperature = 0.7f;
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody()));
  GenerationRequest g = ToGenerationRequest(r, {1}, 0, d);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.7f);
  EXPECT_EQ(g.sampling.top_p, 1.0f);
  EXPECT_EQ(g.sampling.top_k, 0);
  EXPECT_EQ(g.sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(g.max_tokens, 16);  // Completions' own default.
  g = ToGenerationRequest(Ok(ParseChatRequest(ChatBody())), {1}, 0, d);
  EXPECT_EQ(g.max_tokens, std::numeric_limits<int64_t>::max());
  // Explicit null on completions: until the context is full.
  g = ToGenerationRequest(
      Ok(ParseCompletionRequest(CompletionBody(R"("max_tokens": null)"))), {1},
      0, d);
  EXPECT_EQ(g.max_tokens, std::numeric_limits<int64_t>::max());
}

TEST(DefaultsTest, ResolveMaxTokens) {
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody()));
  EXPECT_EQ(ResolveMaxTokens(r, {}), std::optional<int64_t>(16));
  EXPECT_EQ(ResolveMaxTokens(r, QwenDefaults()), std::optional<int64_t>(300));
  r = Ok(ParseChatRequest(ChatBody()));
  EXPECT_EQ(ResolveMaxTokens(r, {}), std::nullopt);
  r = Ok(ParseChatRequest(ChatBody(R"("max_completion_tokens": 9)")));
  EXPECT_EQ(ResolveMaxTokens(r, QwenDefaults()), std::optional<int64_t>(9));
}

// ---------------------------------------------------------------------------
// vLLM's extra fields.

TEST(ExtraFieldsTest, ParsedOnBothEndpoints) {
  const std::string extra =
      R"("min_tokens": 4, "max_tokens": 4, "include_stop_str_in_output": true,
         "skip_special_tokens": false, "spaces_between_special_tokens": false,
         "add_special_tokens": true, "request_id": "abc-1")";
  for (bool chat : {false, true}) {
    CompletionRequest r =
        Ok(chat ? ParseChatRequest(ChatBody(extra))
                : ParseCompletionRequest(CompletionBody(extra)));
    EXPECT_EQ(r.min_tokens, 4);
    EXPECT_TRUE(r.include_stop_str_in_output);
    EXPECT_FALSE(r.skip_special_tokens);
    EXPECT_FALSE(r.spaces_between_special_tokens);
    EXPECT_TRUE(r.add_special_tokens);
    EXPECT_EQ(r.request_id, std::optional<std::string>("abc-1"));
    EXPECT_EQ(ResponseId(r), chat ? "chatcmpl-abc-1" : "cmpl-abc-1");
    EXPECT_TRUE(r.ignored_fields.empty());
  }
  EXPECT_FALSE(Ok(ParseCompletionRequest(
                      CompletionBody(R"("add_special_tokens": false)")))
                   .add_special_tokens);
  CompletionRequest r = Ok(ParseChatRequest(ChatBody()));
  EXPECT_EQ(ResponseId(r).rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(ResponseId(r).size(), 9u + 32u);
  EXPECT_EQ(Err(ParseChatRequest(ChatBody(absl::StrCat(
                    R"("request_id": ")", std::string(257, 'x'), "\""))))
                .param,
            "request_id");
}

TEST(ExtraFieldsTest, MinTokensWithoutMaxTokens) {
  // Completions' default limit (16) is not the client's: checked against the
  // context (CheckContextLength), not at parse time.
  CompletionRequest r =
      Ok(ParseCompletionRequest(CompletionBody(R"("min_tokens": 20)")));
  EXPECT_EQ(r.min_tokens, 20);
  EXPECT_EQ(ToGenerationRequest(r, {1}, 0).min_tokens, 20);
  EXPECT_EQ(
      Ok(ParseChatRequest(ChatBody(R"("min_tokens": 100000)"))).min_tokens,
      100000);
  // Equal is fine.
  Ok(ParseChatRequest(ChatBody(R"("min_tokens": 5, "max_tokens": 5)")));
  ApiError error =
      Err(ParseChatRequest(ChatBody(R"("min_tokens": 6, "max_tokens": 5)")));
  EXPECT_EQ(error.message,
            "min_tokens must be less than or equal to max_tokens=5, got 6.");
}

TEST(ExtraFieldsTest, ChatTemplateFlags) {
  const std::string messages =
      R"({"model": "m", "messages": [{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hel"}], )";
  CompletionRequest r = Ok(ParseChatRequest(absl::StrCat(
      messages,
      R"("add_generation_prompt": false, "continue_final_message": true})")));
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_TRUE(r.continue_final_message);
  r = Ok(ParseChatRequest(
      absl::StrCat(messages, R"("add_generation_prompt": false})")));
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_FALSE(r.continue_final_message);
}

TEST(ExtraFieldsTest, ChatEcho) {
  const std::string messages =
      R"({"model": "m", "messages": [{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": [{"type": "text", "text": "Hel"},
                                            {"type": "text", "text": "lo"}]}],
          "add_generation_prompt": false, "continue_final_message": true)";
  CompletionRequest r =
      Ok(ParseChatRequest(absl::StrCat(messages, R"(, "echo": true})")));
  EXPECT_EQ(r.echo_text, "Hel\nlo");
  r = Ok(ParseChatRequest(absl::StrCat(messages, "}")));
  EXPECT_EQ(r.echo_text, "");
  // Echo after a user message echoes nothing (the reply is the assistant's).
  r = Ok(ParseChatRequest(ChatBody(R"("echo": true)")));
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.echo_text, "");
}

TEST(ExtraFieldsTest, ToolsDocumentsAndKwargsFormTheTemplateContext) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody(
      R"("tools": [{"type": "function", "function": {"name": "f"}}],
         "tool_choice": "none",
         "documents": [{"title": "t", "text": "x"}],
         "chat_template_kwargs": {"enable_thinking": false, "documents": []})")));
  ordered_json context = ChatTemplateContext(r);
  EXPECT_EQ(Keys(context), Keys_({"tools", "documents", "enable_thinking"}));
  EXPECT_EQ(context["tools"][0]["function"]["name"], "f");
  EXPECT_EQ(context["documents"], ordered_json::array());  // kwargs win.
  EXPECT_EQ(context["enable_thinking"], false);
  EXPECT_EQ(ChatTemplateContext(Ok(ParseChatRequest(ChatBody()))),
            ordered_json::object());
  // tool_choice "none", and "auto" or "required" with no tools, are
  // accepted.
  Ok(ParseChatRequest(ChatBody(R"("tool_choice": "none")")));
  Ok(ParseChatRequest(ChatBody(R"("tool_choice": "required", "tools": [])")));
  Ok(ParseChatRequest(ChatBody(R"("tool_choice": "auto", "tools": [])")));
}

TEST(ContinueFinalMessageTest, CutsAfterTheFinalMessage) {
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello, I am"}])");
  const std::string rendered =
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I "
      "am<|im_end|>\n";
  absl::StatusOr<std::string> cut = ContinueFinalMessage(rendered, messages);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(*cut,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I "
            "am");
}

TEST(ContinueFinalMessageTest, TrailingSpaceKeptOnlyWhereTheTemplateKeptIt) {
  const ordered_json messages =
      ordered_json::parse(R"([{"role": "assistant", "content": "Sure: "}])");
  // A template that trims the content.
  EXPECT_EQ(ContinueFinalMessage("<a>Sure:</a>", messages).value(), "<a>Sure:");
  // A template that keeps it.
  EXPECT_EQ(ContinueFinalMessage("<a>Sure: </a>", messages).value(),
            "<a>Sure: ");
  // The last occurrence counts.
  const ordered_json twice = ordered_json::parse(
      R"([{"role": "user", "content": "ok"},
          {"role": "assistant", "content": "ok"}])");
  EXPECT_EQ(ContinueFinalMessage("[ok][ok]", twice).value(), "[ok][ok");
}

TEST(ContinueFinalMessageTest, MissingContentIsAnError) {
  const ordered_json messages =
      ordered_json::parse(R"([{"role": "assistant", "content": "absent"}])");
  absl::StatusOr<std::string> cut = ContinueFinalMessage("<a>x</a>", messages);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApiErrorFromStatus(cut.status()).http_status, 400);
  EXPECT_FALSE(ContinueFinalMessage("x", ordered_json::array()).ok());
}

// ---------------------------------------------------------------------------
// Fields vLLM implements and Tessera does not: a 400 naming the field.

TEST(UnsupportedTest, NamedWithUnsupportedParameter) {
  struct Case {
    const char* extra;
    const char* param;
    bool completions;
    bool chat;
  };
  for (
      const Case& c : std::vector<Case>{
          {R"("use_beam_search": true)", "use_beam_search", true, true},
          {R"("prompt_logprobs": 0)", "prompt_logprobs", true, true},
          {R"("truncate_prompt_tokens": 5)", "truncate_prompt_tokens", true,
           true},
          {R"("allowed_token_ids": [1, 2])", "allowed_token_ids", true, true},
          {R"("allowed_token_ids": [])", "allowed_token_ids", true, true},
          {R"("bad_words": ["x"])", "bad_words", true, true},
          {R"("logits_processors": ["m.P"])", "logits_processors", true, true},
          {R"("return_tokens_as_token_ids": true)",
           "return_tokens_as_token_ids", true, true},
          {R"("return_token_ids": true)", "return_token_ids", true, true},
          {R"("cache_salt": "s")", "cache_salt", true, true},
          {R"("kv_transfer_params": {"a": 1})", "kv_transfer_params", true,
           true},
          {R"("priority": 1)", "priority", true, true},
          {R"("guided_whitespace_pattern": " ")", "guided_whitespace_pattern",
           true, true},
          {R"("structural_tag": "{}")", "structural_tag", true, true},
          {R"("logit_bias": {"1": 5})", "logit_bias", true, true},
          {R"("best_of": 3)", "best_of", true, true},
          {R"("stream": true, "stream_options": {"continuous_usage_stats": true})",
           "stream_options.continuous_usage_stats", true, true},
          {R"("prompt_embeds": "AAAA")", "prompt_embeds", true, false},
          {R"("suffix": "x")", "suffix", true, false},
          {R"("chat_template": "{{ x }}")", "chat_template", false, true},
      }) {
    for (bool chat : {false, true}) {
      if (chat ? !c.chat : !c.completions) continue;
      const std::string body =
          chat ? ChatBody(c.extra) : CompletionBody(c.extra);
      ApiError error =
          Err(chat ? ParseChatRequest(body) : ParseCompletionRequest(body));
      EXPECT_EQ(error.http_status, 400) << body;
      EXPECT_EQ(error.param, c.param) << body << ": " << error.message;
      EXPECT_EQ(error.code, "unsupported_parameter") << body;
      EXPECT_NE(error.message.find(c.param), std::string::npos)
          << error.message;
    }
  }
  // The other endpoint's field is ignored, as vLLM ignores unknown fields.
  EXPECT_EQ(Ok(ParseChatRequest(ChatBody(R"("prompt_embeds": "AAAA")")))
                .ignored_fields,
            std::vector<std::string>({"prompt_embeds"}));
}

TEST(UnsupportedTest, IgnoredFieldsWarning) {
  CompletionRequest r = Ok(ParseChatRequest(
      ChatBody(R"("user": "u", "store": false, "we\nird": 1)")));
  EXPECT_EQ(IgnoredFieldsWarning(r),
            "The following fields were present in the request but ignored: "
            R"("user", "store", "we\nird")");
  EXPECT_EQ(IgnoredFieldsWarning(Ok(ParseChatRequest(ChatBody()))), "");
  // Bounded: 16 names of at most 64 bytes, then a count.
  std::string extra;
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&extra, i ? ", " : "", "\"", std::string(100, 'a' + i % 26),
                    i, "\": 1");
  }
  r = Ok(ParseCompletionRequest(CompletionBody(extra)));
  EXPECT_EQ(r.ignored_fields.size(), 40u);
  const std::string warning = IgnoredFieldsWarning(r);
  EXPECT_LT(warning.size(), 16u * 72u + 100u);
  EXPECT_NE(warning.find(" and 24 more"), std::string::npos) << warning;
}

// ---------------------------------------------------------------------------
// vLLM's limits.

TEST(LimitsTest, MaxLogprobsIsConfigurable) {
  ParseOptions options;
  options.max_logprobs = 5;
  EXPECT_EQ(
      Ok(ParseCompletionRequest(CompletionBody(R"("logprobs": 5)"), options))
          .top_logprobs,
      5);
  ApiError error =
      Err(ParseCompletionRequest(CompletionBody(R"("logprobs": 6)"), options));
  EXPECT_EQ(error.param, "logprobs");
  EXPECT_NE(error.message.find("[0, 5]"), std::string::npos) << error.message;
  EXPECT_EQ(
      Err(ParseChatRequest(ChatBody(R"("logprobs": true, "top_logprobs": 6)"),
                           options))
          .param,
      "top_logprobs");
  // Default 20.
  EXPECT_EQ(
      Ok(ParseChatRequest(ChatBody(R"("logprobs": true, "top_logprobs": 20)")))
          .top_logprobs,
      20);
  EXPECT_EQ(
      Err(ParseChatRequest(ChatBody(R"("logprobs": true, "top_logprobs": 21)")))
          .param,
      "top_logprobs");
  // Negative: no limit.
  options.max_logprobs = -1;
  EXPECT_EQ(
      Ok(ParseCompletionRequest(CompletionBody(R"("logprobs": 1000)"), options))
          .top_logprobs,
      1000);
}

TEST(LimitsTest, TemperatureAboveTwoAndLargeN) {
  CompletionRequest r = Ok(ParseChatRequest(
      ChatBody(R"("temperature": 5, "n": 1000, "best_of": 1000)")));
  EXPECT_EQ(r.temperature, std::optional<float>(5.0f));
  EXPECT_EQ(r.n, 1000);
  EXPECT_TRUE(ToGenerationRequest(r, {1}, 0).sampling.Validate().ok());
}

// ---------------------------------------------------------------------------
// Messages as vLLM hands them to the template.

TEST(MessagesTest, ToolCallArgumentsParsedIntoObjects) {
  CompletionRequest r = Ok(ParseChatRequest(R"({"model": "m", "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get", "arguments": "{\"city\": \"Oslo\"}"}},
        {"id": "c2", "type": "function",
         "function": {"name": "now", "arguments": {"tz": "UTC"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "5C"}]})"));
  const ordered_json& calls = r.messages[1]["tool_calls"];
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(calls[0]["function"]["arguments"],
            ordered_json::parse(R"({"city": "Oslo"})"));
  EXPECT_EQ(calls[1]["function"]["arguments"],
            ordered_json::parse(R"({"tz": "UTC"})"));
  EXPECT_EQ(calls[0]["id"], "c1");
}

TEST(MessagesTest, BadToolCallsAre400NamingTheField) {
  struct Case {
    const char* message;
    const char* param;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"role": "assistant", "tool_calls": [{"function":
                {"name": "f", "arguments": "{not json"}}]})",
            "messages.[0].tool_calls.[0].function.arguments"},
           {R"({"role": "assistant", "tool_calls": {}})",
            "messages.[0].tool_calls"},
           {R"({"role": "assistant", "tool_calls": [3]})",
            "messages.[0].tool_calls.[0]"},
           {R"({"role": "assistant", "tool_calls": [{"function": "f"}]})",
            "messages.[0].tool_calls.[0].function"},
       }) {
    const std::string body =
        absl::StrCat(R"({"model": "m", "messages": [)", c.message, "]}");
    ApiError error = Err(ParseChatRequest(body));
    EXPECT_EQ(error.http_status, 400) << body;
    EXPECT_EQ(error.param, c.param) << body << ": " << error.message;
  }
  // Arguments nested too deep inside their string are refused too.
  const std::string deep =
      absl::StrCat(std::string(70, '['), std::string(70, ']'));
  ApiError error = Err(ParseChatRequest(absl::StrCat(
      R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": )",
      R"([{"function": {"name": "f", "arguments": ")", deep, R"("}}]}]})")));
  EXPECT_EQ(error.param, "messages.[0].tool_calls.[0].function.arguments");
  EXPECT_NE(error.message.find("nested deeper"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Context length (vLLM's wording).

TEST(ContextLengthTest, PromptTooLong) {
  CompletionRequest r = Ok(ParseChatRequest(ChatBody()));
  std::optional<ApiError> error = CheckContextLength(r, {}, 512, 512);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->http_status, 400);
  EXPECT_EQ(error->message,
            "This model's maximum context length is 512 tokens. However, you "
            "requested 512 tokens in the messages, Please reduce the length "
            "of the messages.");
  EXPECT_EQ(error->param, "messages");
  EXPECT_EQ(error->code, "context_length_exceeded");
  EXPECT_FALSE(CheckContextLength(r, {}, 511, 512).has_value());
  EXPECT_EQ(PromptTooLong(Endpoint::kCompletions, 8, 9).param, "prompt");
}

TEST(ContextLengthTest, RequestedMaxTokensMustFit) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(CompletionBody(R"("max_tokens": 100)")));
  std::optional<ApiError> error = CheckContextLength(r, {}, 450, 512);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->message,
            "This model's maximum context length is 512 tokens. However, you "
            "requested 550 tokens (450 in the messages, 100 in the "
            "completion). Please reduce the length of the messages or "
            "completion.");
  EXPECT_EQ(error->param, "prompt");
  EXPECT_FALSE(CheckContextLength(r, {}, 412, 512).has_value());
  // A huge max_tokens does not overflow the sum.
  r = Ok(ParseCompletionRequest(
      CompletionBody(R"("max_tokens": 9223372036854775807)")));
  error = CheckContextLength(r, {}, 10, 512);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->message.find("requested 9223372036854775807 tokens"),
            std::string::npos)
      << error->message;
}

TEST(ContextLengthTest, DefaultLimitsAreCappedNotRefused) {
  // Completions' 16 and generation_config's max_new_tokens are not the
  // client's: they shrink to the room left.
  CompletionRequest r = Ok(ParseCompletionRequest(CompletionBody()));
  EXPECT_FALSE(CheckContextLength(r, {}, 510, 512).has_value());
  EXPECT_FALSE(CheckContextLength(r, QwenDefaults(), 510, 512).has_value());
}

TEST(ContextLengthTest, MinTokensMustFitTheLimitThatApplies) {
  CompletionRequest r =
      Ok(ParseCompletionRequest(CompletionBody(R"("min_tokens": 20)")));
  std::optional<ApiError> error = CheckContextLength(r, {}, 10, 512);
  ASSERT_TRUE(error.has_value());  // 16 by default.
  EXPECT_EQ(error->message,
            "min_tokens must be less than or equal to max_tokens=16, got 20.");
  EXPECT_EQ(error->param, "min_tokens");
  EXPECT_FALSE(CheckContextLength(r, QwenDefaults(), 10, 512).has_value());
  // Chat without a limit: the room left.
  r = Ok(ParseChatRequest(ChatBody(R"("min_tokens": 100)")));
  EXPECT_FALSE(CheckContextLength(r, {}, 412, 512).has_value());
  error = CheckContextLength(r, {}, 413, 512);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->message,
            "min_tokens must be less than or equal to max_tokens=99, got 100.");
}

// ---------------------------------------------------------------------------
// stop_reason.

TEST(StopReasonTest, InResponses) {
  Choice by_string;
  by_string.text = "a";
  by_string.finish_reason = FinishReason::kStop;
  by_string.stop_reason = StopReason(std::string("END"));
  Choice by_id;
  by_id.index = 1;
  by_id.finish_reason = FinishReason::kStop;
  by_id.stop_reason = StopReason(int32_t{151645});
  ordered_json json = ordered_json::parse(
      CompletionResponse(Header("c"), {by_string, by_id}, Usage{}));
  EXPECT_EQ(json["choices"][0]["stop_reason"], "END");
  EXPECT_EQ(json["choices"][1]["stop_reason"], 151645);
  json = ordered_json::parse(
      ChatResponse(Header("c"), {by_string, by_id}, Usage{}));
  EXPECT_EQ(json["choices"][0]["stop_reason"], "END");
  EXPECT_EQ(json["choices"][1]["stop_reason"], 151645);
}

TEST(StopReasonTest, InTheFinalChunk) {
  Choice last;
  last.finish_reason = FinishReason::kStop;
  last.stop_reason = StopReason(std::string("\n\n"));
  EXPECT_EQ(ordered_json::parse(CompletionChunk(
                Header("c"), last))["choices"][0]["stop_reason"],
            "\n\n");
  EXPECT_EQ(ordered_json::parse(
                ChatChunk(Header("c"), last))["choices"][0]["stop_reason"],
            "\n\n");
  last.stop_reason = StopReason(int32_t{2});
  EXPECT_EQ(ordered_json::parse(
                ChatChunk(Header("c"), last))["choices"][0]["stop_reason"],
            2);
}

// ---------------------------------------------------------------------------
// Helpers for the server.

TEST(HelpersTest, CountCodePoints) {
  EXPECT_EQ(CountCodePoints(""), 0);
  EXPECT_EQ(CountCodePoints("abc"), 3);
  EXPECT_EQ(CountCodePoints("h\xC3\xA9llo"), 5);  // é: 2 bytes.
  EXPECT_EQ(CountCodePoints("\xE2\x82\xAC\xF0\x9F\x98\x80"), 2);  // €, 😀.
}

TEST(HelpersTest, RouteErrors) {
  ApiError not_found = RouteNotFound("POST", "/v1/nothing");
  EXPECT_EQ(not_found.http_status, 404);
  EXPECT_EQ(ErrorBody(not_found),
            R"j({"error":{"message":"Invalid URL (POST /v1/nothing)",)j"
            R"("type":"invalid_request_error","param":null,)"
            R"("code":"not_found"}})");
  ApiError wrong = MethodNotAllowed("GET", "/v1/completions", "POST");
  EXPECT_EQ(wrong.http_status, 405);
  EXPECT_EQ(wrong.message,
            "Method GET is not allowed for /v1/completions (allowed: POST).");
  EXPECT_EQ(wrong.code, "method_not_allowed");
  // A hostile path is cut.
  EXPECT_LT(RouteNotFound("GET", std::string(100000, 'x')).message.size(),
            300u);
}

TEST(HelpersTest, VersionBody) {
  EXPECT_EQ(VersionResponse("0.14.0"), R"({"version":"0.14.0"})");
}

TEST(HelpersTest, TemplateErrorsAre400) {
  for (const absl::Status& status : {
           absl::ResourceExhaustedError("chat template: output too long"),
           absl::UnimplementedError("chat template: filter 'x'"),
           absl::InvalidArgumentError("chat template: bad role"),
       }) {
    ApiError error = ApiErrorFromTemplateStatus(status);
    EXPECT_EQ(error.http_status, 400) << status;
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.message, status.message());
  }
}

// ---------------------------------------------------------------------------
// /tokenize and /detokenize.

TokenizeRequest TokOk(const TokenizeParseResult& result) {
  if (const ApiError* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << "unexpected error: " << ErrorBody(*error);
    return {};
  }
  return std::get<TokenizeRequest>(result);
}

ApiError TokErr(const TokenizeParseResult& result) {
  if (std::holds_alternative<TokenizeRequest>(result)) {
    ADD_FAILURE() << "expected an error, got a request";
    return {};
  }
  return std::get<ApiError>(result);
}

TEST(TokenizeRequestTest, PromptFormAndItsDefaults) {
  const TokenizeRequest t =
      TokOk(ParseTokenizeRequest(R"({"model": "m", "prompt": "hi there"})"));
  EXPECT_EQ(t.request.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(t.request.model, "m");
  ASSERT_EQ(t.request.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(t.request.prompts[0]), "hi there");
  EXPECT_TRUE(t.request.add_special_tokens);  // vLLM's default for prompts.
  EXPECT_FALSE(t.return_token_strs);
  const TokenizeRequest u = TokOk(ParseTokenizeRequest(
      R"({"prompt": "", "add_special_tokens": false,
          "return_token_strs": true, "user": "x"})"));
  EXPECT_EQ(u.request.model, "");  // Absent: the served model.
  EXPECT_FALSE(u.request.add_special_tokens);
  EXPECT_TRUE(u.return_token_strs);
  EXPECT_EQ(u.request.ignored_fields, std::vector<std::string>{"user"});
}

TEST(TokenizeRequestTest, ChatFormAndItsDefaults) {
  const TokenizeRequest t = TokOk(ParseTokenizeRequest(
      R"({"model": "m", "messages": [{"role": "user", "content":
          [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "chat_template_kwargs": {"enable_thinking": false},
          "tools": [{"type": "function"}]})"));
  EXPECT_EQ(t.request.endpoint, Endpoint::kChat);
  EXPECT_FALSE(t.request.add_special_tokens);  // The template adds them.
  EXPECT_TRUE(t.request.add_generation_prompt);
  EXPECT_FALSE(t.request.continue_final_message);
  EXPECT_EQ(t.request.messages[0]["content"], "a\nb");  // Parts joined.
  EXPECT_EQ(t.request.chat_template_kwargs["enable_thinking"], false);
  EXPECT_TRUE(t.request.tools.is_array());
  const TokenizeRequest c = TokOk(ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "q"},
                       {"role": "assistant", "content": "The"}],
          "add_generation_prompt": false, "continue_final_message": true,
          "add_special_tokens": true})"));
  EXPECT_TRUE(c.request.continue_final_message);
  EXPECT_FALSE(c.request.add_generation_prompt);
  EXPECT_TRUE(c.request.add_special_tokens);
}

TEST(TokenizeRequestTest, BadRequestsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"model": 3, "prompt": "x"})", "model"},
      {R"({"model": "", "prompt": "x"})", "model"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [1, 2]})", "prompt"},
      {R"({})", "prompt"},
      {R"({"prompt": "x", "messages": []})", "prompt"},
      {R"({"prompt": "x", "add_special_tokens": 1})", "add_special_tokens"},
      {R"({"prompt": "x", "return_token_strs": "yes"})", "return_token_strs"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"content": "x"}]})", "messages.[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})",
       "messages.[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "continue_final_message": true})",
       "continue_final_message"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "add_generation_prompt": false, "continue_final_message": true})",
       "continue_final_message"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})",
       "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "chat_template_kwargs": []})",
       "chat_template_kwargs"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "chat_template": "{{ x }}"})",
       "chat_template"},
  };
  for (const Case& c : cases) {
    const ApiError e = TokErr(ParseTokenizeRequest(c.body));
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
  }
  // Not JSON, not an object, nested too deep: 400 without a param.
  EXPECT_EQ(TokErr(ParseTokenizeRequest("{")).http_status, 400);
  EXPECT_EQ(TokErr(ParseTokenizeRequest("[1]")).http_status, 400);
  EXPECT_EQ(TokErr(ParseTokenizeRequest(std::string(100000, '[') +
                                        std::string(100000, ']')))
                .http_status,
            400);
}

TEST(DetokenizeRequestTest, IdsInRangeElseA400NamingTheElement) {
  auto parsed = ParseDetokenizeRequest(
      R"({"model": "m", "tokens": [1, 2.0, 31999], "x": 1})", 32000);
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(parsed))
      << ErrorBody(std::get<ApiError>(parsed));
  const DetokenizeRequest& d = std::get<DetokenizeRequest>(parsed);
  EXPECT_EQ(d.model, "m");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2, 31999}));
  EXPECT_EQ(d.ignored_fields, std::vector<std::string>{"x"});
  EXPECT_TRUE(std::holds_alternative<DetokenizeRequest>(
      ParseDetokenizeRequest(R"({"tokens": []})", 10)));
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"tokens": [1, 32000]})", "tokens.[1]"},
      {R"({"tokens": [-1]})", "tokens.[0]"},
      {R"({"tokens": [1.5]})", "tokens.[0]"},
      {R"({"tokens": ["1"]})", "tokens.[0]"},
      {R"({"tokens": [true]})", "tokens.[0]"},
      {R"({"tokens": [18446744073709551615]})", "tokens.[0]"},
      {R"({"tokens": [1e300]})", "tokens.[0]"},
      {R"({"tokens": "1 2"})", "tokens"},
      {R"({"model": "m"})", "tokens"},
      {R"({"model": 1, "tokens": []})", "model"},
  };
  for (const Case& c : cases) {
    auto r = ParseDetokenizeRequest(c.body, 32000);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << c.body;
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400) << c.body;
    EXPECT_EQ(std::get<ApiError>(r).param, c.param) << c.body;
  }
}

TEST(TokenizeResponseTest, VllmShapes) {
  EXPECT_EQ(TokenizeResponse({1, 2, 3}, 512, std::nullopt),
            R"({"count":3,"max_model_len":512,"tokens":[1,2,3],)"
            R"("token_strs":null})");
  EXPECT_EQ(TokenizeResponse({}, 8, std::vector<std::string>{}),
            R"({"count":0,"max_model_len":8,"tokens":[],"token_strs":[]})");
  EXPECT_EQ(TokenizeResponse({5}, 8, std::vector<std::string>{"\xE2\x96\x81O"}),
            "{\"count\":1,\"max_model_len\":8,\"tokens\":[5],"
            "\"token_strs\":[\"\xE2\x96\x81O\"]}");
  EXPECT_EQ(DetokenizeResponse("Once \"upon\""),
            R"({"prompt":"Once \"upon\""})");
  // Invalid UTF-8 (a token cut mid-character) is written as U+FFFD.
  EXPECT_EQ(DetokenizeResponse("a\xE2"), "{\"prompt\":\"a\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace serve
}  // namespace tessera
