// Jinja parser (internal to runtime/text/jinja*): tokens to a syntax tree,
// following the grammar and operator precedence of Jinja 3.1's parser.
#ifndef TESSERA_RUNTIME_TEXT_JINJA_PARSER_H_
#define TESSERA_RUNTIME_TEXT_JINJA_PARSER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/text/jinja_ast.h"

namespace tessera {
namespace jinja {

// Parses a template. InvalidArgument for syntax errors and for filters or
// tests that Jinja itself does not have (Jinja rejects those when compiling,
// even in branches that never run); Unimplemented for statements Jinja has
// but this implementation does not ({% include %}, {% call %}, ...).
// Messages name the line: `unknown filter "frobnicate" (line 3)`.
absl::StatusOr<StmtList> Parse(absl::string_view source);

}  // namespace jinja
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_JINJA_PARSER_H_
