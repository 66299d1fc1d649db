#include "runtime/text/hf_tokenizer.h"

#include <sys/stat.h>
#include <utf8proc.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/text/hf_regex.h"
#include "runtime/text/unicode.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

using ::nlohmann::json;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ---------------------------------------------------------------------------
// Helpers.

std::string Qwen3Dir() { return RunfilesRoot() + "/shared/tokenizers/qwen3"; }

// Writes tokenizer.json (and tokenizer_config.json when given) to a fresh
// folder under $TEST_TMPDIR and loads it, as a model folder would be.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromFiles(
    const std::string& name, const std::string& tokenizer_json,
    const std::string& config_json = "") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  const auto write = [&dir](const char* file, const std::string& text) {
    std::FILE* f = std::fopen((dir + "/" + file).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  };
  write("tokenizer.json", tokenizer_json);
  if (!config_json.empty()) write("tokenizer_config.json", config_json);
  return LoadHfTokenizer(dir);
}

std::unique_ptr<Tokenizer> MustLoad(const std::string& name, const json& tok,
                                    const json& config = json()) {
  auto loaded =
      LoadFromFiles(name, tok.dump(), config.is_null() ? "" : config.dump());
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *std::move(loaded) : nullptr;
}

// ---------------------------------------------------------------------------
// Small hand-written tokenizers. Their expected encodings below were produced
// by Hugging Face `tokenizers` 0.23.2 from these exact files.

json SpecialAdded(int id, const std::string& content) {
  return {{"id", id},        {"content", content}, {"single_word", false},
          {"lstrip", false}, {"rstrip", false},    {"normalized", false},
          {"special", true}};
}

json Specials() {
  return json::array({SpecialAdded(0, "<unk>"), SpecialAdded(1, "<s>"),
                      SpecialAdded(2, "</s>")});
}

json Bpe(json vocab, json merges, json extra = json::object()) {
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  model.update(extra);
  return model;
}

json Tok(json model, json normalizer, json pre_tokenizer, json decoder,
         json post_processor = nullptr, json added = Specials()) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", std::move(normalizer)},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", std::move(post_processor)},
          {"decoder", std::move(decoder)},
          {"model", std::move(model)}};
}

// <unk>=0, <s>=1, </s>=2, <0x00>..<0xFF>=3..258, then a few SentencePiece
// style words from 259 on.
json ByteFallbackVocab() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  for (const char* word :
       {"\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "ll",
        "\u2581hell", "\u2581hello", "\u2581w", "or", "\u2581wor",
        "\u2581world", "el", "\u2581he", "\u2581worl"}) {
    const int id = static_cast<int>(vocab.size());
    vocab[word] = id;
  }
  return vocab;
}

json SentencePieceMerges() {
  return {"\u2581 h",    "l l",          "e l",         "\u2581h e",
          "\u2581he ll", "\u2581hell o", "\u2581 w",    "o r",
          "\u2581w or",  "\u2581wor l",  "\u2581worl d"};
}

