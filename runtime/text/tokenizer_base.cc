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

}  // namespace tessera
