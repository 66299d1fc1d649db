#include "runtime/text/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

TEST(SentencePieceTokenizerTest, DemoTokenizerMatchesReferenceIds) {
  auto tok = LoadTokenizer(DemoModelDir(), /*config_bos_id=*/1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 512);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_TRUE((*tok)->add_bos());
  // sentencepiece's own encoding of the demo prompt
  // (tests/fixtures/stories260K_golden.json, written by
  // tools/make_golden_fixtures.py), without the BOS.
  auto ids = (*tok)->Encode("Once upon a time");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(*(*tok)->Decode(*ids), "Once upon a time");
  EXPECT_TRUE((*tok)->Encode("")->empty());
}

TEST(SentencePieceTokenizerTest, DecodeSuffixKeepsTheLeadingSpace) {
  auto tok = LoadTokenizer(DemoModelDir(), 1);
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> ids = *(*tok)->Encode("Once upon a time there was");
  const size_t prefix = (*(*tok)->Encode("Once upon a time")).size();
  auto suffix = (*tok)->DecodeSuffix(ids, prefix, false);
  ASSERT_TRUE(suffix.ok());
  EXPECT_EQ(*suffix, " there was");
  EXPECT_FALSE((*tok)->Decode(std::vector<int32_t>{600}).ok());
}

TEST(LoadTokenizerTest, MissingAndUnsupportedFiles) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/tok";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  EXPECT_EQ(LoadTokenizer(dir, -1).status().code(),
            absl::StatusCode::kNotFound);
  // tokenizer.json wins when present: a broken one is an error, not a fallback.
  std::ofstream(dir + "/tokenizer.json") << "{}";
  std::ofstream(dir + "/tokenizer.model") << "not a sentencepiece model";
  EXPECT_EQ(LoadTokenizer(dir, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::remove((dir + "/tokenizer.json").c_str());
  EXPECT_EQ(LoadTokenizer(dir, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadTokenizerTest, TokenizerConfigCanTurnBosOff) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/nobos";
  ASSERT_EQ(std::system(("mkdir -p " + dir + " && cp " + DemoModelDir() +
                         "/tokenizer.model " + dir + "/")
                            .c_str()),
            0);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"add_bos_token": false})";
  auto tok = LoadTokenizer(dir, 1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE((*tok)->add_bos());
}

// EncodeAtMost on tokenizer.model: Encode's ids whenever the text fits
// (including texts longer than one 16 KB chunk), OutOfRange otherwise, and
// 50 MB refused after about the limit's worth of work.
void ExpectEncodeAtMost(const Tokenizer& tok) {
  std::string long_text;
  for (int i = 0; i < 3000; ++i) {
    absl::StrAppend(&long_text, "Line ", i, ": h\xc3\xa9llo  w\xc3\xb6rld.\n",
                    std::string(i % 5, ' '), "Once upon a time ");
  }
  for (const std::string& text :
       {std::string(), std::string("Once upon a time"), std::string("  a  b "),
        std::string(40000, 'a'), std::string(40000, ' '), long_text}) {
    absl::StatusOr<std::vector<int32_t>> full = tok.Encode(text);
    ASSERT_TRUE(full.ok()) << full.status();
    const int64_t n = static_cast<int64_t>(full->size());
    for (int64_t limit : {n, n + 1, 2 * n + 10}) {
      absl::StatusOr<std::vector<int32_t>> ids = tok.EncodeAtMost(text, limit);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, *full);
    }
    if (n > 0) {
      EXPECT_EQ(tok.EncodeAtMost(text, n - 1).status().code(),
                absl::StatusCode::kOutOfRange);
    }
  }
  constexpr size_t kBytes = size_t{50} << 20;
  std::string words;
  while (words.size() < kBytes) words += "The quick brown fox jumps. ";
  for (const std::string* text :
       {&words, new std::string(kBytes, 'a')}) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<int32_t>> ids = tok.EncodeAtMost(*text, 40960);
    std::printf(
        "EncodeAtMost(50 MB, 40960): %.3f s\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kOutOfRange);
    if (text != &words) delete text;
  }
}

TEST(SentencePieceTokenizerTest, EncodeAtMostDemo) {
  auto tok = LoadTokenizer(DemoModelDir(), 1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ExpectEncodeAtMost(**tok);
}

TEST(SentencePieceTokenizerTest, EncodeAtMostLlama2) {
  auto tok =
      LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/llama2", /*bos=*/1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ExpectEncodeAtMost(**tok);
}

}  // namespace
}  // namespace tessera
