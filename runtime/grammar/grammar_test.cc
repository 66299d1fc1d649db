#include "runtime/grammar/grammar.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace grammar {
namespace {

std::string ErrorOf(const std::string& ebnf) {
  auto g = ParseEbnf(ebnf);
  return g.ok() ? "ok" : std::string(g.status().message());
}

TEST(GrammarTest, ParsesRulesAcrossLines) {
  auto g = ParseEbnf(
      "# a comment\nroot ::= a\n  | b  # trailing\n\na ::= \"x\"\nb ::=\n "
      "\"y\" a");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rule_names[g->root], "root");
  EXPECT_EQ(g->rules[g->root].size(), 2u);
}

TEST(GrammarTest, RefusesMalformedGrammars) {
  EXPECT_NE(ErrorOf("a ::= \"x\"").find("no rule named 'root'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("root ::= b").find("'b' is used but never defined"),
            std::string::npos);
  EXPECT_NE(ErrorOf("root ::= root \"x\"").find("left-recursive"),
            std::string::npos);
  // Through a rule that can match nothing.
  EXPECT_NE(ErrorOf("root ::= e root \"x\" | \"y\"\ne ::= \"z\"?")
                .find("left-recursive"),
            std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"x").find("unterminated"), std::string::npos);
  EXPECT_NE(ErrorOf("root ::= [a-").find("unterminated"), std::string::npos);
  EXPECT_NE(ErrorOf("root ::= [z-a]").find("backwards"), std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"\\q\"").find("unknown escape"),
            std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"x\"{3,2}").find("m < n"), std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"x\"{99999}").find("above"), std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"x\"\nroot ::= \"y\"").find("defined twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf("root ::= \"x\" )").find("unexpected"), std::string::npos);
  EXPECT_NE(ErrorOf("").find("no rules"), std::string::npos);
}

TEST(GrammarTest, BoundsNestingAndSize) {
  std::string deep =
      "root ::= " + std::string(200, '(') + "\"x\"" + std::string(200, ')');
  EXPECT_NE(ErrorOf(deep).find("nest deeper"), std::string::npos);
  // Repetitions multiply: 10000 x 10000 elements is refused, not built.
  EXPECT_NE(ErrorOf("root ::= a{10000}\na ::= \"x\"{10000}").find("ok"),
            std::string::npos);
  std::string many = "root ::=";
  for (int i = 0; i < 7; ++i) many += " \"x\"{0,10000}";
  EXPECT_NE(ErrorOf(many).find("expands to more"), std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMaxGrammarBytes + 1, ' ')).find("bytes"),
            std::string::npos);
}

TEST(GrammarTest, LiteralEscapingRoundTrips) {
  const std::string text = "a\"b\\c\n\x01 é";
  auto g = ParseEbnf("root ::= \"" + EbnfLiteral(text) + "\"");
  ASSERT_TRUE(g.ok()) << g.status();
  // One element per byte, then the end.
  EXPECT_EQ(g->elements.size(), text.size() + 1);
}

}  // namespace
}  // namespace grammar
}  // namespace tessera
