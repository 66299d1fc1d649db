// llama3_json: Llama 3.1-3.3 JSON tool calls. The output opens (after an
// optional <|python_tag|>) with {"name": "f", "parameters": {...}}; more
// calls follow after ";". An output that opens otherwise has no calls
// (tool_parser.h).
#include "absl/strings/match.h"
#include "runtime/serve/parsers/json_scan.h"
#include "runtime/serve/parsers/tool_parser.h"

namespace tessera {
namespace serve {
namespace {

constexpr absl::string_view kPythonTag = "<|python_tag|>";

class Llama3JsonFormat final : public ToolCallFormat {
 public:
  absl::string_view name() const override { return "llama3_json"; }

  SectionFind FindSection(absl::string_view text,
                          bool at_output_start) const override {
    SectionFind find;
    if (!at_output_start) return find;
    const size_t pos = SkipJsonSpace(text, 0);
    const absl::string_view rest = text.substr(pos);
    if (absl::StartsWith(rest, kPythonTag) || absl::StartsWith(rest, "{")) {
      // The leading whitespace goes with the calls (dropped if they are).
      find.kind = SectionFind::kFound;
    } else if (kPythonTag.substr(0, rest.size()) == rest) {
      find.kind = SectionFind::kPartial;  // Whitespace or a tag's start.
    }
    return find;
  }

  CallStep NextCalls(absl::string_view text, bool final) const override {
    CallStep step;
    size_t pos = SkipJsonSpace(text, 0);
    const size_t start = pos;
    absl::string_view rest = text.substr(pos);
    if (absl::StartsWith(rest, kPythonTag)) {
      pos = SkipJsonSpace(text, pos + kPythonTag.size());
    } else if (!final && !rest.empty() &&
               kPythonTag.substr(0, rest.size()) == rest) {
      return step;  // kMore.
    }
    if (pos < text.size() && text[pos] == ';') {
      pos = SkipJsonSpace(text, pos + 1);
    }
    if (pos >= text.size()) {
      if (final) {
        step.kind = CallStep::kEnd;
        step.end = start;
      }
      return step;
    }
    if (text[pos] != '{') {
      step.kind = CallStep::kEnd;
      step.end = start;
      return step;
    }
    const JsonScanResult scan = ScanJsonValue(text, pos);
    if (scan.state == JsonScan::kIncomplete && !final) return step;
    step.end = scan.state == JsonScan::kComplete ? scan.end : text.size();
    std::optional<ToolCall> call;
    if (scan.state == JsonScan::kComplete) {
      call = ToolCallFromJson(
          ParseCompleteJson(text.substr(scan.begin, scan.end - scan.begin)),
          {"parameters", "arguments"});
    }
    if (!call.has_value()) {
      step.kind = CallStep::kInvalid;
      return step;
    }
    step.kind = CallStep::kCalls;
    step.calls.push_back(std::move(*call));
    return step;
  }
};

}  // namespace

const ToolCallFormat& Llama3JsonToolCallFormat() {
  static const Llama3JsonFormat format;
  return format;
}

}  // namespace serve
}  // namespace tessera
