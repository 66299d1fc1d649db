#include "runtime/core/json_limits.h"

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status CheckJsonNesting(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return absl::InvalidArgumentError(
              absl::StrCat("JSON nested deeper than ", max_depth, " levels"));
        }
        break;
      case ']':
      case '}':
        // Unbalanced closers are the parser's to report.
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
