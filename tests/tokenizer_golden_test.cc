// Tokenizer goldens: Tessera's tokenizers against Hugging Face `tokenizers`,
// transformers and the `sentencepiece` package on a varied corpus
// (tests/fixtures/tokenizer/corpus.jsonl). tools/make_tokenizer_goldens.py
// wrote the reference ids and decodes on a machine with those libraries; every
// id and every decoded string must match.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_paths.h"

namespace tessera {
namespace {

struct GoldenSet {
  std::string name;  // tests/fixtures/tokenizer/<name>.jsonl
  std::string dir;   // The tokenizer folder, relative to the runfiles root.
};

std::vector<GoldenSet> Sets() {
  return {
      {"qwen3", "shared/tokenizers/qwen3"},
      {"llama2_sp", "shared/tokenizers/llama2"},
      {"demo_sp", "shared/models/stories260K"},
      {"llama2_hf", "tessera/tests/fixtures/tokenizer/llama2_hf"},
      {"llama3_style", "tessera/tests/fixtures/tokenizer/llama3_style"},
      {"metaspace", "tessera/tests/fixtures/tokenizer/metaspace"},
  };
}

class TokenizerGoldenTest : public ::testing::TestWithParam<GoldenSet> {};

TEST_P(TokenizerGoldenTest, IdsAndDecodeMatchTheReference) {
  const GoldenSet& set = GetParam();
  auto tokenizer =
      LoadTokenizer(RunfilesRoot() + "/" + set.dir, /*config_bos_id=*/-1);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(FixturesDir() + "/tokenizer/" + set.name + ".jsonl");
  ASSERT_TRUE(in.good()) << set.name;
  std::string line;
  int cases = 0, id_mismatches = 0, decode_mismatches = 0;
  while (std::getline(in, line)) {
    const nlohmann::json golden = nlohmann::json::parse(line);
    const std::string text = golden["text"];
    const std::vector<int32_t> want = golden["ids"];
    ++cases;
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (*ids != want) {
      ++id_mismatches;
      ADD_FAILURE() << set.name << ": ids differ for "
                    << nlohmann::json(text).dump() << "\n  got  "
                    << nlohmann::json(*ids).dump() << "\n  want "
                    << nlohmann::json(want).dump();
    }
    auto decoded = (*tokenizer)->Decode(want, /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (*decoded != golden["decoded"].get<std::string>()) {
      ++decode_mismatches;
      ADD_FAILURE() << set.name << ": decode differs for "
                    << nlohmann::json(text).dump() << "\n  got  "
                    << nlohmann::json(*decoded).dump() << "\n  want "
                    << golden["decoded"].dump();
    }
  }
  EXPECT_GE(cases, 40) << set.name;
  std::cout << set.name << ": " << cases << " texts, " << id_mismatches
            << " id mismatches, " << decode_mismatches
            << " decode mismatches\n";
}

// What a grammar matches the output against: the tokens' bytes, end to end,
// spell the decoded text (a SentencePiece text's first word-boundary space
// aside, which decoding drops).
TEST_P(TokenizerGoldenTest, TokenBytesSpellTheDecodedText) {
  const GoldenSet& set = GetParam();
  auto tokenizer =
      LoadTokenizer(RunfilesRoot() + "/" + set.dir, /*config_bos_id=*/-1);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(FixturesDir() + "/tokenizer/" + set.name + ".jsonl");
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    const nlohmann::json golden = nlohmann::json::parse(line);
    const std::vector<int32_t> ids = golden["ids"];
    std::string bytes;
    bool special = false;
    for (int32_t id : ids) {
      special = special || (*tokenizer)->IsSpecial(id);
      bytes += (*tokenizer)->TokenBytes(id);
    }
    if (special) continue;
    const std::string decoded = golden["decoded"];
    if (bytes != decoded && !bytes.empty() && bytes[0] == ' ' &&
        bytes.substr(1) == decoded) {
      bytes = decoded;
    }
    EXPECT_EQ(bytes, decoded) << set.name << ": " << golden["text"].dump();
    ++checked;
  }
  EXPECT_GE(checked, 20) << set.name;
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerGoldenTest,
                         ::testing::ValuesIn(Sets()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
