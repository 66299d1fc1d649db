// --tool-call-parser: the tool calls in a model's output (tool_choice
// "auto"), told apart from its content, as vLLM's tool parsers do.
//
// Formats (vLLM's names; each in its own file, one line in the table of
// tool_parser.cc):
//  - hermes: Hermes 2 Pro / Qwen2.5 / Qwen3:
//      <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//    any number of times, anywhere in the output.
//  - llama3_json: Llama 3.1-3.3 JSON calls: the output opens (after an
//    optional <|python_tag|>) with {"name": ..., "parameters": {...}},
//    further calls after ";".
//  - mistral: [TOOL_CALLS] followed by a JSON array of {"name",
//    "arguments"} (tokenizers before v11), or by name[ARGS]{...} per call
//    (v11 and later; [CALL_ID]id between them where the model gives one).
//
// A call is told once it is complete (its JSON closed); its arguments are
// JSON text. Text that is not a call — before, between or after calls, a
// call whose JSON does not parse, a call cut off by max_tokens — is
// content, never dropped; only the whitespace between and after calls is
// (the text before the first call is kept as written, vLLM's).
#ifndef TESSERA_RUNTIME_SERVE_PARSERS_TOOL_PARSER_H_
#define TESSERA_RUNTIME_SERVE_PARSERS_TOOL_PARSER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace serve {

struct ToolCall {
  std::string id;  // Empty: the server makes one.
  std::string name;
  std::string arguments;  // JSON text.
};

struct ToolCallDelta {
  std::string content;
  std::vector<ToolCall> calls;
};

// Where a format's calls start in text told so far.
struct SectionFind {
  enum Kind {
    kNone,     // No calls start in the text: all of it is content.
    kPartial,  // The text ends with what may be a marker, from `begin`.
    kFound,    // A marker at `begin`; the calls are read from `calls_begin`.
  };
  Kind kind = kNone;
  size_t begin = 0;
  size_t calls_begin = 0;
};

// What reading a call section gives next.
struct CallStep {
  enum Kind {
    kMore,     // Needs more text.
    kCalls,    // `calls` read; text[0, end) used.
    kEnd,      // The section ends: text[0, end) used, the rest is content.
    kInvalid,  // Not a call: the section's unread text is content.
  };
  Kind kind = kMore;
  size_t end = 0;
  std::vector<ToolCall> calls;
};

class ToolCallFormat {
 public:
  virtual ~ToolCallFormat() = default;
  virtual absl::string_view name() const = 0;
  // Finds a call section in `text`, content not yet told (`at_output_start`:
  // nothing but whitespace came before it in the output).
  virtual SectionFind FindSection(absl::string_view text,
                                  bool at_output_start) const = 0;
  // Reads the next call(s) from the start of `text`, the section's unread
  // text (`final`: no more will come).
  virtual CallStep NextCalls(absl::string_view text, bool final) const = 0;
  // The format's markers are special tokens the detokenizer must keep.
  virtual bool needs_special_tokens() const { return false; }
};

// The format named `name`; InvalidArgument listing the known names.
absl::StatusOr<const ToolCallFormat*> FindToolCallFormat(
    absl::string_view name);
std::string ToolCallFormatNames();

// Splits an output as it streams. Bytes that may start a marker, and an
// open call, are held back until the text tells; the pieces joined equal
// ParseToolCalls of the whole text.
class ToolCallStream {
 public:
  explicit ToolCallStream(const ToolCallFormat& format) : format_(format) {}

  ToolCallDelta Feed(absl::string_view text);
  ToolCallDelta Finish();

 private:
  void Run(bool final, ToolCallDelta* out);

  const ToolCallFormat& format_;
  std::string pending_;  // Not yet told.
  bool at_output_start_ = true;
  bool in_section_ = false;
  // The last piece's size and whether it holds a byte that can close a
  // call: an open call is re-read only then (tool_parser.cc).
  size_t new_bytes_ = 0;
  bool may_close_ = false;
};

ToolCallDelta ParseToolCalls(const ToolCallFormat& format,
                             absl::string_view text);

// Helpers for the formats.

// A call from a parsed JSON object: "name" (a string) and the first of
// `argument_keys` present (an object, or a string holding JSON text, which
// is kept as it is); none: "{}". nullopt: not a call.
std::optional<ToolCall> ToolCallFromJson(
    const nlohmann::ordered_json& value,
    const std::vector<absl::string_view>& argument_keys);

// Parses text the scanner found complete (nesting checked first); a
// discarded value when it is not JSON.
nlohmann::ordered_json ParseCompleteJson(absl::string_view text);

// Arguments as JSON text: compact, UTF-8 kept, invalid bytes replaced.
std::string ToolArgumentsText(const nlohmann::ordered_json& arguments);

// Where `marker` first occurs in `text` or where a prefix of it ends the
// text (kPartial).
SectionFind FindMarker(absl::string_view text, absl::string_view marker);

size_t SkipJsonSpace(absl::string_view text, size_t pos);

// Per-format tables (one file each).
const ToolCallFormat& HermesToolCallFormat();
const ToolCallFormat& Llama3JsonToolCallFormat();
const ToolCallFormat& MistralToolCallFormat();

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_PARSERS_TOOL_PARSER_H_
