// The regex and JSON-schema converters, judged by what their grammars match
// (byte by byte through the matcher).
#include <string>

#include "gtest/gtest.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/regex.h"
#include "runtime/grammar/structured_output.h"

namespace tessera {
namespace grammar {
namespace {

std::shared_ptr<const TokenVocabulary> ByteVocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back("</s>");
  std::vector<bool> excluded(bytes.size(), false);
  excluded[256] = true;
  return *TokenVocabulary::Create(bytes, excluded);
}

bool Matches(const std::string& ebnf, const std::string& text) {
  auto g = ParseEbnf(ebnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << ebnf;
  if (!g.ok()) return false;
  GrammarMatcher m(
      std::make_shared<CompiledGrammar>(*std::move(g), ByteVocabulary()),
      {256});
  for (char c : text) {
    if (!m.Accept(static_cast<uint8_t>(c)).ok()) return false;
  }
  return m.CanEnd();
}

std::string Regex(const std::string& pattern, bool json = false) {
  RegexOptions o;
  o.json_string = json;
  auto e = RegexToEbnf(pattern, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return "root ::= " + e.value_or("\"\"") + "\n";
}

std::string Schema(const std::string& schema) {
  auto e = JsonSchemaTextToEbnf(schema);
  EXPECT_TRUE(e.ok()) << e.status() << " for " << schema;
  return e.value_or("root ::= \"\"");
}

TEST(RegexTest, MatchesInFull) {
  EXPECT_TRUE(Matches(Regex(R"(^\d{3}-\d{4}$)"), "555-1234"));
  EXPECT_FALSE(Matches(Regex(R"(\d{3}-\d{4})"), "555-12345"));
  EXPECT_TRUE(Matches(Regex("(?:ab|c)+d?"), "abcab"));
  EXPECT_TRUE(Matches(Regex("[^a-c]\\w\\s."), "dz\t!"));
  EXPECT_FALSE(Matches(Regex("."), "\n"));
  EXPECT_TRUE(Matches(Regex("caf\\u00e9|[à-ü]+"), "café"));
  EXPECT_TRUE(Matches(Regex("x{2,}?y*?"), "xxx"));
  EXPECT_TRUE(Matches(Regex("a{,2}"), "a{,2}"));  // not a repetition
  EXPECT_TRUE(Matches(Regex("\\.\\*\\[\\]"), ".*[]"));
  EXPECT_TRUE(Matches(Regex("\\D\\W\\S"), "a b"));
}

TEST(RegexTest, JsonStringModeWritesEscapes) {
  // The pattern's " and \ and line break appear JSON-escaped.
  EXPECT_TRUE(Matches(Regex("a\"b\\\\c\\n", true), "a\\\"b\\\\c\\n"));
  EXPECT_FALSE(Matches(Regex("a\"b", true), "a\"b"));
  EXPECT_TRUE(Matches(Regex("[^x]", true), "\\\""));
  EXPECT_FALSE(Matches(Regex("[^x]", true), "\x01"));
}

TEST(RegexTest, RefusesWhatItCannotEnforce) {
  for (const char* p : {"(a)\\1", "(?=a)", "(?<=a)b", "\\bword", "(?i)a", "a**",
                        "*a", "(a", "a)", "[z-a]", "a{99999}", "a++"}) {
    EXPECT_FALSE(RegexToEbnf(p).ok()) << p;
  }
}

TEST(JsonSchemaTest, IntegerRangesAreExact) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{
           {-15, 123}, {0, 9}, {7, 7}, {-120, -3}, {95, 1050}}) {
    const std::string ebnf =
        Schema("{\"type\": \"integer\", \"minimum\": " + std::to_string(lo) +
               ", \"maximum\": " + std::to_string(hi) + "}");
    for (int v = -1100; v <= 1100; v += (v > -200 && v < 200) ? 1 : 37) {
      EXPECT_EQ(Matches(ebnf, std::to_string(v)), v >= lo && v <= hi)
          << v << " in [" << lo << ", " << hi << "]";
    }
    EXPECT_FALSE(Matches(ebnf, "007"));
    EXPECT_FALSE(Matches(ebnf, "-0"));
  }
}

TEST(JsonSchemaTest, ObjectsFollowOrderRequiredAndAdditional) {
  const std::string ebnf = Schema(R"({"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                     "c": {"type": "boolean"}},
      "required": ["b"]})");
  EXPECT_TRUE(Matches(ebnf, R"({"b": "x"})"));
  EXPECT_TRUE(Matches(ebnf, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(Matches(ebnf, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"));
  EXPECT_FALSE(Matches(ebnf, R"({"a": 1})"));            // b is required
  EXPECT_FALSE(Matches(ebnf, R"({"b": "x", "d": 1})"));  // no additional
  EXPECT_FALSE(Matches(ebnf, R"({"b": "x",})"));
  const std::string open = Schema(R"({"type": "object",
      "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(Matches(open, R"({"any": 1, "thing": 2})"));
  EXPECT_FALSE(Matches(open, R"({"any": "x"})"));
}

TEST(JsonSchemaTest, ArraysStringsRefsAndEnums) {
  EXPECT_TRUE(Matches(Schema(R"({"type": "array", "minItems": 2,
      "maxItems": 3, "items": {"type": "null"}})"),
                      "[null, null]"));
  EXPECT_FALSE(Matches(Schema(R"({"type": "array", "minItems": 2,
      "maxItems": 3, "items": {"type": "null"}})"),
                       "[null]"));
  EXPECT_TRUE(Matches(Schema(R"({"prefixItems": [{"const": 1},
      {"type": "string"}], "items": false})"),
                      "[1, \"a\"]"));
  EXPECT_FALSE(Matches(Schema(R"({"prefixItems": [{"const": 1}],
      "items": false})"),
                       "[1, 2]"));
  EXPECT_TRUE(Matches(Schema(R"({"type": "string", "minLength": 2,
      "maxLength": 3})"),
                      "\"é\\n\""));
  EXPECT_FALSE(
      Matches(Schema(R"({"type": "string", "maxLength": 1})"), "\"ab\""));
  const std::string tree = Schema(R"({"$defs": {"t": {"type": "object",
      "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
      "required": ["kids"]}}, "$ref": "#/$defs/t"})");
  EXPECT_TRUE(
      Matches(tree, R"({"kids": [{"kids": []}, {"kids": [{"kids": []}]}]})"));
  EXPECT_TRUE(Matches(Schema(R"({"enum": ["a\"b", 2, null, {"k": [1]}]})"),
                      R"({"k":[1]})"));
  EXPECT_TRUE(Matches(Schema(R"({"type": "string", "format": "date"})"),
                      "\"2024-02-28\""));
  EXPECT_FALSE(Matches(Schema(R"({"type": "string", "format": "date"})"),
                       "\"2024-02-30\""));
}

