#include "runtime/text/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"
#include "runtime/text/bpe.h"
#include "runtime/text/hf_pipeline.h"
#include "runtime/text/unicode.h"

namespace tessera {
namespace {

using nlohmann::json;

// Not fopen(): a FIFO named tokenizer.json must be refused, not waited on.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadRegularFile(path);
}

// ---------------------------------------------------------------------------
// tokenizer.json reader.
//
// A DOM of the whole file would hold ~300k small JSON values for the
// vocabulary and merges of a large model only to copy them into hash maps, and
// take most of the load time. This SAX handler streams model.vocab and
// model.merges straight into their final form and builds a DOM of the rest.
class TokenizerJsonReader final : public nlohmann::json_sax<json> {
 public:
  json root;
  BpeModel::Vocab vocab;
  BpeModel::Merges merges;
  bool has_vocab = false;
  bool has_merges = false;
  std::string error;

  // `json_bytes`: the file's size, from which the vocabulary and merge counts
  // are guessed so their containers grow at most once or twice.
  explicit TokenizerJsonReader(size_t json_bytes)
      : size_hint_(json_bytes / 64) {}

  bool null() override { return Value(nullptr); }
  bool boolean(bool v) override { return Value(v); }
  bool number_integer(number_integer_t v) override { return Value(v); }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
        return Fail(absl::StrCat("model.vocab id ", v, " is too large"));
      }
      // A repeated token keeps its last id, as HF's map insertion does.
      vocab.insert_or_assign(std::move(vocab_key_), static_cast<int32_t>(v));
      return true;
    }
    return Value(v);
  }
  bool number_float(number_float_t v, const string_t&) override {
    return Value(v);
  }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      // "left right": exactly one space, as HF requires.
      const size_t space = v.find(' ');
      if (space == std::string::npos || v.find(' ', space + 1) != v.npos) {
        return Fail(absl::StrCat("model.merges entry ", merges.size(), " (\"",
                                 v, "\") is not two tokens split by a space"));
      }
      merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return Value(std::move(v));
  }
  bool binary(binary_t&) override { return Fail("unexpected binary value"); }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) return Fail(Where() + " holds an object");
    if (AtModelKey("vocab")) {
      mode_ = Mode::kVocab;
      has_vocab = true;
      vocab.reserve(size_hint_);
      return true;
    }
    const bool is_model = stack_.size() == 1 && key_ == "model";
    json* obj = Insert(json::object());
    if (obj == nullptr) return false;
    stack_.push_back(obj);
    if (is_model) model_ = obj;
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) return Fail(Where() + " holds a list");
    if (AtModelKey("merges")) {
      mode_ = Mode::kMerges;
      has_merges = true;
      merges.reserve(size_hint_);
      return true;
    }
    json* arr = Insert(json::array());
    if (arr == nullptr) return false;
    stack_.push_back(arr);
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) {
        return Fail(absl::StrCat("model.merges entry ", merges.size(),
                                 " is not a pair of tokens"));
      }
      merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error = absl::StrCat("malformed JSON at byte ", position, ": ", e.what());
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool AtModelKey(absl::string_view name) const {
    return model_ != nullptr && !stack_.empty() && stack_.back() == model_ &&
           key_ == name;
  }
  std::string Where() const {
    return mode_ == Mode::kVocab ? "model.vocab" : "model.merges";
  }
  bool Fail(std::string message) {
    error = std::move(message);
    return false;
  }
  // Adds a value where the parser is; returns it (for containers), or
  // nullptr with `error` set.
  json* Insert(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json* top = stack_.back();
    if (top->is_object()) {
      json& slot = (*top)[key_];
      slot = std::move(v);
      return &slot;
    }
    top->push_back(std::move(v));
    return &top->back();
  }
  template <typename T>
  bool Value(T&& v) {
    if (mode_ != Mode::kDom) {
      return Fail(mode_ == Mode::kVocab
                      ? "model.vocab values must be non-negative integer ids"
                      : "model.merges entries must be strings or string pairs");
    }
    return Insert(json(std::forward<T>(v))) != nullptr;
  }

  size_t size_hint_;
  Mode mode_ = Mode::kDom;
  // Open containers of the DOM, innermost last. Only the innermost grows, so
  // the pointers to its ancestors stay valid.
  std::vector<json*> stack_;
  std::string key_;
  json* model_ = nullptr;
  std::string vocab_key_;
  std::vector<std::string> pair_;
};

