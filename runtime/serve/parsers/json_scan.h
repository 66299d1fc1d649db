// Finding where one JSON value ends in text that may still be arriving
// (a model's output, piece by piece), without parsing it.
//
// Tool-call parsers need to know when a call's JSON is complete before they
// hand it to nlohmann::json: the parser itself cannot say "not yet" apart
// from "never". The scanner matches brackets outside strings and follows
// string escapes; it does not validate the rest of the syntax (the parser
// does, once the value is complete). Nesting deeper than kMaxJsonDepth is
// invalid, so the bracket stack and any later recursion stay bounded.
#ifndef TESSERA_RUNTIME_SERVE_PARSERS_JSON_SCAN_H_
#define TESSERA_RUNTIME_SERVE_PARSERS_JSON_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace tessera {
namespace serve {

enum class JsonScan {
  kComplete,    // [begin, end) is one value.
  kIncomplete,  // The text ends inside the value (or before it starts).
  kInvalid,     // Not a JSON value (mismatched bracket, too deep, ...).
};

struct JsonScanResult {
  JsonScan state = JsonScan::kIncomplete;
  size_t begin = 0;  // The value's first byte (after whitespace).
  size_t end = 0;    // One past its last byte (kComplete).
};

// Scans the value that starts at or after `pos` (leading whitespace
// skipped). A bare scalar (number, true, false, null) is complete only when
// a byte that cannot continue it follows: at the end of the text it is
// kIncomplete, as more digits may come.
JsonScanResult ScanJsonValue(absl::string_view text, size_t pos = 0);

// The same scan, resumable: Feed the value's text as it arrives and the
// work is linear in its length however it is cut.
class JsonValueScanner {
 public:
  // Feeds the next bytes. kComplete: the value ended, `*used` bytes of this
  // piece belong to it (what follows is not read). kIncomplete: all of the
  // piece was used and the value goes on. kInvalid: stays invalid.
  JsonScan Feed(absl::string_view piece, size_t* used);
  // The text ended: a scalar in progress is complete.
  JsonScan Finish();
  bool started() const { return started_; }

 private:
  bool started_ = false;
  bool done_ = false;
  bool invalid_ = false;
  bool in_string_ = false;
  bool escape_ = false;
  bool scalar_ = false;
  std::vector<char> stack_;  // Open brackets: '[' or '{'.
};

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_PARSERS_JSON_SCAN_H_
