#include "launch/flag_parser.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(FlagParserTest, ParsesEveryFormAndType) {
  std::string model;
  int64_t n = 5;
  double t = 1.0;
  bool json = false, other = true;
  FlagParser p("generate");
  p.Add("model", &model, "");
  p.Add("max-tokens", &n, "");
  p.Add("temperature", &t, "");
  p.Add("json", &json, "");
  p.Add("other", &other, "");
  ASSERT_TRUE(p.Parse({"--model", "/m", "--max-tokens=7", "--temperature", "0",
                       "--json", "--other=false"})
                  .ok());
  EXPECT_EQ(model, "/m");
  EXPECT_EQ(n, 7);
  EXPECT_EQ(t, 0.0);
  EXPECT_TRUE(json);
  EXPECT_FALSE(other);
  EXPECT_TRUE(p.WasSet("model"));
  EXPECT_NE(p.Usage().find("--max-tokens"), std::string::npos);
}

TEST(FlagParserTest, RejectsBadInput) {
  int64_t n = 0;
  FlagParser p("bench");
  p.Add("input-len", &n, "");
  EXPECT_NE(p.Parse({"--nope=1"}).message().find("unknown flag --nope"),
            std::string::npos);
  EXPECT_NE(p.Parse({"--input-len", "abc"}).message().find("not an integer"),
            std::string::npos);
  EXPECT_NE(p.Parse({"--input-len"}).message().find("needs a value"),
            std::string::npos);
  EXPECT_FALSE(p.Parse({"stray"}).ok());
  EXPECT_TRUE(p.Parse({"--help"}).ok());
  EXPECT_TRUE(p.help_requested());
}

}  // namespace
}  // namespace tessera
