// Sets of Unicode code points as sorted ranges, shared by the EBNF parser and
// the regex converter (UTF-8 encoding is runtime/text/unicode.h's).
#ifndef TESSERA_RUNTIME_GRAMMAR_CODE_RANGES_H_
#define TESSERA_RUNTIME_GRAMMAR_CODE_RANGES_H_

#include <string>
#include <utility>
#include <vector>

namespace tessera {
namespace grammar {

inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Inclusive [first, second] ranges.
using CodeRanges = std::vector<std::pair<char32_t, char32_t>>;

// Sorted and merged, empty ranges and surrogates (U+D800..U+DFFF, not
// characters in UTF-8) removed.
CodeRanges NormalizeRanges(CodeRanges ranges);
// Every code point (but surrogates) not in the normalized `ranges`.
CodeRanges ComplementRanges(const CodeRanges& ranges);

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_CODE_RANGES_H_