json LlamaDecoder() {
  return {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"},
             {"pattern", {{"String", "\u2581"}}},
             {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
}

json BosTemplate() {
  return {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens",
           {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
}

json Metaspace(const std::string& scheme, bool split) {
  return {{"type", "Metaspace"},
          {"replacement", "\u2581"},
          {"prepend_scheme", scheme},
          {"split", split}};
}

json SplitPre(json pattern, const std::string& behavior, bool invert) {
  return {{"type", "Split"},
          {"pattern", std::move(pattern)},
          {"behavior", behavior},
          {"invert", invert}};
}

json AddedToken(int id, const std::string& content, bool single_word,
                bool lstrip, bool rstrip, bool normalized, bool special) {
  return {
      {"id", id},          {"content", content}, {"single_word", single_word},
      {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
      {"special", special}};
}

std::map<std::string, json> SmallTokenizers() {
  std::map<std::string, json> t;
  // Mistral-style: Metaspace (prepend "first"), byte fallback, decoder
  // Sequence[Replace, ByteFallback, Fuse, Strip].
  t["metaspace"] =
      Tok(Bpe(ByteFallbackVocab(), SentencePieceMerges(),
              {{"unk_token", "<unk>"},
               {"byte_fallback", true},
               {"fuse_unk", true}}),
          nullptr, Metaspace("first", false), LlamaDecoder(), BosTemplate());
  // Llama-2 "legacy": Prepend + Replace normalizer, no pre-tokenizer, merges
  // given as pairs.
  json pair_merges = json::array();
  for (const json& m : SentencePieceMerges()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    pair_merges.push_back(
        json::array({s.substr(0, space), s.substr(space + 1)}));
  }
  t["prepend"] = Tok(Bpe(ByteFallbackVocab(), pair_merges,
                         {{"unk_token", "<unk>"},
                          {"byte_fallback", true},
                          {"fuse_unk", true}}),
                     {{"type", "Sequence"},
                      {"normalizers",
                       {{{"type", "Prepend"}, {"prepend", "\u2581"}},
                        {{"type", "Replace"},
                         {"pattern", {{"String", " "}}},
                         {"content", "\u2581"}}}}},
                     nullptr, LlamaDecoder(), BosTemplate());
  // Digits (individual) before Metaspace "always", unknown token, no fusing.
  t["digits"] =
      Tok(Bpe({{"<unk>", 0},
               {"<s>", 1},
               {"</s>", 2},
               {"\u2581", 3},
               {"1", 4},
               {"2", 5},
               {"3", 6},
               {"12", 7},
               {"23", 8},
               {"\u25811", 9},
               {"a", 10},
               {"\u2581a", 11},
               {"\u2581123", 12},
               {"\u258112", 13}},
              {"1 2", "2 3", "\u2581 1", "\u2581 a", "\u25811 2", "\u258112 3"},
              {{"unk_token", "<unk>"}}),
          nullptr,
          {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Digits"}, {"individual_digits", true}},
             Metaspace("always", true)}}},
          Metaspace("always", true));
  // Split on "-" with every behavior, and an inverted regex.
  const json split_vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"a", 3},
                            {"b", 4},     {"-", 5},   {"a-", 6},   {"-b", 7},
                            {"--", 8},    {"a-b", 9}, {"--b", 10}, {"a--", 11},
                            {" ", 12},    {"a ", 13}};
  // json::array: a braced list of string pairs would make an object.
  const json split_merges =
      json::array({json::array({"a", "-"}), json::array({"-", "b"}),
                   json::array({"-", "-"}), json::array({"a-", "b"}),
                   json::array({"--", "b"}), json::array({"a-", "-"}),
                   json::array({"a", " "})});
  for (const char* behavior : {"Isolated", "Removed", "MergedWithPrevious",
                               "MergedWithNext", "Contiguous"}) {
    t[std::string("split_") + behavior] =
        Tok(Bpe(split_vocab, split_merges, {{"unk_token", "<unk>"}}), nullptr,
            SplitPre({{"String", "-"}}, behavior, false), nullptr);
  }
  t["split_invert"] =
      Tok(Bpe(split_vocab, split_merges, {{"unk_token", "<unk>"}}), nullptr,
          SplitPre({{"Regex", "[ab]+"}}, "Removed", true), nullptr);
  // "abc" is in the vocabulary, but no merge builds it.
  for (bool flag : {false, true}) {
    t[flag ? "ignore_merges_true" : "ignore_merges_false"] = Tok(
        Bpe({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"bc", 5}},
            json::array({json::array({"a", "b"}), json::array({"b", "c"})}),
            {{"ignore_merges", flag}}),
        nullptr, SplitPre({{"Regex", "\\s+"}}, "Removed", false), nullptr,
        nullptr, json::array());
  }
  // Added tokens with lstrip / rstrip / single_word / normalized.
  t["added"] =
      Tok(Bpe({{"<unk>", 0}, {"a", 1}, {"b", 2}, {" ", 3}, {"x", 4}, {"y", 5}},
              json::array(), {{"unk_token", "<unk>"}}),
          {{"type", "Sequence"},
           {"normalizers", {{{"type", "Lowercase"}}, {{"type", "NFKC"}}}}},
          nullptr, nullptr, nullptr,
          {AddedToken(0, "<unk>", false, false, false, false, true),
           AddedToken(6, "<L>", false, true, false, false, true),
           AddedToken(7, "<R>", false, false, true, false, false),
           AddedToken(8, "Word", true, false, false, true, false),
           AddedToken(9, "<LR>", false, true, true, false, true),
           AddedToken(10, "<L", false, false, false, false, false)});
  // GPT-2 style byte level: ByteLevel(add_prefix_space, use_regex).
  json byte_vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    byte_vocab[unicode::ByteToChar(static_cast<unsigned char>(b))] = b;
  }
  byte_vocab["\u0120h"] = 256;
  byte_vocab["\u0120hi"] = 257;
  byte_vocab["hi"] = 258;
  byte_vocab["\u0120\u0120"] = 259;
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", true},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  t["bytelevel"] =
      Tok(Bpe(byte_vocab, {"\u0120 h", "h i", "\u0120h i", "\u0120 \u0120"}),
          nullptr, byte_level, byte_level, byte_level,
          {AddedToken(260, "<|end|>", false, false, false, false, true)});
  // Continuing-subword prefix and end-of-word suffix, Strip normalizer.
  t["suffix"] =
      Tok(Bpe({{"<unk>", 0},
               {"a", 1},
               {"##b", 2},
               {"##c</w>", 3},
               {"ab", 4},
               {"abc</w>", 5},
               {"a</w>", 6},
               {"##b</w>", 7}},
              {"a ##b", "ab ##c</w>"},
              {{"unk_token", "<unk>"},
               {"continuing_subword_prefix", "##"},
               {"end_of_word_suffix", "</w>"}}),
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
          SplitPre({{"Regex", " "}}, "Removed", false), nullptr, nullptr,
          json::array());
  // Stripping the leading spaces moves the text off offset 0, so Metaspace
  // "first" does not prepend.
  t["strip_first"] =
      Tok(Bpe(ByteFallbackVocab(), SentencePieceMerges(),
              {{"unk_token", "<unk>"}, {"byte_fallback", true}}),
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}},
          Metaspace("first", true), Metaspace("first", true));
  // Oniguruma's ^ and $ match at every line.
  t["replace_anchor"] =
      Tok(Bpe(ByteFallbackVocab(), SentencePieceMerges(),
              {{"unk_token", "<unk>"}, {"byte_fallback", true}}),
          {{"type", "Replace"},
           {"pattern", {{"Regex", "^ +|x$"}}},
           {"content", ""}},
          Metaspace("first", true), LlamaDecoder());
  return t;
}

