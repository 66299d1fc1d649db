#include "runtime/text/tokenizer.h"

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"
#include "runtime/text/hf_tokenizer.h"
#include "runtime/text/sentencepiece_shim.h"

namespace tessera {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Open(
      const std::string& path) {
    auto tok = std::make_unique<SentencePieceTokenizer>();
    std::string error;
    if (!tok->processor_.Load(path, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot load SentencePiece model ", path, ": ", error));
    }
    return tok;
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

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && processor_.IsControl(id);
  }

  int32_t TokenToId(absl::string_view token) const override {
    const int id = processor_.PieceToId(std::string(token));
    if (id == processor_.UnkId() && processor_.IdToPiece(id) != token)
      return -1;
    return id;
  }

  int32_t vocab_size() const override { return processor_.PieceSize(); }
  int32_t bos_id() const override { return processor_.BosId(); }
  int32_t eos_id() const override { return processor_.EosId(); }

 private:
  SentencePieceShim processor_;
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
    std::ifstream in(tc_path);
    const nlohmann::json tc =
        nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
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
