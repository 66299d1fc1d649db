#include "runtime/grammar/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/grammar/code_ranges.h"
#include "runtime/text/unicode.h"

namespace tessera {
namespace grammar {
namespace {

using Sequence = std::vector<Element>;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte ranges of the UTF-8 encodings of the code points [lo, hi] (no
// surrogates inside), as sequences of per-byte ranges: the classic split at
// the points where the encoding's length or a continuation byte's range
// changes, so that each sequence matches exactly a contiguous block.
void Utf8Sequences(char32_t lo, char32_t hi,
                   std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  static constexpr char32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (char32_t end : kLengthEnds) {
    if (lo <= end && hi > end) {
      Utf8Sequences(lo, end, out);
      Utf8Sequences(end + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const char32_t mask = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        Utf8Sequences(lo, lo | mask, out);
        Utf8Sequences((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        Utf8Sequences(lo, (hi & ~mask) - 1, out);
        Utf8Sequences(hi & ~mask, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  unicode::AppendUtf8(lo, &a);
  unicode::AppendUtf8(hi, &b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  }
  out->push_back(std::move(seq));
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Parse() {
    if (text_.size() > kMaxGrammarBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the grammar is ", text_.size(), " bytes; at most ",
                       kMaxGrammarBytes, " are accepted"));
    }
    SkipSpace();
    if (AtEnd()) return Error("the grammar has no rules");
    while (!AtEnd()) {
      RETURN_IF_ERROR(ParseRule());
      SkipSpace();
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!defined_[r]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "grammar: rule '", names_[r], "' is used but never defined"));
      }
    }
    const auto root = ids_.find("root");
    if (root == ids_.end()) {
      return absl::InvalidArgumentError(
          "grammar: there is no rule named 'root' (the start rule)");
    }
    Grammar g;
    g.root = root->second;
    g.rule_names = names_;
    g.byte_sets = std::move(byte_sets_);
    g.rules.resize(rules_.size());
    size_t total = 0;
    for (const auto& alts : rules_) {
      for (const Sequence& s : alts) total += s.size() + 1;
    }
    if (total > kMaxGrammarElements) return TooLarge();
    g.elements.reserve(total);
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Sequence& s : rules_[r]) {
        g.rules[r].push_back(static_cast<int32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), s.begin(), s.end());
        g.elements.push_back(Element{Element::kEnd, 0});
      }
    }
    RETURN_IF_ERROR(CheckLeftRecursion(g));
    g.source = std::string(text_);
    return g;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  absl::Status Error(absl::string_view what) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') ++line;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: line ", line, ": ", what));
  }
  absl::Status TooLarge() const {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: it expands to more than ", kMaxGrammarElements,
                     " elements or ", kMaxGrammarRules,
                     " rules (repetition counts add up)"));
  }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  absl::string_view ParseName() {
    const size_t begin = pos_;
    while (!AtEnd() && IsNameChar(text_[pos_])) ++pos_;
    return text_.substr(begin, pos_ - begin);
  }

  // Whether a `name ::=` starts at the current position (the next rule).
  bool AtRuleStart() {
    const size_t save = pos_;
    const absl::string_view name = ParseName();
    SkipSpace();
    const bool start =
        !name.empty() && text_.substr(pos_, 3) == absl::string_view("::=");
    pos_ = save;
    return start;
  }

  absl::StatusOr<int32_t> RuleId(absl::string_view name) {
    auto [it, inserted] = ids_.try_emplace(std::string(name),
                                           static_cast<int32_t>(names_.size()));
    if (inserted) {
      if (names_.size() >= kMaxGrammarRules) return TooLarge();
      names_.emplace_back(name);
      rules_.emplace_back();
      defined_.push_back(false);
    }
    return it->second;
  }

  absl::StatusOr<int32_t> NewHelper(absl::string_view base) {
    if (names_.size() >= kMaxGrammarRules) return TooLarge();
    const int32_t id = static_cast<int32_t>(names_.size());
    names_.push_back(absl::StrCat(base, "_", id));
    rules_.emplace_back();
    defined_.push_back(true);
    return id;
  }

  int32_t ByteSetIndex(const ByteSet& set) {
    auto [it, inserted] = byte_set_ids_.try_emplace(
        std::string(reinterpret_cast<const char*>(set.bits.data()),
                    sizeof(set.bits)),
        static_cast<int32_t>(byte_sets_.size()));
    if (inserted) byte_sets_.push_back(set);
    return it->second;
  }
  Element Bytes(const ByteSet& set) {
    return Element{Element::kBytes, ByteSetIndex(set)};
  }
  Element Byte(uint8_t b) {
    ByteSet set;
    set.Add(b);
    return Bytes(set);
  }

