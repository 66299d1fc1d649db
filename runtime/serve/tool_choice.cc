#include "runtime/serve/tool_choice.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

// Keywords whose values are data, not schemas: a "$ref" inside them is not
// a reference.
bool IsDataKeyword(absl::string_view key) {
  return key == "enum" || key == "const" || key == "default" ||
         key == "examples";
}

// Rewrites the local "$ref"s of `schema` (a schema that is moved to the JSON
// pointer `base` of a larger document) to point into its new place. The
// request body's nesting bound (kMaxJsonDepth) bounds the recursion.
void RebaseRefs(Json& schema, const std::string& base) {
  if (schema.is_array()) {
    for (Json& item : schema) RebaseRefs(item, base);
    return;
  }
  if (!schema.is_object()) return;
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    if (IsDataKeyword(it.key())) continue;
    if (it.key() == "$ref" && it->is_string()) {
      const std::string& ref = it->get_ref<const std::string&>();
      if (ref == "#" || absl::StartsWith(ref, "#/")) {
        *it = absl::StrCat("#", base, ref.substr(1));
      }
      continue;
    }
    RebaseRefs(*it, base);
  }
}

}  // namespace

Json ToolParametersSchema(const Json& tool) {
  const Json& function = tool.at("function");
  auto it = function.find("parameters");
  if (it == function.end() || it->is_null()) {
    return Json{{"type", "object"}};
  }
  return *it;
}

Json RequiredToolCallsSchema(const Json& tools, bool parallel_tool_calls) {
  Json any_of = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    Json parameters = ToolParametersSchema(tools[i]);
    RebaseRefs(parameters,
               absl::StrCat("/items/anyOf/", i, "/properties/parameters"));
    Json name = Json::object();
    name["type"] = "string";
    name["enum"] = Json::array({tools[i].at("function").at("name")});
    Json properties = Json::object();
    properties["name"] = std::move(name);
    properties["parameters"] = std::move(parameters);
    Json call = Json::object();
    call["type"] = "object";
    call["properties"] = std::move(properties);
    call["required"] = Json::array({"name", "parameters"});
    any_of.push_back(std::move(call));
  }
  Json items = Json::object();
  items["anyOf"] = std::move(any_of);
  Json schema = Json::object();
  schema["type"] = "array";
  schema["items"] = std::move(items);
  schema["minItems"] = 1;
  if (!parallel_tool_calls) schema["maxItems"] = 1;
  return schema;
}

}  // namespace serve
}  // namespace tessera
