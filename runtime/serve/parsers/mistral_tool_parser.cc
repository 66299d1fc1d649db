// mistral: [TOOL_CALLS] then either a JSON array of {"name", "arguments"}
// (tokenizers before v11) or name[ARGS]{...} per call, with
// [CALL_ID]id between name and [ARGS] where the model writes one (v11 and
// later). Mistral's chat template wants 9-character alphanumeric call ids
// when the calls come back in the next turn, so the parser makes those
// (vLLM's) rather than the server's longer ones (tool_parser.h).
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "runtime/serve/parsers/json_scan.h"
#include "runtime/serve/parsers/tool_parser.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kMarker = "[TOOL_CALLS]";
constexpr absl::string_view kArgs = "[ARGS]";
constexpr absl::string_view kCallId = "[CALL_ID]";
// A function name or call id longer than this is not one.
constexpr size_t kMaxNameBytes = 256;

std::string MistralCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(9, 'a');
  for (char& c : id) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

bool IsNameByte(char c) {
  return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.';
}

class MistralFormat final : public ToolCallFormat {
 public:
  absl::string_view name() const override { return "mistral"; }
  // [TOOL_CALLS], [ARGS] and [CALL_ID] are control tokens.
  bool needs_special_tokens() const override { return true; }

  SectionFind FindSection(absl::string_view text,
                          bool /*at_output_start*/) const override {
    return FindMarker(text, kMarker);
  }

  CallStep NextCalls(absl::string_view text, bool final) const override {
    CallStep step;
    const size_t start = SkipJsonSpace(text, 0);
    const absl::string_view rest = text.substr(start);
    if (!absl::StartsWith(rest, kMarker)) {
      if (!final && kMarker.substr(0, rest.size()) == rest) return step;
      step.kind = CallStep::kEnd;
      step.end = start;
      return step;
    }
    const size_t pos = SkipJsonSpace(text, start + kMarker.size());
    if (pos >= text.size()) return Cut(text, final);
    if (text[pos] == '[' || text[pos] == '{')
      return JsonCalls(text, pos, final);
    return NamedCall(text, pos, final);
  }

 private:
  static CallStep Cut(absl::string_view text, bool final) {
    CallStep step;
    if (final) {
      step.kind = CallStep::kInvalid;
      step.end = text.size();
    }
    return step;
  }

  static CallStep Invalid(size_t end) {
    CallStep step;
    step.kind = CallStep::kInvalid;
    step.end = end;
    return step;
  }

  // A section that is not a call is content up to the next marker, so
  // where it ends does not depend on how the text was cut.
  static CallStep NotACall(absl::string_view text, bool final) {
    const size_t start = SkipJsonSpace(text, 0) + kMarker.size();
    const SectionFind next = FindMarker(text.substr(start), kMarker);
    if (next.kind == SectionFind::kFound) return Invalid(start + next.begin);
    return Cut(text, final);
  }

  static std::optional<ToolCall> Call(const Json& value) {
    std::optional<ToolCall> call = ToolCallFromJson(value, {"arguments"});
    if (!call.has_value()) return call;
    auto id = value.find("id");
    if (id != value.end() && id->is_string() &&
        !id->get_ref<const std::string&>().empty() &&
        id->get_ref<const std::string&>().size() <= kMaxNameBytes) {
      call->id = id->get<std::string>();
    } else {
      call->id = MistralCallId();
    }
    return call;
  }

  // [{"name", "arguments"}, ...] or one such object.
  static CallStep JsonCalls(absl::string_view text, size_t pos, bool final) {
    const JsonScanResult scan = ScanJsonValue(text, pos);
    if (scan.state == JsonScan::kIncomplete) return Cut(text, final);
    if (scan.state == JsonScan::kInvalid) return NotACall(text, final);
    const Json value =
        ParseCompleteJson(text.substr(scan.begin, scan.end - scan.begin));
    CallStep step;
    step.end = scan.end;
    if (value.is_array() && !value.empty()) {
      for (const Json& element : value) {
        std::optional<ToolCall> call = Call(element);
        if (!call.has_value()) return Invalid(scan.end);
        step.calls.push_back(std::move(*call));
      }
    } else {
      std::optional<ToolCall> call = Call(value);
      if (!call.has_value()) return Invalid(scan.end);
      step.calls.push_back(std::move(*call));
    }
    step.kind = CallStep::kCalls;
    return step;
  }

  // name[ARGS]{...} or name[CALL_ID]id[ARGS]{...}.
  static CallStep NamedCall(absl::string_view text, size_t pos, bool final) {
    size_t end = pos;
    while (end < text.size() && IsNameByte(text[end]) &&
           end - pos <= kMaxNameBytes) {
      ++end;
    }
    if (end - pos > kMaxNameBytes || end == pos) return NotACall(text, final);
    if (end == text.size()) return Cut(text, final);
    ToolCall call;
    call.name = std::string(text.substr(pos, end - pos));
    absl::string_view rest = text.substr(end);
    if (absl::StartsWith(rest, kCallId)) {
      size_t id_begin = end + kCallId.size();
      size_t id_end = id_begin;
      while (id_end < text.size() && IsNameByte(text[id_end]) &&
             id_end - id_begin <= kMaxNameBytes) {
        ++id_end;
      }
      if (id_end - id_begin > kMaxNameBytes) return NotACall(text, final);
      if (id_end == text.size()) return Cut(text, final);
      call.id = std::string(text.substr(id_begin, id_end - id_begin));
      end = id_end;
      rest = text.substr(end);
    } else if (kCallId.substr(0, rest.size()) == rest) {
      return Cut(text, final);
    }
    if (!absl::StartsWith(rest, kArgs)) {
      if (kArgs.substr(0, rest.size()) == rest) return Cut(text, final);
      return NotACall(text, final);
    }
    const JsonScanResult scan = ScanJsonValue(text, end + kArgs.size());
    if (scan.state == JsonScan::kIncomplete) return Cut(text, final);
    if (scan.state == JsonScan::kInvalid) return NotACall(text, final);
    const Json arguments =
        ParseCompleteJson(text.substr(scan.begin, scan.end - scan.begin));
    if (!arguments.is_object()) return Invalid(scan.end);
    call.arguments = ToolArgumentsText(arguments);
    if (call.id.empty()) call.id = MistralCallId();
    CallStep step;
    step.kind = CallStep::kCalls;
    step.end = scan.end;
    step.calls.push_back(std::move(call));
    return step;
  }
};

}  // namespace

const ToolCallFormat& MistralToolCallFormat() {
  static const MistralFormat format;
  return format;
}

}  // namespace serve
}  // namespace tessera