// ---------------------------------------------------------------------------
// Added tokens.

struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // What decoding emits: the content, or for a normalized token its
  // normalized form (HF hands that to the decoder so it can invert it).
  std::string decode_text;
};

// Finds added tokens in text: leftmost match first and, among matches at the
// same position, the longest (HF's Aho-Corasick LeftmostLongest), through a
// byte trie. The root's children sit in a table so that the bytes that start
// no token are skipped at one lookup each.
class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin;
    size_t end;
    int32_t token;  // index into the tokenizer's added tokens
  };

  AddedTokenMatcher() : nodes_(1) { root_.fill(-1); }

  bool empty() const { return nodes_.size() == 1; }

  void Add(absl::string_view content, int32_t token) {
    if (content.empty()) return;
    int32_t node = 0;
    for (size_t i = 0; i < content.size(); ++i) {
      const auto b = static_cast<unsigned char>(content[i]);
      int32_t child = Child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        if (node == 0) {
          root_[b] = child;
        } else {
          nodes_[node].children.emplace_back(b, child);
        }
      }
      node = child;
    }
    // The first token with a given content wins, like the first pattern of
    // an Aho-Corasick automaton.
    if (nodes_[node].token < 0) nodes_[node].token = token;
  }

  // Calls `found` with each match in order until it returns false.
  template <typename Found>
  void FindAll(absl::string_view text, Found found) const {
    size_t pos = 0;
    while (pos < text.size()) {
      int32_t node = root_[static_cast<unsigned char>(text[pos])];
      if (node < 0) {
        ++pos;
        continue;
      }
      int32_t best_token = -1;
      size_t best_end = 0;
      size_t i = pos + 1;
      while (true) {
        if (nodes_[node].token >= 0) {
          best_token = nodes_[node].token;
          best_end = i;
        }
        if (i >= text.size()) break;
        node = Child(node, static_cast<unsigned char>(text[i]));
        if (node < 0) break;
        ++i;
      }
      if (best_token < 0) {
        ++pos;
        continue;
      }
      if (!found(Match{pos, best_end, best_token})) return;
      pos = best_end;
    }
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;
  };

  int32_t Child(int32_t node, unsigned char b) const {
    if (node == 0) return root_[b];
    for (const auto& [byte, child] : nodes_[node].children) {
      if (byte == b) return child;
    }
    return -1;
  }

  std::vector<Node> nodes_;
  std::array<int32_t, 256> root_;
};

// A stretch of the input: an added token (token >= 0) or text to tokenize.
struct Section {
  size_t begin;
  size_t end;
  int32_t token;
};

char32_t LastCodePoint(absl::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  return unicode::NextCodePoint(s, &start);
}

char32_t FirstCodePoint(absl::string_view s) {
  size_t pos = 0;
  return unicode::NextCodePoint(s, &pos);
}

// HF's AddedVocabulary::find_matches: cuts `text` at the added tokens that
// `matcher` finds, applying single_word, lstrip and rstrip. Each added token
// kept becomes one id, so false (and `sections` incomplete) as soon as more
// than `max_tokens` are kept: memory stays proportional to the limit.
bool SplitOnAddedTokens(absl::string_view text,
                        const AddedTokenMatcher& matcher,
                        const std::vector<AddedToken>& tokens,
                        std::vector<Section>* sections,
                        int64_t max_tokens = INT64_MAX) {
  sections->clear();
  size_t start_offset = 0;
  int64_t kept = 0;
  bool fits = true;
  matcher.FindAll(text, [&](const AddedTokenMatcher::Match& m) {
    const AddedToken& token = tokens[m.token];
    size_t start = m.begin;
    size_t stop = m.end;
    if (token.single_word) {
      const bool start_space =
          start == 0 ||
          !unicode::IsWordChar(LastCodePoint(text.substr(0, start)));
      const bool stop_space =
          stop == text.size() ||
          !unicode::IsWordChar(FirstCodePoint(text.substr(stop)));
      if (!start_space || !stop_space) return true;
    }
    if (token.lstrip) {
      // Back over the whitespace before the token, but never into what an
      // earlier token already took.
      size_t new_start = start;
      while (new_start > 0) {
        size_t char_start = new_start - 1;
        while (char_start > 0 &&
               (static_cast<unsigned char>(text[char_start]) & 0xC0) == 0x80) {
          --char_start;
        }
        size_t next = char_start;
        if (!unicode::IsWhiteSpace(unicode::NextCodePoint(text, &next))) break;
        new_start = char_start;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!unicode::IsWhiteSpace(unicode::NextCodePoint(text, &next))) break;
        stop = next;
      }
    }
    if (start_offset < start) sections->push_back({start_offset, start, -1});
    sections->push_back({start, stop, m.token});
    start_offset = stop;
    if (++kept > max_tokens) fits = false;
    return fits;
  });
  if (!fits) return false;
  if (start_offset != text.size()) {
    sections->push_back({start_offset, text.size(), -1});
  }
  return true;
}

