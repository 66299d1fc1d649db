#include "runtime/text/jinja_lexer.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/text/jinja_value.h"

namespace tessera {
namespace jinja {
namespace {

absl::Status SyntaxError(int line, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("syntax error: ", message, " (line ", line, ")"));
}

// Jinja works on "\n"-separated lines and drops the final newline.
std::string NormalizeNewlines(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Length of the (Python, Unicode-aware) whitespace run at `pos`.
size_t WhitespaceRun(absl::string_view s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (!IsPySpace(c)) break;
      ++i;
      continue;
    }
    // A multi-byte character: decode just this one.
    size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 4;
    if (i + len > s.size()) break;
    const std::u32string cp = DecodeUtf8(s.substr(i, len));
    if (cp.size() != 1 || !IsPySpace(cp[0])) break;
    i += len;
  }
  return i - pos;
}

// Python's str.rstrip() with no argument.
absl::string_view RStripWhitespace(absl::string_view s) {
  const std::string stripped = PyStrip(s, nullptr, false, true);
  return s.substr(0, stripped.size());
}

bool AllWhitespace(absl::string_view s) {
  return !s.empty() && WhitespaceRun(s, 0) == s.size();
}

int CountNewlines(absl::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// `(\d+_)*\d+` at `pos`: digits with single underscores between them.
size_t DigitRun(absl::string_view s, size_t pos) {
  size_t i = pos;
  if (i >= s.size() || !IsDigit(s[i])) return 0;
  while (true) {
    while (i < s.size() && IsDigit(s[i])) ++i;
    if (i + 1 < s.size() && s[i] == '_' && IsDigit(s[i + 1])) {
      ++i;
      continue;
    }
    return i - pos;
  }
}

std::string WithoutUnderscores(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '_') out.push_back(c);
  }
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body, which is how
// Jinja reads string literals.
absl::StatusOr<std::string> DecodeStringLiteral(absl::string_view body,
                                                int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
      case '\'':
      case '"':
        out.push_back(e);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7': {
        int value = e - '0';
        for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' &&
                        body[i + 1] <= '7';
             ++k) {
          value = value * 8 + (body[++i] - '0');
        }
        AppendUtf8(static_cast<char32_t>(value), &out);
        break;
      }
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t value = 0;
        for (int k = 0; k < digits; ++k) {
          if (i + 1 >= body.size() || HexValue(body[i + 1]) < 0) {
            return SyntaxError(line,
                               absl::StrCat("truncated \\", std::string(1, e),
                                            " escape in string literal"));
          }
          value = value * 16 + static_cast<uint32_t>(HexValue(body[++i]));
        }
        if (value > 0x10ffff) {
          return SyntaxError(line, "illegal Unicode character in string");
        }
        AppendUtf8(static_cast<char32_t>(value), &out);
        break;
      }
      case 'N':
        return SyntaxError(line, "\\N{...} escapes are not supported");
      default:
        // Python keeps unknown escapes as they are.
        out.push_back('\\');
        out.push_back(e);
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) : src_(NormalizeNewlines(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const size_t tag = FindTag(pos_);
      if (tag == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos_));
        break;
      }
      const char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) {
        sign = src_[after++];
      }
      size_t raw_body = 0;
      const bool raw = kind == '%' && MatchRawBegin(after, &raw_body);
      absl::string_view text = absl::string_view(src_).substr(pos_, tag - pos_);
      const int text_line = line_;
      line_ += CountNewlines(text);
      text = ApplyLeftStrip(text, sign, /*lstrip_allowed=*/kind != '{');
      if (!text.empty()) Emit(TokenType::kData, text, text_line);
      if (raw) {
        RETURN_IF_ERROR(LexRaw(raw_body));
      } else if (kind == '#') {
        RETURN_IF_ERROR(LexComment(after));
      } else {
        RETURN_IF_ERROR(LexTag(kind, tag, after));
      }
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_;
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  size_t FindTag(size_t from) const {
    size_t i = from;
    while (true) {
      i = src_.find('{', i);
      if (i == std::string::npos || i + 1 >= src_.size()) {
        return std::string::npos;
      }
      const char next = src_[i + 1];
      if (next == '{' || next == '%' || next == '#') return i;
      ++i;
    }
  }

  // The whitespace control that applies to the text before a tag.
  absl::string_view ApplyLeftStrip(absl::string_view text, char sign,
                                   bool lstrip_allowed) const {
    if (sign == '-') return RStripWhitespace(text);
    if (sign == '+' || !lstrip_allowed) return text;
    const size_t newline = text.rfind('\n');
    const size_t line_start =
        newline == absl::string_view::npos ? 0 : newline + 1;
    if ((line_start > 0 || line_starting_) &&
        AllWhitespace(text.substr(line_start))) {
      return text.substr(0, line_start);
    }
    return text;
  }

  // `{%[-+]?\s*raw\s*(-%}\s*|%})` from just after the sign.
  bool MatchRawBegin(size_t after, size_t* body) const {
    size_t i = after + WhitespaceRun(src_, after);
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    if (i < src_.size() && IsNameChar(src_[i])) return false;
    i += WhitespaceRun(src_, i);
    if (src_.compare(i, 3, "-%}") == 0) {
      i += 3;
      i += WhitespaceRun(src_, i);
    } else if (src_.compare(i, 2, "%}") == 0) {
      i += 2;
    } else {
      return false;
    }
    *body = i;
    return true;
  }

  // Skips what an end tag's whitespace control consumes after it, and notes
  // whether the next text starts a line (for lstrip_blocks).
  void ConsumeAfterEnd(size_t end, char sign, bool trim_newline) {
    size_t i = end;
    if (sign == '-') {
      i += WhitespaceRun(src_, i);
    } else if (trim_newline && i < src_.size() && src_[i] == '\n') {
      ++i;
    }
    line_ += CountNewlines(absl::string_view(src_).substr(end, i - end));
    line_starting_ = i > 0 && src_[i - 1] == '\n';
    pos_ = i;
  }

  absl::Status LexComment(size_t after) {
    const size_t close = src_.find("#}", after);
    if (close == std::string::npos) {
      return SyntaxError(line_, "missing end of comment tag");
    }
    char sign = 0;
    size_t content_end = close;
    if (close > after && (src_[close - 1] == '-' || src_[close - 1] == '+')) {
      sign = src_[close - 1];
      content_end = close - 1;
    }
    line_ += CountNewlines(
        absl::string_view(src_).substr(after, content_end - after));
    ConsumeAfterEnd(close + 2, sign, /*trim_newline=*/sign != '+');
    return absl::OkStatus();
  }

  absl::Status LexRaw(size_t body) {
    // Find `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)`.
    size_t search = body;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) {
        return SyntaxError(line_, "missing end of raw directive");
      }
      size_t i = open + 2;
      char sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) {
        sign = src_[i++];
      }
      i += WhitespaceRun(src_, i);
      if (src_.compare(i, 6, "endraw") != 0 ||
          (i + 6 < src_.size() && IsNameChar(src_[i + 6]))) {
        search = open + 2;
        continue;
      }
      i += 6;
      i += WhitespaceRun(src_, i);
      char end_sign = 0;
      size_t end;
      if (src_.compare(i, 3, "+%}") == 0) {
        end_sign = '+';
        end = i + 3;
      } else if (src_.compare(i, 3, "-%}") == 0) {
        end_sign = '-';
        end = i + 3;
      } else if (src_.compare(i, 2, "%}") == 0) {
        end = i + 2;
      } else {
        search = open + 2;
        continue;
      }
      // The raw begin tag ended without a newline check, so the body's line
      // start depends on what that tag consumed.
      line_starting_ = body > 0 && src_[body - 1] == '\n';
      absl::string_view text =
          absl::string_view(src_).substr(body, open - body);
      const int text_line = line_;
      line_ += CountNewlines(text);
      text = ApplyLeftStrip(text, sign, /*lstrip_allowed=*/true);
      if (!text.empty()) Emit(TokenType::kData, text, text_line);
      line_ += CountNewlines(absl::string_view(src_).substr(open, end - open));
      ConsumeAfterEnd(end, end_sign, /*trim_newline=*/end_sign != '+');
      return absl::OkStatus();
    }
  }

  absl::Status LexTag(char kind, size_t tag, size_t after) {
    const bool block = kind == '%';
    Emit(block ? TokenType::kBlockBegin : TokenType::kVariableBegin,
         absl::string_view(src_).substr(tag, after - tag));
    std::vector<char> balance;
    size_t i = after;
    while (true) {
      const size_t ws = WhitespaceRun(src_, i);
      line_ += CountNewlines(absl::string_view(src_).substr(i, ws));
      i += ws;
      if (i >= src_.size()) {
        return SyntaxError(line_, block ? "unexpected end of template, "
                                          "expected '%}'"
                                        : "unexpected end of template, "
                                          "expected '}}'");
      }
      if (balance.empty()) {
        char sign = 0;
        size_t end = 0;
        if (block) {
          if (src_.compare(i, 3, "+%}") == 0) {
            sign = '+';
            end = i + 3;
          } else if (src_.compare(i, 3, "-%}") == 0) {
            sign = '-';
            end = i + 3;
          } else if (src_.compare(i, 2, "%}") == 0) {
            end = i + 2;
          }
        } else {
          if (src_.compare(i, 3, "-}}") == 0) {
            sign = '-';
            end = i + 3;
          } else if (src_.compare(i, 2, "}}") == 0) {
            end = i + 2;
          }
        }
        if (end != 0) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd,
               absl::string_view(src_).substr(i, end - i));
          ConsumeAfterEnd(end, sign, /*trim_newline=*/block && sign != '+');
          return absl::OkStatus();
        }
      }
      ASSIGN_OR_RETURN(i, LexExpressionToken(i, &balance));
    }
  }

  // One token inside {{ }} or {% %}; returns the position after it.
  absl::StatusOr<size_t> LexExpressionToken(size_t i,
                                            std::vector<char>* balance) {
    const char c = src_[i];
    // float: (\d+_)*\d+ ((\.D)? e[+-]? D | \.D), not right after a '.'.
    if (IsDigit(c) && (i == 0 || src_[i - 1] != '.')) {
      const size_t int_len = DigitRun(src_, i);
      size_t j = i + int_len;
      bool is_float = false;
      if (j + 1 < src_.size() && src_[j] == '.' && IsDigit(src_[j + 1])) {
        j += 1 + DigitRun(src_, j + 1);
        is_float = true;
      }
      if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
        size_t k = j + 1;
        if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
        const size_t exp_len = DigitRun(src_, k);
        if (exp_len > 0) {
          j = k + exp_len;
          is_float = true;
        }
      }
      if (is_float) {
        Token t;
        t.type = TokenType::kFloat;
        t.value = src_.substr(i, j - i);
        t.float_value =
            std::strtod(WithoutUnderscores(t.value).c_str(), nullptr);
        t.line = line_;
        tokens_.push_back(std::move(t));
        return j;
      }
    }
    if (IsDigit(c)) return LexInteger(i);
    if (IsNameStart(c)) {
      size_t j = i;
      while (j < src_.size() && IsNameChar(src_[j])) ++j;
      Emit(TokenType::kName, absl::string_view(src_).substr(i, j - i));
      return j;
    }
    if (c == '\'' || c == '"') return LexString(i);
    static constexpr absl::string_view kTwoCharOps[] = {
        "//", "**", "==", "!=", ">=", "<="};
    for (absl::string_view op : kTwoCharOps) {
      if (src_.compare(i, 2, op.data(), op.size()) == 0) {
        Emit(TokenType::kOperator, op);
        return i + 2;
      }
    }
    static constexpr absl::string_view kOneCharOps = "+-/*%~[](){}><=.:|,;";
    if (kOneCharOps.find(c) != absl::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') {
        balance->push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
      } else if (c == ')' || c == ']' || c == '}') {
        if (balance->empty()) {
          return SyntaxError(
              line_, absl::StrCat("unexpected '", std::string(1, c), "'"));
        }
        if (balance->back() != c) {
          return SyntaxError(
              line_,
              absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                           std::string(1, balance->back()), "'"));
        }
        balance->pop_back();
      }
      Emit(TokenType::kOperator, absl::string_view(src_).substr(i, 1));
      return i + 1;
    }
    return SyntaxError(
        line_, absl::StrCat("unexpected char '", std::string(1, c), "'"));
  }

  absl::StatusOr<size_t> LexInteger(size_t i) {
    // 0b/0o/0x prefixes, [1-9](_?\d)*, or 0(_?0)*.
    size_t j = i;
    int base = 10;
    if (src_[i] == '0' && i + 1 < src_.size()) {
      const char p = src_[i + 1];
      base = (p == 'b' || p == 'B')   ? 2
             : (p == 'o' || p == 'O') ? 8
             : (p == 'x' || p == 'X') ? 16
                                      : 10;
    }
    auto is_base_digit = [base](char d) {
      if (base == 2) return d == '0' || d == '1';
      if (base == 8) return d >= '0' && d <= '7';
      if (base == 16) return HexValue(d) >= 0;
      return IsDigit(d);
    };
    std::string digits;
    if (base != 10) {
      j = i + 2;
      while (j < src_.size()) {
        if (src_[j] == '_' && j + 1 < src_.size() &&
            is_base_digit(src_[j + 1])) {
          ++j;
        }
        if (j >= src_.size() || !is_base_digit(src_[j])) break;
        digits.push_back(src_[j++]);
      }
      if (digits.empty()) {
        // "0b" with no digits: just the "0".
        base = 10;
        j = i + 1;
        digits = "0";
      }
    } else if (src_[i] == '0') {
      j = i + 1;
      while (j < src_.size()) {
        if (src_[j] == '0') {
          ++j;
        } else if (src_[j] == '_' && j + 1 < src_.size() &&
                   src_[j + 1] == '0') {
          j += 2;
        } else {
          break;
        }
      }
      digits = "0";
    } else {
      const size_t len = DigitRun(src_, i);
      j = i + len;
      digits = WithoutUnderscores(absl::string_view(src_).substr(i, len));
    }
    errno = 0;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(digits.c_str(), &end, base);
    if (errno == ERANGE || value > static_cast<unsigned long long>(INT64_MAX)) {
      return SyntaxError(line_, "integer literal too large");
    }
    Token t;
    t.type = TokenType::kInteger;
    t.value = src_.substr(i, j - i);
    t.int_value = static_cast<int64_t>(value);
    t.line = line_;
    tokens_.push_back(std::move(t));
    return j;
  }

  absl::StatusOr<size_t> LexString(size_t i) {
    const char quote = src_[i];
    size_t j = i + 1;
    while (j < src_.size() && src_[j] != quote) {
      j += src_[j] == '\\' ? 2 : 1;
    }
    if (j >= src_.size()) {
      return SyntaxError(line_, "unterminated string literal");
    }
    const absl::string_view body =
        absl::string_view(src_).substr(i + 1, j - i - 1);
    Token t;
    t.type = TokenType::kString;
    t.line = line_;
    ASSIGN_OR_RETURN(t.value, DecodeStringLiteral(body, line_));
    tokens_.push_back(std::move(t));
    line_ += CountNewlines(body);
    return j + 1;
  }

  void Emit(TokenType type, absl::string_view value, int line = -1) {
    Token t;
    t.type = type;
    t.value = std::string(value);
    t.line = line < 0 ? line_ : line;
    tokens_.push_back(std::move(t));
  }

  const std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  // Whether the text after the last tag starts a line (lstrip_blocks).
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

}  // namespace jinja
}  // namespace tessera
