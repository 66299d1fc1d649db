// Hugging Face tokenizer.json tokenizers (Qwen, Llama 3, GPT-2, Mistral,
// Llama 2 conversions).
//
// Encode matches `tokenizers`' Tokenizer.encode(text, add_special_tokens=False)
// and Decode matches transformers' tokenizer.decode(ids, skip_special_tokens)
// for the components implemented here:
//   model          BPE (byte fallback, ignore_merges, unk/fuse_unk,
//                  continuing_subword_prefix, end_of_word_suffix)
//   normalizer     NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace,
//                  Sequence
//   pre_tokenizer  Split, ByteLevel, Metaspace, Digits, Sequence
//   decoder        ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
//                  Sequence
//   post_processor TemplateProcessing, RobertaProcessing, BertProcessing,
//                  ByteLevel, Sequence: read only to learn whether prompts
//                  start with BOS (Encode never adds special tokens).
// Any other component type fails the load with an error naming it.
//
// Added tokens (tokenizer.json "added_tokens") are found in the raw text
// before normalization, longest match first, honouring lstrip, rstrip,
// single_word and normalized (normalized ones are matched in the normalized
// text, as HF does).
//
// The returned tokenizer is immutable apart from an internal word cache, and
// Encode/Decode may be called from several threads at once.
#ifndef TESSERA_RUNTIME_TEXT_HF_TOKENIZER_H_
#define TESSERA_RUNTIME_TEXT_HF_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/text/tokenizer.h"

namespace tessera {

// Reads `<dir>/tokenizer.json` and, when present, `<dir>/tokenizer_config.json`
// (add_bos_token, bos_token, eos_token, added_tokens_decoder, and the
// clean_up_tokenization_spaces settings). NotFound without tokenizer.json;
// InvalidArgument for malformed files; Unimplemented for unsupported
// components.
//
// add_bos(): tokenizer_config's add_bos_token when present, else whether the
// post-processor's single-sequence template starts with a special token.
// bos_id(): that template token, else tokenizer_config's bos_token, else -1.
// eos_id(): tokenizer_config's eos_token, else -1.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(
    const std::string& dir);

// The same from the files' contents; `tokenizer_config_json` may be empty
// (no tokenizer_config.json).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerFromJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_HF_TOKENIZER_H_
