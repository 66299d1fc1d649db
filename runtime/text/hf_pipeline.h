// The normalizer, pre-tokenizer and decoder stages of a Hugging Face
// tokenizer.json, each parsed from its JSON and applied the way `tokenizers`
// applies it.
//
// Every stage is immutable after parsing and safe to share between threads.
// A component type that is not implemented is a load-time error naming it,
// never silently skipped.
#ifndef TESSERA_RUNTIME_TEXT_HF_PIPELINE_H_
#define TESSERA_RUNTIME_TEXT_HF_PIPELINE_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace hf {

// One piece of text between pre-tokenization steps. The text is only valid
// during the call it is passed to.
struct PreToken {
  absl::string_view text;
  // Whether the piece starts at offset 0 of the original input (HF's
  // `offsets_original().0 == 0`), which Metaspace's prepend_scheme "first"
  // depends on. Tracked through deletions at the start of the text, not
  // through characters a stage inserted in front of it.
  bool at_origin = false;
};

// Receives the pieces a pre-tokenizer produces, in order.
using PreTokenSink = absl::FunctionRef<absl::Status(PreToken)>;

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text`. Clears `*origin_kept` when the text's first original
  // character was removed (so the result no longer starts at offset 0).
  virtual absl::Status Normalize(std::string* text,
                                 bool* origin_kept) const = 0;
  // Whether Normalize leaves every all-ASCII text as it is (the Unicode
  // normal forms, and sequences of them), so such text need not be copied.
  virtual bool KeepsAscii() const { return false; }
};

// Pre-tokenizers stream: each piece goes through every later stage and on to
// the model before the next piece is cut, so memory stays proportional to a
// piece, not to the input.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits and rewrites `piece`, passing every non-empty result to `sink`
  // (HF drops empty pieces).
  virtual absl::Status PreTokenize(PreToken piece, PreTokenSink sink) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: token strings in, token strings out (joined by the
  // caller).
  virtual absl::Status DecodeChain(std::vector<std::string>* tokens) const = 0;
  // The same for one token in the middle of a text, before any cleanup: raw
  // bytes (no U+FFFD for a partial UTF-8 character), no first-token or
  // whole-text stripping. Tokenizer::TokenBytes.
  virtual absl::Status DecodeChainRaw(std::vector<std::string>* tokens) const {
    return DecodeChain(tokens);
  }
};

// Each parser takes the component's JSON object (not null) and returns
// InvalidArgument for a malformed one, Unimplemented for an unsupported type.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(
    const nlohmann::json& json);
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(
    const nlohmann::json& json);
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(
    const nlohmann::json& json);

}  // namespace hf
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_HF_PIPELINE_H_
