#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

absl::StatusOr<std::string> Tokenizer::DecodeSuffix(
    absl::Span<const int32_t> ids, size_t prefix_len,
    bool skip_special_tokens) const {
  if (prefix_len > ids.size()) {
    return absl::InvalidArgumentError(
        "DecodeSuffix: prefix longer than the ids");
  }
  ASSIGN_OR_RETURN(std::string full, Decode(ids, skip_special_tokens));
  ASSIGN_OR_RETURN(std::string prefix,
                   Decode(ids.subspan(0, prefix_len), skip_special_tokens));
  // Decoding is prefix-stable for SentencePiece except for the leading space of
  // the very first piece, which only ever makes the prefix's text shorter,
  // never different.
  if (full.compare(0, prefix.size(), prefix) == 0)
    return full.substr(prefix.size());
  return full;
}

absl::StatusOr<std::string> Tokenizer::DecodeSuffix(
    absl::Span<const int32_t> ids, size_t prefix_len,
    const DecodeOptions& options) const {
  // TODO(text): spaces_between_special_tokens for SentencePiece tokenizers.
  return DecodeSuffix(ids, prefix_len, options.skip_special_tokens);
}

absl::StatusOr<std::string> Tokenizer::Decode(
    absl::Span<const int32_t> ids, const DecodeOptions& options) const {
  // TODO(text): spaces_between_special_tokens for SentencePiece tokenizers.
  return Decode(ids, options.skip_special_tokens);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeAtMost(
    absl::string_view text, int64_t max_tokens) const {
  // TODO(text): stop early instead of encoding everything.
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(text));
  if (static_cast<int64_t>(ids.size()) > max_tokens) {
    return absl::OutOfRangeError(
        absl::StrCat("the text has more than ", max_tokens, " tokens"));
  }
  return ids;
}

}  // namespace tessera
