// ChatOutput: what one chat choice's generated text says, as the reply
// tells it — content, reasoning_content (a --reasoning-parser) and tool
// calls (tool_choice "auto" through a --tool-call-parser, "required" and a
// named function through the structured-output engine) — streamed or not.
//
//   ChatOutput out(formats, request, rendered_prompt);
//   for each decoded piece: ChatOutputDelta d = out.Feed(piece); ... send d
//   ChatOutputDelta last = out.Finish();
//   finish_reason "tool_calls" when out.finish_as_tool_calls() and the
//   engine stopped.
//
// How each tool_choice reads the text (vLLM's behaviour):
//  - none (or no tools): reasoning split off when there is a reasoning
//    format, the rest content;
//  - auto: reasoning split off, then the rest through the tool-call format
//    (parsers/tool_parser.h): content before the calls, complete calls as
//    they close; with parallel_tool_calls false only the first call is
//    kept;
//  - named: the whole text is the arguments of one call of that function,
//    streamed as argument pieces (finish_reason stays "stop", as OpenAI's
//    forced calls);
//  - required: the text is the JSON array tool_choice.h's schema forces;
//    each element becomes a call when it closes. Text the array does not
//    account for (an output cut by max_tokens) is content, never dropped.
// A constrained output (request.grammar set: structured output, required,
// named) has reasoning only where its text opens it with the start tag: the
// grammar holds from the first token (vLLM instead lets the model reason
// before the grammar starts; Tessera does not yet), so a prompt that opens
// a reasoning block, or DeepSeek-R1's implied one, does not make the
// constrained text reasoning.
#ifndef TESSERA_RUNTIME_SERVE_CHAT_OUTPUT_H_
#define TESSERA_RUNTIME_SERVE_CHAT_OUTPUT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "runtime/serve/openai_protocol.h"
#include "runtime/serve/parsers/reasoning_parser.h"
#include "runtime/serve/parsers/tool_parser.h"

namespace tessera {
namespace serve {

// The server's parsers (--reasoning-parser, --tool-call-parser); null: none.
struct ChatOutputFormats {
  const ReasoningFormat* reasoning = nullptr;
  const ToolCallFormat* tool_calls = nullptr;
};

struct ChatOutputDelta {
  std::string content;
  // Set when this piece carries reasoning (with include_reasoning false,
  // never).
  std::optional<std::string> reasoning;
  std::vector<ToolCallItem> tool_calls;
};

// Adds `next` to `into`: texts appended, a call's later argument pieces
// joined to it (the whole reply of a non-streamed choice).
void MergeChatOutput(ChatOutputDelta next, ChatOutputDelta* into);

class ChatOutput {
 public:
  // `prompt`: the rendered prompt (whether it opens a reasoning block).
  ChatOutput(const ChatOutputFormats& formats, const CompletionRequest& request,
             absl::string_view prompt);
  ~ChatOutput();
  ChatOutput(const ChatOutput&) = delete;
  ChatOutput& operator=(const ChatOutput&) = delete;

  ChatOutputDelta Feed(absl::string_view text);
  ChatOutputDelta Finish();
  // Feed(text) and Finish() merged: a whole, non-streamed output.
  ChatOutputDelta All(absl::string_view text);

  // The choice called tools (auto with a call, required): its
  // finish_reason is "tool_calls" where the engine says "stop".
  bool finish_as_tool_calls() const;

 private:
  // Text after reasoning, through the tool-call mode.
  void Content(absl::string_view text, bool final, ChatOutputDelta* out);
  void AddCall(ToolCall call, ChatOutputDelta* out);
  void RequiredCalls(bool final, ChatOutputDelta* out);

  ToolChoice mode_;
  std::string tool_name_;
  bool parallel_tool_calls_;
  bool include_reasoning_;
  ReasoningFormat constrained_format_;  // Outlives reasoning_.
  std::unique_ptr<ReasoningStream> reasoning_;
  std::unique_ptr<ToolCallStream> tool_stream_;
  int calls_ = 0;
  // named: the call's id once its first piece went out.
  std::optional<std::string> named_id_;
  // required: the text so far and how far it has been read.
  std::string required_text_;
  size_t required_pos_ = 0;
  bool required_open_ = false;  // Past the array's "[".
  bool required_closed_ = false;
};

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_CHAT_OUTPUT_H_
