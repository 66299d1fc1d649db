// Tests of ChatTemplate on real Hugging Face chat templates
// (tests/fixtures/chat_templates, sources in its README.md).
//
// The spot checks below are the exact text transformers' apply_chat_template
// produces for these templates (rendered with jinja2 in transformers'
// environment when the tests were written). GoldensMatchTransformers compares
// every case of goldens.json, written by tools/make_chat_template_goldens.py.
#include "runtime/text/chat_template.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/text/jinja.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

using ::nlohmann::ordered_json;

std::string TemplatesDir() { return FixturesDir() + "/chat_templates"; }

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

ChatTemplate LoadFixture(const std::string& name, SpecialTokens tokens) {
  const std::string path = TemplatesDir() + "/" + name + ".jinja";
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromString(ReadText(path), std::move(tokens));
  EXPECT_TRUE(t.ok()) << path << ": " << t.status();
  return *std::move(t);
}

const SpecialTokens& Llama3Tokens() {
  static const auto* const kTokens = new SpecialTokens{
      {"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  return *kTokens;
}

const SpecialTokens& SentencePieceTokens() {
  static const auto* const kTokens = new SpecialTokens{
      {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
  return *kTokens;
}

const SpecialTokens& Qwen3Tokens() {
  static const auto* const kTokens = new SpecialTokens{
      {"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
  return *kTokens;
}

ordered_json SystemUserAssistantUser() {
  return ordered_json::parse(R"json([
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi there. How can I help?"},
    {"role": "user", "content": "Tell me a joke."}
  ])json");
}

std::string RenderOrError(const ChatTemplate& t, const ordered_json& messages,
                          bool add_generation_prompt,
                          const ordered_json& extra = nullptr) {
  absl::StatusOr<std::string> out =
      t.Render(messages, add_generation_prompt, extra);
  if (!out.ok()) return absl::StrCat("ERROR: ", out.status().ToString());
  return *out;
}

TEST(ChatTemplateTest, EveryFixtureRendersAConversation) {
  struct Fixture {
    const char* name;
    const SpecialTokens* tokens;
  };
  const Fixture fixtures[] = {
      {"qwen3", &Qwen3Tokens()},
      {"llama3", &Llama3Tokens()},
      {"llama3.2", &Llama3Tokens()},
      {"mistral", &SentencePieceTokens()},
      {"mistral-v0.2", &SentencePieceTokens()},
      {"llama2", &SentencePieceTokens()},
  };
  const ordered_json extra = {{"date_string", "26 Jul 2024"}};
  for (const Fixture& f : fixtures) {
    const ChatTemplate t = LoadFixture(f.name, *f.tokens);
    for (bool add_generation_prompt : {false, true}) {
      absl::StatusOr<std::string> out =
          t.Render(SystemUserAssistantUser(), add_generation_prompt, extra);
      ASSERT_TRUE(out.ok()) << f.name << ": " << out.status();
      EXPECT_TRUE(absl::StrContains(*out, "Tell me a joke.")) << f.name;
    }
  }
}

TEST(ChatTemplateTest, Qwen3) {
  const ChatTemplate t = LoadFixture("qwen3", Qwen3Tokens());
  const ordered_json hi =
      ordered_json::parse(R"json([{"role": "user", "content": "Hi"}])json");
  EXPECT_EQ(RenderOrError(t, hi, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderOrError(t, hi, false), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(RenderOrError(t, hi, true, {{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
  EXPECT_EQ(RenderOrError(t, SystemUserAssistantUser(), false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello!<|im_end|>\n"
            "<|im_start|>assistant\nHi there. How can I help?<|im_end|>\n"
            "<|im_start|>user\nTell me a joke.<|im_end|>\n");
  // Reasoning of the turn after the last user message is shown; earlier
  // turns lose theirs.
  EXPECT_EQ(RenderOrError(t, ordered_json::parse(R"json([
              {"role": "user", "content": "Hi"},
              {"role": "assistant",
               "content": "<think>\nThe user greets me.\n</think>\n\nHello!"}
            ])json"),
                          false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\nThe user greets me.\n</think>\n\nHello!<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen3Tools) {
  const ChatTemplate t = LoadFixture("qwen3", Qwen3Tokens());
  const ordered_json extra = ordered_json::parse(R"json({"tools": [
    {"type": "function", "function": {"name": "get_weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
  ]})json");
  const ordered_json messages = ordered_json::parse(R"json([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather",
                                        "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "21C"}
  ])json");
  EXPECT_EQ(
      RenderOrError(t, messages, true, extra),
      "<|im_start|>system\n# Tools\n\nYou may call one or more functions to "
      "assist with the user query.\n\nYou are provided with function "
      "signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
      "{\"type\": \"string\"}}}}}\n</tools>\n\nFor each function call, return "
      "a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n21C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3) {
  const ChatTemplate t = LoadFixture("llama3", Llama3Tokens());
  const ordered_json question = ordered_json::parse(
      R"json([{"role": "user", "content": "What is 2+2?"}])json");
  EXPECT_EQ(RenderOrError(t, question, true, {{"date_string", "26 Jul 2024"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            "What is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Without date_string the Llama 3.1 template falls back to its own date.
  EXPECT_EQ(RenderOrError(t, question, true),
            RenderOrError(t, question, true, {{"date_string", "26 Jul 2024"}}));
}

TEST(ChatTemplateTest, Llama32UsesStrftimeNow) {
  const ChatTemplate t = LoadFixture("llama3.2", Llama3Tokens());
  jinja::RenderOptions options;
  // Noon UTC on 26 July 2024: the same date in any time zone within 11 hours.
  options.clock = [] { return static_cast<std::time_t>(1721995200); };
  absl::StatusOr<std::string> out = t.Render(
      ordered_json::parse(R"json([{"role": "user", "content": "Hi"}])json"),
      true, nullptr, options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(absl::StrContains(*out, "Today Date: 26 Jul 2024\n")) << *out;
}

TEST(ChatTemplateTest, MistralAndLlama2) {
  EXPECT_EQ(RenderOrError(LoadFixture("mistral", SentencePieceTokens()),
                          SystemUserAssistantUser(), true),
            "<s>[INST]Hello![/INST]Hi there. How can I help?</s>"
            "[INST]You are a helpful assistant.\n\nTell me a joke.[/INST]");
  EXPECT_EQ(RenderOrError(LoadFixture("mistral-v0.2", SentencePieceTokens()),
                          SystemUserAssistantUser(), false),
            "<s> [INST] You are a helpful assistant.\n\nHello! [/INST] Hi "
            "there. How can I help?</s> [INST] Tell me a joke. [/INST]");
  EXPECT_EQ(RenderOrError(LoadFixture("llama2", SentencePieceTokens()),
                          SystemUserAssistantUser(), false),
            "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n"
            "Hello! [/INST] Hi there. How can I help? </s>"
            "<s>[INST] Tell me a joke. [/INST]");
}

TEST(ChatTemplateTest, RaiseExceptionBecomesInvalidArgument) {
  const ChatTemplate t = LoadFixture("mistral", SentencePieceTokens());
  absl::StatusOr<std::string> out = t.Render(ordered_json::parse(R"json([
    {"role": "user", "content": "One"}, {"role": "user", "content": "Two"}
  ])json"),
                                             true);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chat template: After the optional system message, conversation "
            "roles must alternate user/assistant/user/assistant/...");
  EXPECT_TRUE(jinja::IsTemplateException(out.status()));
}

TEST(ChatTemplateTest, ExtraContextAndSpecialTokens) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(
      "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ tools }}|"
      "{{ documents }}|{{ add_generation_prompt }}|{{ custom }}|"
      "{{ messages|length }}",
      {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(RenderOrError(*t, ordered_json::array(), true),
            "<s>|</s>|False|None|None|True||0");
  EXPECT_EQ(RenderOrError(*t, ordered_json::array(), false,
                          {{"custom", 7}, {"eos_token", "<end>"}}),
            "<s>|<end>|False|None|None|False|7|0");

  EXPECT_EQ(t->Render(ordered_json::object(), true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Render(ordered_json::array(), true, ordered_json::array())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      t->Render(ordered_json::array(), true, {{"messages", 1}}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ErrorsArePrefixed) {
  absl::StatusOr<ChatTemplate> bad = ChatTemplate::FromString("{% if %}", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "chat template: "))
      << bad.status();

  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromString("\n{{ messages|wordwrap }}", {});
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = t->Render(ordered_json::array(), false);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(out.status().message(),
            "chat template: unsupported filter \"wordwrap\" (line 2)");
}

// `depth` nested arrays around 1, parsed (nlohmann's parser and destructor
// do not recurse; copies and conversions do).
ordered_json Nested(int depth) {
  std::string text(static_cast<size_t>(depth), '[');
  text += "1";
  text.append(static_cast<size_t>(depth), ']');
  return ordered_json::parse(text);
}

// 20,000 levels (40 KB) in a message field, in tools or in a
// chat_template_kwargs variable: a 400 that says why, not a crash, even when
// the caller did not check the text first.
TEST(ChatTemplateTest, DeeplyNestedRequestJsonIsAnError) {
  const ChatTemplate t = LoadFixture("qwen3", Qwen3Tokens());
  ordered_json messages =
      ordered_json::parse(R"json([{"role": "user", "content": "Hi"}])json");
  messages[0]["extra"] = Nested(20000);
  absl::StatusOr<std::string> out = t.Render(messages, true);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chat template: messages: JSON nested deeper than 64 levels");

  messages[0].erase("extra");
  ordered_json extra = ordered_json::object();
  extra["tools"] = ordered_json::array({Nested(20000)});
  out = t.Render(messages, true, extra);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chat template: extra context: JSON nested deeper than 64 levels");

  extra = ordered_json::object();
  extra["my_kwarg"] = Nested(20000);
  out = t.Render(messages, true, extra);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);

  // Nesting up to the limit renders (the tool schema is printed by tojson).
  extra = ordered_json::object();
  extra["tools"] = ordered_json::array({Nested(62)});
  out = t.Render(messages, true, extra);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(absl::StrContains(*out, std::string(62, '[') + "1"));
}

// A runaway template is the request's or the template's fault: 400, never
// ResourceExhausted (which the server answers with a retryable 429).
TEST(ChatTemplateTest, RunawayTemplatesAreInvalidArgument) {
  const ordered_json hi =
      ordered_json::parse(R"json([{"role": "user", "content": "Hi"}])json");
  for (const char* source : {
           "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
           "{% for i in range(100000) %}{% for j in range(100000) %}"
           "{% endfor %}{% endfor %}",
           "{{ range(1000000)|length }}",
           "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
           "{% set ns = namespace(x=none) %}{% for i in range(1000) %}"
           "{% set ns.x = [ns.x] %}{% endfor %}",
           "{{ 'x' * 100000000 }}",
       }) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(source, {});
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<std::string> out = t->Render(hi, true);
    ASSERT_FALSE(out.ok()) << source;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument)
        << source << ": " << out.status();
    EXPECT_TRUE(absl::StartsWith(out.status().message(), "chat template: "));
  }
}

TEST(ChatTemplateTest, FromTokenizerConfigReadsTheSharedQwen3Tokenizer) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromTokenizerConfig(
      RunfilesRoot() + "/shared/tokenizers/qwen3");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source(), ReadText(TemplatesDir() + "/qwen3.jinja"));
  // bos_token and unk_token are null in this config: left out.
  EXPECT_EQ(t->special_tokens(), Qwen3Tokens());
}

class ChatTemplateFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  std::string Render(const ChatTemplate& t) {
    return RenderOrError(t, ordered_json::array(), false);
  }

  std::filesystem::path dir_;
};

TEST_F(ChatTemplateFolderTest, NamedTemplatesUseDefault) {
  WriteText(dir_ / "tokenizer_config.json", R"json({
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "chat_template": [
      {"name": "tool_use", "template": "tools"},
      {"name": "default", "template": "default {{ bos_token }}{{ eos_token }}"}
    ]})json");
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromTokenizerConfig(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Render(*t), "default <s></s>");
}

TEST_F(ChatTemplateFolderTest, JinjaFileWinsOverTheConfig) {
  WriteText(dir_ / "tokenizer_config.json",
            R"json({"eos_token": "</s>", "chat_template": "config"})json");
  WriteText(dir_ / "chat_template.jinja", "file {{ eos_token }}\n");
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromTokenizerConfig(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Render(*t), "file </s>");
}

TEST_F(ChatTemplateFolderTest, ChatTemplateJson) {
  WriteText(dir_ / "chat_template.json",
            R"json({"chat_template": "from json"})json");
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromTokenizerConfig(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Render(*t), "from json");
}

// Before: a FIFO in the folder blocked the open() forever.
TEST_F(ChatTemplateFolderTest, FifosAreRefusedNotWaitedOn) {
  for (const char* name :
       {"tokenizer_config.json", "chat_template.jinja", "chat_template.json"}) {
    const std::string path = (dir_ / name).string();
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
    absl::StatusOr<ChatTemplate> t =
        ChatTemplate::FromTokenizerConfig(dir_.string());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument)
        << name << ": " << t.status();
    EXPECT_NE(t.status().message().find(path + " is a FIFO"), std::string::npos)
        << t.status();
    std::filesystem::remove(path);
  }
}

TEST_F(ChatTemplateFolderTest, Errors) {
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(dir_.string()).status().code(),
            absl::StatusCode::kNotFound);

  WriteText(dir_ / "tokenizer_config.json", R"json({"eos_token": "</s>"})json");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(dir_.string()).status().code(),
            absl::StatusCode::kNotFound);

  WriteText(dir_ / "tokenizer_config.json", "{not json");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);

  WriteText(dir_ / "tokenizer_config.json",
            R"json({"chat_template": [{"name": "a", "template": "x"}]})json");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);

  WriteText(dir_ / "tokenizer_config.json",
            R"json({"chat_template": "{% if %}"})json");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every case of goldens.json: the exact text transformers renders, or the
// template's own exception.
TEST(ChatTemplateGoldenTest, GoldensMatchTransformers) {
  const std::string path = TemplatesDir() + "/goldens.json";
  ASSERT_TRUE(std::filesystem::exists(path))
      << "no " << path << " (tools/make_chat_template_goldens.py writes it)";
  ordered_json goldens;
  try {
    goldens = ordered_json::parse(ReadText(path));
  } catch (const nlohmann::json::exception& e) {
    FAIL() << path << ": " << e.what();
  }
  ASSERT_TRUE(goldens.is_array() && !goldens.empty()) << path;
  int failures = 0;
  for (const ordered_json& g : goldens) {
    const std::string name = g.at("template").get<std::string>();
    const std::string label = absl::StrCat(
        name, "/", g.value("case", std::string("?")),
        g.at("add_generation_prompt").get<bool>() ? " (+prompt)" : "");
    SpecialTokens tokens;
    for (const auto& [key, value] : g.at("special_tokens").items()) {
      tokens[key] = value.get<std::string>();
    }
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(
        ReadText(TemplatesDir() + "/" + name + ".jinja"), tokens);
    ASSERT_TRUE(t.ok()) << label << ": " << t.status();
    absl::StatusOr<std::string> out =
        t->Render(g.at("messages"), g.at("add_generation_prompt").get<bool>(),
                  g.value("extra", ordered_json::object()));
    if (g.contains("expected")) {
      const std::string expected = g.at("expected").get<std::string>();
      if (!out.ok()) {
        ADD_FAILURE() << label << ": " << out.status();
        ++failures;
      } else if (*out != expected) {
        size_t at = 0;
        while (at < out->size() && at < expected.size() &&
               (*out)[at] == expected[at]) {
          ++at;
        }
        ADD_FAILURE() << label << ": differs at byte " << at
                      << "\n  expected: " << ordered_json(expected).dump()
                      << "\n  got:      " << ordered_json(*out).dump();
        ++failures;
      }
    } else {
      const std::string error = g.at("error").get<std::string>();
      if (out.ok()) {
        ADD_FAILURE() << label << ": expected the error \"" << error
                      << "\", got " << ordered_json(*out).dump();
        ++failures;
      } else if (g.value("error_type", std::string()) == "TemplateError") {
        // raise_exception: the template's own message, exactly.
        EXPECT_TRUE(jinja::IsTemplateException(out.status())) << label;
        EXPECT_EQ(out.status().message(), "chat template: " + error) << label;
      }
    }
  }
  EXPECT_EQ(failures, 0) << "of " << goldens.size() << " golden cases";
}

}  // namespace
}  // namespace tessera
