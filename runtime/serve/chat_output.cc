#include "runtime/serve/chat_output.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/json_limits.h"
#include "runtime/serve/parsers/json_scan.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kToolCallIdPrefix = "chatcmpl-tool-";

size_t SkipSpace(absl::string_view text, size_t pos) {
  while (pos < text.size() && absl::ascii_isspace(text[pos])) ++pos;
  return pos;
}

}  // namespace

void MergeChatOutput(ChatOutputDelta next, ChatOutputDelta* into) {
  into->content += next.content;
  if (next.reasoning.has_value()) {
    into->reasoning = into->reasoning.value_or("") + *next.reasoning;
  }
  for (ToolCallItem& call : next.tool_calls) {
    if (!call.id.has_value() && !into->tool_calls.empty() &&
        into->tool_calls.back().index == call.index) {
      into->tool_calls.back().arguments += call.arguments;
    } else {
      into->tool_calls.push_back(std::move(call));
    }
  }
}

ChatOutput::ChatOutput(const ChatOutputFormats& formats,
                       const CompletionRequest& request,
                       absl::string_view prompt)
    : mode_(request.tool_choice),
      tool_name_(request.tool_name),
      parallel_tool_calls_(request.parallel_tool_calls),
      include_reasoning_(request.include_reasoning) {
  if (mode_ == ToolChoice::kAuto && formats.tool_calls == nullptr) {
    mode_ = ToolChoice::kNone;  // The protocol layer allows auto only with one.
  }
  if (formats.reasoning != nullptr) {
    if (request.grammar.empty()) {
      reasoning_ =
          std::make_unique<ReasoningStream>(*formats.reasoning, prompt);
    } else {
      // The grammar holds from the first token: reasoning only where the
      // text itself opens it (a grammar that writes the tags).
      constrained_format_ = *formats.reasoning;
      constrained_format_.starts_in_reasoning = false;
      reasoning_ = std::make_unique<ReasoningStream>(constrained_format_, "");
    }
  }
  if (mode_ == ToolChoice::kAuto) {
    tool_stream_ = std::make_unique<ToolCallStream>(*formats.tool_calls);
  }
}

ChatOutput::~ChatOutput() = default;

bool ChatOutput::finish_as_tool_calls() const {
  return calls_ > 0 &&
         (mode_ == ToolChoice::kAuto || mode_ == ToolChoice::kRequired);
}

void ChatOutput::AddCall(ToolCall call, ChatOutputDelta* out) {
  if (!parallel_tool_calls_ && calls_ > 0) return;  // Only the first counts.
  ToolCallItem item;
  item.index = calls_++;
  item.id = call.id.empty() ? RandomResponseId(kToolCallIdPrefix)
                            : std::move(call.id);
  item.name = std::move(call.name);
  item.arguments = std::move(call.arguments);
  out->tool_calls.push_back(std::move(item));
}

// The array's elements, each {"name", "parameters"}, as they close. The
// grammar made the text; the checks only guard against a cut.
void ChatOutput::RequiredCalls(bool final, ChatOutputDelta* out) {
  absl::string_view text = required_text_;
  while (!required_closed_) {
    size_t pos = SkipSpace(text, required_pos_);
    if (pos >= text.size()) break;
    if (!required_open_) {
      if (text[pos] != '[') break;
      required_open_ = true;
      required_pos_ = pos + 1;
      continue;
    }
    if (text[pos] == ',') {
      required_pos_ = pos + 1;
      continue;
    }
    if (text[pos] == ']') {
      required_closed_ = true;
      required_pos_ = pos + 1;
      break;
    }
    const JsonScanResult scan = ScanJsonValue(text, pos);
    if (scan.state != JsonScan::kComplete) break;
    const absl::string_view element =
        text.substr(scan.begin, scan.end - scan.begin);
    Json value;
    if (CheckJsonNesting(element).ok()) {
      value = Json::parse(element, nullptr, /*allow_exceptions=*/false);
    }
    const Json* name = nullptr;
    if (value.is_object()) {
      auto it = value.find("name");
      if (it != value.end() && it->is_string()) name = &*it;
    }
    if (name == nullptr) break;  // Not a call: left for the content below.
    ToolCall call;
    call.name = name->get<std::string>();
    auto parameters = value.find("parameters");
    call.arguments =
        parameters == value.end()
            ? "{}"
            : parameters->dump(-1, ' ', false, Json::error_handler_t::replace);
    AddCall(std::move(call), out);
    required_pos_ = scan.end;
  }
  if (final) {
    // What the array does not account for is told as content.
    const size_t rest = SkipSpace(text, required_pos_);
    if (rest < text.size()) out->content += std::string(text.substr(rest));
    required_pos_ = text.size();
  }
}

void ChatOutput::Content(absl::string_view text, bool final,
                         ChatOutputDelta* out) {
  switch (mode_) {
    case ToolChoice::kNone:
      absl::StrAppend(&out->content, text);
      return;
    case ToolChoice::kAuto: {
      ToolCallDelta delta = tool_stream_->Feed(text);
      if (final) {
        ToolCallDelta last = tool_stream_->Finish();
        delta.content += last.content;
        for (ToolCall& call : last.calls)
          delta.calls.push_back(std::move(call));
      }
      out->content += delta.content;
      for (ToolCall& call : delta.calls) AddCall(std::move(call), out);
      return;
    }
    case ToolChoice::kNamed: {
      if (text.empty() && !(final && !named_id_.has_value())) return;
      ToolCallItem item;
      item.index = 0;
      if (!named_id_.has_value()) {
        named_id_ = RandomResponseId(kToolCallIdPrefix);
        item.id = named_id_;
        item.name = tool_name_;
        ++calls_;
      }
      item.arguments = std::string(text);
      out->tool_calls.push_back(std::move(item));
      return;
    }
    case ToolChoice::kRequired:
      required_text_.append(text.data(), text.size());
      // An element can only close on a '}' or ']' (the array too): other
      // pieces would re-read the open element for nothing.
      if (final || text.find_first_of("}]") != absl::string_view::npos) {
        RequiredCalls(final, out);
      }
      return;
  }
}

ChatOutputDelta ChatOutput::Feed(absl::string_view text) {
  ChatOutputDelta out;
  if (reasoning_ == nullptr) {
    Content(text, /*final=*/false, &out);
    return out;
  }
  ReasoningDelta split = reasoning_->Feed(text);
  if (include_reasoning_ && !split.reasoning.empty()) {
    out.reasoning = std::move(split.reasoning);
  }
  Content(split.content, /*final=*/false, &out);
  return out;
}

ChatOutputDelta ChatOutput::Finish() {
  ChatOutputDelta out;
  std::string rest;
  if (reasoning_ != nullptr) {
    ReasoningDelta split = reasoning_->Finish();
    if (include_reasoning_ && !split.reasoning.empty()) {
      out.reasoning = std::move(split.reasoning);
    }
    rest = std::move(split.content);
  }
  Content(rest, /*final=*/true, &out);
  return out;
}

ChatOutputDelta ChatOutput::All(absl::string_view text) {
  ChatOutputDelta out = Feed(text);
  MergeChatOutput(Finish(), &out);
  return out;
}

}  // namespace serve
}  // namespace tessera
