#include "runtime/text/detokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

// Whether `s` is well-formed UTF-8 with no truncated character at either end.
bool IsCompleteUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const size_t len = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += len;
  }
  return true;
}

// Streams `text`'s tokens after `prompt` and checks that every chunk is
// complete UTF-8 and that the chunks add up to the one-shot decode.
void ExpectStreamMatchesOneShot(const Tokenizer& tok, const std::string& prompt,
                                const std::string& text, bool skip_special) {
  std::vector<int32_t> prompt_ids = *tok.Encode(prompt);
  if (tok.add_bos()) prompt_ids.insert(prompt_ids.begin(), tok.bos_id());
  std::vector<int32_t> generated = *tok.Encode(text);
  IncrementalDetokenizer detok(&tok, prompt_ids, skip_special);
  std::string streamed;
  for (int32_t id : generated) {
    auto chunk = detok.Append(id);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_TRUE(IsCompleteUtf8(*chunk))
        << "chunk \"" << *chunk << "\" in " << text;
    streamed += *chunk;
  }
  streamed += *detok.Finish();
  std::vector<int32_t> all = prompt_ids;
  all.insert(all.end(), generated.begin(), generated.end());
  EXPECT_EQ(streamed, *tok.DecodeSuffix(all, prompt_ids.size(), skip_special))
      << text;
}

const char* const kTexts[] = {
    "Once upon a time there was a dog.",
    " leading space and  double  spaces",
    "emoji 🙂 and a family 👨‍👩‍👧 in a row",
    "中文字符和日本語のテキスト",
    "Ünïcödé ëverywhere, Привет мир, مرحبا بالعالم, नमस्ते दुनिया",
    "tabs\tand\r\nnewlines\n\n",
};

TEST(IncrementalDetokenizerTest, SentencePieceWithByteFallback) {
  auto tok = LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/llama2", 1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const char* text : kTexts) {
    ExpectStreamMatchesOneShot(**tok, "Hello", text, /*skip_special=*/true);
    ExpectStreamMatchesOneShot(**tok, "", text, /*skip_special=*/false);
  }
}

// Byte-level BPE (Qwen3): emoji and CJK characters split across tokens at byte
// boundaries.
TEST(IncrementalDetokenizerTest, ByteLevelBpe) {
  auto tok = LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/qwen3", -1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const char* text : kTexts) {
    ExpectStreamMatchesOneShot(**tok, "Hello", text, /*skip_special=*/false);
  }
  ExpectStreamMatchesOneShot(
      **tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
      "Sure 🙂<|im_end|>", /*skip_special=*/true);
}

TEST(IncrementalDetokenizerTest, DemoTokenizer) {
  auto tok = LoadTokenizer(DemoModelDir(), 1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const char* text : kTexts)
    ExpectStreamMatchesOneShot(**tok, "Once upon", text, true);
}

TEST(IncrementalDetokenizerTest, HoldsBackAPartialCharacter) {
  auto tok = LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/llama2", 1);
  ASSERT_TRUE(tok.ok());
  // A rare CJK character is byte-fallback pieces: nothing is emitted until its
  // last byte.
  const std::vector<int32_t> ids = *(*tok)->Encode("𝄞");
  ASSERT_GT(ids.size(), 1u);
  IncrementalDetokenizer detok(tok->get(), std::vector<int32_t>{1}, true);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    auto chunk = detok.Append(ids[i]);
    ASSERT_TRUE(chunk.ok());
    out += *chunk;
  }
  EXPECT_EQ(out.find("\xEF\xBF\xBD"), std::string::npos) << out;
  out += *detok.Append(ids.back());
  out += *detok.Finish();
  EXPECT_NE(out.find("𝄞"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
