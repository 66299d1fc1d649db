// Jinja lexer (internal to runtime/text/jinja*): template source to tokens,
// with the whitespace rules of the environment transformers renders chat
// templates in (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False).
//
// The rules, as Jinja 3.1's lexer applies them:
//  * Newlines ("\r\n", "\r", "\n") become "\n", and one trailing newline of
//    the whole template is dropped.
//  * "{%-", "{{-", "{#-" strip all whitespace (newlines included) before the
//    tag; "-%}", "-}}", "-#}" strip all whitespace after it.
//  * trim_blocks: a "\n" right after "%}" or "#}" is dropped ("+%}" keeps it).
//    Not after "}}".
//  * lstrip_blocks: spaces and tabs between the start of a line and "{%" or
//    "{#" are dropped ("{%+" keeps them). Not before "{{". "Start of a line"
//    means after a newline in the preceding text, or at the template start,
//    or right after a tag whose end consumed a newline.
#ifndef TESSERA_RUNTIME_TEXT_JINJA_LEXER_H_
#define TESSERA_RUNTIME_TEXT_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace jinja {

enum class TokenType {
  kData,           // literal text
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifier or keyword (if, for, and, none, ...)
  kString,         // string literal, escapes decoded
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < <= > >= = . : | , ; ( ) [ ] { }
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;  // text, name, decoded string or operator
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
};

// Tokenizes a template. InvalidArgument for malformed input (an unclosed tag,
// comment or string, an unexpected character), naming the line.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace jinja
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_JINJA_LEXER_H_
