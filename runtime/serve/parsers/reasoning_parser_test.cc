#include "runtime/serve/parsers/reasoning_parser.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace serve {
namespace {

const ReasoningFormat& Format(const char* name) {
  return **FindReasoningFormat(name);
}

// Streamed in pieces of every size from 1 to 6 bytes, the parts joined
// must equal the whole split.
ReasoningDelta Check(const char* format, const std::string& prompt,
                     const std::string& text) {
  const ReasoningDelta whole = SplitReasoning(Format(format), prompt, text);
  for (size_t n = 1; n <= 6; ++n) {
    ReasoningStream stream(Format(format), prompt);
    ReasoningDelta joined;
    for (size_t pos = 0; pos < text.size(); pos += n) {
      ReasoningDelta d = stream.Feed(text.substr(pos, n));
      joined.reasoning += d.reasoning;
      joined.content += d.content;
    }
    ReasoningDelta d = stream.Finish();
    joined.reasoning += d.reasoning;
    joined.content += d.content;
    EXPECT_EQ(joined.reasoning, whole.reasoning) << text << " by " << n;
    EXPECT_EQ(joined.content, whole.content) << text << " by " << n;
  }
  return whole;
}

TEST(ReasoningParserTest, KnownNamesAndAnError) {
  EXPECT_TRUE(FindReasoningFormat("qwen3").ok());
  EXPECT_TRUE(FindReasoningFormat("deepseek_r1").ok());
  absl::StatusOr<const ReasoningFormat*> bad = FindReasoningFormat("gpt");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("qwen3, deepseek_r1"),
            std::string::npos);
}

TEST(ReasoningParserTest, Qwen3SplitsTheThinkBlock) {
  ReasoningDelta d = Check("qwen3", "", "<think>\nplan</think>\n\nanswer");
  EXPECT_EQ(d.reasoning, "\nplan");
  EXPECT_EQ(d.content, "\n\nanswer");
  // No block: all content, tags in the middle included.
  d = Check("qwen3", "", "plain <think>x</think> y");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "plain <think>x</think> y");
  // Cut by max_tokens inside the block: reasoning.
  d = Check("qwen3", "", "<think>still going </thi");
  EXPECT_EQ(d.reasoning, "still going </thi");
  EXPECT_EQ(d.content, "");
  // A second block after the first is content.
  d = Check("qwen3", "", "<think>a</think>b<think>c</think>");
  EXPECT_EQ(d.reasoning, "a");
  EXPECT_EQ(d.content, "b<think>c</think>");
}

TEST(ReasoningParserTest, PromptThatOpensTheBlock) {
  const std::string open = "<|im_start|>assistant\n<think>\n";
  EXPECT_TRUE(PromptOpensReasoning(Format("qwen3"), open));
  // enable_thinking=false: the template closes an empty block.
  EXPECT_FALSE(PromptOpensReasoning(Format("qwen3"), open + "\n</think>\n\n"));
  ReasoningDelta d = Check("qwen3", open, "thinking</think>answer");
  EXPECT_EQ(d.reasoning, "thinking");
  EXPECT_EQ(d.content, "answer");
}

TEST(ReasoningParserTest, DeepSeekR1StartsInReasoning) {
  ReasoningDelta d = Check("deepseek_r1", "", "step 1</think>42");
  EXPECT_EQ(d.reasoning, "step 1");
  EXPECT_EQ(d.content, "42");
  d = Check("deepseek_r1", "", "<think>step</think>42");
  EXPECT_EQ(d.reasoning, "step");
  EXPECT_EQ(d.content, "42");
  d = Check("deepseek_r1", "", "never closed");
  EXPECT_EQ(d.reasoning, "never closed");
  EXPECT_EQ(d.content, "");
}

TEST(ReasoningParserTest, RandomTextStreamsAsItSplits) {
  std::mt19937 rng(7);
  const char* pieces[] = {"<", "think", ">",  "</", "</think>", "<think>",
                          "a", " ",     "\n", "th", "k>"};
  for (int i = 0; i < 200; ++i) {
    std::string text;
    for (int j = 0; j < 12; ++j) text += pieces[rng() % 11];
    Check("qwen3", "", text);
    Check("deepseek_r1", "", text);
    Check("qwen3", "<think>", text);
  }
}

TEST(ReasoningParserTest, PartialTagSuffix) {
  EXPECT_EQ(PartialTagSuffix("abc</thi", "</think>"), 5u);
  EXPECT_EQ(PartialTagSuffix("abc", "</think>"), 0u);
  EXPECT_EQ(PartialTagSuffix("<", "</think>"), 1u);
}

}  // namespace
}  // namespace serve
}  // namespace tessera