struct SmallCase {
  const char* tokenizer;
  const char* text;
  std::vector<int32_t> ids;
  const char* decoded;       // Decode(ids)
  const char* decoded_skip;  // Decode(ids, skip_special_tokens=true)
};

// Reference values from Hugging Face `tokenizers`.
const SmallCase kSmallCases[] = {
    {"metaspace", "hello world", {270, 274}, "hello world", "hello world"},
    {"metaspace",
     "h\u00e9llo",
     {267, 198, 172, 268, 263},
     "h\u00e9llo",
     "h\u00e9llo"},
    {"metaspace", " hello", {270}, "hello", "hello"},
    {"metaspace", "<s>hello", {1, 260, 261, 268, 263}, "<s>hello", "hello"},
    {"metaspace",
     "hello<s> world",
     {270, 1, 274},
     "hello<s> world",
     "hello world"},
    {"metaspace", "  hello", {259, 270}, " hello", " hello"},
    {"metaspace",
     "\U0001F600",
     {259, 243, 162, 155, 131},
     "\U0001F600",
     "\U0001F600"},
    {"metaspace", "hello</s>", {270, 2}, "hello</s>", "hello"},
    {"prepend", "hello world", {270, 274}, "hello world", "hello world"},
    {"prepend", " hello", {259, 270}, " hello", " hello"},
    {"prepend", "<s>hello", {1, 270}, "<s> hello", "hello"},
    {"prepend",
     "hello<s> world",
     {270, 1, 259, 274},
     "hello<s>  world",
     "hello  world"},
    {"prepend",
     "hello  world",
     {270, 259, 274},
     "hello  world",
     "hello  world"},
    {"digits", "123", {9, 3, 5, 3, 6}, "1 2 3", "1 2 3"},
    {"digits", "a123", {11, 9, 3, 5, 3, 6}, "a 1 2 3", "a 1 2 3"},
    {"digits", "a 12", {11, 3, 9, 3, 5}, "a  1 2", "a  1 2"},
    {"split_Isolated", "a--b", {3, 5, 5, 4}, "a - - b", "a - - b"},
    {"split_Isolated", "a - b", {13, 5, 12, 4}, "a  -   b", "a  -   b"},
    {"split_Removed", "a--b", {3, 4}, "a b", "a b"},
    {"split_Removed", "-a-", {3}, "a", "a"},
    {"split_MergedWithPrevious", "a-b", {6, 4}, "a- b", "a- b"},
    {"split_MergedWithPrevious", "a--b", {6, 5, 4}, "a- - b", "a- - b"},
    {"split_MergedWithPrevious", "-a-", {5, 6}, "- a-", "- a-"},
    {"split_MergedWithNext", "a-b", {3, 7}, "a -b", "a -b"},
    {"split_MergedWithNext", "a--b", {3, 5, 7}, "a - -b", "a - -b"},
    {"split_MergedWithNext", "ab-ba", {3, 4, 7, 3}, "a b -b a", "a b -b a"},
    {"split_Contiguous", "a--b", {3, 8, 4}, "a -- b", "a -- b"},
    {"split_Contiguous", "-a-", {5, 3, 5}, "- a -", "- a -"},
    {"split_invert", "a - b", {3, 4}, "a b", "a b"},
    {"split_invert", "ab-ba", {3, 4, 4, 3}, "a b b a", "a b b a"},
    {"ignore_merges_false", "abc ab", {3, 2, 3}, "ab c ab", "ab c ab"},
    {"ignore_merges_true", "abc ab", {4, 3}, "abc ab", "abc ab"},
    {"ignore_merges_true", "cab", {2, 3}, "c ab", "c ab"},
    {"added", "a <L> b", {1, 6, 3, 2}, "a <L>   b", "a   b"},
    {"added", "a  <L>", {1, 6}, "a <L>", "a"},
    {"added", "a <R>  b", {1, 3, 7, 2}, "a   <R> b", "a   <R> b"},
    {"added", "x <LR>  y", {4, 9, 5}, "x <LR> y", "x y"},
    {"added", "WORD b", {8, 3, 2}, "word   b", "word   b"},
    {"added", "aWord", {1, 0, 0, 0, 0}, "a <unk> <unk> <unk> <unk>", "a"},
    {"added", "<L", {10}, "<L", "<L"},
    {"added", "a<L>b", {1, 6, 2}, "a <L> b", "a b"},
    {"added", "<LR><LR>", {9, 9}, "<LR> <LR>", ""},
    {"bytelevel", "hi hi", {257, 257}, " hi hi", " hi hi"},
    {"bytelevel", "  hi", {32, 257}, "  hi", "  hi"},
    {"bytelevel", "hi<|end|>hi", {257, 260, 257}, " hi<|end|> hi", " hi hi"},
    {"bytelevel", "h\u00e9", {256, 195, 169}, " h\u00e9", " h\u00e9"},
    {"suffix",
     "abc ab a",
     {5, 1, 7, 6},
     "abc</w> a ##b</w> a</w>",
     "abc</w> a ##b</w> a</w>"},
    {"suffix", "ba", {0, 0}, "<unk> <unk>", "<unk> <unk>"},
    {"strip_first", "hello", {270}, "hello", "hello"},
    {"strip_first", "  hello", {260, 261, 268, 263}, "hello", "hello"},
    {"replace_anchor",
     "hello\n hello",
     {270, 13, 260, 261, 268, 263},
     "hello\nhello",
     "hello\nhello"},
    {"replace_anchor",
     "  hellox\nx",
     {260, 261, 268, 263, 13},
     "hello\n",
     "hello\n"},
};

