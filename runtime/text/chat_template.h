// Chat templates: a conversation (a list of messages) to the prompt text a
// model was trained on, exactly as Hugging Face transformers'
// `tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=...)` produces it.
//
// Messages, tools and extra variables are JSON (nlohmann::ordered_json) so
// that any field a template reads (tool_calls, reasoning_content, ...) passes
// through untouched, in its original key order (which `tojson` preserves).
//
//   ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::FromTokenizerConfig(dir));
//   ASSIGN_OR_RETURN(std::string prompt,
//                    t.Render(messages, /*add_generation_prompt=*/true));
#ifndef TESSERA_RUNTIME_TEXT_CHAT_TEMPLATE_H_
#define TESSERA_RUNTIME_TEXT_CHAT_TEMPLATE_H_

#include <map>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "runtime/text/jinja.h"

namespace tessera {

// The tokenizer's named special tokens as templates see them:
// "bos_token" -> "<s>", "eos_token" -> "</s>", ... A name that is absent is
// undefined in the template, as transformers leaves out tokens that are None.
using SpecialTokens = std::map<std::string, std::string>;

// bos/eos/unk/sep/pad/cls/mask_token of a parsed tokenizer_config.json; each
// may be a string or an AddedToken object ({"content": "<s>", ...}).
SpecialTokens SpecialTokensFromConfig(const nlohmann::ordered_json& config);

class ChatTemplate {
 public:
  // The chat template of a model folder, looked up as transformers does:
  // `chat_template.jinja` if present, else tokenizer_config.json's
  // `chat_template` (a string, or a list of {"name", "template"} of which
  // "default" is used), else `chat_template.json` ({"chat_template": ...}).
  // Special tokens come from tokenizer_config.json. NotFound when the folder
  // has no chat template; InvalidArgument for unreadable files or a template
  // that does not parse.
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(
      const std::string& model_dir);

  // A template from its source text.
  static absl::StatusOr<ChatTemplate> FromString(std::string source,
                                                 SpecialTokens tokens);

  // Renders `messages` (a JSON array of message objects). `extra_context`
  // (a JSON object, or null) adds template variables: `tools` and
  // `documents` (None when not given, as in transformers), and any others a
  // template reads (enable_thinking, date_string, ...); they override special
  // tokens of the same name.
  //
  // Errors start with "chat template: ". A template's raise_exception("msg")
  // gives InvalidArgument "chat template: msg" for which
  // jinja::IsTemplateException() is true; features outside the supported
  // Jinja subset give Unimplemented naming them (see jinja.h).
  absl::StatusOr<std::string> Render(
      const nlohmann::ordered_json& messages, bool add_generation_prompt,
      const nlohmann::ordered_json& extra_context = nullptr,
      const jinja::RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }
  const SpecialTokens& special_tokens() const { return tokens_; }

 private:
  ChatTemplate(std::string source, SpecialTokens tokens,
               jinja::Template compiled)
      : source_(std::move(source)),
        tokens_(std::move(tokens)),
        compiled_(std::move(compiled)) {}

  std::string source_;
  SpecialTokens tokens_;
  jinja::Template compiled_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_CHAT_TEMPLATE_H_
