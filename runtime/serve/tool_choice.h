// tool_choice "required" and a named tool_choice (forced function calling)
// as JSON schemas for the structured-output engine (runtime/grammar), the
// way vLLM forces them:
//  - named {"type": "function", "function": {"name": "f"}}: the output is
//    f's arguments, a value of f's parameters schema;
//  - "required": the output is a JSON array of at least one call (at most one
//    with parallel_tool_calls false), each {"name": <a tool's name>,
//    "parameters": <that tool's parameters>}.
// The tools are the request's `tools`, already checked by the protocol layer
// (an array of {"type": "function", "function": {"name": non-empty string,
// "parameters": object or boolean, optional}}).
#ifndef TESSERA_RUNTIME_SERVE_TOOL_CHOICE_H_
#define TESSERA_RUNTIME_SERVE_TOOL_CHOICE_H_

#include "nlohmann/json.hpp"

namespace tessera {
namespace serve {

// A tool's parameters schema: function.parameters, or {"type": "object"}
// (any object) when the tool declares none.
nlohmann::ordered_json ToolParametersSchema(const nlohmann::ordered_json& tool);

// The schema of tool_choice "required"'s output. Each tool's schema sits at
// /items/anyOf/<i>/properties/parameters of the result, so its local
// references ("#", "#/$defs/...", any "#/..." pointer) are rewritten to that
// place; everything else is kept as written.
nlohmann::ordered_json RequiredToolCallsSchema(
    const nlohmann::ordered_json& tools, bool parallel_tool_calls);

}  // namespace serve
}  // namespace tessera

#endif  // TESSERA_RUNTIME_SERVE_TOOL_CHOICE_H_
