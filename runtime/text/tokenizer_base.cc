#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

namespace {

// The text that `full` adds to `prefix`, the decodes of ids and of their first
// prefix_len ids.
std::string Suffix(std::string full, const std::string& prefix) {
  // Decoding is prefix-stable for SentencePiece except for the leading space of
  // the very first piece, which only ever makes the prefix's text shorter,
  // never different. (A segment joined with " " comes after the prefix's
  // text, so vLLM's rendering of a tokenizer.model is prefix-stable too.)
  if (full.compare(0, prefix.size(), prefix) == 0)
    return full.substr(prefix.size());
  return full;
}

}  // namespace

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
  return Suffix(std::move(full), prefix);
}

absl::StatusOr<std::string> Tokenizer::DecodeSuffix(
    absl::Span<const int32_t> ids, size_t prefix_len,
    const DecodeOptions& options) const {
  if (prefix_len > ids.size()) {
    return absl::InvalidArgumentError(
        "DecodeSuffix: prefix longer than the ids");
  }
  ASSIGN_OR_RETURN(std::string full, Decode(ids, options));
  ASSIGN_OR_RETURN(std::string prefix,
                   Decode(ids.subspan(0, prefix_len), options));
  return Suffix(std::move(full), prefix);
}

absl::StatusOr<std::string> Tokenizer::DecodeWithOptions(
    absl::Span<const int32_t> ids, const DecodeOptions& options) const {
  return Decode(ids, options.skip_special_tokens);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeAtMost(
    absl::string_view text, int64_t max_tokens) const {
  // The fallback for a tokenizer that cannot stop early (both of Tessera's
  // do): encode everything, then count.
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(text));
  if (static_cast<int64_t>(ids.size()) > max_tokens) {
    return absl::OutOfRangeError(
        absl::StrCat("the text has more than ", max_tokens, " tokens"));
  }
  return ids;
}

}  // namespace tessera
