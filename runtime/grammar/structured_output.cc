#include "runtime/grammar/structured_output.h"

#include "absl/status/status.h"
#include "runtime/core/status.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/regex.h"

namespace tessera {
namespace grammar {

absl::StatusOr<std::string> StructuredOutputEbnf(const StructuredOutput& spec) {
  std::string ebnf;
  switch (spec.kind) {
    case StructuredOutput::Kind::kJsonSchema: {
      JsonSchemaOptions options;
      options.any_whitespace = spec.any_whitespace;
      ASSIGN_OR_RETURN(ebnf, JsonSchemaToEbnf(spec.schema, options));
      break;
    }
    case StructuredOutput::Kind::kJsonObject: {
      JsonSchemaOptions options;
      options.any_whitespace = spec.any_whitespace;
      ebnf = JsonObjectEbnf(options);
      break;
    }
    case StructuredOutput::Kind::kRegex: {
      ASSIGN_OR_RETURN(const std::string expr, RegexToEbnf(spec.text));
      ebnf = "root ::= " + expr + "\n";
      break;
    }
    case StructuredOutput::Kind::kChoice: {
      if (spec.choices.empty()) {
        return absl::InvalidArgumentError("choice: the list is empty");
      }
      ebnf = "root ::= ";
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        if (spec.choices[i].empty()) {
          return absl::InvalidArgumentError("choice: an empty string");
        }
        if (i > 0) ebnf += " | ";
        ebnf += "\"" + EbnfLiteral(spec.choices[i]) + "\"";
      }
      ebnf += "\n";
      break;
    }
    case StructuredOutput::Kind::kGrammar:
      ebnf = spec.text;
      break;
  }
  // Every kind is checked by the parser the sampling rank uses.
  RETURN_IF_ERROR(ParseEbnf(ebnf).status());
  return ebnf;
}

}  // namespace grammar
}  // namespace tessera
