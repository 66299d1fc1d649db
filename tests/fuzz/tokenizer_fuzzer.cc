// tokenizer.json loading and encode/decode (runtime/text/hf_tokenizer.h).
// An input that starts with '{' is a tokenizer.json (loaded, then used on a
// fixed text); any other input is text for a small fixed byte-level BPE
// tokenizer, encoded and decoded, and also read as token ids to decode.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/text/hf_tokenizer.h"
#include "runtime/text/tokenizer.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

// A byte-level BPE (GPT-2 style): every byte is a token, a few merges.
std::string FixedTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  // GPT-2's byte-to-unicode map: printable bytes map to themselves, the
  // rest to U+0100 onwards.
  int next = 0;
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    vocab[utf8(printable ? b : 256 + next++)] = b;
  }
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["<|end|>"] = 259;
  const nlohmann::json tok = {{"version", "1.0"},
                              {"truncation", nullptr},
                              {"padding", nullptr},
                              {"added_tokens",
                               {{{"id", 259},
                                 {"content", "<|end|>"},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}}}},
                              {"normalizer", nullptr},
                              {"pre_tokenizer",
                               {{"type", "ByteLevel"},
                                {"add_prefix_space", false},
                                {"trim_offsets", true},
                                {"use_regex", true}}},
                              {"post_processor", nullptr},
                              {"decoder",
                               {{"type", "ByteLevel"},
                                {"add_prefix_space", true},
                                {"trim_offsets", true},
                                {"use_regex", true}}},
                              {"model",
                               {{"type", "BPE"},
                                {"dropout", nullptr},
                                {"unk_token", nullptr},
                                {"continuing_subword_prefix", nullptr},
                                {"end_of_word_suffix", nullptr},
                                {"fuse_unk", false},
                                {"byte_fallback", false},
                                {"ignore_merges", false},
                                {"vocab", vocab},
                                {"merges", {"h e", "l l", "he ll"}}}}};
  return tok.dump();
}

void Exercise(const tessera::Tokenizer& t, absl::string_view text) {
  auto ids = t.Encode(text);
  if (ids.ok()) (void)t.Decode(*ids, /*skip_special_tokens=*/true);
  (void)t.EncodeAtMost(text, 16);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  if (!input.empty() && input[0] == '{') {
    auto t = tessera::LoadHfTokenizerFromJson(input, "");
    if (t.ok()) Exercise(**t, "hello <|end|> world \xc3\xa9\xff");
    return 0;
  }
  static const std::unique_ptr<tessera::Tokenizer>* const fixed = [] {
    auto t = tessera::LoadHfTokenizerFromJson(FixedTokenizerJson(), "");
    if (!t.ok()) __builtin_trap();  // The fixed tokenizer must load.
    return new std::unique_ptr<tessera::Tokenizer>(*std::move(t));
  }();
  Exercise(**fixed, input);
  // The bytes as ids (any int32, in or out of the vocabulary).
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  (void)(*fixed)->Decode(ids, /*skip_special_tokens=*/false);
  return 0;
}