TEST(JsonSchemaTest, RefusesWhatItCannotEnforce) {
  for (const char* s : {
           R"({"type": "array", "uniqueItems": true})",
           R"({"type": "number", "maximum": 3})",
           R"({"type": "integer", "multipleOf": 2})",
           R"({"not": {"type": "string"}})",
           R"({"$ref": "#/$defs/missing"})",
           R"({"$ref": "http://example.com/s.json"})",
           R"({"type": "strange"})",
           R"({"type": "object", "patternProperties": {"a": {}}})",
           R"({"type": "integer", "minimum": 5, "maximum": 4})",
           R"(false)",
       }) {
    EXPECT_FALSE(JsonSchemaTextToEbnf(s).ok()) << s;
  }
}

TEST(StructuredOutputTest, ChoicesAndGrammarsAreChecked) {
  StructuredOutput choice;
  choice.kind = StructuredOutput::Kind::kChoice;
  choice.choices = {"yes", "no \"way\""};
  auto ebnf = StructuredOutputEbnf(choice);
  ASSERT_TRUE(ebnf.ok());
  EXPECT_TRUE(Matches(*ebnf, "no \"way\""));
  EXPECT_FALSE(Matches(*ebnf, "ye"));
  StructuredOutput bad;
  bad.kind = StructuredOutput::Kind::kGrammar;
  bad.text = "root ::= root \"x\"";
  EXPECT_FALSE(StructuredOutputEbnf(bad).ok());
}

}  // namespace
}  // namespace grammar
}  // namespace tessera