  absl::Status CountElements(size_t n) {
    elements_ += n;
    return elements_ > kMaxGrammarElements ? TooLarge() : absl::OkStatus();
  }

  absl::Status ParseRule() {
    const absl::string_view name = ParseName();
    if (name.empty()) return Error("expected a rule name");
    SkipSpace();
    if (text_.substr(pos_, 3) != absl::string_view("::=")) {
      return Error(absl::StrCat("expected '::=' after '", name, "'"));
    }
    pos_ += 3;
    ASSIGN_OR_RETURN(const int32_t id, RuleId(name));
    if (defined_[id]) {
      return Error(absl::StrCat("rule '", name, "' is defined twice"));
    }
    defined_[id] = true;
    current_ = std::string(name);
    ASSIGN_OR_RETURN(std::vector<Sequence> alts, ParseAlternatives(0));
    if (Peek() == ')') return Error("unexpected ')' without a '('");
    rules_[id] = std::move(alts);
    return absl::OkStatus();
  }

  // Sequences separated by `|`, up to the next rule, a `)` (nested) or the end.
  absl::StatusOr<std::vector<Sequence>> ParseAlternatives(int depth) {
    std::vector<Sequence> alts;
    while (true) {
      ASSIGN_OR_RETURN(Sequence seq, ParseSequence(depth));
      alts.push_back(std::move(seq));
      SkipSpace();
      if (Peek() != '|') break;
      ++pos_;
    }
    return alts;
  }

  absl::StatusOr<Sequence> ParseSequence(int depth) {
    Sequence seq;
    while (true) {
      SkipSpace();
      if (AtEnd()) break;
      const char c = Peek();
      if (c == '|' || c == ')') break;
      if (IsNameChar(c) && depth == 0 && AtRuleStart()) break;
      ASSIGN_OR_RETURN(Sequence unit, ParseTerm(depth));
      ASSIGN_OR_RETURN(unit, ParseQuantifiers(std::move(unit)));
      RETURN_IF_ERROR(CountElements(unit.size()));
      seq.insert(seq.end(), unit.begin(), unit.end());
    }
    return seq;
  }

