// Grammar: a byte-level context-free grammar, the one form every structured-
// output request takes before it constrains decoding (JSON schemas, regexes,
// choices and EBNF all become one; runtime/grammar/structured_output.h).
//
// Written here rather than taken from a library: the engines that do this
// (xgrammar, llguidance, outlines-core) are not packaged in Debian, and
// Tessera needs the grammar on the sampling rank in C++ with bounded work.
//
// Form: rules, each an alternation of sequences; a sequence is a run of
// elements ending in kEnd; an element matches one byte from a set (kBytes) or
// one whole rule (kRule). Characters above ASCII in the source grammar are
// expanded into their UTF-8 byte sequences when it is parsed, so matching
// never decodes UTF-8 and a token that ends inside a character is handled
// like any other.
//
// EBNF (ParseEbnf) is the GBNF dialect llama.cpp, vLLM and xgrammar accept:
//
//   root   ::= object            # comments run to the end of the line
//   object ::= "{" ws (pair ("," ws pair)*)? "}"
//   pair   ::= string ws ":" ws value
//   ws     ::= [ \t\n]*
//   digit  ::= [0-9] | "\u00e9" | [^"\\\x00-\x1f]
//
// Terms: "literal" or 'literal' (escapes \n \r \t \\ \" \' \xHH \uHHHH
// \UHHHHHHHH), [class] and [^class] (ranges a-z, the same escapes; over code
// points), `.` (any code point), rule names ([A-Za-z0-9_-.]), ( groups ), and
// the postfix operators * + ? {n} {n,} {n,m}. A rule runs until the next
// `name ::=`, so line breaks are free. The start rule is `root`.
//
// Checks (InvalidArgument, naming the rule): an undefined rule, a left-
// recursive rule (directly or through rules that can match nothing), and
// the size bounds below, so that no client grammar makes the parser or the
// matcher recurse without bound or allocate without limit.
#ifndef TESSERA_RUNTIME_GRAMMAR_GRAMMAR_H_
#define TESSERA_RUNTIME_GRAMMAR_GRAMMAR_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace grammar {

// Bounds on a grammar's text and its expanded form.
inline constexpr size_t kMaxGrammarBytes = 1 << 20;
inline constexpr size_t kMaxGrammarElements = 1 << 20;
inline constexpr size_t kMaxGrammarRules = 1 << 16;
inline constexpr int kMaxGrammarNesting = 64;     // ( groups ) inside groups.
inline constexpr int64_t kMaxRepetition = 10000;  // {n,m}: n and m at most.

// A set of bytes, 256 bits.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

struct Element {
  enum Kind : uint8_t { kEnd, kBytes, kRule };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: an index into byte_sets; kRule: a rule id.
};

struct Grammar {
  // Every sequence of every rule, one after another, each ending in kEnd.
  // A position is an index into `elements`.
  std::vector<Element> elements;
  std::vector<ByteSet> byte_sets;
  // rules[r]: the start positions of rule r's alternatives.
  std::vector<std::vector<int32_t>> rules;
  std::vector<std::string> rule_names;  // For messages; helpers are "name_N".
  int32_t root = 0;
  // The text it was parsed from (the cache's key; what the plan carries).
  std::string source;
};

// Parses GBNF text into a Grammar (see above). InvalidArgument with the line
// and what is wrong for anything malformed or over the bounds.
absl::StatusOr<Grammar> ParseEbnf(absl::string_view text);

// Escapes `text` as a GBNF string literal's body (without quotes): every byte
// that is not printable ASCII, and \ and ", escaped. For the converters.
std::string EbnfLiteral(absl::string_view text);

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_GRAMMAR_H_
