#include "runtime/grammar/regex.h"

#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/grammar/code_ranges.h"
#include "runtime/grammar/grammar.h"
#include "runtime/text/unicode.h"

namespace tessera {
namespace grammar {
namespace {

constexpr int kMaxRegexNesting = 64;

const CodeRanges& Digits() {
  static const CodeRanges r = {{'0', '9'}};
  return r;
}
const CodeRanges& WordChars() {
  static const CodeRanges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const CodeRanges& SpaceChars() {
  static const CodeRanges r = {{'\t', '\r'}, {' ', ' '}};
  return r;
}

std::string CodePointEscape(char32_t cp) {
  char buf[16];
  if (cp <= 0xFFFF) {
    std::snprintf(buf, sizeof(buf), "\\u%04X", static_cast<unsigned>(cp));
  } else {
    std::snprintf(buf, sizeof(buf), "\\U%08X", static_cast<unsigned>(cp));
  }
  return buf;
}

class RegexParser {
 public:
  RegexParser(absl::string_view pattern, const RegexOptions& options)
      : p_(pattern), options_(options) {}

  absl::StatusOr<std::string> Parse() {
    if (p_.size() > kMaxRegexBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "regex: ", p_.size(), " bytes; at most ", kMaxRegexBytes));
    }
    if (!p_.empty() && p_[0] == '^') ++pos_;
    ASSIGN_OR_RETURN(std::string out, ParseAlternation(0));
    if (pos_ < p_.size()) {
      return Error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected text");
    }
    return out;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex: ", what, " at offset ", pos_));
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return AtEnd() ? '\0' : p_[pos_]; }

  absl::StatusOr<std::string> ParseAlternation(int depth) {
    std::vector<std::string> alts;
    while (true) {
      ASSIGN_OR_RETURN(std::string seq, ParseConcat(depth));
      alts.push_back(std::move(seq));
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) {
      if (i > 0) out += " | ";
      out += alts[i].empty() ? "\"\"" : alts[i];
    }
    return out + ")";
  }

  absl::StatusOr<std::string> ParseConcat(int depth) {
    std::string out;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && pos_ + 1 == p_.size()) {
        ++pos_;
        break;
      }
      ASSIGN_OR_RETURN(std::string atom, ParseAtom(depth));
      ASSIGN_OR_RETURN(std::string quant, ParseQuantifier());
      if (!out.empty()) out += " ";
      out += quant.empty() ? atom : "(" + atom + ")" + quant;
    }
    return out.empty() ? std::string("\"\"") : out;
  }

