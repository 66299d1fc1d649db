#include "runtime/serve/parsers/json_scan.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace serve {
namespace {

TEST(JsonScanTest, FindsTheEndOfObjectsArraysAndStrings) {
  const std::string text = R"(  {"a": "}]\"{", "b": [1, {"c": []}]} tail)";
  JsonScanResult r = ScanJsonValue(text);
  ASSERT_EQ(r.state, JsonScan::kComplete);
  EXPECT_EQ(r.begin, 2u);
  EXPECT_EQ(text.substr(r.end), " tail");
  r = ScanJsonValue(R"("x\\" y)");
  ASSERT_EQ(r.state, JsonScan::kComplete);
  EXPECT_EQ(r.end, 5u);
}

TEST(JsonScanTest, IncompleteUntilItCloses) {
  EXPECT_EQ(ScanJsonValue(R"({"a": [1, 2)").state, JsonScan::kIncomplete);
  EXPECT_EQ(ScanJsonValue(R"({"a": "}\)").state, JsonScan::kIncomplete);
  EXPECT_EQ(ScanJsonValue("   ").state, JsonScan::kIncomplete);
  // A number may go on.
  EXPECT_EQ(ScanJsonValue("12").state, JsonScan::kIncomplete);
  JsonScanResult r = ScanJsonValue("12,");
  ASSERT_EQ(r.state, JsonScan::kComplete);
  EXPECT_EQ(r.end, 2u);
  EXPECT_EQ(ScanJsonValue("x", 5).state, JsonScan::kIncomplete);
}

TEST(JsonScanTest, InvalidOnMismatchOrDepth) {
  EXPECT_EQ(ScanJsonValue("[1}").state, JsonScan::kInvalid);
  EXPECT_EQ(ScanJsonValue("<x>").state, JsonScan::kInvalid);
  EXPECT_EQ(ScanJsonValue(std::string(65, '[')).state, JsonScan::kInvalid);
  EXPECT_EQ(ScanJsonValue(std::string(64, '[')).state, JsonScan::kIncomplete);
}

TEST(JsonScanTest, ResumableScanAgreesWhateverTheCut) {
  const std::string text = R"({"k": ["a\"]", {"n": -1.5e3}], "z": null} x)";
  const JsonScanResult whole = ScanJsonValue(text);
  ASSERT_EQ(whole.state, JsonScan::kComplete);
  for (size_t step = 1; step <= 5; ++step) {
    JsonValueScanner scanner;
    size_t pos = 0;
    JsonScan state = JsonScan::kIncomplete;
    while (pos < text.size() && state == JsonScan::kIncomplete) {
      size_t used = 0;
      const size_t n = std::min(step, text.size() - pos);
      state = scanner.Feed(absl::string_view(text).substr(pos, n), &used);
      pos += used;
    }
    EXPECT_EQ(state, JsonScan::kComplete);
    EXPECT_EQ(pos, whole.end) << step;
  }
  JsonValueScanner scalar;
  size_t used = 0;
  EXPECT_EQ(scalar.Feed("true", &used), JsonScan::kIncomplete);
  EXPECT_EQ(scalar.Finish(), JsonScan::kComplete);
}

}  // namespace
}  // namespace serve
}  // namespace tessera
