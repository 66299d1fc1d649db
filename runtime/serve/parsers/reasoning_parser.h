// --reasoning-parser: a reasoning model's <think> block told apart from its
// answer, as vLLM's reasoning parsers do (reasoning_content and content).
//
// Formats (vLLM's names):
//  - qwen3: the output may open with <think> and closes it with </think>;
//    an output without the start tag is all content, unless the prompt
//    opened the block (a chat template that appends "<think>\n").
//  - deepseek_r1: the template opens the block itself, so the output starts
//    in reasoning (a leading <think> is dropped) until </think>; an output
//    that never closes it is all reasoning.
// An unclosed block (cut by max_tokens) is reasoning in both, streamed or
// not. After the end tag everything is content (a second <think> too).
#ifndef TESSERA_RUNTIME_SERVE_PARSERS_REASONING_PARSER_H_
#define TESSERA_RUNTIME_SERVE_PARSERS_REASONING_PARSER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace serve {

struct ReasoningFormat {
  std::string name;
  std::string start_tag;  // "<think>"
  std::string end_tag;    // "</think>"
  // The output begins inside the block whatever the prompt says.
  bool starts_in_reasoning = false;
};

// The format named `name`; InvalidArgument listing the known names.
absl::StatusOr<const ReasoningFormat*> FindReasoningFormat(
    absl::string_view name);

// "qwen3, deepseek_r1": for help texts and errors.
std::string ReasoningFormatNames();

// The prompt leaves a block open: its last start tag has no end tag after
// it (a template's "<|im_start|>assistant\n<think>\n").
bool PromptOpensReasoning(const ReasoningFormat& format,
                          absl::string_view prompt);

// The length of the longest suffix of `text` that is a proper prefix of
// `tag`: bytes to hold back while a tag may be arriving.
size_t PartialTagSuffix(absl::string_view text, absl::string_view tag);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

// Splits an output as it streams. Bytes that may be the start of a tag are
// held back until the next piece (or Finish) tells; the pieces joined equal
// SplitReasoning of the whole text.
class ReasoningStream {
 public:
  ReasoningStream(const ReasoningFormat& format, absl::string_view prompt);

  ReasoningDelta Feed(absl::string_view text);
  ReasoningDelta Finish();

  bool in_reasoning() const { return state_ == State::kReasoning; }
  // The output had a reasoning block (its start seen, or begun in one).
  bool had_reasoning() const { return had_reasoning_; }

 private:
  enum class State {
    kStart,      // Nothing decided yet: the output may open with the tag.
    kReasoning,  // Inside the block.
    kContent,    // After it (or no block at all).
  };
  void Run(bool final, ReasoningDelta* out);

  const ReasoningFormat& format_;
  State state_ = State::kStart;
  // kStart: whether the block is open whatever the output's first bytes.
  bool opened_ = false;
  bool had_reasoning_ = false;
  std::string pending_;  // Held back: may be (part of) a tag.
};

// The whole output at once.
ReasoningDelta SplitReasoning(const ReasoningFormat& format,
                              absl::string_view prompt, absl::string_view text);

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_PARSERS_REASONING_PARSER_H_
