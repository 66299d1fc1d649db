#include "runtime/core/progress_bar.h"

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What a bar wrote to a temporary file.
class Captured {
 public:
  Captured() : file_(std::tmpfile()) {}
  ~Captured() { std::fclose(file_); }
  std::FILE* file() { return file_; }
  std::string Text() {
    std::fflush(file_);
    std::string text;
    std::rewind(file_);
    for (int c = std::fgetc(file_); c != EOF; c = std::fgetc(file_)) {
      text.push_back(static_cast<char>(c));
    }
    return text;
  }

 private:
  std::FILE* file_;
};

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST(ProgressBarTest, LogModePrintsOneLinePerQuarter) {
  Captured out;
  {
    ProgressBar bar("loading weights", 40, out.file(), /*interactive=*/false);
    for (int i = 0; i < 40; ++i) bar.Advance();
    bar.Finish();
  }
  const std::string text = out.Text();
  // 0%, 25%, 50%, 75%, 100%: five lines, no carriage returns.
  EXPECT_EQ(Count(text, "\n"), 5) << text;
  EXPECT_EQ(Count(text, "\r"), 0);
  EXPECT_THAT(text, StartsWith("[tessera] loading weights: 0% (0/40)"));
  EXPECT_THAT(text, HasSubstr("[tessera] loading weights: 25% (10/40)"));
  EXPECT_THAT(text, HasSubstr("[tessera] loading weights: 50% (20/40)"));
  EXPECT_THAT(text, HasSubstr("[tessera] loading weights: 100% (40/40)"));
}

TEST(ProgressBarTest, InteractiveModeRedrawsOneLine) {
  Captured out;
  {
    ProgressBar bar("loading weights", 4, out.file(), /*interactive=*/true);
    bar.Advance(2);
    bar.Finish();
  }
  const std::string text = out.Text();
  EXPECT_EQ(Count(text, "\n"), 1) << text;  // Only the end of the line.
  EXPECT_EQ(Count(text, "\r"), 3);          // 0%, 50%, 100%.
  EXPECT_THAT(text, HasSubstr("[##########----------]  50% (2/4)"));
  EXPECT_THAT(text, HasSubstr("[####################] 100% (4/4)"));
}

TEST(ProgressBarTest, AdvanceStopsAtTheTotalAndSilentWritesNothing) {
  Captured out;
  {
    ProgressBar bar("x", 2, out.file(), /*interactive=*/false);
    bar.Advance(5);
    bar.Finish();
    bar.Finish();  // Idempotent.
  }
  EXPECT_EQ(Count(out.Text(), "100% (2/2)"), 1);
  ProgressBar silent = ProgressBar::Silent();
  silent.Advance();
  silent.Finish();  // Nothing to check but that it does not crash.
}

TEST(ProgressBarTest, AnInterruptedInteractiveBarEndsItsLine) {
  Captured out;
  {
    ProgressBar bar("x", 3, out.file(), /*interactive=*/true);
    bar.Advance();
  }  // Destroyed before Finish, as when a load fails.
  const std::string text = out.Text();
  EXPECT_EQ(text.back(), '\n');
  EXPECT_THAT(text, HasSubstr("33% (1/3)"));
}

}  // namespace
}  // namespace tessera
