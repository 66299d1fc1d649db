#include "runtime/serve/chat_output.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

ChatOutputFormats Formats(const char* reasoning, const char* tools) {
  ChatOutputFormats f;
  if (reasoning != nullptr) f.reasoning = *FindReasoningFormat(reasoning);
  if (tools != nullptr) f.tool_calls = *FindToolCallFormat(tools);
  return f;
}

CompletionRequest Request(ToolChoice choice, std::string grammar = "") {
  CompletionRequest r;
  r.endpoint = Endpoint::kChat;
  r.tool_choice = choice;
  r.grammar = std::move(grammar);
  return r;
}

// The reply of `text` streamed in pieces of random sizes (1 to 7 bytes),
// merged the way a client adds up deltas; every call's first delta must
// carry its id and name, and later ones neither.
ChatOutputDelta Streamed(const ChatOutputFormats& formats,
                         const CompletionRequest& request,
                         const std::string& prompt, const std::string& text,
                         uint32_t seed) {
  ChatOutput out(formats, request, prompt);
  std::mt19937 rng(seed);
  ChatOutputDelta all;
  size_t pos = 0;
  auto add = [&](ChatOutputDelta d) {
    for (const ToolCallItem& call : d.tool_calls) {
      const bool first = call.index == static_cast<int>(all.tool_calls.size());
      EXPECT_EQ(call.id.has_value(), first) << text;
      EXPECT_EQ(call.name.has_value(), first) << text;
    }
    MergeChatOutput(std::move(d), &all);
  };
  while (pos < text.size()) {
    const size_t n = std::min<size_t>(1 + rng() % 7, text.size() - pos);
    add(out.Feed(text.substr(pos, n)));
    pos += n;
  }
  add(out.Finish());
  return all;
}

ChatOutputDelta Whole(const ChatOutputFormats& formats,
                      const CompletionRequest& request,
                      const std::string& prompt, const std::string& text) {
  ChatOutput out(formats, request, prompt);
  return out.All(text);
}

void ExpectSame(const ChatOutputDelta& a, const ChatOutputDelta& b) {
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.reasoning, b.reasoning);
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size());
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].index, b.tool_calls[i].index);
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name);
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments);
  }
}

// Every case gives the same reply streamed (under several chunkings) as
// whole.
ChatOutputDelta Check(const ChatOutputFormats& formats,
                      const CompletionRequest& request,
                      const std::string& prompt, const std::string& text) {
  ChatOutputDelta whole = Whole(formats, request, prompt, text);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    ExpectSame(Streamed(formats, request, prompt, text, seed), whole);
  }
  return whole;
}

TEST(ChatOutputTest, PlainTextIsContent) {
  ChatOutputDelta d = Check({}, Request(ToolChoice::kNone), "", "Hello <x>");
  EXPECT_EQ(d.content, "Hello <x>");
  EXPECT_FALSE(d.reasoning.has_value());
  EXPECT_TRUE(d.tool_calls.empty());
}

TEST(ChatOutputTest, NamedCallIsTheWholeText) {
  CompletionRequest r = Request(ToolChoice::kNamed, "root ::= ...");
  r.tool_name = "get_weather";
  ChatOutput out({}, r, "");
  ChatOutputDelta d = out.All(R"({"city": "Oslo"})");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(*d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].id->rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_TRUE(d.content.empty());
  // A forced named call finishes as "stop" (OpenAI's).
  EXPECT_FALSE(out.finish_as_tool_calls());
  Check({}, r, "", R"({"city": "Oslo", "days": [1, 2]})");
  // Even an empty output is the call (its arguments as they are).
  ChatOutput empty({}, r, "");
  EXPECT_EQ(empty.All("").tool_calls.size(), 1u);
}