// ---------------------------------------------------------------------------
// tokenizer_config.json.

// bos_token / eos_token: a string, {"content": ...} or null.
absl::StatusOr<std::string> ConfigTokenText(const json& config,
                                            const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return content->get<std::string>();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer_config.json: \"", key,
      "\" must be a string or an object with a \"content\" string"));
}

// The id of the special token a post-processor puts first in a single
// sequence, or -1.
// A non-negative integer that fits a token id (int32): get<int32_t>() of a
// larger one would wrap.
bool IsTokenId(const json& value) {
  return value.is_number_unsigned() &&
         value.get<uint64_t>() <=
             static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
}

absl::StatusOr<int32_t> LeadingSpecialToken(const json& pp) {
  if (pp.is_null()) return -1;
  const auto type_it = pp.is_object() ? pp.find("type") : pp.end();
  if (type_it == pp.end() || !type_it->is_string()) {
    return absl::InvalidArgumentError(
        "tokenizer.json: post_processor has no \"type\"");
  }
  const std::string type = type_it->get<std::string>();
  if (type == "ByteLevel") return -1;
  if (type == "Sequence") {
    const auto list = pp.find("processors");
    if (list == pp.end() || !list->is_array()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: post_processor Sequence needs a \"processors\" "
          "list");
    }
    for (const json& item : *list) {
      ASSIGN_OR_RETURN(const int32_t id, LeadingSpecialToken(item));
      if (id >= 0) return id;
    }
    return -1;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    // "cls": [token, id] opens every single sequence.
    const auto cls = pp.find("cls");
    if (cls == pp.end() || !cls->is_array() || cls->size() != 2 ||
        !IsTokenId((*cls)[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: post_processor ", type,
                       " needs \"cls\": [token, id]"));
    }
    return (*cls)[1].get<int32_t>();
  }
  if (type == "TemplateProcessing") {
    const auto single = pp.find("single");
    if (single == pp.end() || !single->is_array()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: post_processor TemplateProcessing needs a "
          "\"single\" list");
    }
    if (single->empty() || !single->front().is_object()) return -1;
    const auto special = single->front().find("SpecialToken");
    if (special == single->front().end()) return -1;
    const auto name = special->find("id");
    const auto table = pp.find("special_tokens");
    if (name == special->end() || !name->is_string() || table == pp.end() ||
        !table->is_object()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: post_processor TemplateProcessing: malformed "
          "SpecialToken");
    }
    const auto entry = table->find(name->get<std::string>());
    if (entry == table->end() || !entry->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: post_processor TemplateProcessing: special token \"",
          name->get<std::string>(), "\" is not in special_tokens"));
    }
    const auto ids = entry->find("ids");
    if (ids == entry->end() || !ids->is_array() || ids->empty() ||
        !IsTokenId(ids->front())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: post_processor TemplateProcessing: special token \"",
          name->get<std::string>(), "\" has no ids"));
    }
    return ids->front().get<int32_t>();
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: post_processor type \"", type,
                   "\" is not supported yet"));
}

// transformers' clean_up_tokenization.
std::string CleanUpTokenization(std::string text) {
  static constexpr std::pair<absl::string_view, absl::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
      {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
      {" 've", "'ve"}, {" 're", "'re"},
  };
  // One rule at a time, as Python's chained str.replace does.
  for (const auto& rule : kRules) text = absl::StrReplaceAll(text, {rule});
  return text;
}

// ---------------------------------------------------------------------------

class HfTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Build(
      TokenizerJsonReader& reader, absl::string_view config_json);

  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const override;
  absl::StatusOr<std::vector<int32_t>> EncodeAtMost(
      absl::string_view text, int64_t max_tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::string TokenBytes(int32_t id) const override;
  bool IsSpecial(int32_t id) const override {
    const auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }
  int32_t TokenToId(absl::string_view token) const override {
    const auto it = added_by_content_.find(token);
    if (it != added_by_content_.end()) return added_[it->second].id;
    return model_->TokenToId(token);
  }
  std::string IdToToken(int32_t id) const override {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      return added_[it->second].content;
    }
    const std::string* token = model_->IdToToken(id);
    return token != nullptr ? *token : std::string();
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }

 private:
  absl::Status ParseAddedTokens(const json& list);
  absl::Status ApplyConfig(absl::string_view config_json, int32_t template_bos);
  // Encode, stopping with TooManyTokens() as soon as more than `max_tokens`
  // ids are certain: pre-tokens stream into the model one at a time, and a
  // pre-token is not tokenized when the ids it must give (BpeModel::MinIds)
  // would pass the limit.
  absl::StatusOr<std::vector<int32_t>> EncodeLimited(absl::string_view text,
                                                     int64_t max_tokens) const;
  // Normalizes and tokenizes text between raw-matched added tokens.
  absl::Status EncodeSection(absl::string_view section, bool at_origin,
                             int64_t max_tokens,
                             std::vector<int32_t>* ids) const;
  // Pre-tokenizes and tokenizes normalized text.
  absl::Status EncodeNormalized(absl::string_view text, bool at_origin,
                                int64_t max_tokens,
                                std::vector<int32_t>* ids) const;
  absl::Status TokenizeWord(absl::string_view word, int64_t max_tokens,
                            std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<hf::Normalizer> normalizer_;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<hf::Decoder> decoder_;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;  // -> index
  absl::flat_hash_map<int32_t, int32_t> added_by_id_;           // -> index
  // HF decides "special" when decoding by a token's text.
  absl::flat_hash_set<std::string> special_contents_;
  AddedTokenMatcher raw_matcher_;  // tokens with normalized: false
  AddedTokenMatcher
      normalized_matcher_;  // normalized: true, contents normalized
  int32_t vocab_size_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool clean_up_ = false;
};

absl::StatusOr<bool> OptionalBool(const json& j, const char* key, bool fallback,
                                  absl::string_view where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" must be a boolean"));
  }
  return it->get<bool>();
}

absl::StatusOr<std::string> OptionalString(const json& j, const char* key,
                                           absl::string_view where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" must be a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Build(
    TokenizerJsonReader& reader, absl::string_view config_json) {
  const json& root = reader.root;
  if (!root.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  auto tok = std::make_unique<HfTokenizer>();

  // Model.
  const auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json has no \"model\" object");
  }
  const json& model = *model_it;
  std::string type = "BPE";  // older files omit the type of a BPE model
  if (const auto t = model.find("type"); t != model.end()) {
    if (!t->is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: model \"type\" must be a string");
    }
    type = t->get<std::string>();
  }
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json: model type \"", type, "\" is not supported yet"));
  }
  if (!reader.has_vocab || !reader.has_merges) {
    return absl::InvalidArgumentError(
        "tokenizer.json: BPE model needs a \"vocab\" object and a \"merges\" "
        "list");
  }
  constexpr absl::string_view kModel = "tokenizer.json: model";
  if (const auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0) {
      return absl::UnimplementedError(
          "tokenizer.json: BPE dropout is not supported (encoding would be "
          "random)");
    }
  }
  BpeOptions options;
  if (const auto u = model.find("unk_token");
      u != model.end() && !u->is_null()) {
    if (!u->is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer.json: model \"unk_token\" must be a string");
    }
    options.has_unk_token = true;
    options.unk_token = u->get<std::string>();
  }
  ASSIGN_OR_RETURN(options.continuing_subword_prefix,
                   OptionalString(model, "continuing_subword_prefix", kModel));
  ASSIGN_OR_RETURN(options.end_of_word_suffix,
                   OptionalString(model, "end_of_word_suffix", kModel));
  ASSIGN_OR_RETURN(options.fuse_unk,
                   OptionalBool(model, "fuse_unk", false, kModel));
  ASSIGN_OR_RETURN(options.byte_fallback,
                   OptionalBool(model, "byte_fallback", false, kModel));
  ASSIGN_OR_RETURN(options.ignore_merges,
                   OptionalBool(model, "ignore_merges", false, kModel));
  ASSIGN_OR_RETURN(tok->model_,
                   BpeModel::Create(std::move(reader.vocab), reader.merges,
                                    std::move(options)));
  reader.merges.clear();
  reader.merges.shrink_to_fit();

  // Pipeline stages; null or absent means none.
  const auto stage = [&root](const char* key) -> const json* {
    const auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* j = stage("normalizer")) {
    ASSIGN_OR_RETURN(tok->normalizer_, hf::ParseNormalizer(*j));
  }
  if (const json* j = stage("pre_tokenizer")) {
    ASSIGN_OR_RETURN(tok->pre_tokenizer_, hf::ParsePreTokenizer(*j));
  }
  if (const json* j = stage("decoder")) {
    ASSIGN_OR_RETURN(tok->decoder_, hf::ParseDecoder(*j));
  }
  int32_t template_bos = -1;
  if (const json* j = stage("post_processor")) {
    ASSIGN_OR_RETURN(template_bos, LeadingSpecialToken(*j));
  }
  if (const json* j = stage("added_tokens")) {
    RETURN_IF_ERROR(tok->ParseAddedTokens(*j));
  }
  RETURN_IF_ERROR(tok->ApplyConfig(config_json, template_bos));

  tok->vocab_size_ = tok->model_->id_limit();
  for (const AddedToken& t : tok->added_) {
    tok->vocab_size_ = std::max(tok->vocab_size_, t.id + 1);
  }
  return tok;
}