  absl::StatusOr<Sequence> ParseTerm(int depth) {
    const char c = Peek();
    if (c == '"' || c == '\'') {
      ++pos_;
      std::string bytes;
      while (true) {
        if (AtEnd()) return Error("unterminated string literal");
        if (Peek() == c) {
          ++pos_;
          break;
        }
        ASSIGN_OR_RETURN(char32_t cp, ParseChar());
        unicode::AppendUtf8(cp, &bytes);
      }
      Sequence seq;
      for (char b : bytes) seq.push_back(Byte(static_cast<uint8_t>(b)));
      return seq;
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (Peek() == '^') {
        negated = true;
        ++pos_;
      }
      CodeRanges ranges;
      while (true) {
        if (AtEnd()) return Error("unterminated character class");
        if (Peek() == ']') {
          ++pos_;
          break;
        }
        ASSIGN_OR_RETURN(char32_t lo, ParseChar());
        char32_t hi = lo;
        if (Peek() == '-' && pos_ + 1 < text_.size() &&
            text_[pos_ + 1] != ']') {
          ++pos_;
          ASSIGN_OR_RETURN(hi, ParseChar());
          if (hi < lo) return Error("a character range runs backwards");
        }
        ranges.push_back({lo, hi});
      }
      ranges = NormalizeRanges(std::move(ranges));
      if (negated) ranges = ComplementRanges(ranges);
      if (ranges.empty()) return Error("a character class matches nothing");
      return ClassUnit(ranges);
    }
    if (c == '.') {
      ++pos_;
      return ClassUnit(NormalizeRanges({{0, kMaxCodePoint}}));
    }
    if (c == '(') {
      if (depth + 1 > kMaxGrammarNesting) {
        return Error(absl::StrCat("groups nest deeper than ",
                                  kMaxGrammarNesting, " levels"));
      }
      ++pos_;
      ASSIGN_OR_RETURN(std::vector<Sequence> alts,
                       ParseAlternatives(depth + 1));
      SkipSpace();
      if (Peek() != ')') return Error("expected ')'");
      ++pos_;
      if (alts.size() == 1) return std::move(alts[0]);
      ASSIGN_OR_RETURN(const int32_t id, NewHelper(current_));
      rules_[id] = std::move(alts);
      return Sequence{Element{Element::kRule, id}};
    }
    if (IsNameChar(c)) {
      const absl::string_view name = ParseName();
      ASSIGN_OR_RETURN(const int32_t id, RuleId(name));
      return Sequence{Element{Element::kRule, id}};
    }
    return Error(
        absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  // A class as one element when it is ASCII only; else a helper rule with one
  // alternative per UTF-8 byte-range sequence.
  absl::StatusOr<Sequence> ClassUnit(const CodeRanges& ranges) {
    ByteSet ascii;
    bool has_ascii = false;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> multi;
    for (auto [lo, hi] : ranges) {
      if (lo < 0x80) {
        ascii.AddRange(static_cast<uint8_t>(lo),
                       static_cast<uint8_t>(std::min<char32_t>(hi, 0x7F)));
        has_ascii = true;
        if (hi < 0x80) continue;
        lo = 0x80;
      }
      Utf8Sequences(lo, hi, &multi);
    }
    if (multi.empty()) return Sequence{Bytes(ascii)};
    ASSIGN_OR_RETURN(const int32_t id, NewHelper(current_));
    std::vector<Sequence> alts;
    if (has_ascii) alts.push_back({Bytes(ascii)});
    for (const auto& byte_ranges : multi) {
      Sequence seq;
      for (auto [lo, hi] : byte_ranges) {
        ByteSet set;
        set.AddRange(lo, hi);
        seq.push_back(Bytes(set));
      }
      alts.push_back(std::move(seq));
    }
    RETURN_IF_ERROR(CountElements(alts.size() * 4));
    rules_[id] = std::move(alts);
    return Sequence{Element{Element::kRule, id}};
  }

  // One character of a literal or a class, with its escape.
  absl::StatusOr<char32_t> ParseChar() {
    const char c = text_[pos_++];
    if (c != '\\') {
      // A raw UTF-8 character.
      const uint8_t b = static_cast<uint8_t>(c);
      if (b < 0x80) return static_cast<char32_t>(b);
      int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
      if (len == 0 || pos_ + len - 1 > text_.size()) {
        return Error("invalid UTF-8 in the grammar");
      }
      char32_t cp = b & (0xFF >> (len + 1));
      for (int i = 1; i < len; ++i) {
        const uint8_t cb = static_cast<uint8_t>(text_[pos_++]);
        if ((cb & 0xC0) != 0x80) return Error("invalid UTF-8 in the grammar");
        cp = (cp << 6) | (cb & 0x3F);
      }
      return cp;
    }
    if (AtEnd()) return Error("a backslash ends the grammar");
    const char e = text_[pos_++];
    switch (e) {
      case 'n':
        return U'\n';
      case 'r':
        return U'\r';
      case 't':
        return U'\t';
      case 'x':
        return ParseHex(2);
      case 'u':
        return ParseHex(4);
      case 'U':
        return ParseHex(8);
      default:
        // \\ \" \' \[ \] \- \^ and any other punctuation stand for themselves.
        if (static_cast<uint8_t>(e) < 0x80 && !IsNameChar(e)) {
          return static_cast<char32_t>(e);
        }
        return Error(
            absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
    }
  }

  absl::StatusOr<char32_t> ParseHex(int digits) {
    char32_t cp = 0;
    for (int i = 0; i < digits; ++i) {
      const int v = AtEnd() ? -1 : HexValue(text_[pos_]);
      if (v < 0) return Error("expected a hex digit in an escape");
      ++pos_;
      cp = cp * 16 + v;
    }
    if (cp > kMaxCodePoint) return Error("an escape is beyond U+10FFFF");
    return cp;
  }

  // The unit as one element (a helper rule when it has several).
  absl::StatusOr<Element> AsElement(Sequence unit) {
    if (unit.size() == 1) return unit[0];
    ASSIGN_OR_RETURN(const int32_t id, NewHelper(current_));
    rules_[id] = {std::move(unit)};
    return Element{Element::kRule, id};
  }

  // e* as a helper: R ::= e R | ε (right recursion: the matcher's stack does
  // not grow with the count).
  absl::StatusOr<Element> Star(Element e) {
    ASSIGN_OR_RETURN(const int32_t id, NewHelper(current_));
    const Element self{Element::kRule, id};
    rules_[id] = {{e, self}, {}};
    return self;
  }

  absl::StatusOr<Sequence> ParseQuantifiers(Sequence unit) {
    while (true) {
      const char c = Peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        ASSIGN_OR_RETURN(Element e, AsElement(std::move(unit)));
        if (c == '*') {
          ASSIGN_OR_RETURN(Element star, Star(e));
          unit = {star};
        } else if (c == '+') {
          ASSIGN_OR_RETURN(Element star, Star(e));
          unit = {e, star};
        } else {
          ASSIGN_OR_RETURN(const int32_t id, NewHelper(current_));
          rules_[id] = {{e}, {}};
          unit = {Element{Element::kRule, id}};
        }
        continue;
      }
      if (c == '{') {
        ++pos_;
        SkipSpace();
        ASSIGN_OR_RETURN(int64_t lo, ParseCount());
        int64_t hi = lo;
        SkipSpace();
        if (Peek() == ',') {
          ++pos_;
          SkipSpace();
          hi = Peek() == '}' ? -1 : 0;
          if (hi == 0) {
            ASSIGN_OR_RETURN(hi, ParseCount());
          }
          SkipSpace();
        }
        if (Peek() != '}') return Error("expected '}' after a repetition");
        ++pos_;
        if (hi >= 0 && hi < lo) return Error("a repetition {n,m} has m < n");
        ASSIGN_OR_RETURN(Element e, AsElement(std::move(unit)));
        RETURN_IF_ERROR(
            CountElements(static_cast<size_t>((hi < 0 ? lo + 2 : hi) * 2)));
        Sequence out(static_cast<size_t>(lo), e);
        if (hi < 0) {
          ASSIGN_OR_RETURN(Element star, Star(e));
          out.push_back(star);
        } else if (hi > lo) {
          // opt_k ::= e opt_{k-1} | ε, nested, so at most one choice is open
          // at a time.
          Element inner{};
          bool have_inner = false;
          for (int64_t k = 0; k < hi - lo; ++k) {
            ASSIGN_OR_RETURN(const int32_t id, NewHelper(current_));
            Sequence body = {e};
            if (have_inner) body.push_back(inner);
            rules_[id] = {std::move(body), {}};
            inner = Element{Element::kRule, id};
            have_inner = true;
          }
          out.push_back(inner);
        }
        unit = std::move(out);
        continue;
      }
      return unit;
    }
  }

  absl::StatusOr<int64_t> ParseCount() {
    if (AtEnd() || Peek() < '0' || Peek() > '9') {
      return Error("expected a number in a repetition");
    }
    int64_t n = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      n = n * 10 + (text_[pos_++] - '0');
      if (n > kMaxRepetition) {
        return Error(
            absl::StrCat("a repetition count is above ", kMaxRepetition));
      }
    }
    return n;
  }

  // Left recursion makes a top-down matcher loop: rule r reaching itself
  // through first elements (each one before it able to match nothing).
  absl::Status CheckLeftRecursion(const Grammar& g) const {
    const size_t n = g.rules.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (int32_t start : g.rules[r]) {
          bool all = true;
          for (int32_t p = start; g.elements[p].kind != Element::kEnd; ++p) {
            const Element& e = g.elements[p];
            if (e.kind == Element::kBytes || !nullable[e.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<int32_t>> first(n);
    for (size_t r = 0; r < n; ++r) {
      for (int32_t start : g.rules[r]) {
        for (int32_t p = start; g.elements[p].kind != Element::kEnd; ++p) {
          const Element& e = g.elements[p];
          if (e.kind == Element::kBytes) break;
          first[r].push_back(e.value);
          if (!nullable[e.value]) break;
        }
      }
    }
    // Iterative DFS with colours: 0 new, 1 on the stack, 2 done.
    std::vector<char> colour(n, 0);
    for (size_t s = 0; s < n; ++s) {
      if (colour[s]) continue;
      std::vector<std::pair<int32_t, size_t>> stack = {{int32_t(s), 0}};
      colour[s] = 1;
      while (!stack.empty()) {
        auto& [r, next] = stack.back();
        if (next < first[r].size()) {
          const int32_t to = first[r][next++];
          if (colour[to] == 1) {
            return absl::InvalidArgumentError(absl::StrCat(
                "grammar: rule '", g.rule_names[to],
                "' is left-recursive (it can reach itself before matching "
                "anything); rewrite it with repetition, e.g. a ::= b (\"+\" "
                "b)*"));
          }
          if (colour[to] == 0) {
            colour[to] = 1;
            stack.push_back({to, 0});
          }
        } else {
          colour[r] = 2;
          stack.pop_back();
        }
      }
    }
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
  std::string current_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> rules_;
  std::vector<bool> defined_;
  std::vector<ByteSet> byte_sets_;
  absl::flat_hash_map<std::string, int32_t> byte_set_ids_;
  size_t elements_ = 0;
};

}  // namespace

absl::StatusOr<Grammar> ParseEbnf(absl::string_view text) {
  return Parser(text).Parse();
}

std::string EbnfLiteral(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (b >= 0x20 && b < 0x7F) {
      out.push_back(c);
    } else if (b >= 0x80) {
      out.push_back(c);  // UTF-8 passes through (ParseChar reads it).
    } else {
      out += "\\x";
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
  }
  return out;
}

}  // namespace grammar
}  // namespace tessera
