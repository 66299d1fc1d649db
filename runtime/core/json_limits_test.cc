#include "runtime/core/json_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

std::string Nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(JsonLimitsTest, AcceptsUpToTheLimit) {
  EXPECT_TRUE(CheckJsonNesting(Nested(kMaxJsonDepth)).ok());
  EXPECT_TRUE(CheckJsonNesting(R"({"a": [1, {"b": []}]})", 4).ok());
  EXPECT_TRUE(CheckJsonNesting("").ok());
}

TEST(JsonLimitsTest, RejectsDeeper) {
  const absl::Status s = CheckJsonNesting(Nested(kMaxJsonDepth + 1));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("nested deeper than 64"), std::string::npos);
  const std::string hostile = "{\"a\":" + std::string(80000, '[') +
                              std::string(80000, ']') + ",\"b\":1}";
  EXPECT_FALSE(CheckJsonNesting(hostile).ok());
  EXPECT_FALSE(CheckJsonNesting(R"({"a": [1, {"b": []}]})", 3).ok());
}

TEST(JsonLimitsTest, BracketsInStringsDoNotCount) {
  const std::string text = "{\"s\": \"" + std::string(1000, '[') + "\\\"" +
                           std::string(1000, '{') + "\"}";
  EXPECT_TRUE(CheckJsonNesting(text, 1).ok());
  // An escaped backslash ends before the quote, which closes the string.
  EXPECT_FALSE(CheckJsonNesting(R"({"s": "\\", "t": [[]]})", 2).ok());
}

TEST(JsonLimitsTest, ClosersOnlyNeverUnderflow) {
  EXPECT_TRUE(CheckJsonNesting(std::string(100, ']') + Nested(3), 3).ok());
}

}  // namespace
}  // namespace tessera