  absl::StatusOr<std::string> ParseQuantifier() {
    std::string q;
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t save = pos_;
      ++pos_;
      std::string body;
      while (!AtEnd() && (std::isdigit(static_cast<unsigned char>(Peek())) ||
                          Peek() == ',')) {
        body.push_back(p_[pos_++]);
      }
      if (Peek() != '}' || body.empty() || body[0] == ',') {
        // Python treats a brace that is not a repetition as a literal.
        pos_ = save;
        return std::string();
      }
      ++pos_;
      for (size_t i = 0, n = 0; i < body.size(); ++i) {
        if (body[i] == ',') {
          n = 0;
          continue;
        }
        n = n * 10 + (body[i] - '0');
        if (n > static_cast<size_t>(kMaxRepetition)) {
          return Error(
              absl::StrCat("a repetition count above ", kMaxRepetition));
        }
      }
      q = "{" + body + "}";
    } else {
      return std::string();
    }
    if (Peek() == '?') ++pos_;  // lazy: the same strings
    if (Peek() == '+') return Error("possessive quantifiers are not supported");
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{') {
      return Error("a quantifier follows a quantifier");
    }
    return q;
  }

  absl::StatusOr<std::string> ParseAtom(int depth) {
    const char c = p_[pos_];
    if (c == '(') {
      if (depth + 1 > kMaxRegexNesting) {
        return Error(
            absl::StrCat("groups nest deeper than ", kMaxRegexNesting));
      }
      ++pos_;
      if (Peek() == '?') {
        if (p_.substr(pos_, 2) == "?:") {
          pos_ += 2;
        } else if (p_.substr(pos_, 2) == "?P" || p_.substr(pos_, 2) == "?<") {
          // Named groups: (?P<name>...) and (?<name>...); lookbehind (?<= (?<!
          // is not supported.
          if (p_.substr(pos_, 3) == "?<=" || p_.substr(pos_, 3) == "?<!") {
            return Error("lookbehind is not supported");
          }
          const size_t close = p_.find('>', pos_);
          if (close == absl::string_view::npos) return Error("bad group name");
          pos_ = close + 1;
        } else {
          return Error(
              "lookahead, lookbehind and inline flags are not supported");
        }
      }
      ASSIGN_OR_RETURN(std::string inner, ParseAlternation(depth + 1));
      if (Peek() != ')') return Error("missing ')'");
      ++pos_;
      return "(" + inner + ")";
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Ranges(ComplementRanges({{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?') return Error("nothing to repeat");
    if (c == '^') return Error("'^' inside the pattern is not supported");
    if (c == '$') return Error("'$' inside the pattern is not supported");
    if (c == '\\') {
      ++pos_;
      CodeRanges ranges;
      ASSIGN_OR_RETURN(bool is_class, ParseEscape(&ranges, /*in_class=*/false));
      if (is_class) return Ranges(NormalizeRanges(ranges));
      return RenderChar(ranges[0].first);
    }
    ASSIGN_OR_RETURN(char32_t cp, NextChar());
    return RenderChar(cp);
  }

  // A raw UTF-8 character of the pattern.
  absl::StatusOr<char32_t> NextChar() {
    const uint8_t b = static_cast<uint8_t>(p_[pos_++]);
    if (b < 0x80) return static_cast<char32_t>(b);
    const int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || pos_ + len - 1 > p_.size()) return Error("invalid UTF-8");
    char32_t cp = b & (0xFF >> (len + 1));
    for (int i = 1; i < len; ++i) {
      const uint8_t cb = static_cast<uint8_t>(p_[pos_++]);
      if ((cb & 0xC0) != 0x80) return Error("invalid UTF-8");
      cp = (cp << 6) | (cb & 0x3F);
    }
    return cp;
  }

  absl::StatusOr<char32_t> Hex(int digits) {
    char32_t cp = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(Peek()))) {
        return Error("expected a hex digit");
      }
      const char h = p_[pos_++];
      cp = cp * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return cp;
  }

  // After a backslash: fills `ranges` and says whether it is a class (\d,
  // \w, ...) rather than one character.
  absl::StatusOr<bool> ParseEscape(CodeRanges* ranges, bool in_class) {
    if (AtEnd()) return Error("a backslash ends the pattern");
    const char e = p_[pos_++];
    auto one = [&](char32_t cp) {
      ranges->push_back({cp, cp});
      return false;
    };
    switch (e) {
      case 'd':
        *ranges = Digits();
        return true;
      case 'w':
        *ranges = WordChars();
        return true;
      case 's':
        *ranges = SpaceChars();
        return true;
      case 'D':
      case 'W':
      case 'S': {
        if (in_class) {
          return Error(absl::StrCat("\\", std::string(1, e),
                                    " inside a class is not supported"));
        }
        const CodeRanges& base = e == 'D'   ? Digits()
                                 : e == 'W' ? WordChars()
                                            : SpaceChars();
        *ranges = ComplementRanges(base);
        return true;
      }
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 't':
        return one('\t');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0':
        return one(0);
      case 'x': {
        ASSIGN_OR_RETURN(char32_t cp, Hex(2));
        return one(cp);
      }
      case 'u': {
        ASSIGN_OR_RETURN(char32_t cp, Hex(4));
        if (cp >= 0xD800 && cp <= 0xDFFF) {
          return Error("a \\u escape is a surrogate");
        }
        return one(cp);
      }
      case 'b':
      case 'B':
        if (in_class && e == 'b') return one('\b');
        return Error("word boundaries (\\b, \\B) are not supported");
      case 'A':
      case 'Z':
      case 'z':
        return Error("\\A, \\Z and \\z anchors are not supported");
      default:
        if (e >= '1' && e <= '9') {
          return Error("backreferences are not supported");
        }
        if (std::isalnum(static_cast<unsigned char>(e))) {
          return Error(absl::StrCat("unknown escape \\", std::string(1, e)));
        }
        return one(static_cast<unsigned char>(e));
    }
  }

  absl::StatusOr<std::string> ParseClass() {
    ++pos_;  // '['
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodeRanges ranges;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      CodeRanges item;
      bool is_class = false;
      if (Peek() == '\\') {
        ++pos_;
        ASSIGN_OR_RETURN(is_class, ParseEscape(&item, /*in_class=*/true));
      } else {
        ASSIGN_OR_RETURN(char32_t cp, NextChar());
        item.push_back({cp, cp});
      }
      if (!is_class && Peek() == '-' && pos_ + 1 < p_.size() &&
          p_[pos_ + 1] != ']') {
        ++pos_;
        char32_t hi;
        if (Peek() == '\\') {
          ++pos_;
          CodeRanges h;
          ASSIGN_OR_RETURN(bool hc, ParseEscape(&h, /*in_class=*/true));
          if (hc) return Error("a class escape ends a range");
          hi = h[0].first;
        } else {
          ASSIGN_OR_RETURN(hi, NextChar());
        }
        if (hi < item[0].first) return Error("a range runs backwards");
        item[0].second = hi;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    ranges = NormalizeRanges(std::move(ranges));
    if (negated) ranges = ComplementRanges(ranges);
    if (ranges.empty()) return Error("a class matches nothing");
    return Ranges(ranges);
  }

  absl::StatusOr<std::string> Ranges(const CodeRanges& ranges) const {
    std::string out = RenderRanges(ranges);
    if (out.empty()) {
      return Error(
          "a class of control characters only (a JSON string holds them "
          "escaped, and only \\t \\n \\r are written)");
    }
    return out;
  }

  // One character as an EBNF literal (JSON-escaped in a JSON string).
  std::string RenderChar(char32_t cp) const {
    if (options_.json_string) {
      switch (cp) {
        case '"':
          return "\"\\\\\\\"\"";  // the two bytes \"
        case '\\':
          return "\"\\\\\\\\\"";  // the two bytes \\ .
        case '\n':
          return "\"\\\\n\"";
        case '\r':
          return "\"\\\\r\"";
        case '\t':
          return "\"\\\\t\"";
        default:
          if (cp < 0x20) {
            char buf[16];
            std::snprintf(buf, sizeof(buf), "\"\\\\u%04x\"",
                          static_cast<unsigned>(cp));
            return buf;
          }
      }
    }
    std::string utf8;
    unicode::AppendUtf8(cp, &utf8);
    return "\"" + EbnfLiteral(utf8) + "\"";
  }

  // A class as EBNF; in a JSON string the characters that need escapes are
  // written escaped, as alternatives.
  std::string RenderRanges(const CodeRanges& ranges) const {
    CodeRanges plain = ranges;
    std::vector<std::string> escaped;
    if (options_.json_string) {
      plain.clear();
      for (auto [lo, hi] : ranges) {
        for (char32_t special : {U'\t', U'\n', U'\r', U'"', U'\\'}) {
          if (lo <= special && special <= hi) {
            escaped.push_back(RenderChar(special));
          }
        }
        // Control characters other than those, and " and \, leave the class.
        const CodeRanges safe = {
            {0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}};
        for (auto [slo, shi] : safe) {
          const char32_t a = std::max(lo, slo), b = std::min(hi, shi);
          if (a <= b) plain.push_back({a, b});
        }
      }
    }
    std::string cls;
    if (!plain.empty()) {
      cls = "[";
      for (auto [lo, hi] : plain) {
        cls += CodePointEscape(lo);
        if (hi != lo) cls += "-" + CodePointEscape(hi);
      }
      cls += "]";
    }
    if (escaped.empty()) return cls;
    std::string out = "(";
    if (!cls.empty()) out += cls;
    for (const std::string& e : escaped) {
      if (out.size() > 1) out += " | ";
      out += e;
    }
    return out + ")";
  }

  absl::string_view p_;
  RegexOptions options_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::string> RegexToEbnf(absl::string_view pattern,
                                        const RegexOptions& options) {
  return RegexParser(pattern, options).Parse();
}

}  // namespace grammar
}  // namespace tessera
