#include "runtime/text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/json_limits.h"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

constexpr char kPrefix[] = "chat template: ";

// Prefixes an error, keeping its code and payloads (IsTemplateException).
absl::Status WithPrefix(const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(kPrefix, status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) {
        out.SetPayload(url, payload);
      });
  return out;
}

// Not a plain open(): a FIFO named chat_template.jinja must be refused, not
// waited on.
absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path.string());
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPrefix, text.status().message()));
  }
  return text;
}

absl::StatusOr<nlohmann::ordered_json> ReadJson(
    const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPrefix, path.string(), ": ", e.what()));
  }
}

// A `chat_template` value: a string, or named templates of which transformers
// uses "default" when it is not told otherwise.
absl::StatusOr<std::string> TemplateFromValue(
    const nlohmann::ordered_json& value, const std::string& origin) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string names;
    for (const auto& entry : value) {
      if (!entry.is_object() || !entry.contains("name") ||
          !entry.contains("template") || !entry["name"].is_string() ||
          !entry["template"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            kPrefix, origin,
            ": chat_template list entries need string \"name\" and "
            "\"template\""));
      }
      const std::string name = entry["name"].get<std::string>();
      if (name == "default") return entry["template"].get<std::string>();
      absl::StrAppend(&names, names.empty() ? "" : ", ", name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        kPrefix, origin,
        ": several chat templates and none named \"default\" (", names, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kPrefix, origin, ": chat_template must be a string or a list"));
}

}  // namespace

SpecialTokens SpecialTokensFromConfig(const nlohmann::ordered_json& config) {
  SpecialTokens tokens;
  if (!config.is_object()) return tokens;
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token",
                           "pad_token", "cls_token", "mask_token"}) {
    auto it = config.find(name);
    if (it == config.end()) continue;
    if (it->is_string()) {
      tokens[name] = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") &&
               (*it)["content"].is_string()) {
      tokens[name] = (*it)["content"].get<std::string>();
    }
  }
  return tokens;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(
    const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(config, ReadJson(config_path));
  }
  SpecialTokens tokens = SpecialTokensFromConfig(config);

  // transformers reads chat_template.jinja last, so it wins over the config.
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    ASSIGN_OR_RETURN(std::string source, ReadFile(jinja_path));
    return FromString(std::move(source), std::move(tokens));
  }
  if (config.is_object() && config.contains("chat_template") &&
      !config["chat_template"].is_null()) {
    ASSIGN_OR_RETURN(
        std::string source,
        TemplateFromValue(config["chat_template"], config_path.string()));
    return FromString(std::move(source), std::move(tokens));
  }
  const std::filesystem::path json_path = dir / "chat_template.json";
  if (std::filesystem::exists(json_path, ec)) {
    ASSIGN_OR_RETURN(nlohmann::ordered_json doc, ReadJson(json_path));
    if (doc.is_object() && doc.contains("chat_template")) {
      ASSIGN_OR_RETURN(
          std::string source,
          TemplateFromValue(doc["chat_template"], json_path.string()));
      return FromString(std::move(source), std::move(tokens));
    }
  }
  return absl::NotFoundError(
      absl::StrCat(kPrefix, "no chat template in ", model_dir,
                   " (looked for chat_template.jinja, tokenizer_config.json's "
                   "chat_template, chat_template.json)"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromString(std::string source,
                                                      SpecialTokens tokens) {
  absl::StatusOr<jinja::Template> compiled = jinja::Template::Parse(source);
  if (!compiled.ok()) return WithPrefix(compiled.status());
  return ChatTemplate(std::move(source), std::move(tokens),
                      std::move(*compiled));
}

absl::StatusOr<std::string> ChatTemplate::Render(
    const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const nlohmann::ordered_json& extra_context,
    const jinja::RenderOptions& options) const {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPrefix, "messages must be a JSON array"));
  }
  if (!extra_context.is_null() && !extra_context.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPrefix, "extra context must be a JSON object"));
  }
  // Checked before anything is copied: copying a JSON value recurses once per
  // level, as does the conversion to template values (which checks again).
  if (absl::Status deep = jinja::CheckJsonDepth(messages, kMaxJsonDepth);
      !deep.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPrefix, "messages: ", deep.message()));
  }
  if (absl::Status deep = jinja::CheckJsonDepth(extra_context, kMaxJsonDepth);
      !deep.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPrefix, "extra context: ", deep.message()));
  }
  // The variables transformers passes: special tokens, then messages, tools,
  // documents and add_generation_prompt, then the caller's keyword arguments
  // (which override special tokens).
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const auto& [name, text] : tokens_) vars[name] = text;
  vars["messages"] = messages;
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (extra_context.is_object()) {
    for (const auto& [name, value] : extra_context.items()) {
      if (name == "messages" || name == "add_generation_prompt") {
        return absl::InvalidArgumentError(
            absl::StrCat(kPrefix, "\"", name,
                         "\" is an argument of Render, not an extra variable"));
      }
      vars[name] = value;
    }
  }
  absl::StatusOr<std::string> text = compiled_.Render(vars, options);
  if (!text.ok()) return WithPrefix(text.status());
  return text;
}

}  // namespace tessera
