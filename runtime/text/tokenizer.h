// Tokenizer: text <-> token ids for a model folder.
//
// Encode never adds special tokens; whether a prompt starts with BOS is the
// caller's decision (see add_bos()). Decode of a whole id sequence is exact; to
// stream, decode the growing sequence and emit the new suffix (DecodeSuffix),
// which keeps SentencePiece's leading-space rules right.
#ifndef TESSERA_RUNTIME_TEXT_TOKENIZER_H_
#define TESSERA_RUNTIME_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera {

// How ids become text (vLLM's request fields of the same names).
struct DecodeOptions {
  // Special tokens (BOS, EOS, <|im_end|>, ...) produce no text.
  bool skip_special_tokens = true;
  // Kept added tokens are separated from the text around them and from each
  // other by a space ("<s> The </s>", not "<s>The</s>"), as vLLM decodes with
  // Hugging Face's slow (SentencePiece) tokenizers: a tokenizer.model. vLLM's
  // fast path (tokenizer.json) ignores the flag, and so does Decode for a
  // tokenizer.json. See Tokenizer::Decode(ids, options).
  bool spaces_between_special_tokens = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text to ids, with no special tokens added (Hugging Face's
  // add_special_tokens=False). tokenizer.json: added/special tokens that
  // appear literally in the text ("<|im_start|>") are matched as single
  // tokens, as Hugging Face `tokenizers` does. tokenizer.model: the text is
  // encoded exactly as the sentencepiece library does, which treats "<s>" as
  // text; a folder whose chat template writes special-token text should ship
  // a tokenizer.json, as Hugging Face Llama 2 and Mistral folders do.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const = 0;

  // Encode, giving up as soon as the result would hold more than
  // `max_tokens` ids: OutOfRange ("more than N tokens") without tokenizing
  // the rest, so an oversized prompt costs about what a fitting one does.
  virtual absl::StatusOr<std::vector<int32_t>> EncodeAtMost(
      absl::string_view text, int64_t max_tokens) const;

  // Ids to text. InvalidArgument for a negative id; an id >= vocab_size() (a
  // model's padded embedding rows) decodes to no text, as in Hugging Face. With
  // skip_special_tokens, special tokens (BOS, EOS, <|im_end|>, ...) produce no
  // text. This is Tessera's own rendering (transformers' decode), not vLLM's:
  // a tokenizer.model prints a kept special token's text right after the text
  // before it ("<s> The</s>": the space is the piece's word boundary), and its
  // unknown piece as SentencePiece does (" \u2047 "). Use the DecodeOptions
  // form for vLLM's output text.
  virtual absl::StatusOr<std::string> Decode(
      absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const {
    return Decode(ids, /*skip_special_tokens=*/false);
  }
  // Ids to text as vLLM renders a request's output with these options. A
  // tokenizer.json decodes as Decode(ids, options.skip_special_tokens) does
  // (vLLM's fast detokenizer ignores spaces_between_special_tokens). A
  // tokenizer.model decodes as vLLM's slow detokenizer over transformers'
  // LlamaTokenizer: the added tokens (control pieces and the unknown piece,
  // what get_added_vocab() holds) are skipped with skip_special_tokens, and
  // otherwise cut the text into segments — each run of other pieces decoded on
  // its own, so without its leading word-boundary space, and each added
  // token's piece text — joined with " " when spaces_between_special_tokens
  // and "" when not: {<s>, The, </s>} is "<s> The </s>" or "<s>The</s>".
  // Skipped tokens do not cut a run.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options) const {
    return DecodeWithOptions(ids, options);
  }

  // Number of ids (the base vocabulary plus added tokens).
  virtual int32_t vocab_size() const = 0;
  // The bytes `id` adds to the text in the middle of a sequence, before any
  // cleanup: a byte-level token's raw bytes (maybe part of a UTF-8
  // character), a SentencePiece piece with its word-boundary space, a byte
  // fallback token's byte. Empty for special and unknown tokens and unused
  // ids. What a grammar (runtime/grammar) matches the output against.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Whether `id` is a special token (skipped by Decode(..., true)).
  virtual bool IsSpecial(int32_t id) const = 0;
  // The id of a token's exact text ("<|im_end|>"), or -1.
  virtual int32_t TokenToId(absl::string_view token) const = 0;
  // The vocabulary's text of `id` as stored (SentencePiece's "\u2581Once",
  // byte-level BPE's "\u0120the", an added token's content): Hugging Face's
  // convert_ids_to_tokens, which vLLM's /tokenize returns as token_strs.
  // Empty for an id the vocabulary does not hold (negative, beyond
  // vocab_size(), an unused id) and for tokenizers without a vocabulary.
  virtual std::string IdToToken(int32_t id) const {
    (void)id;
    return std::string();
  }

  // -1 when the tokenizer has none.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  // Whether prompts get a BOS token prepended (tokenizer_config.json's
  // add_bos_token, a tokenizer.json post-processor that adds one, or the
  // tokenizer family's default).
  bool add_bos() const { return add_bos_; }
  void set_add_bos(bool add_bos) { add_bos_ = add_bos; }

  // The text that `ids[prefix_len:]` adds when appended to `ids[:prefix_len]`
  // (decoding the two together keeps word-boundary spaces right).
  absl::StatusOr<std::string> DecodeSuffix(absl::Span<const int32_t> ids,
                                           size_t prefix_len,
                                           bool skip_special_tokens) const;
  // The same with Decode(ids, options)'s rendering.
  absl::StatusOr<std::string> DecodeSuffix(absl::Span<const int32_t> ids,
                                           size_t prefix_len,
                                           const DecodeOptions& options) const;

 protected:
  // Decode(ids, options). The default is vLLM's fast path:
  // Decode(ids, options.skip_special_tokens), whatever
  // spaces_between_special_tokens says.
  virtual absl::StatusOr<std::string> DecodeWithOptions(
      absl::Span<const int32_t> ids, const DecodeOptions& options) const;

 private:
  bool add_bos_ = false;
};

// Loads the tokenizer of a model folder: `tokenizer.model` (SentencePiece) for
// now. NotFound when the folder has no tokenizer file; Unimplemented for a
// folder with only a Hugging Face tokenizer.json (not supported yet: pass
// --prompt-ids). `config_bos_id` is the model config's bos_token_id (-1 if
// none): a SentencePiece tokenizer adds BOS by default (as Hugging Face's
// LlamaTokenizer does) unless tokenizer_config.json sets add_bos_token to
// false.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& model_dir, int64_t config_bos_id);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_TOKENIZER_H_
