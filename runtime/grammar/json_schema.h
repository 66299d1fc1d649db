// JSON schemas (response_format json_schema, guided_json, a tool's
// parameters) as EBNF for grammar.h, so that every output parses and
// validates against its schema.
//
// Supported, as xgrammar (vLLM's default backend) treats them:
//  - type (one or a list), enum, const, anyOf / oneOf, allOf of objects
//    (merged), $ref to "#", "#/$defs/...", "#/definitions/..." or any JSON
//    pointer into the document (recursive schemas too), true / {} (any
//    value).
//  - object: properties (generated in the schema's order, the required ones
//    always, the others optionally), required, additionalProperties (false /
//    true / a schema; absent means false when properties are given, as
//    xgrammar's strict mode and OpenAI's strict schemas, else any).
//  - array: items, prefixItems, minItems, maxItems.
//  - string: minLength, maxLength, pattern (regex.h), format date, time,
//    date-time, uuid, email, ipv4 (other formats are annotations and left
//    free, as JSON Schema says).
//  - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (digit
//    ranges); number: minimum 0.
// Whitespace between tokens: none, one space, or a line break and up to 24
// spaces or tabs of indent (compact and pretty-printed JSON fit; a run of
// blank lines does not, so a small model cannot spend its tokens on it);
// with any_whitespace false, none at all (vLLM's disable_any_whitespace).
// Anything else that constrains values (uniqueItems, multipleOf,
// patternProperties, min/maxProperties, number ranges, not, if/then/else,
// dependentRequired, contains, ...) is InvalidArgument naming the keyword:
// never silently ignored. Annotations (title, description, default,
// examples, $schema, $id, $comment, ...) are ignored.
#ifndef TESSERA_RUNTIME_GRAMMAR_JSON_SCHEMA_H_
#define TESSERA_RUNTIME_GRAMMAR_JSON_SCHEMA_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace grammar {

struct JsonSchemaOptions {
  bool any_whitespace = true;
};

// The grammar of values the schema accepts (a whole EBNF text with `root`).
absl::StatusOr<std::string> JsonSchemaToEbnf(
    const nlohmann::ordered_json& schema,
    const JsonSchemaOptions& options = {});
// The same from the schema's JSON text (its nesting checked first).
absl::StatusOr<std::string> JsonSchemaTextToEbnf(
    absl::string_view text, const JsonSchemaOptions& options = {});

// response_format {"type": "json_object"}: any JSON object.
std::string JsonObjectEbnf(const JsonSchemaOptions& options = {});

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_JSON_SCHEMA_H_
