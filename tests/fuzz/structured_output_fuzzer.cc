// Structured-output requests (runtime/grammar): a client's JSON schema, regex,
// choice list or EBNF grammar becomes a grammar, a compiled grammar over a
// vocabulary and, step by step, masks and accepts. Any bytes give an error or
// a grammar whose masks the matcher can walk; never a crash, a hang or
// unbounded memory. The first byte picks the kind (as the request's field
// would), the rest is its text; a choice list is one choice per line.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/core/json_limits.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/structured_output.h"
#include "runtime/grammar/token_vocabulary.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

using tessera::grammar::StructuredOutput;

// A small vocabulary with single bytes, JSON punctuation, multi-byte UTF-8
// and tokens that cross rule boundaries, shared by every input.
std::shared_ptr<const tessera::grammar::TokenVocabulary> Vocabulary() {
  static const auto* vocabulary = [] {
    std::vector<std::string> bytes;
    for (int c = 0; c < 128; ++c) bytes.push_back(std::string(1, char(c)));
    for (const char* t :
         {"\":",   "\",",  "{\"",  "\"}",   "true", "false", "null",
          "12",    "0.",   "e+",   "\\u00", "\\n",  "  ",    "\n  ",
          "é",     "日本", "🙂", "\xc3",  "\xa9", "ab",    "abc",
          "\"a\"", "[]",   "{}",   "],",    "},"}) {
      bytes.push_back(t);
    }
    std::vector<bool> excluded(bytes.size(), false);
    excluded[0] = true;  // An end id, as EOS would be.
    auto v = tessera::grammar::TokenVocabulary::Create(std::move(bytes),
                                                       std::move(excluded));
    return new std::shared_ptr<const tessera::grammar::TokenVocabulary>(
        v.ok() ? *std::move(v) : nullptr);
  }();
  return *vocabulary;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  StructuredOutput spec;
  switch (data[0] % 5) {
    case 0: {
      // As the server takes it: nesting checked on the text first.
      if (!tessera::CheckJsonNesting(text).ok()) return 0;
      spec.kind = StructuredOutput::Kind::kJsonSchema;
      spec.schema = nlohmann::ordered_json::parse(text, nullptr,
                                                  /*allow_exceptions=*/false);
      if (spec.schema.is_discarded()) return 0;
      break;
    }
    case 1:
      spec.kind = StructuredOutput::Kind::kRegex;
      spec.text = std::string(text);
      break;
    case 2:
      spec.kind = StructuredOutput::Kind::kGrammar;
      spec.text = std::string(text);
      break;
    case 3:
      spec.kind = StructuredOutput::Kind::kChoice;
      spec.choices = absl::StrSplit(text, '\n');
      break;
    default:
      spec.kind = StructuredOutput::Kind::kJsonObject;
      spec.any_whitespace = !text.empty() && text[0] % 2 == 0;
      break;
  }
  auto ebnf = tessera::grammar::StructuredOutputEbnf(spec);
  if (!ebnf.ok()) return 0;
  auto vocabulary = Vocabulary();
  if (vocabulary == nullptr) return 0;
  tessera::grammar::GrammarCache cache(vocabulary);
  auto compiled = cache.Get(*ebnf);
  if (!compiled.ok()) return 0;
  tessera::grammar::GrammarMatcher matcher(*compiled, /*end_ids=*/{0});
  std::vector<uint32_t> mask(matcher.mask_words());
  // A bounded walk: each step takes an allowed token picked by the input's
  // bytes, so different inputs explore different paths.
  for (int step = 0; step < 48 && !matcher.terminated(); ++step) {
    if (!matcher.FillNextTokenMask(absl::MakeSpan(mask)).ok()) break;
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if (mask[id / 32] >> (id % 32) & 1) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    const int32_t token = allowed[data[(step * 7 + 1) % size] % allowed.size()];
    if (!matcher.Accept(token).ok()) __builtin_trap();  // Allowed, refused.
  }
  return 0;
}
