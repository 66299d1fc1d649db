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

// Streams `generated` after `prompt_ids` with DecodeOptions and checks that
// the chunks add up to DecodeSuffix with the same options; returns the
// streamed text.
std::string StreamWithOptions(const Tokenizer& tok,
                              const std::vector<int32_t>& prompt_ids,
                              const std::vector<int32_t>& generated,
                              const DecodeOptions& options) {
  IncrementalDetokenizer detok(&tok, prompt_ids, options);
  std::string streamed;
  for (int32_t id : generated) {
    auto chunk = detok.Append(id);
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) return streamed;
    EXPECT_TRUE(IsCompleteUtf8(*chunk)) << "chunk \"" << *chunk << "\"";
    streamed += *chunk;
  }
  streamed += *detok.Finish();
  std::vector<int32_t> all = prompt_ids;
  all.insert(all.end(), generated.begin(), generated.end());
  EXPECT_EQ(streamed, *tok.DecodeSuffix(all, prompt_ids.size(), options));
  return streamed;
}

// Every text of kTexts with special tokens (and, for a tokenizer.model, the
// unknown piece) spliced in at the start, between words and at the end,
// streamed with all four DecodeOptions.
void ExpectOptionsStreamsMatchOneShot(const Tokenizer& tok,
                                      const std::string& prompt,
                                      const std::vector<int32_t>& specials) {
  std::vector<int32_t> prompt_ids = *tok.Encode(prompt);
  if (tok.add_bos()) prompt_ids.insert(prompt_ids.begin(), tok.bos_id());
  for (const char* text : kTexts) {
    const std::vector<int32_t> ids = *tok.Encode(text);
    std::vector<int32_t> generated = {specials[0]};
    for (size_t i = 0; i < ids.size(); ++i) {
      generated.push_back(ids[i]);
      if (i % 3 == 1) generated.push_back(specials[i % specials.size()]);
      if (i % 7 == 2) {
        generated.push_back(specials[0]);
        generated.push_back(specials.back());
      }
    }
    generated.push_back(specials.back());
    for (bool skip : {false, true}) {
      for (bool spaces : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << text << " skip=" << skip << " spaces=" << spaces);
        StreamWithOptions(tok, prompt_ids, generated,
                          DecodeOptions{skip, spaces});
        StreamWithOptions(tok, {}, generated, DecodeOptions{skip, spaces});
      }
    }
  }
}

TEST(IncrementalDetokenizerTest, OptionsSentencePiece) {
  for (const std::string& dir :
       {RunfilesRoot() + "/shared/tokenizers/llama2", DemoModelDir()}) {
    auto tok = LoadTokenizer(dir, 1);
    ASSERT_TRUE(tok.ok()) << tok.status();
    ExpectOptionsStreamsMatchOneShot(**tok, "Hello", {2, 1, 0});
  }
}

TEST(IncrementalDetokenizerTest, OptionsByteLevelBpe) {
  auto tok = LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/qwen3", -1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t im_end = (*tok)->TokenToId("<|im_end|>");
  const int32_t im_start = (*tok)->TokenToId("<|im_start|>");
  ASSERT_GE(im_end, 0);
  ASSERT_GE(im_start, 0);
  ExpectOptionsStreamsMatchOneShot(**tok, "<|im_start|>assistant\n",
                                   {im_end, im_start});
}

// vLLM's streamed text for a tokenizer.model: detokenize_incrementally
// (vllm/transformers_utils/detokenizer_utils.py) emits new_text minus
// prefix_text of its window, both rendered by
// _convert_tokens_to_string_with_added_encoders. Prompt <s> ▁Hello, then
// ▁world: "<s> Hello world" minus "<s> Hello" is " world"; then </s>: window
// ▁world, "world </s>" minus "world" is " </s>" (with "": "world</s>" minus
// "world", "</s>").
TEST(IncrementalDetokenizerTest, OptionsSentencePieceMatchesVllm) {
  auto tok = LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/llama2", 1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<int32_t> prompt = {1};
  const std::vector<int32_t> hello = *(*tok)->Encode("Hello");
  prompt.insert(prompt.end(), hello.begin(), hello.end());
  std::vector<int32_t> generated = *(*tok)->Encode("world");
  generated.push_back(2);
  EXPECT_EQ(StreamWithOptions(**tok, prompt, generated, {false, true}),
            " world </s>");
  EXPECT_EQ(StreamWithOptions(**tok, prompt, generated, {false, false}),
            " world</s>");
  EXPECT_EQ(StreamWithOptions(**tok, prompt, generated, {true, true}),
            " world");
  // Two specials after the text, and text after them.
  generated.push_back(1);
  const std::vector<int32_t> bye = *(*tok)->Encode("Bye");
  generated.insert(generated.end(), bye.begin(), bye.end());
  EXPECT_EQ(StreamWithOptions(**tok, prompt, generated, {false, true}),
            " world </s> <s> Bye");
  EXPECT_EQ(StreamWithOptions(**tok, prompt, generated, {false, false}),
            " world</s><s>Bye");
  EXPECT_EQ(StreamWithOptions(**tok, prompt, generated, {true, false}),
            " world Bye");
  // The bool form keeps Tessera's rendering.
  IncrementalDetokenizer detok(tok->get(), prompt,
                               /*skip_special_tokens=*/false);
  std::string streamed;
  for (int32_t id : generated) streamed += *detok.Append(id);
  streamed += *detok.Finish();
  EXPECT_EQ(streamed, " world</s><s> Bye");
}

// vLLM's fast path (a tokenizer.json) ignores spaces_between_special_tokens.
TEST(IncrementalDetokenizerTest, OptionsByteLevelBpeIgnoresTheSpacesFlag) {
  auto tok = LoadTokenizer(RunfilesRoot() + "/shared/tokenizers/qwen3", -1);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> prompt =
      *(*tok)->Encode("<|im_start|>assistant\n");
  const std::vector<int32_t> generated =
      *(*tok)->Encode("Sure<|im_end|><|im_end|> ok<|im_start|>");
  for (bool skip : {false, true}) {
    const std::string with =
        StreamWithOptions(**tok, prompt, generated, DecodeOptions{skip, true});
    EXPECT_EQ(with, StreamWithOptions(**tok, prompt, generated,
                                      DecodeOptions{skip, false}));
    EXPECT_EQ(with,
              skip ? "Sure ok" : "Sure<|im_end|><|im_end|> ok<|im_start|>");
  }
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
