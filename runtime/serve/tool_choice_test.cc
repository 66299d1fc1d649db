#include "runtime/serve/tool_choice.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/token_vocabulary.h"

namespace tessera {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;
using grammar::CompiledGrammar;
using grammar::GrammarMatcher;
using grammar::TokenVocabulary;

std::shared_ptr<const TokenVocabulary> ByteVocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back("</s>");
  std::vector<bool> excluded(bytes.size(), false);
  excluded[256] = true;
  return *TokenVocabulary::Create(bytes, excluded);
}

// Whether `text` is a whole output of the schema's grammar.
bool Matches(const Json& schema, const std::string& text) {
  auto ebnf = grammar::JsonSchemaToEbnf(schema);
  EXPECT_TRUE(ebnf.ok()) << ebnf.status() << "\n" << schema.dump();
  if (!ebnf.ok()) return false;
  auto g = grammar::ParseEbnf(*ebnf);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return false;
  GrammarMatcher m(
      std::make_shared<CompiledGrammar>(*std::move(g), ByteVocabulary()),
      {256});
  for (char c : text) {
    if (!m.Accept(static_cast<uint8_t>(c)).ok()) return false;
  }
  return m.CanEnd();
}

const Json kTools = Json::parse(
    R"([ {"type": "function", "function": {"name": "get_weather", "parameters": { "type": "object", "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}}, "required": ["city"], "$defs": {"unit": {"enum": ["c", "f"]}}}}}, {"type": "function", "function": {"name": "now"}}
])");

TEST(ToolChoiceTest, ParametersDefaultToAnyObject) {
  EXPECT_EQ(ToolParametersSchema(kTools[1]), Json::parse(R"({"type":
                                                 "object"})"));
  EXPECT_EQ(ToolParametersSchema(kTools[0]),
            kTools[0]["function"]["parameters"]);
  EXPECT_TRUE(Matches(ToolParametersSchema(kTools[0]),
                      R"({"city": "Oslo", "unit": "c"})"));
  EXPECT_FALSE(Matches(ToolParametersSchema(kTools[0]), R"({"unit": "c"})"));
}

TEST(ToolChoiceTest, RequiredIsAnArrayOfCallsOfTheTools) {
  const Json schema = RequiredToolCallsSchema(kTools, true);
  // The reference moved with its schema.
  EXPECT_EQ(schema["items"]["anyOf"][0]["properties"]["parameters"]
                  ["properties"]["unit"]["$ref"],
            "#/items/anyOf/0/properties/parameters/$defs/unit");
  EXPECT_TRUE(Matches(
      schema,
      R"([{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "f"}}])"));
  EXPECT_TRUE(Matches(
      schema,
      R"([{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "x"}}])"));
  EXPECT_FALSE(Matches(schema, "[]"));  // At least one call.
  EXPECT_FALSE(Matches(schema, R"([{"name": "other", "parameters": {}}])"));
  EXPECT_FALSE(Matches(
      schema,
      R"([{"name": "get_weather", "parameters": {"city": "x", "unit": "k"}}])"));
  EXPECT_FALSE(Matches(schema, R"([{"name": "now"}])"));
  const Json one = RequiredToolCallsSchema(kTools, false);
  EXPECT_TRUE(Matches(one, R"([{"name": "now", "parameters": {}}])"));
  EXPECT_FALSE(Matches(
      one,
      R"([{"name": "now", "parameters": {}}, {"name": "now", "parameters": {}}])"));
}

TEST(ToolChoiceTest, RootReferencesAndDataAreRebasedOnlyWhereTheyRefer) {
  const Json tools = Json::parse(
      R"([{"function": {"name": "tree", "parameters": {"type": "object", "properties": { "children": {"type": "array", "items": {"$ref": "#"}}, "tag": {"const": {"$ref": "#"}}}}}}])");
  const Json schema = RequiredToolCallsSchema(tools, true);
  const Json& parameters =
      schema["items"]["anyOf"][0]["properties"]["parameters"];
  EXPECT_EQ(parameters["properties"]["children"]["items"]["$ref"],
            "#/items/anyOf/0/properties/parameters");
  EXPECT_EQ(parameters["properties"]["tag"]["const"]["$ref"], "#");
  EXPECT_TRUE(Matches(
      schema,
      R"([{"name": "tree", "parameters": {"children": [{"children": []}]}}])"));
}

}  // namespace
}  // namespace serve
}  // namespace tessera