class SmallTokenizerTest : public ::testing::TestWithParam<SmallCase> {};

TEST_P(SmallTokenizerTest, MatchesHuggingFace) {
  const SmallCase& c = GetParam();
  static const auto* const tokenizers =
      new std::map<std::string, json>(SmallTokenizers());
  const auto json_it = tokenizers->find(c.tokenizer);
  ASSERT_NE(json_it, tokenizers->end()) << c.tokenizer;
  auto tok = LoadHfTokenizerFromJson(json_it->second.dump(), "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ids = (*tok)->Encode(c.text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAreArray(c.ids));
  auto decoded = (*tok)->Decode(c.ids);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, c.decoded);
  auto skipped = (*tok)->Decode(c.ids, /*skip_special_tokens=*/true);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(*skipped, c.decoded_skip);
  // A tokenizer.json is vLLM's fast path: spaces_between_special_tokens
  // changes nothing.
  for (bool spaces : {false, true}) {
    EXPECT_EQ(*(*tok)->Decode(c.ids, DecodeOptions{false, spaces}), c.decoded);
    EXPECT_EQ(*(*tok)->Decode(c.ids, DecodeOptions{true, spaces}),
              c.decoded_skip);
  }
}

INSTANTIATE_TEST_SUITE_P(All, SmallTokenizerTest,
                         ::testing::ValuesIn(kSmallCases),
                         [](const ::testing::TestParamInfo<SmallCase>& info) {
                           return std::string(info.param.tokenizer) + "_" +
                                  std::to_string(info.index);
                         });

TEST(SmallTokenizerTest, ByteFallbackDecoding) {
  auto tok = MustLoad("bytefallback", SmallTokenizers()["metaspace"]);
  ASSERT_NE(tok, nullptr);
  // <0xE5><0x8F><0xAB> is one character; an incomplete sequence becomes one
  // U+FFFD per byte (HF's rule), and the leading space of the first piece is
  // stripped.
  EXPECT_EQ(*tok->Decode({3 + 0xE5, 3 + 0x8F, 3 + 0xAB}), "\u53eb");
  EXPECT_EQ(*tok->Decode({3 + 0xE5, 3 + 0x8F, 261}), "\ufffd\ufffde");
  EXPECT_EQ(*tok->Decode({3 + 0xE5}), "\ufffd");
  EXPECT_EQ(*tok->Decode({1, 3 + 0x61, 2}), "<s>a</s>");
  EXPECT_EQ(*tok->Decode({1, 3 + 0x61, 2}, true), "a");
  EXPECT_EQ(*tok->Decode({259, 259, 260}), " h");
}

TEST(SmallTokenizerTest, BosFromTemplateAndConfig) {
  std::map<std::string, json> t = SmallTokenizers();
  auto tok = MustLoad("bos_template", t["metaspace"]);
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), -1);  // no tokenizer_config.json
  EXPECT_TRUE(tok->IsSpecial(1));
  EXPECT_FALSE(tok->IsSpecial(270));
  EXPECT_EQ(tok->vocab_size(), 278);
  EXPECT_EQ(tok->TokenToId("\u2581hello"), 270);
  EXPECT_EQ(tok->TokenToId("</s>"), 2);
  EXPECT_EQ(tok->TokenToId("nope"), -1);
  // IdToToken is TokenToId's inverse (vLLM's token_strs), added tokens too.
  EXPECT_EQ(tok->IdToToken(270), "\u2581hello");
  EXPECT_EQ(tok->IdToToken(2), "</s>");
  EXPECT_EQ(tok->IdToToken(-1), "");
  EXPECT_EQ(tok->IdToToken(278), "");

  tok = MustLoad("bos_config", t["metaspace"],
                 {{"add_bos_token", false},
                  {"bos_token", {{"content", "<s>"}}},
                  {"eos_token", {{"content", "</s>"}, {"special", true}}}});
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);

  // No template BOS: tokenizer_config names it.
  tok = MustLoad(
      "bos_from_config", t["split_Isolated"],
      {{"add_bos_token", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);

  tok = MustLoad("no_bos", t["split_Isolated"]);
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), -1);
}

TEST(SmallTokenizerTest, CleanUpOnlyWhenForcedForBpe) {
  std::map<std::string, json> t = SmallTokenizers();
  const std::vector<int32_t> ids = {270, 259, 3 + '.'};  // "hello ."
  // transformers 5 ignores clean_up_tokenization_spaces for BPE models...
  auto tok = MustLoad("cleanup_ignored", t["prepend"],
                      {{"clean_up_tokenization_spaces", true}});
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Decode(ids), "hello .");
  // ...unless told to apply it anyway.
  tok = MustLoad(
      "cleanup_forced", t["prepend"],
      {{"clean_up_tokenization_spaces", true},
       {"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_"
        "output",
        true}});
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Decode(ids), "hello.");
}

TEST(SmallTokenizerTest, ConfigMarksAddedTokenSpecial) {
  std::map<std::string, json> t = SmallTokenizers();
  // <R> (id 7) is not special in tokenizer.json; tokenizer_config's
  // added_tokens_decoder says it is, as transformers would register it.
  auto tok = MustLoad("config_special", t["added"],
                      {{"added_tokens_decoder",
                        {{"7", {{"content", "<R>"}, {"special", true}}}}}});
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->IsSpecial(7));
  EXPECT_EQ(*tok->Decode({1, 7}, /*skip_special_tokens=*/true), "a");
}

