// Regular expressions for tokenizer.json patterns, through PCRE2.
//
// Hugging Face `tokenizers` compiles Split / Replace patterns with Oniguruma.
// This wrapper translates the few Oniguruma escapes whose meaning differs in
// PCRE2 (\s, \w, \h, \uHHHH), compiles in UTF + UCP mode with JIT, and
// iterates matches the way Oniguruma's find_iter does. A compiled Regex is
// immutable and safe to use from several threads at once.
#ifndef TESSERA_RUNTIME_TEXT_HF_REGEX_H_
#define TESSERA_RUNTIME_TEXT_HF_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct pcre2_real_code_8;

namespace tessera {

// A match as byte offsets [begin, end) into the searched text.
struct RegexMatch {
  size_t begin;
  size_t end;
};

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern. InvalidArgument naming the pattern
  // when it does not compile; Unimplemented for Oniguruma-only constructs
  // (nested character classes, \S inside a class, ...).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(
      absl::string_view pattern);
  // A pattern that matches `literal` exactly (HF's SplitPattern::String).
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(
      absl::string_view literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls `on_match` for every match in `text` (valid UTF-8), leftmost first
  // and non-overlapping, stopping at the first error it returns. As in
  // Oniguruma's find_iter, an empty match directly at the end of the previous
  // match is skipped.
  absl::Status ForEachMatch(
      absl::string_view text,
      absl::FunctionRef<absl::Status(RegexMatch)> on_match) const;
  // Appends every match to `out`.
  absl::Status FindAll(absl::string_view text,
                       std::vector<RegexMatch>* out) const;

  // The pattern as given (before translation).
  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, pcre2_real_code_8* code, bool jit)
      : pattern_(std::move(pattern)), code_(code), jit_(jit) {}
  static absl::StatusOr<std::unique_ptr<Regex>> CompileTranslated(
      std::string original, const std::string& pcre_pattern, bool literal);

  std::string pattern_;
  pcre2_real_code_8* code_;
  bool jit_;
};

// The PCRE2 spelling of an Oniguruma pattern (exposed for tests).
absl::StatusOr<std::string> TranslateOnigurumaPattern(
    absl::string_view pattern);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_HF_REGEX_H_
