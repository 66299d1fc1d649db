#include "runtime/text/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"
#include "runtime/text/hf_tokenizer.h"
#include "runtime/text/sentencepiece_shim.h"

namespace tessera {
namespace {

// Whether `path` names anything: a FIFO or directory in a tokenizer file's
// place is then refused by name when read (ReadRegularFile), not skipped.
bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Open(
      const std::string& path) {
    auto tok = std::make_unique<SentencePieceTokenizer>();
    // Read here, not by SentencePiece's own open(): a FIFO in the model's
    // place must be refused, not waited on.
    ASSIGN_OR_RETURN(const std::string bytes, ReadRegularFile(path));
    std::string error;
    if (!tok->processor_.LoadFromBytes(bytes, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot load SentencePiece model ", path, ": ", error));
    }
    for (int id = 0; id < tok->processor_.PieceSize(); ++id) {
      tok->max_piece_bytes_ =
          std::max(tok->max_piece_bytes_, tok->processor_.IdToPiece(id).size());
    }
    return tok;
  }

  // SentencePiece splits the (normalized) text at whitespace before it
  // merges, and encodes a word after a space as it encodes the word alone
  // (the dummy prefix stands for the space). So the text is encoded in
  // chunks cut at single spaces between words, left to right, until more
  // than `max_tokens` ids are certain; a text that fits is then encoded
  // whole, so its ids are exactly Encode's. A run without such a space is
  // refused unencoded when even its fewest possible ids (a piece covers at
  // most its own bytes of printable ASCII, which normalization keeps; a
  // factor of 4 to spare) would not fit. Known gap: a huge run of only
  // whitespace or non-ASCII text without single spaces is encoded whole.
  absl::StatusOr<std::vector<int32_t>> EncodeAtMost(
      absl::string_view text, int64_t max_tokens) const override {
    max_tokens = std::max<int64_t>(max_tokens, 0);
    auto too_many = [max_tokens] {
      return absl::OutOfRangeError(
          absl::StrCat("the text has more than ", max_tokens, " tokens"));
    };
    constexpr size_t kChunkBytes = 16 << 10;
    const size_t max_covered = std::max<size_t>(max_piece_bytes_, 1) * 4;
    // Normalization may drop whitespace and control characters
    // (remove_extra_whitespaces, nmt_nfkc), never printable ASCII.
    auto kept = [](char c) { return c > ' ' && c < 0x7f; };
    int64_t count = 0;
    size_t pos = 0;
    while (text.size() - pos > kChunkBytes) {
      size_t cut = pos + kChunkBytes;
      size_t sure = 0;  // bytes since `pos` that surely need ids
      for (size_t i = pos; i < cut; ++i) sure += kept(text[i]);
      while (
          cut + 1 < text.size() &&
          !(text[cut] == ' ' && text[cut - 1] != ' ' && text[cut + 1] != ' ')) {
        sure += kept(text[cut]);
        ++cut;
        if (sure / max_covered > static_cast<size_t>(max_tokens - count)) {
          return too_many();
        }
      }
      if (cut + 1 >= text.size()) break;
      ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                       Encode(text.substr(pos, cut - pos)));
      count += static_cast<int64_t>(ids.size());
      if (count > max_tokens) return too_many();
      pos = cut + 1;  // the space is the next word's dummy prefix
    }
    size_t sure = 0;
    for (size_t i = pos; i < text.size(); ++i) sure += kept(text[i]);
    if (sure / max_covered > static_cast<size_t>(max_tokens - count)) {
      return too_many();
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(text));
    if (static_cast<int64_t>(ids.size()) > max_tokens) return too_many();
    return ids;
  }

  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const override {
    std::vector<int> ids;
    std::string error;
    if (!processor_.Encode(std::string(text), &ids, &error)) {
      return absl::InternalError(absl::StrCat("SentencePiece encode: ", error));
    }
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // SentencePiece itself renders control pieces (<s>, </s>) as nothing. Like
  // transformers, Tessera prints their text unless asked to skip special
  // tokens, decoding the ordinary pieces between them in runs so
  // SentencePiece's space handling stays intact.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const override {
    std::string text;
    std::vector<int> run;
    auto flush = [&]() -> absl::Status {
      if (run.empty()) return absl::OkStatus();
      std::string piece_text, error;
      if (!processor_.Decode(run, &piece_text, &error)) {
        return absl::InternalError(
            absl::StrCat("SentencePiece decode: ", error));
      }
      // SentencePiece drops the word-boundary space of a run's first piece,
      // which is right only at the very start of the text (transformers'
      // Metaspace decoder strips only there).
      if (!text.empty() &&
          absl::StartsWith(processor_.IdToPiece(run[0]), "\xE2\x96\x81")) {
        text += ' ';
      }
      text += piece_text;
      run.clear();
      return absl::OkStatus();
    };
    for (int32_t id : ids) {
      if (id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is negative"));
      }
      // An id of the model's padded vocabulary beyond the tokenizer's: no
      // text, as Hugging Face decodes it.
      if (id >= vocab_size()) continue;
      if (processor_.IsControl(id)) {
        RETURN_IF_ERROR(flush());
        if (!skip_special_tokens) text += processor_.IdToPiece(id);
        continue;
      }
      run.push_back(id);
    }
    RETURN_IF_ERROR(flush());
    return text;
  }