// ---------------------------------------------------------------------------
// Errors.

absl::Status LoadStatus(const json& tok) {
  return LoadHfTokenizerFromJson(tok.dump(), "").status();
}

TEST(HfTokenizerErrorTest, UnsupportedComponentsAreNamed) {
  json base = SmallTokenizers()["split_Isolated"];

  json t = base;
  t["pre_tokenizer"] = {{"type", "Whitespace"}};
  absl::Status s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.json: pre_tokenizer type "
                                     "\"Whitespace\" is not supported yet"));

  t = base;
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Digits"}}, {{"type", "Punctuation"}}}}};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("\"Punctuation\""));

  t = base;
  t["normalizer"] = {{"type", "BertNormalizer"}};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("normalizer type \"BertNormalizer\""));

  t = base;
  t["decoder"] = {{"type", "WordPiece"}};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("decoder type \"WordPiece\""));

  // Before: a BOS id of 2^32 in the post-processor was read as token 0.
  t = base;
  t["post_processor"] = BosTemplate();
  t["post_processor"]["special_tokens"]["<s>"]["ids"] = {uint64_t{1} << 32};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has no ids"));
  t = base;
  t["post_processor"] = {{"type", "RobertaProcessing"},
                         {"cls", {"<s>", uint64_t{1} << 31}}};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs \"cls\": [token, id]"));

  t = base;
  t["post_processor"] = {{"type", "SomethingNew"}};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("post_processor type \"SomethingNew\""));

  t = base;
  t["model"]["type"] = "Unigram";
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("model type \"Unigram\""));

  t = base;
  t["model"]["dropout"] = 0.1;
  EXPECT_EQ(LoadStatus(t).code(), absl::StatusCode::kUnimplemented);
}

