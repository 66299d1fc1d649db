#include "runtime/serve/parsers/json_scan.h"

#include "runtime/core/json_limits.h"

namespace tessera {
namespace serve {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Bytes that may continue a number or a literal.
bool IsScalarByte(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z') || c == '-' || c == '+' || c == '.';
}

}  // namespace

JsonScan JsonValueScanner::Feed(absl::string_view piece, size_t* used) {
  *used = 0;
  if (invalid_) return JsonScan::kInvalid;
  if (done_) return JsonScan::kComplete;
  for (size_t i = 0; i < piece.size(); ++i) {
    const char c = piece[i];
    if (!started_) {
      if (IsSpace(c)) continue;
      started_ = true;
      if (c == '"') {
        in_string_ = true;
      } else if (c == '[' || c == '{') {
        stack_.push_back(c);
      } else if (IsScalarByte(c)) {
        scalar_ = true;
      } else {
        invalid_ = true;
        *used = i;
        return JsonScan::kInvalid;
      }
      continue;
    }
    if (scalar_) {
      if (IsScalarByte(c)) continue;
      done_ = true;
      *used = i;  // The byte after the scalar is not the value's.
      return JsonScan::kComplete;
    }
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        if (stack_.empty()) {
          done_ = true;
          *used = i + 1;
          return JsonScan::kComplete;
        }
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        break;
      case '[':
      case '{':
        if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) {
          invalid_ = true;
          *used = i;
          return JsonScan::kInvalid;
        }
        stack_.push_back(c);
        break;
      case ']':
      case '}':
        if (stack_.back() != (c == ']' ? '[' : '{')) {
          invalid_ = true;
          *used = i;
          return JsonScan::kInvalid;
        }
        stack_.pop_back();
        if (stack_.empty()) {
          done_ = true;
          *used = i + 1;
          return JsonScan::kComplete;
        }
        break;
      default:
        break;
    }
  }
  *used = piece.size();
  return JsonScan::kIncomplete;
}

JsonScan JsonValueScanner::Finish() {
  if (invalid_) return JsonScan::kInvalid;
  if (done_ || (scalar_ && started_)) {
    done_ = true;
    return JsonScan::kComplete;
  }
  return JsonScan::kIncomplete;
}

JsonScanResult ScanJsonValue(absl::string_view text, size_t pos) {
  JsonScanResult result;
  if (pos > text.size()) pos = text.size();
  while (pos < text.size() && IsSpace(text[pos])) ++pos;
  result.begin = pos;
  JsonValueScanner scanner;
  size_t used = 0;
  result.state = scanner.Feed(text.substr(pos), &used);
  result.end = pos + used;
  return result;
}

}  // namespace serve
}  // namespace tessera