TEST(ChatOutputTest, RequiredArrayBecomesCalls) {
  CompletionRequest r = Request(ToolChoice::kRequired, "root ::= ...");
  const std::string text =
      "[{\"name\": \"a\", \"parameters\": {\"x\": \"]},\"}},\n  {\"name\": "
      "\"b\", \"parameters\": {}}]";
  ChatOutputDelta d = Check({}, r, "", text);
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(*d.tool_calls[0].name, "a");
  EXPECT_EQ(Json::parse(d.tool_calls[0].arguments), Json::parse(R"({"x":
      "]},"})"));
  EXPECT_EQ(*d.tool_calls[1].name, "b");
  EXPECT_EQ(d.tool_calls[1].arguments, "{}");
  EXPECT_EQ(d.tool_calls[1].index, 1);
  EXPECT_TRUE(d.content.empty());
  ChatOutput out({}, r, "");
  out.All(text);
  EXPECT_TRUE(out.finish_as_tool_calls());

  // parallel_tool_calls false keeps the first.
  r.parallel_tool_calls = false;
  EXPECT_EQ(Check({}, r, "", text).tool_calls.size(), 1u);
}

TEST(ChatOutputTest, RequiredCutShortKeepsTheRestAsContent) {
  CompletionRequest r = Request(ToolChoice::kRequired, "root ::= ...");
  ChatOutputDelta d =
      Check({}, r, "",
            "[{\"name\": \"a\", \"parameters\": {}}, {\"name\": \"b\", \"par");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.content, "{\"name\": \"b\", \"par");
}

TEST(ChatOutputTest, AutoThroughHermesWithReasoning) {
  const ChatOutputFormats f = Formats("qwen3", "hermes");
  CompletionRequest r = Request(ToolChoice::kAuto);
  ChatOutputDelta d = Check(
      f, r, "<|im_start|>assistant\n",
      "<think>\nweather needs a tool\n</think>\n\nChecking.<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
      "</tool_call>");
  EXPECT_EQ(d.reasoning, "\nweather needs a tool\n");
  EXPECT_EQ(d.content, "\n\nChecking.");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(*d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(d.tool_calls[0].arguments)["city"], "Zürich");
  EXPECT_EQ(*d.tool_calls[1].name, "now");
  ChatOutput out(f, r, "");
  out.All("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
  EXPECT_TRUE(out.finish_as_tool_calls());
  ChatOutput none(f, r, "");
  none.All("no calls here");
  EXPECT_FALSE(none.finish_as_tool_calls());
}

TEST(ChatOutputTest, ReasoningOpenedByThePrompt) {
  const ChatOutputFormats f = Formats("qwen3", nullptr);
  ChatOutputDelta d =
      Check(f, Request(ToolChoice::kNone), "<|im_start|>assistant\n<think>\n",
            "thinking</think>\n\nanswer");
  EXPECT_EQ(d.reasoning, "thinking");
  EXPECT_EQ(d.content, "\n\nanswer");
  // include_reasoning false drops it.
  CompletionRequest r = Request(ToolChoice::kNone);
  r.include_reasoning = false;
  d = Check(f, r, "<think>\n", "thinking</think>answer");
  EXPECT_FALSE(d.reasoning.has_value());
  EXPECT_EQ(d.content, "answer");
}

TEST(ChatOutputTest, ConstrainedOutputIsReasoningOnlyWhereItOpensIt) {
  const ChatOutputFormats f = Formats("deepseek_r1", nullptr);
  // Unconstrained DeepSeek-R1 output starts in reasoning...
  EXPECT_EQ(Check(f, Request(ToolChoice::kNone), "", "abc").reasoning, "abc");
  // ...but a grammar's output is what the grammar says, even after a prompt
  // that opens a think block.
  ChatOutputDelta d = Check(f, Request(ToolChoice::kNone, "root ::= ..."),
                            "<think>\n", "{\"a\": 1}");
  EXPECT_FALSE(d.reasoning.has_value());
  EXPECT_EQ(d.content, "{\"a\": 1}");
  d = Check(f, Request(ToolChoice::kNone, "root ::= ..."), "",
            "<think>x</think>{}");
  EXPECT_EQ(d.reasoning, "x");
  EXPECT_EQ(d.content, "{}");
}

}  // namespace
}  // namespace serve
}  // namespace tessera
