// IncrementalDetokenizer: turns a growing stream of token ids into text for
// streaming.
//
// Each Append returns only text that is final: complete UTF-8 characters whose
// rendering can no longer change. A character split across several tokens
// (byte-level BPE, SentencePiece byte fallback) is held back until its last
// byte arrives; SentencePiece's word-boundary spaces come out right because
// every decode includes a few tokens of left context.
//
// Cost: each Append decodes a window from `prefix_offset` (the start of the
// last emitted chunk's context) to the end, so the work per token is bounded by
// the window, not by the sequence length — no quadratic re-decoding. (The
// scheme is vLLM's detokenize_incrementally.)
//
// Concatenating every Append result and Finish() equals
// tokenizer.DecodeSuffix(prompt + generated, prompt.size(), options) — with
// the DecodeOptions constructor vLLM's output text (Decode(ids, options)), with
// the bool one Tessera's own rendering (Decode(ids, skip_special_tokens)).
// Each window is decoded on its own, as vLLM's slow detokenizer does, which
// is what makes a tokenizer.model's segments come out the same streamed as
// decoded whole.
#ifndef TESSERA_RUNTIME_TEXT_DETOKENIZER_H_
#define TESSERA_RUNTIME_TEXT_DETOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object. `prompt_ids` give the left context of
  // the first generated token (only their last few tokens are decoded).
  // Tessera's rendering: Decode(ids, skip_special_tokens).
  IncrementalDetokenizer(const Tokenizer* tokenizer,
                         absl::Span<const int32_t> prompt_ids,
                         bool skip_special_tokens);
  // vLLM's rendering: Decode(ids, options).
  IncrementalDetokenizer(const Tokenizer* tokenizer,
                         absl::Span<const int32_t> prompt_ids,
                         const DecodeOptions& options);

  // Adds one generated token; returns the text that became final (possibly
  // empty).
  absl::StatusOr<std::string> Append(int32_t id);

  // Returns whatever is still held back (an incomplete character renders as the
  // tokenizer renders it, usually U+FFFD). Call once, at the end of the
  // sequence.
  absl::StatusOr<std::string> Finish();

 private:
  // The text the tokens after read_offset_ add to the window's prefix;
  // `complete` says whether it ends on a whole character (so it may be
  // emitted).
  absl::StatusOr<std::string> PendingText(bool* complete) const;
  // `ids` decoded with the rendering the constructor chose.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  // How many prompt tokens of left context the first decode gets.
  static constexpr size_t kInitialContext = 5;

  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  bool with_options_;  // Decode(ids, options_) rather than the bool form
  std::vector<int32_t> ids_;
  size_t prefix_offset_;  // Start of the decode window.
  size_t read_offset_;    // Tokens before this have been emitted.
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_DETOKENIZER_H_
