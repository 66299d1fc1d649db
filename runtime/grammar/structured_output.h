// What a structured-output request asks for, as the one grammar the sampler
// enforces (grammar.h): a JSON schema, any JSON object, a regex, a choice
// among strings, or an EBNF grammar given as is (vLLM's guided_json /
// guided_regex / guided_choice / guided_grammar, structured_outputs, and
// OpenAI's response_format).
#ifndef TESSERA_RUNTIME_GRAMMAR_STRUCTURED_OUTPUT_H_
#define TESSERA_RUNTIME_GRAMMAR_STRUCTURED_OUTPUT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace grammar {

struct StructuredOutput {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  nlohmann::ordered_json schema;     // kJsonSchema.
  std::string text;                  // kRegex, kGrammar.
  std::vector<std::string> choices;  // kChoice: non-empty.
  // JSON kinds: whitespace between tokens (json_schema.h); false is vLLM's
  // disable_any_whitespace.
  bool any_whitespace = true;
};

// The grammar's EBNF text, parsed once here so that a bad schema, regex or
// grammar is the caller's InvalidArgument (a 400) before any work.
absl::StatusOr<std::string> StructuredOutputEbnf(const StructuredOutput& spec);

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_STRUCTURED_OUTPUT_H_
