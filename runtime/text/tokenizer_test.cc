#include "runtime/text/tokenizer.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

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
  for (const std::string* text : {&words, new std::string(kBytes, 'a')}) {
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

// vLLM's rendering of a tokenizer.model (Decode with DecodeOptions). The
// expected strings follow vLLM's slow path,
// vllm/transformers_utils/detokenizer_utils.py:
// _convert_tokens_to_string_with_added_encoders puts each token of
// tokenizer.get_added_vocab() (LlamaTokenizer: <unk>, <s>, </s>) into
// sub_texts as is, each run of other tokens as convert_tokens_to_string(run)
// (sentencepiece's decode: no leading space), and returns
// " ".join(sub_texts) or "".join(sub_texts) by spaces_between_special_tokens;
// with skip_special_tokens, convert_ids_to_tokens has dropped the
// all_special_ids (<unk>, <s>, </s>) before, so they do not cut a run
// (detokenize_incrementally and convert_prompt_ids_to_tokens pass
// skip_special_tokens to it).
class VllmSentencePieceDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok =
        LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/llama2", /*bos=*/1);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }
  // `parts` with each kText replaced by the ids of the next of `texts`.
  std::vector<int32_t> Ids(std::initializer_list<int32_t> parts,
                           std::initializer_list<const char*> texts) {
    std::vector<int32_t> out;
    auto text = texts.begin();
    for (int32_t part : parts) {
      if (part != kText) {
        out.push_back(part);
        continue;
      }
      const std::vector<int32_t> ids = *tok_->Encode(*text++);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip, bool spaces) {
    DecodeOptions options;
    options.skip_special_tokens = skip;
    options.spaces_between_special_tokens = spaces;
    absl::StatusOr<std::string> text = tok_->Decode(ids, options);
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "<error>";
  }
  static constexpr int32_t kText = -100;
  static constexpr int32_t kUnk = 0, kBos = 1, kEos = 2;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(VllmSentencePieceDecodeTest, SegmentsJoinedBySpacesOrNothing) {
  // <s> ▁The </s>
  const std::vector<int32_t> ids = Ids({kBos, kText, kEos}, {"The"});
  ASSERT_EQ(ids, (std::vector<int32_t>{1, 450, 2}));
  EXPECT_EQ(Decode(ids, false, true), "<s> The </s>");
  EXPECT_EQ(Decode(ids, false, false), "<s>The</s>");
  EXPECT_EQ(Decode(ids, true, true), "The");
  EXPECT_EQ(Decode(ids, true, false), "The");
  // The bool form keeps Tessera's own rendering (the word-boundary space of
  // "▁The" printed, none before </s>).
  EXPECT_EQ(*tok_->Decode(ids, false), "<s> The</s>");
  EXPECT_EQ(*tok_->Decode(ids, true), "The");

  const std::vector<int32_t> mid =
      Ids({kBos, kText, kEos, kText}, {"Hello world", "Bye now"});
  EXPECT_EQ(Decode(mid, false, true), "<s> Hello world </s> Bye now");
  EXPECT_EQ(Decode(mid, false, false), "<s>Hello world</s>Bye now");
  // Skipped tokens do not cut the run: one sentencepiece decode.
  EXPECT_EQ(Decode(mid, true, true), "Hello world Bye now");
  EXPECT_EQ(Decode(mid, true, false), "Hello world Bye now");

  // Added tokens next to each other, and alone.
  EXPECT_EQ(Decode({kBos, kEos, kEos}, false, true), "<s> </s> </s>");
  EXPECT_EQ(Decode({kBos, kEos, kEos}, false, false), "<s></s></s>");
  EXPECT_EQ(Decode({kBos, kEos}, true, true), "");
  EXPECT_EQ(Decode({}, false, true), "");
  EXPECT_EQ(Decode({kEos}, false, true), "</s>");
}

TEST_F(VllmSentencePieceDecodeTest, UnknownPieceIsAnAddedToken) {
  const std::vector<int32_t> ids = Ids({kText, kUnk, kText}, {"Hi", "there"});
  EXPECT_EQ(Decode(ids, false, true), "Hi <unk> there");
  EXPECT_EQ(Decode(ids, false, false), "Hi<unk>there");
  EXPECT_EQ(Decode(ids, true, true), "Hi there");
  EXPECT_FALSE(tok_->IsSpecial(kUnk));  // IsSpecial is unchanged
}

TEST_F(VllmSentencePieceDecodeTest, EmptyRunIsStillASegment) {
  // "▁" alone decodes to "" at the start of a run; " ".join keeps it.
  const int32_t space = tok_->TokenToId("\xE2\x96\x81");
  ASSERT_GE(space, 0);
  // IdToToken is TokenToId's inverse (the piece as stored: vLLM's
  // token_strs), and empty outside the vocabulary.
  EXPECT_EQ(tok_->IdToToken(space), "\xE2\x96\x81");
  EXPECT_EQ(tok_->IdToToken(kBos), "<s>");
  EXPECT_EQ(tok_->IdToToken(-1), "");
  EXPECT_EQ(tok_->IdToToken(tok_->vocab_size()), "");
  EXPECT_EQ(Decode({kBos, space, kEos}, false, true), "<s>  </s>");
  EXPECT_EQ(Decode({kBos, space, kEos}, false, false), "<s></s>");
}

TEST_F(VllmSentencePieceDecodeTest, IdsPastTheVocabularyAndNegativeIds) {
  // Past the vocabulary: no text and no cut, as vLLM's "" token for an
  // out-of-range id; negative: an error.
  const int32_t past = tok_->vocab_size() + 5;
  EXPECT_EQ(Decode(Ids({kText, past, kText}, {"a", "b"}), false, true), "a b");
  EXPECT_EQ(Decode({kBos, past, kEos}, false, true), "<s> </s>");
  EXPECT_FALSE(tok_->Decode({kBos, -1}, DecodeOptions{}).ok());
}

TEST_F(VllmSentencePieceDecodeTest, DecodeSuffixWithOptions) {
  const std::vector<int32_t> ids =
      Ids({kBos, kText, kText, kEos}, {"Hello", "world"});
  DecodeOptions spaces{/*skip_special_tokens=*/false,
                       /*spaces_between_special_tokens=*/true};
  DecodeOptions none{false, false};
  EXPECT_EQ(*tok_->DecodeSuffix(ids, 2, spaces), " world </s>");
  EXPECT_EQ(*tok_->DecodeSuffix(ids, 2, none), " world</s>");
  EXPECT_EQ(*tok_->DecodeSuffix(ids, 1, spaces), " Hello world </s>");
  EXPECT_EQ(*tok_->DecodeSuffix(ids, 1, none), "Hello world</s>");
  EXPECT_FALSE(tok_->DecodeSuffix(ids, 5, spaces).ok());
}

// The demo checkpoint's tokenizer.model follows the same rule.
TEST(SentencePieceTokenizerTest, DemoVllmSpacesBetweenSpecialTokens) {
  auto tok = LoadTokenizer(DemoModelDir(), 1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<int32_t> ids = {1};
  const std::vector<int32_t> text = *(*tok)->Encode("Once upon a time");
  ids.insert(ids.end(), text.begin(), text.end());
  ids.push_back(2);
  EXPECT_EQ(*(*tok)->Decode(ids, DecodeOptions{false, true}),
            "<s> Once upon a time </s>");
  EXPECT_EQ(*(*tok)->Decode(ids, DecodeOptions{false, false}),
            "<s>Once upon a time</s>");
  EXPECT_EQ(*(*tok)->Decode(ids, DecodeOptions{true, true}),
            "Once upon a time");
}

// Before: a FIFO named like a tokenizer file blocked LoadTokenizer in open()
// forever (or, for tokenizer.json, was skipped as absent).
TEST(LoadTokenizerTest, FifosAreRefusedNotWaitedOn) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "tokenizer_fifo";
  for (const char* name :
       {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"}) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    if (std::string(name) == "tokenizer_config.json") {
      std::filesystem::copy_file(
          std::filesystem::path(DemoModelDir()) / "tokenizer.model",
          dir / "tokenizer.model");
    }
    const std::string path = (dir / name).string();
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
    auto tok = LoadTokenizer(dir.string(), /*config_bos_id=*/1);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument)
        << name << ": " << tok.status();
    EXPECT_NE(tok.status().message().find(path + " is a FIFO"),
              std::string::npos)
        << tok.status();
  }
}

}  // namespace
}  // namespace tessera
