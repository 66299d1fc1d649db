#include "runtime/text/detokenizer.h"

#include <algorithm>

#include "runtime/core/status.h"

namespace tessera {
namespace {

constexpr absl::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

bool EndsWith(absl::string_view text, absl::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(
    const Tokenizer* tokenizer, absl::Span<const int32_t> prompt_ids,
    bool skip_special_tokens)
    : IncrementalDetokenizer(tokenizer, prompt_ids,
                             DecodeOptions{skip_special_tokens, false}) {
  with_options_ = false;
}

IncrementalDetokenizer::IncrementalDetokenizer(
    const Tokenizer* tokenizer, absl::Span<const int32_t> prompt_ids,
    const DecodeOptions& options)
    : tokenizer_(tokenizer), options_(options), with_options_(true) {
  const size_t context = std::min(prompt_ids.size(), kInitialContext);
  ids_.assign(prompt_ids.end() - context, prompt_ids.end());
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

absl::StatusOr<std::string> IncrementalDetokenizer::Decode(
    absl::Span<const int32_t> ids) const {
  if (with_options_) return tokenizer_->Decode(ids, options_);
  return tokenizer_->Decode(ids, options_.skip_special_tokens);
}

absl::StatusOr<std::string> IncrementalDetokenizer::PendingText(
    bool* complete) const {
  const absl::Span<const int32_t> all(ids_);
  ASSIGN_OR_RETURN(
      const std::string prefix_text,
      Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_)));
  ASSIGN_OR_RETURN(const std::string new_text,
                   Decode(all.subspan(prefix_offset_)));
  // A trailing U+FFFD means the last character is not complete yet.
  *complete = new_text.size() > prefix_text.size() &&
              !EndsWith(new_text, kReplacementCharacter);
  if (new_text.size() <= prefix_text.size()) return std::string();
  return new_text.substr(prefix_text.size());
}

absl::StatusOr<std::string> IncrementalDetokenizer::Append(int32_t id) {
  ids_.push_back(id);
  bool complete = false;
  ASSIGN_OR_RETURN(std::string delta, PendingText(&complete));
  if (!complete) return std::string();  // Wait for more bytes.
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  // Keep the buffer small: only the window [prefix_offset_, end) is ever
  // decoded again.
  ids_.erase(ids_.begin(), ids_.begin() + prefix_offset_);
  read_offset_ -= prefix_offset_;
  prefix_offset_ = 0;
  return delta;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Finish() {
  if (read_offset_ == ids_.size()) return std::string();
  bool complete = false;
  ASSIGN_OR_RETURN(std::string rest, PendingText(&complete));
  read_offset_ = ids_.size();
  return rest;
}

}  // namespace tessera