TEST(HfTokenizerErrorTest, MalformedFiles) {
  const std::string good = SmallTokenizers()["split_Isolated"].dump();
  absl::Status s =
      LoadHfTokenizerFromJson(good.substr(0, good.size() / 2), "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("malformed JSON"));
  EXPECT_EQ(LoadHfTokenizerFromJson("[1, 2]", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadHfTokenizerFromJson(good, "{not json").status().code(),
            absl::StatusCode::kInvalidArgument);

  json t = SmallTokenizers()["split_Isolated"];
  t["model"]["merges"].push_back(json::array({"a", "zzz"}));
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("zzz"));

  t = SmallTokenizers()["split_Isolated"];
  t["model"]["merges"] = json::array({"a - b"});
  EXPECT_EQ(LoadStatus(t).code(), absl::StatusCode::kInvalidArgument);

  t = SmallTokenizers()["split_Isolated"];
  t["model"]["vocab"]["a"] = "three";
  EXPECT_EQ(LoadStatus(t).code(), absl::StatusCode::kInvalidArgument);

  t = SmallTokenizers()["split_Isolated"];
  t["pre_tokenizer"]["pattern"] = {{"Regex", "(unclosed"}};
  s = LoadStatus(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(unclosed"));

  t = SmallTokenizers()["split_Isolated"];
  t["pre_tokenizer"]["behavior"] = "Sideways";
  EXPECT_EQ(LoadStatus(t).code(), absl::StatusCode::kInvalidArgument);

  t = SmallTokenizers()["split_Isolated"];
  t["added_tokens"][0]["content"] = 5;
  EXPECT_EQ(LoadStatus(t).code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfTokenizerErrorTest, MissingFolder) {
  EXPECT_EQ(LoadHfTokenizer("/nonexistent/folder").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(HfTokenizerErrorTest, BadInputAndIds) {
  auto tok =
      LoadHfTokenizerFromJson(SmallTokenizers()["split_Isolated"].dump(), "");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->Encode("a\xFF").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Past the vocabulary (a model's padded rows): no text, as in Hugging Face.
  EXPECT_EQ(*(*tok)->Decode({99}), "");
  EXPECT_EQ((*tok)->Decode({-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// The real Qwen3 tokenizer.

class Qwen3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = LoadHfTokenizer(Qwen3Dir());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static Tokenizer* tok_;
};
Tokenizer* Qwen3Test::tok_ = nullptr;

TEST_F(Qwen3Test, Vocabulary) {
  EXPECT_EQ(tok_->vocab_size(), 151669);
  EXPECT_EQ(tok_->TokenToId("Hello"), 9707);
  EXPECT_EQ(tok_->TokenToId("\u0120world"), 1879);  // " world"
  EXPECT_EQ(tok_->TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ(tok_->TokenToId("not a token"), -1);
  EXPECT_TRUE(tok_->IsSpecial(151644));
  EXPECT_TRUE(tok_->IsSpecial(151645));
  EXPECT_FALSE(tok_->IsSpecial(151657));  // <tool_call> is not special
  EXPECT_FALSE(tok_->IsSpecial(9707));
  // tokenizer_config.json: eos "<|im_end|>", no BOS, add_bos_token false.
  EXPECT_EQ(tok_->eos_id(), 151645);
  EXPECT_EQ(tok_->bos_id(), -1);
  EXPECT_FALSE(tok_->add_bos());
}

// Qwen checkpoints pad the embedding to 151,936 rows: the ids past the
// tokenizer's 151,669 decode to nothing (Hugging Face's decode gives "").
TEST_F(Qwen3Test, IdsPastTheVocabularyDecodeToNothing) {
  EXPECT_EQ(*tok_->Decode({151669}), "");
  EXPECT_EQ(*tok_->Decode({9707, 151700, 151935, 1879}, true), "Hello world");
  EXPECT_FALSE(tok_->Decode({9707, -3}).ok());
}

struct KnownEncoding {
  const char* text;
  std::vector<int32_t> ids;
};

TEST_F(Qwen3Test, KnownEncodings) {
  // "Hello"=9707 and " world"=1879 read from the vocabulary; the rest from
  // Hugging Face `tokenizers` on this file.
  const KnownEncoding cases[] = {
      {"Hello world", {9707, 1879}},
      {"<|im_start|>user\nhi<|im_end|>", {151644, 872, 198, 6023, 151645}},
      {"  Hello  world  ", {220, 21927, 220, 1879, 256}},
      {"I'm here, you're there, he's 'S' 'LL 'Ve 'd 'M 'T 'Re",
       {40,  2776, 1588, 11,    498, 2299, 1052, 11, 566, 594, 364, 50, 6,
        364, 4086, 364,  42612, 364, 67,   364,  44, 364, 51,  364, 693}},
      {"1234567", {16, 17, 18, 19, 20, 21, 22}},
      {"\u4f60\u597d\uff0c\u4e16\u754c\uff01", {108386, 3837, 99489, 6313}},
      {"a\r\nb\r\n\r\nc", {64, 319, 65, 871, 66}},
      // NFC: the decomposed forms and U+212B encode like the composed ones.
      {"caf\u00e9 cafe\u0301 \u00c5 A\u030a \u212b",
       {924, 58858, 51950, 79252, 79252, 79252}},
      {"<think>\nok\n</think>\n\nans",
       {151667, 198, 562, 198, 151668, 271, 596}},
      {"def f(x):\n    return x**2  # square\n\n\nclass A:\n\tpass\n",
       {750, 282, 2075, 982, 262, 470, 856, 334, 17, 220, 671, 9334, 1406, 1040,
        362, 510, 41431, 198}},
      {"a\u0085b", {64, 126, 227, 65}},
      {"!\u00a0\u00a0x", {0, 4102, 4102, 87}},
  };
  for (const KnownEncoding& c : cases) {
    auto ids = tok_->Encode(c.text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(c.ids)) << c.text;
  }
}

TEST_F(Qwen3Test, EmptyText) {
  auto ids = tok_->Encode("");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, IsEmpty());
  EXPECT_EQ(*tok_->Decode({}), "");
}

TEST_F(Qwen3Test, DecodeSpecialTokens) {
  const std::vector<int32_t> ids = {151644, 872, 198, 6023, 151645};
  EXPECT_EQ(*tok_->Decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(*tok_->Decode(ids, /*skip_special_tokens=*/true), "user\nhi");
  // Non-special added tokens stay.
  EXPECT_EQ(*tok_->Decode({151657, 9707, 151644}, true), "<tool_call>Hello");
}

// vLLM's fast path (FastIncrementalDetokenizer over tokenizers' DecodeStream)
// gives the same text whatever spaces_between_special_tokens says: its one
// use of the flag, an added token right after an added token printed as its
// content, is what ByteLevel decoding prints for <|im_end|> anyway.
TEST_F(Qwen3Test, DecodeIgnoresSpacesBetweenSpecialTokens) {
  const std::vector<int32_t> ids = {151644, 872,    198,  6023,  151645,
                                    151645, 151657, 9707, 151644};
  for (bool skip : {false, true}) {
    const std::string expected = *tok_->Decode(ids, skip);
    for (bool spaces : {false, true}) {
      EXPECT_EQ(*tok_->Decode(ids, DecodeOptions{skip, spaces}), expected);
      EXPECT_EQ(*tok_->DecodeSuffix(ids, 4, DecodeOptions{skip, spaces}),
                *tok_->DecodeSuffix(ids, 4, skip));
    }
  }
  EXPECT_EQ(*tok_->Decode(ids, DecodeOptions{false, true}),
            "<|im_start|>user\nhi<|im_end|><|im_end|><tool_call>Hello"
            "<|im_start|>");
}

TEST_F(Qwen3Test, DecodeIncompleteUtf8) {
  // 126 is byte 0xC2 alone: a lone lead byte decodes to U+FFFD.
  EXPECT_EQ(*tok_->Decode({126}), "\ufffd");
  EXPECT_EQ(*tok_->Decode({64, 126}), "a\ufffd");
  EXPECT_EQ(*tok_->Decode({64, 126, 227, 65}), "a\u0085b");
  EXPECT_EQ(tok_->Decode({-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(Qwen3Test, ByteLevelRoundTrip) {
  // Any NFC text survives encode + decode byte for byte.
  using std::string_literals::operator""s;
  const std::string texts[] = {
      "Hello, world! \u4f60\u597d\uff0c\u4e16\u754c\uff01",
      "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family, "
      "\U0001F44D\U0001F3FD \U0001F1FA\U0001F1F8",
      "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644"
      "\u0645 \u05e9\u05dc\u05d5\u05dd",
      "line one\r\nline two\r\n\r\n\ttabbed\t\tend  ",
      "\u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14"
      "\u0e35 \ud55c\uad6d\uc5b4",
      "\0 nul \x01\x1b[0m \x7f"s,
      "   ",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>",
      "$100.00 \u20ac50 \u00a520 \u2460\u2461 \u00bd \ufb01",
  };
  for (const std::string& s : texts) {
    auto ids = tok_->Encode(s);
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto decoded = tok_->Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, s);
  }
}

TEST_F(Qwen3Test, LongInputsAndThreads) {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    text += "The quick brown fox " + std::to_string(i) +
            " jumps over the lazy dog. \u4e2d\u6587 \U0001F600\n";
  }
  text += std::string(5000, 'a') + std::string(3000, ' ') + "end";
  auto expected = tok_->Encode(text);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(*tok_->Decode(*expected), text);
  // Encode is const and thread-safe: every thread sees the same ids.
  std::vector<std::thread> threads;
  // One bool object per thread: std::vector<bool> packs them into one word,
  // and four threads writing its bits race (TSan).
  std::array<bool, 4> same{};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int i = 0; i < 5; ++i) {
        auto ids = tok_->Encode(text);
        ok = ok && ids.ok() && *ids == *expected;
      }
      same[t] = ok;
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(same, ElementsAre(true, true, true, true));
}

// ---------------------------------------------------------------------------
// Regex translation and matching.

std::vector<std::string> Matches(const std::string& pattern,
                                 const std::string& text) {
  auto re = Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status();
  std::vector<RegexMatch> found;
  EXPECT_TRUE((*re)->FindAll(text, &found).ok());
  std::vector<std::string> out;
  for (const RegexMatch& m : found) {
    out.push_back(text.substr(m.begin, m.end - m.begin));
  }
  return out;
}

TEST(RegexTest, TranslatesOnigurumaEscapes) {
  EXPECT_EQ(*TranslateOnigurumaPattern("\\s+(?!\\S)"),
            "[\\p{Z}\\t-\\r\\x{85}]+(?![^\\p{Z}\\t-\\r\\x{85}])");
  EXPECT_EQ(*TranslateOnigurumaPattern("[^\\s\\p{L}]"),
            "[^\\p{Z}\\t-\\r\\x{85}\\p{L}]");
  EXPECT_EQ(*TranslateOnigurumaPattern("\\u2581x\\\\s"), "\\x{2581}x\\\\s");
  EXPECT_EQ(TranslateOnigurumaPattern("[\\S]").status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(TranslateOnigurumaPattern("[a-z&&[^aeiou]]").status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(RegexTest, ModelPatternsBehaveLikeOniguruma) {
  const std::string llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  EXPECT_THAT(Matches(llama3, "I'LL pay 12345 $, ok?\n\n  x"),
              ElementsAre("I", "'LL", " pay", " ", "123", "45", " $,", " ok",
                          "?\n\n", " ", " x"));
  // Qwen's is the same with single digits.
  const std::string qwen =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  EXPECT_THAT(Matches(qwen, "x42\u4e2d\u6587"),
              ElementsAre("x", "4", "2", "\u4e2d\u6587"));
  // \s is White_Space: U+0085 is, U+180E and U+200B are not.
  EXPECT_THAT(Matches("\\s", "a\u0085b\u180ec\u200bd\u3000"),
              ElementsAre("\u0085", "\u3000"));
  // ^ and $ match at every line, as in Oniguruma.
  EXPECT_THAT(Matches("^a|b$", "ab\nab"), ElementsAre("a", "b", "a", "b"));
}

TEST(RegexTest, EmptyMatchesAdvanceLikeOniguruma) {
  // An empty match right after a match is skipped, not repeated forever.
  EXPECT_THAT(Matches("a*", "baab"), ElementsAre("", "aa", ""));
}

// ---------------------------------------------------------------------------
// Unicode helpers.

TEST(UnicodeTest, LossyDecodingReplacesMaximalSubparts) {
  EXPECT_EQ(unicode::Utf8Lossy("ok"), "ok");
  EXPECT_EQ(unicode::Utf8Lossy("\xE5\x8F"), "\ufffd");
  EXPECT_EQ(unicode::Utf8Lossy("\xF0\x80x"), "\ufffd\ufffdx");
  EXPECT_EQ(unicode::Utf8Lossy("\xED\xA0\x80"), "\ufffd\ufffd\ufffd");
  EXPECT_EQ(unicode::Utf8Lossy("\xC2"), "\ufffd");
  EXPECT_TRUE(unicode::IsValidUtf8("\u4e2d\U0001F600"));
  EXPECT_FALSE(unicode::IsValidUtf8("\xC0\xAF"));
}

TEST(UnicodeTest, LowercaseIsFullMapping) {
  EXPECT_EQ(unicode::ToLower("\u0130I\u03a3\u1e9e"), "i\u0307i\u03c3\u00df");
}

// The fast path that skips stable characters must agree with normalizing the
// whole text with utf8proc.
TEST(UnicodeTest, NormalizeFastPathMatchesUtf8proc) {
  const char32_t alphabet[] = {
      'a',    'e',    'A',    ' ',    '\n',   0x0301,  0x0308,  0x0323,
      0x0327, 0x00e9, 0x00c5, 0x212b, 0x1100, 0x1161,  0x11a8,  0xac00,
      0xd4db, 0x0b47, 0x0b3e, 0x0cc6, 0x0cc2, 0x0915,  0x093c,  0x0958,
      0xfb01, 0x2460, 0x00bd, 0x3000, 0x4e2d, 0x1f600, 0x0344,  0x1e9b,
      0x0f73, 0x2126, 0xff21, 0x0627, 0x0653, 0x05b8,  0x1d15e, 0x0345};
  std::mt19937 rng(7);
  const unicode::NormalizationForm forms[] = {
      unicode::NormalizationForm::kNfc, unicode::NormalizationForm::kNfd,
      unicode::NormalizationForm::kNfkc, unicode::NormalizationForm::kNfkd};
  const int options[] = {
      UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
      UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
      UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int length = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < length; ++i) {
      unicode::AppendUtf8(alphabet[rng() % std::size(alphabet)], &text);
    }
    for (int f = 0; f < 4; ++f) {
      utf8proc_uint8_t* mapped = nullptr;
      const utf8proc_ssize_t n = utf8proc_map(
          reinterpret_cast<const utf8proc_uint8_t*>(text.data()), text.size(),
          &mapped, static_cast<utf8proc_option_t>(options[f]));
      ASSERT_GE(n, 0);
      const std::string expected(reinterpret_cast<char*>(mapped), n);
      std::free(mapped);
      ASSERT_EQ(unicode::Normalize(text, forms[f]), expected)
          << "form " << f << " text " << text;
    }
  }
}

// --- EncodeAtMost ------------------------------------------------------------

// Texts of the shapes that matter: words, added tokens, long words, runs of
// spaces and newlines, non-ASCII (normalized), digits.
std::vector<std::string> AtMostTexts() {
  std::string long_text;
  for (int i = 0; i < 400; ++i) {
    absl::StrAppend(&long_text, "Line ", i, ": héllo wörld,   tabs\t\tand ",
                    "<|im_start|>user\n", std::string(i % 7, ' '), "\n");
  }
  return {"",
          "Hello world",
          "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
          std::string(3000, 'a'),
          std::string(5000, ' ') + "x",
          "e\xcc\x81t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e 12345678",
          long_text};
}

void ExpectEncodeAtMostMatchesEncode(const Tokenizer& tok) {
  for (const std::string& text : AtMostTexts()) {
    absl::StatusOr<std::vector<int32_t>> full = tok.Encode(text);
    ASSERT_TRUE(full.ok()) << full.status();
    const int64_t n = static_cast<int64_t>(full->size());
    for (int64_t limit : {n, n + 1, n * 2 + 10}) {
      absl::StatusOr<std::vector<int32_t>> at_most =
          tok.EncodeAtMost(text, limit);
      ASSERT_TRUE(at_most.ok()) << at_most.status();
      EXPECT_EQ(*at_most, *full) << text.substr(0, 40);
    }
    for (int64_t limit : {n - 1, n / 2, int64_t{0}}) {
      if (limit < 0 || limit >= n) continue;
      absl::StatusOr<std::vector<int32_t>> at_most =
          tok.EncodeAtMost(text, limit);
      EXPECT_EQ(at_most.status().code(), absl::StatusCode::kOutOfRange)
          << text.substr(0, 40) << " limit " << limit;
    }
  }
}

TEST(HfEncodeAtMostTest, SameIdsAsEncodeOnTheFixtures) {
  for (auto& [name, tok_json] : SmallTokenizers()) {
    SCOPED_TRACE(name);
    auto tok = LoadFromFiles("atmost_" + name, tok_json.dump());
    ASSERT_TRUE(tok.ok()) << tok.status();
    ExpectEncodeAtMostMatchesEncode(**tok);
  }
}

TEST_F(Qwen3Test, EncodeAtMostMatchesEncode) {
  ExpectEncodeAtMostMatchesEncode(*tok_);
}

// 50 MB against a 40,960-token limit: refused after about the limit's worth
// of work. Without the early stop, one word of 50 MB alone takes minutes of
// BPE merging and gigabytes of memory; here every shape finishes at once (the
// time is in the log, not asserted).
TEST_F(Qwen3Test, EncodeAtMostGivesUpEarlyOnHugeText) {
  constexpr size_t kBytes = size_t{50} << 20;
  std::string words;
  while (words.size() < kBytes) words += "The quick brown fox jumps. ";
  std::string specials;
  while (specials.size() < kBytes) specials += "<|im_start|>";
  const std::vector<std::pair<const char*, std::string>> inputs = {
      {"words", std::move(words)},
      {"one word", std::string(kBytes, 'a')},
      {"spaces", std::string(kBytes, ' ')},
      {"newlines", std::string(kBytes, '\n')},
      {"added tokens", std::move(specials)},
  };
  for (const auto& [name, text] : inputs) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<int32_t>> ids = tok_->EncodeAtMost(text, 40960);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::printf("EncodeAtMost(50 MB of %s, 40960): %.3f s\n", name, seconds);
    if (std::string(name) == "spaces") {
      // PCRE2 gives up on one 50 MB whitespace run (\s+(?!\S)) before the
      // model sees it, as Encode does: a clear 400, not a crash or a 429.
      EXPECT_TRUE(ids.status().code() == absl::StatusCode::kOutOfRange ||
                  ids.status().code() == absl::StatusCode::kInvalidArgument)
          << ids.status();
      continue;
    }
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kOutOfRange) << name;
    EXPECT_EQ(ids.status().message(), "the text has more than 40960 tokens");
  }
}

}  // namespace
}  // namespace tessera