absl::Status HfTokenizer::ParseAddedTokens(const json& list) {
  if (!list.is_array()) {
    return absl::InvalidArgumentError(
        "tokenizer.json: \"added_tokens\" must be a list");
  }
  for (const json& item : list) {
    const std::string where =
        absl::StrCat("tokenizer.json: added_tokens[", added_.size(), "]");
    if (!item.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is not an object"));
    }
    AddedToken token;
    const auto id = item.find("id");
    if (id == item.end() || !id->is_number_unsigned() ||
        id->get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"id\" must be a non-negative integer"));
    }
    token.id = id->get<int32_t>();
    const auto content = item.find("content");
    if (content == item.end() || !content->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"content\" must be a string"));
    }
    token.content = content->get<std::string>();
    ASSIGN_OR_RETURN(token.special,
                     OptionalBool(item, "special", false, where));
    ASSIGN_OR_RETURN(token.single_word,
                     OptionalBool(item, "single_word", false, where));
    ASSIGN_OR_RETURN(token.lstrip, OptionalBool(item, "lstrip", false, where));
    ASSIGN_OR_RETURN(token.rstrip, OptionalBool(item, "rstrip", false, where));
    ASSIGN_OR_RETURN(token.normalized,
                     OptionalBool(item, "normalized", !token.special, where));
    // HF ignores empty added tokens.
    if (token.content.empty()) continue;
    token.decode_text = token.content;
    if (token.normalized && normalizer_ != nullptr) {
      // Normalized tokens are looked for in normalized text, so their own
      // text goes through the normalizer too.
      bool origin_kept = true;
      RETURN_IF_ERROR(normalizer_->Normalize(&token.decode_text, &origin_kept));
    }
    const auto index = static_cast<int32_t>(added_.size());
    added_by_content_.insert_or_assign(token.content, index);
    added_by_id_.insert_or_assign(token.id, index);
    if (token.special) special_contents_.insert(token.content);
    added_.push_back(std::move(token));
  }
  // HF's matching order: special tokens first, then the others.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& token = added_[i];
      if (token.special != (pass == 0)) continue;
      if (!token.normalized) {
        raw_matcher_.Add(token.content, static_cast<int32_t>(i));
        continue;
      }
      normalized_matcher_.Add(token.decode_text, static_cast<int32_t>(i));
    }
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::ApplyConfig(absl::string_view config_json,
                                      int32_t template_bos) {
  bos_id_ = template_bos;
  bool add_bos = template_bos >= 0;
  if (config_json.empty()) {
    set_add_bos(add_bos);
    return absl::OkStatus();
  }
  const json config =
      json::parse(config_json.begin(), config_json.end(), nullptr,
                  /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json is not a JSON object");
  }
  constexpr absl::string_view kWhere = "tokenizer_config.json";
  ASSIGN_OR_RETURN(add_bos,
                   OptionalBool(config, "add_bos_token", add_bos, kWhere));
  ASSIGN_OR_RETURN(const std::string bos_text,
                   ConfigTokenText(config, "bos_token"));
  ASSIGN_OR_RETURN(const std::string eos_text,
                   ConfigTokenText(config, "eos_token"));
  if (bos_id_ < 0 && !bos_text.empty()) bos_id_ = TokenToId(bos_text);
  if (!eos_text.empty()) eos_id_ = TokenToId(eos_text);
  // A BOS that cannot be resolved to an id cannot be prepended.
  set_add_bos(add_bos && bos_id_ >= 0);

  // transformers 5 skips this cleanup for BPE models (all models here)
  // unless explicitly forced.
  ASSIGN_OR_RETURN(
      const bool clean_up,
      OptionalBool(config, "clean_up_tokenization_spaces", false, kWhere));
  ASSIGN_OR_RETURN(
      const bool force,
      OptionalBool(
          config,
          "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_"
          "output",
          false, kWhere));
  clean_up_ = clean_up && force;

  // transformers registers added_tokens_decoder entries marked special as
  // special tokens, which also makes decoding skip them.
  if (const auto it = config.find("added_tokens_decoder");
      it != config.end() && it->is_object()) {
    for (const auto& [id_text, entry] : it->items()) {
      if (!entry.is_object()) continue;
      const auto content = entry.find("content");
      const auto special = entry.find("special");
      if (content == entry.end() || !content->is_string() ||
          special == entry.end() || !special->is_boolean() ||
          !special->get<bool>()) {
        continue;
      }
      const auto found = added_by_content_.find(content->get<std::string>());
      if (found == added_by_content_.end()) continue;
      added_[found->second].special = true;
      special_contents_.insert(added_[found->second].content);
    }
  }
  return absl::OkStatus();
}