  // vLLM's rendering (see tokenizer.h): vLLM's slow detokenizer,
  // vllm/transformers_utils/detokenizer_utils.py's
  // _convert_tokens_to_string_with_added_encoders, which
  // detokenize_incrementally uses for a slow tokenizer with added tokens. The
  // added tokens are transformers' get_added_vocab() for a LlamaTokenizer:
  // <unk>, <s>, </s> — here the control pieces and the unknown piece. With
  // skip_special_tokens, convert_ids_to_tokens drops them (all_special_ids
  // holds all three) before any cutting, so they neither print nor cut a run.
  // A run is LlamaTokenizer.convert_tokens_to_string of its pieces, which is
  // sentencepiece's decode: its first word-boundary space is dropped.
  absl::StatusOr<std::string> DecodeWithOptions(
      absl::Span<const int32_t> ids,
      const DecodeOptions& options) const override {
    std::vector<std::string> segments;
    std::vector<int> run;
    auto flush = [&]() -> absl::Status {
      if (run.empty()) return absl::OkStatus();
      std::string run_text, error;
      if (!processor_.Decode(run, &run_text, &error)) {
        return absl::InternalError(
            absl::StrCat("SentencePiece decode: ", error));
      }
      // Even an empty run is a segment, as in vLLM (" ".join keeps it).
      segments.push_back(std::move(run_text));
      run.clear();
      return absl::OkStatus();
    };
    for (int32_t id : ids) {
      if (id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is negative"));
      }
      // An id of the model's padded vocabulary beyond the tokenizer's: no
      // text and no cut (vLLM's out-of-range token is "", an ordinary piece).
      if (id >= vocab_size()) continue;
      if (processor_.IsControl(id) || id == processor_.UnkId()) {
        if (options.skip_special_tokens) continue;
        RETURN_IF_ERROR(flush());
        segments.push_back(processor_.IdToPiece(id));
        continue;
      }
      run.push_back(id);
    }
    RETURN_IF_ERROR(flush());
    return absl::StrJoin(segments,
                         options.spaces_between_special_tokens ? " " : "");
  }

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && processor_.IsControl(id);
  }

  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size() || processor_.IsControl(id) ||
        id == processor_.UnkId()) {
      return std::string();
    }
    const std::string piece = processor_.IdToPiece(id);
    if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 &&
        piece[5] == '>') {
      int byte = 0;
      if (absl::SimpleHexAtoi(piece.substr(3, 2), &byte)) {
        return std::string(1, static_cast<char>(byte));
      }
    }
    // U+2581 stands for the space before a word.
    return absl::StrReplaceAll(piece, {{"\xE2\x96\x81", " "}});
  }

  int32_t TokenToId(absl::string_view token) const override {
    const int id = processor_.PieceToId(std::string(token));
    if (id == processor_.UnkId() && processor_.IdToPiece(id) != token)
      return -1;
    return id;
  }

  std::string IdToToken(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return std::string();
    return processor_.IdToPiece(id);
  }

  int32_t vocab_size() const override { return processor_.PieceSize(); }
  int32_t bos_id() const override { return processor_.BosId(); }
  int32_t eos_id() const override { return processor_.EosId(); }

 private:
  SentencePieceShim processor_;
  size_t max_piece_bytes_ = 0;  // the longest piece
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& model_dir, int64_t config_bos_id) {
  // Like transformers, prefer tokenizer.json (the "fast" tokenizer) when a
  // folder has both.
  if (FileExists(model_dir + "/tokenizer.json")) {
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                     LoadHfTokenizer(model_dir));
    return tokenizer;
  }
  const std::string sp_path = model_dir + "/tokenizer.model";
  if (!FileExists(sp_path)) {
    return absl::NotFoundError(
        absl::StrCat("no tokenizer.json or tokenizer.model in ", model_dir));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> tok,
                   SentencePieceTokenizer::Open(sp_path));
  bool add_bos = config_bos_id >= 0 || tok->bos_id() >= 0;
  const std::string tc_path = model_dir + "/tokenizer_config.json";
  if (FileExists(tc_path)) {
    ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(tc_path));
    const nlohmann::json tc = nlohmann::json::parse(
        text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (tc.is_discarded() || !tc.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(tc_path, " is not a JSON object"));
    }
    auto it = tc.find("add_bos_token");
    if (it != tc.end() && it->is_boolean()) add_bos = it->get<bool>();
  }
  tok->set_add_bos(add_bos);
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace tessera
