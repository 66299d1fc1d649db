#include "runtime/serve/parsers/tool_parser.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

const ToolCallFormat& Format(const char* name) {
  return **FindToolCallFormat(name);
}

// Streamed in pieces of every size from 1 to 7 bytes, and in random cuts,
// the parts joined must equal the whole parse (ids aside: mistral makes
// random ones).
ToolCallDelta Check(const char* format, const std::string& text) {
  const ToolCallDelta whole = ParseToolCalls(Format(format), text);
  std::mt19937 rng(3);
  for (size_t n = 1; n <= 9; ++n) {
    ToolCallStream stream(Format(format));
    ToolCallDelta joined;
    auto add = [&](ToolCallDelta d) {
      joined.content += d.content;
      for (ToolCall& c : d.calls) joined.calls.push_back(std::move(c));
    };
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t size = n <= 7 ? n : 1 + rng() % 40;
      add(stream.Feed(absl::string_view(text).substr(pos, size)));
      pos += size;
    }
    add(stream.Finish());
    EXPECT_EQ(joined.content, whole.content) << text << " by " << n;
    EXPECT_EQ(joined.calls.size(), whole.calls.size()) << text << " by " << n;
    for (size_t i = 0; i < std::min(joined.calls.size(), whole.calls.size());
         ++i) {
      EXPECT_EQ(joined.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(joined.calls[i].arguments, whole.calls[i].arguments);
    }
  }
  return whole;
}

TEST(ToolParserTest, KnownNamesAndAnError) {
  for (const char* name : {"hermes", "llama3_json", "mistral"}) {
    absl::StatusOr<const ToolCallFormat*> f = FindToolCallFormat(name);
    ASSERT_TRUE(f.ok()) << name;
    EXPECT_EQ((*f)->name(), name);
  }
  absl::StatusOr<const ToolCallFormat*> bad = FindToolCallFormat("pythonic");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("hermes, llama3_json, mistral"),
            std::string::npos);
}

TEST(ToolParserTest, HermesCallsAndContent) {
  ToolCallDelta d = Check(
      "hermes",
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"S\\u00e3o Paulo\", \"units\": [\"c\"]}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(d.content, "Let me check.\n");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(d.calls[0].arguments)["city"], "São Paulo");
  EXPECT_EQ(d.calls[0].id, "");
  EXPECT_EQ(d.calls[1].name, "now");
  EXPECT_EQ(d.calls[1].arguments, "{}");
  // Text after the calls is content again; a tag inside a string is not
  // a tag.
  d = Check("hermes",
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": "
            "\"</tool_call>\"}}</tool_call>\n\nDone.");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(Json::parse(d.calls[0].arguments)["s"], "</tool_call>");
  EXPECT_EQ(d.content, "Done.");
  // Arguments given as a JSON string are kept as they are.
  d = Check("hermes",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": "
            "1}\"}</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "{\"a\": 1}");
}

TEST(ToolParserTest, HermesNeverDropsWhatIsNotACall) {
  // Bad JSON, no name, cut off by max_tokens: content as written.
  const std::string bad = "<tool_call>{\"name\": oops}</tool_call>";
  ToolCallDelta d = Check("hermes", "a " + bad + " b");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "a " + bad + " b");
  d = Check("hermes", "<tool_call>{\"arguments\": {}}</tool_call>");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "<tool_call>{\"arguments\": {}}</tool_call>");
  d = Check("hermes", "x<tool_call>{\"name\": \"f\", \"argu");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "x<tool_call>{\"name\": \"f\", \"argu");
  // A complete call whose close tag was cut still counts.
  d = Check("hermes", "<tool_call>{\"name\": \"f\"}\n</tool_");
  ASSERT_EQ(d.calls.size(), 1u);
  // Text that merely looks like the start of a tag.
  d = Check("hermes", "a <tool b <tool_cal");
  EXPECT_EQ(d.content, "a <tool b <tool_cal");
  // Nesting beyond the limit is content, not a crash.
  const std::string deep =
      "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(100, '[') +
      std::string(100, ']') + "}</tool_call>";
  d = Check("hermes", deep);
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, deep);
}

TEST(ToolParserTest, Llama3JsonAtTheStartOnly) {
  ToolCallDelta d = Check(
      "llama3_json",
      "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}; "
      "{\"name\": \"now\", \"parameters\": {}}");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "search");
  EXPECT_EQ(Json::parse(d.calls[0].arguments)["q"], "x");
  EXPECT_EQ(d.calls[1].name, "now");
  EXPECT_EQ(d.content, "");
  d = Check("llama3_json", "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "{\"a\":1}");
  // Anything else first: no calls, JSON later included.
  d = Check("llama3_json", "Sure: {\"name\": \"f\", \"parameters\": {}}");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "Sure: {\"name\": \"f\", \"parameters\": {}}");
  // A JSON answer that is not a call is content.
  d = Check("llama3_json", "{\"answer\": 42}");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "{\"answer\": 42}");
}

TEST(ToolParserTest, MistralBothLayouts) {
  ToolCallDelta d = Check(
      "mistral",
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": "
      "\"b\", \"arguments\": {}, \"id\": \"abcDEF123\"}]");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "a");
  EXPECT_EQ(d.calls[0].id.size(), 9u);
  EXPECT_EQ(d.calls[1].id, "abcDEF123");
  EXPECT_EQ(d.content, "");
  d = Check("mistral",
            "ok[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
            "[TOOL_CALLS]now[CALL_ID]q1w2e3r4t[ARGS]{}");
  EXPECT_EQ(d.content, "ok");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(d.calls[0].arguments)["city"], "Paris");
  EXPECT_EQ(d.calls[0].id.size(), 9u);
  EXPECT_EQ(d.calls[1].name, "now");
  EXPECT_EQ(d.calls[1].id, "q1w2e3r4t");
  // Not a call: content.
  d = Check("mistral", "[TOOL_CALLS]not a call");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "[TOOL_CALLS]not a call");
  d = Check("mistral", "[TOOL_CALLS]f[ARGS]{\"a\": ");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, "[TOOL_CALLS]f[ARGS]{\"a\": ");
}

TEST(ToolParserTest, RandomTextStreamsAsItParses) {
  std::mt19937 rng(11);
  const char* pieces[] = {"<tool_call>",
                          "</tool_call>",
                          "{\"name\": \"f\"",
                          ", \"arguments\": {}",
                          "}",
                          "\n",
                          "x",
                          "<tool",
                          "[TOOL_CALLS]",
                          "g[ARGS]",
                          "[",
                          "]",
                          ";",
                          "<|python_tag|>",
                          "\"",
                          "\\"};
  for (int i = 0; i < 300; ++i) {
    std::string text;
    for (int j = 0; j < 14; ++j) text += pieces[rng() % 16];
    for (const char* f : {"hermes", "llama3_json", "mistral"}) Check(f, text);
  }
}

TEST(ToolParserTest, LongCallsStayLinear) {
  // A call of 1 MB streamed a byte at a time finishes quickly: the open
  // call is not re-read for every piece.
  std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"";
  text += std::string(1 << 20, 'a');
  text += "\"}}</tool_call>";
  ToolCallStream stream(Format("hermes"));
  size_t calls = 0;
  for (char c : text)
    calls += stream.Feed(absl::string_view(&c, 1)).calls.size();
  calls += stream.Finish().calls.size();
  EXPECT_EQ(calls, 1u);
}

}  // namespace
}  // namespace serve
}  // namespace tessera
