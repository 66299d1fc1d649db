#include "runtime/serve/parsers/reasoning_parser.h"

#include <array>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace serve {
namespace {

const std::array<ReasoningFormat, 2>& Formats() {
  static const std::array<ReasoningFormat, 2> kFormats = {{
      {"qwen3", "<think>", "</think>", /*starts_in_reasoning=*/false},
      {"deepseek_r1", "<think>", "</think>", /*starts_in_reasoning=*/true},
  }};
  return kFormats;
}

size_t SkipSpace(absl::string_view text, size_t pos) {
  while (pos < text.size() && absl::ascii_isspace(text[pos])) ++pos;
  return pos;
}

}  // namespace

absl::StatusOr<const ReasoningFormat*> FindReasoningFormat(
    absl::string_view name) {
  for (const ReasoningFormat& format : Formats()) {
    if (format.name == name) return &format;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reasoning parser \"", name,
                   "\" (known: ", ReasoningFormatNames(), ")"));
}

std::string ReasoningFormatNames() {
  return absl::StrJoin(
      Formats(), ", ",
      [](std::string* out, const ReasoningFormat& f) { out->append(f.name); });
}

bool PromptOpensReasoning(const ReasoningFormat& format,
                          absl::string_view prompt) {
  const size_t start = prompt.rfind(format.start_tag);
  if (start == absl::string_view::npos) return false;
  return prompt.find(format.end_tag, start + format.start_tag.size()) ==
         absl::string_view::npos;
}

size_t PartialTagSuffix(absl::string_view text, absl::string_view tag) {
  const size_t longest = std::min(text.size(), tag.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

ReasoningStream::ReasoningStream(const ReasoningFormat& format,
                                 absl::string_view prompt)
    : format_(format),
      opened_(format.starts_in_reasoning ||
              PromptOpensReasoning(format, prompt)) {}

void ReasoningStream::Run(bool final, ReasoningDelta* out) {
  absl::string_view text = pending_;
  size_t pos = 0;
  while (pos < text.size() || (final && state_ == State::kStart)) {
    if (state_ == State::kStart) {
      // The output may open with the start tag (after whitespace); an open
      // block drops it, a closed one begins with it.
      const size_t first = SkipSpace(text, pos);
      const absl::string_view rest = text.substr(first);
      const absl::string_view tag = format_.start_tag;
      if (rest.size() >= tag.size() && rest.substr(0, tag.size()) == tag) {
        state_ = State::kReasoning;
        had_reasoning_ = true;
        pos = first + tag.size();
        continue;
      }
      if (!final && tag.substr(0, rest.size()) == rest) break;  // Not yet.
      state_ = opened_ ? State::kReasoning : State::kContent;
      had_reasoning_ = had_reasoning_ || opened_;
      continue;
    }
    if (state_ == State::kContent) {
      absl::StrAppend(&out->content, text.substr(pos));
      pos = text.size();
      break;
    }
    // kReasoning: up to the end tag.
    const size_t end = text.find(format_.end_tag, pos);
    if (end != absl::string_view::npos) {
      absl::StrAppend(&out->reasoning, text.substr(pos, end - pos));
      pos = end + format_.end_tag.size();
      state_ = State::kContent;
      continue;
    }
    const size_t hold =
        final ? 0 : PartialTagSuffix(text.substr(pos), format_.end_tag);
    absl::StrAppend(&out->reasoning,
                    text.substr(pos, text.size() - pos - hold));
    pos = text.size() - hold;
    break;
  }
  pending_.erase(0, pos);
}

ReasoningDelta ReasoningStream::Feed(absl::string_view text) {
  ReasoningDelta out;
  pending_.append(text.data(), text.size());
  Run(/*final=*/false, &out);
  return out;
}

ReasoningDelta ReasoningStream::Finish() {
  ReasoningDelta out;
  Run(/*final=*/true, &out);
  return out;
}

ReasoningDelta SplitReasoning(const ReasoningFormat& format,
                              absl::string_view prompt,
                              absl::string_view text) {
  ReasoningStream stream(format, prompt);
  ReasoningDelta out = stream.Feed(text);
  ReasoningDelta last = stream.Finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  return out;
}

}  // namespace serve
}  // namespace tessera
