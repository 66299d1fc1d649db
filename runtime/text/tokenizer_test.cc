#include "runtime/text/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

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
  // Ids past the tokenizer's vocabulary (a model's padded embedding rows)
  // decode to nothing, as in Hugging Face; negative ids are an error.
  EXPECT_EQ(*(*tok)->Decode(std::vector<int32_t>{600}), "");
  EXPECT_EQ(*(*tok)->Decode(std::vector<int32_t>{ids[0], 600, ids[1]}),
            *(*tok)->Decode(std::vector<int32_t>{ids[0], ids[1]}));
  EXPECT_FALSE((*tok)->Decode(std::vector<int32_t>{-1}).ok());
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

}  // namespace
}  // namespace tessera