absl::Status TooManyTokens(int64_t max_tokens) {
  return absl::OutOfRangeError(
      absl::StrCat("the text has more than ", max_tokens, " tokens"));
}

bool IsAscii(absl::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(
    absl::string_view text) const {
  return EncodeLimited(text, INT64_MAX);
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::EncodeAtMost(
    absl::string_view text, int64_t max_tokens) const {
  return EncodeLimited(text, std::max<int64_t>(max_tokens, 0));
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::EncodeLimited(
    absl::string_view text, int64_t max_tokens) const {
  if (!unicode::IsValidUtf8(text)) {
    return absl::InvalidArgumentError("Encode: text is not valid UTF-8");
  }
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(
      std::min<int64_t>(static_cast<int64_t>(text.size() / 3 + 4),
                        max_tokens == INT64_MAX ? INT64_MAX : max_tokens + 1)));
  std::vector<Section> sections;
  if (!SplitOnAddedTokens(text, raw_matcher_, added_, &sections, max_tokens)) {
    return TooManyTokens(max_tokens);
  }
  for (const Section& s : sections) {
    if (s.token >= 0) {
      ids.push_back(added_[s.token].id);
    } else {
      RETURN_IF_ERROR(EncodeSection(text.substr(s.begin, s.end - s.begin),
                                    s.begin == 0, max_tokens, &ids));
    }
    if (static_cast<int64_t>(ids.size()) > max_tokens) {
      return TooManyTokens(max_tokens);
    }
  }
  return ids;
}

absl::Status HfTokenizer::EncodeSection(absl::string_view section,
                                        bool at_origin, int64_t max_tokens,
                                        std::vector<int32_t>* ids) const {
  std::string normalized_storage;
  absl::string_view normalized = section;
  // Unicode normal forms leave ASCII alone: no copy of a (possibly huge)
  // ASCII prompt.
  if (normalizer_ != nullptr &&
      !(normalizer_->KeepsAscii() && IsAscii(section))) {
    normalized_storage.assign(section.data(), section.size());
    bool origin_kept = true;
    RETURN_IF_ERROR(normalizer_->Normalize(&normalized_storage, &origin_kept));
    normalized = normalized_storage;
    at_origin = at_origin && origin_kept;
  }
  if (normalized.empty()) return absl::OkStatus();
  if (normalized_matcher_.empty()) {
    return EncodeNormalized(normalized, at_origin, max_tokens, ids);
  }
  std::vector<Section> sections;
  const int64_t room = max_tokens - static_cast<int64_t>(ids->size());
  if (!SplitOnAddedTokens(normalized, normalized_matcher_, added_, &sections,
                          room)) {
    return TooManyTokens(max_tokens);
  }
  for (const Section& s : sections) {
    if (s.token >= 0) {
      ids->push_back(added_[s.token].id);
      if (static_cast<int64_t>(ids->size()) > max_tokens) {
        return TooManyTokens(max_tokens);
      }
      continue;
    }
    RETURN_IF_ERROR(
        EncodeNormalized(normalized.substr(s.begin, s.end - s.begin),
                         at_origin && s.begin == 0, max_tokens, ids));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::TokenizeWord(absl::string_view word,
                                       int64_t max_tokens,
                                       std::vector<int32_t>* ids) const {
  // A word too long for the ids left is refused before the (superlinear)
  // merging, which is what makes one huge word cheap to refuse.
  if (max_tokens != INT64_MAX &&
      static_cast<int64_t>(ids->size() + model_->MinIds(word)) > max_tokens) {
    return TooManyTokens(max_tokens);
  }
  RETURN_IF_ERROR(model_->Tokenize(word, ids));
  if (static_cast<int64_t>(ids->size()) > max_tokens) {
    return TooManyTokens(max_tokens);
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::EncodeNormalized(absl::string_view text,
                                           bool at_origin, int64_t max_tokens,
                                           std::vector<int32_t>* ids) const {
  if (pre_tokenizer_ == nullptr) return TokenizeWord(text, max_tokens, ids);
  return pre_tokenizer_->PreTokenize(
      hf::PreToken{text, at_origin},
      [this, max_tokens, ids](hf::PreToken piece) {
        return TokenizeWord(piece.text, max_tokens, ids);
      });
}

absl::StatusOr<std::string> HfTokenizer::Decode(
    absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is negative"));
    }
    // An id of the model's padded vocabulary beyond the tokenizer's (Qwen's
    // 151,936 embedding rows for 151,669 ids): no text, as Hugging Face
    // decodes it.
    if (id >= vocab_size_) continue;
    const std::string* text = nullptr;
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      text = &added_[it->second].decode_text;
    } else {
      text = model_->IdToToken(id);
    }
    if (text == nullptr) continue;  // an unused id: HF produces nothing
    if (skip_special_tokens && special_contents_.contains(*text)) continue;
    tokens.push_back(*text);
  }
  std::string out;
  if (decoder_ != nullptr) {
    RETURN_IF_ERROR(decoder_->DecodeChain(&tokens));
    out = absl::StrJoin(tokens, "");
  } else {
    out = absl::StrJoin(tokens, " ");
  }
  if (clean_up_) out = CleanUpTokenization(std::move(out));
  return out;
}

std::string HfTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || IsSpecial(id)) return std::string();
  const std::string* text = nullptr;
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    text = &added_[it->second].decode_text;
  } else {
    text = model_->IdToToken(id);
  }
  if (text == nullptr) return std::string();
  if (decoder_ == nullptr) return *text;
  std::vector<std::string> tokens = {*text};
  if (!decoder_->DecodeChainRaw(&tokens).ok()) return std::string();
  return absl::StrJoin(tokens, "");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerFromJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json) {
  TokenizerJsonReader reader(tokenizer_json.size());
  bool parsed = false;
  try {
    parsed =
        json::sax_parse(tokenizer_json.begin(), tokenizer_json.end(), &reader);
  } catch (const std::exception& e) {
    // nlohmann may throw on a DOM insertion that cannot happen for valid
    // JSON; report rather than propagate.
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", e.what()));
  }
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ",
                     reader.error.empty() ? "malformed JSON" : reader.error));
  }
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok;
  try {
    tok = HfTokenizer::Build(reader, tokenizer_config_json);
  } catch (const std::exception& e) {
    // Fields are type-checked before use; this is a last line of defence so
    // that no nlohmann exception crosses the API.
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", e.what()));
  }
  if (!tok.ok()) return tok.status();
  return std::unique_ptr<Tokenizer>(*std::move(tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(
    const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string tokenizer_json,
                   ReadFile(dir + "/tokenizer.json"));
  std::string config_json;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/tokenizer_config.json", ec)) {
    ASSIGN_OR_RETURN(config_json, ReadFile(dir + "/tokenizer_config.json"));
  }
  auto tok = LoadHfTokenizerFromJson(tokenizer_json, config_json);
  if (!tok.ok()) return Annotate(tok.status(), dir);
  return tok;
}

}  // namespace tessera
