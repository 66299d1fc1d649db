// Regular expressions (guided_regex, a JSON schema's "pattern") as an EBNF
// expression for grammar.h.
//
// The dialect is what Python's re and JSON Schema patterns share: literals,
// `.` (any character but a line break), classes [a-z] [^...] with \d \w \s
// (and \D \W \S outside classes), groups ( ) and (?: ), alternation |, the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms *? +? ?? {..}? match the same
// strings), the escapes \n \r \t \f \v \0 \xHH \uHHHH and escaped
// punctuation, and ^ / $ at the ends. The whole text must match (as
// xgrammar and outlines do): a full match also satisfies JSON Schema's
// unanchored "pattern". Backreferences, lookaround, word boundaries and
// inline flags are InvalidArgument naming the feature, never ignored.
#ifndef TESSERA_RUNTIME_GRAMMAR_REGEX_H_
#define TESSERA_RUNTIME_GRAMMAR_REGEX_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace grammar {

inline constexpr size_t kMaxRegexBytes = 64 * 1024;

struct RegexOptions {
  // The expression describes a JSON string's characters, so the grammar
  // writes them JSON-escaped: `"` as \", `\` as \\, line breaks and tabs as
  // \n \r \t; other control characters are left out.
  bool json_string = false;
};

// An EBNF expression (no rule definitions) matching exactly the strings the
// pattern matches in full.
absl::StatusOr<std::string> RegexToEbnf(absl::string_view pattern,
                                        const RegexOptions& options = {});

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_REGEX_H_
