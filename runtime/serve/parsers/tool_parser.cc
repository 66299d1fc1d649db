#include "runtime/serve/parsers/tool_parser.h"

#include <array>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/core/json_limits.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

struct Registration {
  absl::string_view name;
  const ToolCallFormat& (*format)();
};

// One line per format.
constexpr std::array<Registration, 3> kFormats = {{
    {"hermes", &HermesToolCallFormat},
    {"llama3_json", &Llama3JsonToolCallFormat},
    {"mistral", &MistralToolCallFormat},
}};

// An open call is re-read only when a piece may have closed it (a byte
// that ends JSON or a tag) or while its unread text is short (the section
// may be ending): the work per piece stays small for calls of any length
// instead of re-reading the whole open call each time.
constexpr size_t kCheapRereadBytes = 64;

}  // namespace

absl::StatusOr<const ToolCallFormat*> FindToolCallFormat(
    absl::string_view name) {
  for (const Registration& r : kFormats) {
    if (r.name == name) return &r.format();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool call parser \"", name,
                   "\" (known: ", ToolCallFormatNames(), ")"));
}

std::string ToolCallFormatNames() {
  return absl::StrJoin(kFormats, ", ",
                       [](std::string* out, const Registration& r) {
                         out->append(r.name.data(), r.name.size());
                       });
}

size_t SkipJsonSpace(absl::string_view text, size_t pos) {
  while (pos < text.size() && absl::ascii_isspace(text[pos])) ++pos;
  return pos;
}

SectionFind FindMarker(absl::string_view text, absl::string_view marker) {
  SectionFind find;
  const size_t at = text.find(marker);
  if (at != absl::string_view::npos) {
    find.kind = SectionFind::kFound;
    find.begin = at;
    find.calls_begin = at;
    return find;
  }
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) {
      find.kind = SectionFind::kPartial;
      find.begin = text.size() - n;
      return find;
    }
  }
  return find;
}

Json ParseCompleteJson(absl::string_view text) {
  if (!CheckJsonNesting(text).ok()) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string ToolArgumentsText(const Json& arguments) {
  return arguments.dump(-1, ' ', /*ensure_ascii=*/false,
                        Json::error_handler_t::replace);
}

std::optional<ToolCall> ToolCallFromJson(
    const Json& value, const std::vector<absl::string_view>& argument_keys) {
  if (!value.is_object()) return std::nullopt;
  auto name = value.find("name");
  if (name == value.end() || !name->is_string()) return std::nullopt;
  ToolCall call;
  call.name = name->get<std::string>();
  if (call.name.empty()) return std::nullopt;
  call.arguments = "{}";
  for (absl::string_view key : argument_keys) {
    auto it = value.find(std::string(key));
    if (it == value.end()) continue;
    call.arguments =
        it->is_string() ? it->get<std::string>() : ToolArgumentsText(*it);
    break;
  }
  return call;
}

ToolCallDelta ToolCallStream::Feed(absl::string_view text) {
  ToolCallDelta out;
  pending_.append(text.data(), text.size());
  new_bytes_ = text.size();
  may_close_ = text.find_first_of("}]>") != absl::string_view::npos;
  Run(/*final=*/false, &out);
  return out;
}

ToolCallDelta ToolCallStream::Finish() {
  ToolCallDelta out;
  new_bytes_ = 0;
  Run(/*final=*/true, &out);
  return out;
}

void ToolCallStream::Run(bool final, ToolCallDelta* out) {
  const absl::string_view text = pending_;
  size_t pos = 0;
  bool progressed = false;  // A step this run used text: read on.
  while (pos < text.size()) {
    const absl::string_view unread = text.substr(pos);
    if (!in_section_) {
      const SectionFind find = format_.FindSection(unread, at_output_start_);
      // Content up to a marker, holding back what may be one.
      size_t told = unread.size();
      if (find.kind == SectionFind::kFound ||
          (find.kind == SectionFind::kPartial && !final)) {
        told = find.begin;
      }
      const absl::string_view content = unread.substr(0, told);
      absl::StrAppend(&out->content, content);
      if (SkipJsonSpace(content, 0) < content.size()) {
        at_output_start_ = false;
      }
      if (find.kind != SectionFind::kFound) {
        pos += told;
        break;
      }
      pos += find.calls_begin;
      in_section_ = true;
      progressed = true;
      continue;
    }
    const size_t old_bytes =
        unread.size() - std::min(unread.size(), new_bytes_);
    if (!final && !progressed && !may_close_ &&
        old_bytes >= kCheapRereadBytes) {
      break;  // Nothing arrived that could end the open call.
    }
    CallStep step = format_.NextCalls(unread, final);
    if (step.kind == CallStep::kMore && final) {
      step.kind = CallStep::kInvalid;  // Cut off: what is there is content.
      step.end = unread.size();
    }
    if (step.kind == CallStep::kMore) break;
    progressed = true;
    switch (step.kind) {
      case CallStep::kCalls:
        for (ToolCall& call : step.calls) out->calls.push_back(std::move(call));
        at_output_start_ = false;
        pos += step.end;
        break;
      case CallStep::kInvalid:
        absl::StrAppend(&out->content, unread.substr(0, step.end));
        at_output_start_ = false;
        in_section_ = false;
        pos += step.end;
        break;
      case CallStep::kEnd:
        in_section_ = false;
        at_output_start_ = false;
        pos += step.end;
        break;
      case CallStep::kMore:
        break;
    }
  }
  pending_.erase(0, pos);
}

ToolCallDelta ParseToolCalls(const ToolCallFormat& format,
                             absl::string_view text) {
  ToolCallStream stream(format);
  ToolCallDelta out = stream.Feed(text);
  ToolCallDelta last = stream.Finish();
  out.content += last.content;
  for (ToolCall& call : last.calls) out.calls.push_back(std::move(call));
  return out;
}

}  // namespace serve
}  // namespace tessera
