// hermes: Hermes 2 Pro, Qwen2.5 and Qwen3 tool calls —
//   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
// once per call, anywhere in the output (tool_parser.h).
#include "absl/strings/match.h"
#include "runtime/serve/parsers/json_scan.h"
#include "runtime/serve/parsers/tool_parser.h"

namespace tessera {
namespace serve {
namespace {

constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";

bool IsPrefixOf(absl::string_view text, absl::string_view tag) {
  return text.size() < tag.size() && tag.substr(0, text.size()) == text;
}

class HermesFormat final : public ToolCallFormat {
 public:
  absl::string_view name() const override { return "hermes"; }
  // Qwen's tokenizers mark <tool_call> special in some releases.
  bool needs_special_tokens() const override { return true; }

  SectionFind FindSection(absl::string_view text,
                          bool /*at_output_start*/) const override {
    return FindMarker(text, kOpen);
  }

  CallStep NextCalls(absl::string_view text, bool final) const override {
    CallStep step;
    const size_t pos = SkipJsonSpace(text, 0);
    const absl::string_view rest = text.substr(pos);
    if (!absl::StartsWith(rest, kOpen)) {
      if (!final && IsPrefixOf(rest, kOpen)) return step;  // kMore.
      step.kind = CallStep::kEnd;
      step.end = pos;
      return step;
    }
    const JsonScanResult scan = ScanJsonValue(text, pos + kOpen.size());
    // Where this call's text ends: through its close tag.
    auto through_close = [&](size_t from) -> CallStep {
      CallStep s;
      const size_t close = text.find(kClose, from);
      if (close != absl::string_view::npos) {
        s.kind = CallStep::kInvalid;
        s.end = close + kClose.size();
      } else if (final) {
        s.kind = CallStep::kInvalid;
        s.end = text.size();
      }
      return s;
    };
    if (scan.state == JsonScan::kIncomplete) {
      if (!final) return step;
      step.kind = CallStep::kInvalid;
      step.end = text.size();
      return step;
    }
    if (scan.state == JsonScan::kInvalid) return through_close(scan.begin);
    const size_t after = SkipJsonSpace(text, scan.end);
    const absl::string_view tail = text.substr(after);
    const bool closed = absl::StartsWith(tail, kClose);
    if (!closed && !(IsPrefixOf(tail, kClose) || tail.empty())) {
      return through_close(after);  // Text between the JSON and the tag.
    }
    if (!closed && !final) return step;  // The tag may be arriving.
    std::optional<ToolCall> call = ToolCallFromJson(
        ParseCompleteJson(text.substr(scan.begin, scan.end - scan.begin)),
        {"arguments", "parameters"});
    step.end = closed ? after + kClose.size() : text.size();
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

const ToolCallFormat& HermesToolCallFormat() {
  static const HermesFormat format;
  return format;
}

}  // namespace serve
}  // namespace tessera
