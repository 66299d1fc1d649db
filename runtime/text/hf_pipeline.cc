#include "runtime/text/hf_pipeline.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/core/status.h"
#include "runtime/text/hf_regex.h"
#include "runtime/text/unicode.h"

namespace tessera {
namespace hf {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------
// JSON field helpers. Every error names the component and the field.

absl::Status Malformed(absl::string_view component, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", component, ": ", what));
}

absl::Status Unsupported(absl::string_view component, absl::string_view type) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", component,
                                               " type \"", type,
                                               "\" is not supported yet"));
}

absl::StatusOr<std::string> TypeOf(const json& j, absl::string_view component) {
  if (!j.is_object()) return Malformed(component, "is not a JSON object");
  const auto it = j.find("type");
  if (it == j.end() || !it->is_string()) {
    return Malformed(component, "has no \"type\"");
  }
  return it->get<std::string>();
}

absl::StatusOr<std::string> GetString(const json& j, const char* key,
                                      absl::string_view component) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return Malformed(component, absl::StrCat("\"", key, "\" must be a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> GetBool(const json& j, const char* key, bool fallback,
                             absl::string_view component) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return Malformed(component,
                     absl::StrCat("\"", key, "\" must be a boolean"));
  }
  return it->get<bool>();
}

absl::StatusOr<int64_t> GetUnsigned(const json& j, const char* key,
                                    absl::string_view component) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    return Malformed(
        component,
        absl::StrCat("\"", key, "\" must be a non-negative integer"));
  }
  return it->get<int64_t>();
}

// A single Unicode character given as a JSON string (Rust `char` fields).
absl::StatusOr<char32_t> GetChar(const json& j, const char* key,
                                 absl::string_view component) {
  ASSIGN_OR_RETURN(std::string s, GetString(j, key, component));
  if (s.empty() || !unicode::IsValidUtf8(s) ||
      unicode::SequenceLength(static_cast<unsigned char>(s[0])) != s.size()) {
    return Malformed(component,
                     absl::StrCat("\"", key, "\" must be one character"));
  }
  size_t pos = 0;
  return unicode::NextCodePoint(s, &pos);
}

// {"String": "..."} or {"Regex": "..."} (SplitPattern / ReplacePattern).
absl::StatusOr<std::unique_ptr<Regex>> GetPattern(const json& j,
                                                  absl::string_view component) {
  const auto it = j.find("pattern");
  if (it == j.end() || !it->is_object() || it->size() != 1) {
    return Malformed(
        component, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  }
  const auto entry = it->begin();
  const std::string& kind = entry.key();
  const json& value = entry.value();
  if (!value.is_string()) {
    return Malformed(component, "\"pattern\" value must be a string");
  }
  const std::string text = value.get<std::string>();
  absl::StatusOr<std::unique_ptr<Regex>> regex;
  if (kind == "String") {
    regex = Regex::Literal(text);
  } else if (kind == "Regex") {
    regex = Regex::Compile(text);
  } else {
    return Malformed(component,
                     absl::StrCat("unknown pattern kind \"", kind, "\""));
  }
  if (!regex.ok()) {
    return absl::Status(regex.status().code(),
                        absl::StrCat("tokenizer.json: ", component, ": ",
                                     regex.status().message()));
  }
  return regex;
}

// ---------------------------------------------------------------------------
// Splitting (HF's NormalizedString::split and Pattern::find_matches).

// A contiguous run of a piece, either a pattern match or the text between.
struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

enum class SplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

absl::StatusOr<SplitBehavior> ParseBehavior(const json& j,
                                            absl::string_view component) {
  ASSIGN_OR_RETURN(std::string b, GetString(j, "behavior", component));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Malformed(component, absl::StrCat("unknown behavior \"", b, "\""));
}

// Applies a delimiter behavior to the segments of one piece as they are found
// and passes the resulting non-empty pieces on. HF folds the whole segment
// list at once (MergedWithNext from the end); each rule only ever looks one
// segment back, so one pending segment is enough to stream it.
class SegmentFolder {
 public:
  SegmentFolder(SplitBehavior behavior, PreToken piece, PreTokenSink sink)
      : behavior_(behavior), piece_(piece), sink_(sink) {}

  absl::Status Add(Segment s) {
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        return Emit(s.begin, s.end);
      case SplitBehavior::kRemoved:
        return s.is_match ? absl::OkStatus() : Emit(s.begin, s.end);
      case SplitBehavior::kContiguous:
        // Runs of matches, and runs of non-matches, become one piece each.
        if (has_pending_ && s.is_match == previous_match_) {
          pending_.end = s.end;
        } else {
          RETURN_IF_ERROR(Flush());
          Hold(s);
        }
        previous_match_ = s.is_match;
        return absl::OkStatus();
      case SplitBehavior::kMergedWithPrevious:
        // A match joins the piece before it, unless that piece is a match.
        if (s.is_match && !previous_match_ && has_pending_) {
          pending_.end = s.end;
        } else {
          RETURN_IF_ERROR(Flush());
          Hold(s);
        }
        previous_match_ = s.is_match;
        return absl::OkStatus();
      case SplitBehavior::kMergedWithNext:
        // A match joins the piece after it, unless that piece is a match.
        if (has_pending_ && !s.is_match) {
          has_pending_ = false;
          return Emit(pending_.begin, s.end);
        }
        RETURN_IF_ERROR(Flush());
        if (s.is_match) {
          Hold(s);
          return absl::OkStatus();
        }
        return Emit(s.begin, s.end);
    }
    return absl::OkStatus();
  }

  absl::Status Finish() { return Flush(); }

 private:
  void Hold(Segment s) {
    pending_ = s;
    has_pending_ = true;
  }
  absl::Status Flush() {
    if (!has_pending_) return absl::OkStatus();
    has_pending_ = false;
    return Emit(pending_.begin, pending_.end);
  }
  absl::Status Emit(size_t begin, size_t end) {
    if (end <= begin) return absl::OkStatus();
    return sink_(PreToken{piece_.text.substr(begin, end - begin),
                          piece_.at_origin && begin == 0});
  }

  SplitBehavior behavior_;
  PreToken piece_;
  PreTokenSink sink_;
  bool has_pending_ = false;
  Segment pending_{0, 0, false};
  bool previous_match_ = false;
};

// Splits `piece` at the matches of `regex` (flags flipped when `invert`).
absl::Status SplitByRegex(const Regex& regex, bool invert,
                          SplitBehavior behavior, PreToken piece,
                          PreTokenSink sink) {
  if (piece.text.empty()) return absl::OkStatus();
  SegmentFolder folder(behavior, piece, sink);
  size_t prev = 0;
  RETURN_IF_ERROR(
      regex.ForEachMatch(piece.text, [&](RegexMatch m) -> absl::Status {
        if (prev != m.begin) {
          RETURN_IF_ERROR(folder.Add({prev, m.begin, invert}));
        }
        prev = m.end;
        return folder.Add({m.begin, m.end, !invert});
      }));
  if (prev != piece.text.size()) {
    RETURN_IF_ERROR(folder.Add({prev, piece.text.size(), invert}));
  }
  return folder.Finish();
}

// HF's char-predicate pattern: each matching character is its own match.
template <typename Predicate>
absl::Status SplitByChar(Predicate is_match, SplitBehavior behavior,
                         PreToken piece, PreTokenSink sink) {
  if (piece.text.empty()) return absl::OkStatus();
  SegmentFolder folder(behavior, piece, sink);
  const absl::string_view text = piece.text;
  size_t last = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t begin = pos;
    const char32_t cp = unicode::NextCodePoint(text, &pos);
    if (!is_match(cp)) continue;
    if (last < begin) RETURN_IF_ERROR(folder.Add({last, begin, false}));
    RETURN_IF_ERROR(folder.Add({begin, pos, true}));
    last = pos;
  }
  if (last < text.size()) {
    RETURN_IF_ERROR(folder.Add({last, text.size(), false}));
  }
  return folder.Finish();
}

// ---------------------------------------------------------------------------
// Normalizers.

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalizationForm form) : form_(form) {}
  bool KeepsAscii() const override { return true; }
  absl::Status Normalize(std::string* text, bool*) const override {
    *text = unicode::Normalize(*text, form_);
    return absl::OkStatus();
  }

 private:
  unicode::NormalizationForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text, bool*) const override {
    *text = unicode::ToLower(*text);
    return absl::OkStatus();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text, bool* origin_kept) const override {
    size_t begin = 0;
    size_t end = text->size();
    if (left_) {
      size_t pos = 0;
      while (pos < end) {
        size_t next = pos;
        if (!unicode::IsWhiteSpace(unicode::NextCodePoint(*text, &next))) break;
        pos = next;
      }
      begin = pos;
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin &&
               (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t next = start;
        if (!unicode::IsWhiteSpace(unicode::NextCodePoint(*text, &next))) break;
        end = start;
      }
    }
    if (begin > 0) *origin_kept = false;
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_;
  bool right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend)
      : prepend_(std::move(prepend)) {}
  absl::Status Normalize(std::string* text, bool*) const override {
    if (!text->empty()) text->insert(0, prepend_);
    return absl::OkStatus();
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text, bool* origin_kept) const override {
    std::vector<RegexMatch> matches;
    RETURN_IF_ERROR(pattern_->FindAll(*text, &matches));
    if (matches.empty()) return absl::OkStatus();
    std::string out;
    out.reserve(text->size());
    size_t prev = 0;
    for (const RegexMatch& m : matches) {
      out.append(*text, prev, m.begin - prev);
      out += content_;
      prev = m.end;
    }
    out.append(*text, prev, std::string::npos);
    // Replacing the leading characters by nothing moves the start of the
    // text past original offset 0.
    if (content_.empty() && matches.front().begin == 0 &&
        matches.front().end > 0) {
      *origin_kept = false;
    }
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  bool KeepsAscii() const override {
    for (const auto& n : parts_) {
      if (!n->KeepsAscii()) return false;
    }
    return true;
  }
  absl::Status Normalize(std::string* text, bool* origin_kept) const override {
    for (const auto& part : parts_) {
      RETURN_IF_ERROR(part->Normalize(text, origin_kept));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---------------------------------------------------------------------------
// Pre-tokenizers.

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> pattern, SplitBehavior behavior,
                    bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  absl::Status PreTokenize(PreToken piece, PreTokenSink sink) const override {
    return SplitByRegex(*pattern_, invert_, behavior_, piece, sink);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is set.
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status PreTokenize(PreToken piece, PreTokenSink sink) const override {
    if (piece.text.empty()) return absl::OkStatus();
    std::string prefixed;
    if (add_prefix_space_ && piece.text[0] != ' ') {
      // HF adds the space to every piece that reaches this stage.
      prefixed.reserve(piece.text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece.text.data(), piece.text.size());
      piece.text = prefixed;
    }
    std::string mapped;
    const auto map_bytes = [&sink, &mapped](PreToken p) -> absl::Status {
      mapped.resize(p.text.size() * 2);
      char* out = mapped.data();
      for (unsigned char b : p.text) out = unicode::WriteByteChar(b, out);
      return sink(PreToken{
          absl::string_view(mapped.data(), out - mapped.data()), p.at_origin});
    };
    if (regex_ == nullptr) return map_bytes(piece);
    return SplitByRegex(*regex_, /*invert=*/false, SplitBehavior::kIsolated,
                        piece, map_bytes);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace fields shared by the pre-tokenizer and the decoder, including the
// older add_prefix_space spelling of prepend_scheme.
struct MetaspaceConfig {
  char32_t replacement;
  PrependScheme scheme;
  bool split;
};

absl::StatusOr<MetaspaceConfig> ParseMetaspace(const json& j,
                                               absl::string_view component) {
  MetaspaceConfig config;
  ASSIGN_OR_RETURN(config.replacement, GetChar(j, "replacement", component));
  config.scheme = PrependScheme::kAlways;
  if (auto it = j.find("prepend_scheme"); it != j.end() && !it->is_null()) {
    const std::string s = it->is_string() ? it->get<std::string>() : "";
    if (s == "always") {
      config.scheme = PrependScheme::kAlways;
    } else if (s == "first") {
      config.scheme = PrependScheme::kFirst;
    } else if (s == "never") {
      config.scheme = PrependScheme::kNever;
    } else {
      return Malformed(component,
                       "\"prepend_scheme\" must be "
                       "\"always\", \"first\" or \"never\"");
    }
  }
  if (auto it = j.find("add_prefix_space");
      it != j.end() && it->is_boolean() && !it->get<bool>()) {
    if (config.scheme != PrependScheme::kNever) {
      // HF refuses this combination rather than guess.
      return Malformed(
          component, "add_prefix_space does not match declared prepend_scheme");
    }
  }
  ASSIGN_OR_RETURN(config.split, GetBool(j, "split", true, component));
  return config;
}

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  explicit MetaspacePreTokenizer(MetaspaceConfig config) : config_(config) {
    unicode::AppendUtf8(config.replacement, &replacement_);
  }
  absl::Status PreTokenize(PreToken piece, PreTokenSink sink) const override {
    if (piece.text.empty()) return absl::OkStatus();
    std::string text;
    text.reserve(piece.text.size() + replacement_.size());
    for (char c : piece.text) {
      if (c == ' ') {
        text += replacement_;
      } else {
        text.push_back(c);
      }
    }
    const bool starts_with_replacement =
        text.compare(0, replacement_.size(), replacement_) == 0;
    if (!starts_with_replacement &&
        (config_.scheme == PrependScheme::kAlways ||
         (config_.scheme == PrependScheme::kFirst && piece.at_origin))) {
      text.insert(0, replacement_);
    }
    const PreToken rewritten{text, piece.at_origin};
    if (!config_.split) return sink(rewritten);
    const char32_t replacement = config_.replacement;
    return SplitByChar([replacement](char32_t c) { return c == replacement; },
                       SplitBehavior::kMergedWithNext, rewritten, sink);
  }

 private:
  MetaspaceConfig config_;
  std::string replacement_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  absl::Status PreTokenize(PreToken piece, PreTokenSink sink) const override {
    return SplitByChar(
        unicode::IsNumeric,
        individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
        piece, sink);
  }

 private:
  bool individual_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(
      std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status PreTokenize(PreToken piece, PreTokenSink sink) const override {
    return Run(0, piece, sink);
  }

 private:
  // Feeds `piece` to stage `stage`, whose pieces go on to the next stage.
  absl::Status Run(size_t stage, PreToken piece, PreTokenSink sink) const {
    if (stage == parts_.size()) return sink(piece);
    return parts_[stage]->PreTokenize(
        piece, [&](PreToken next) { return Run(stage + 1, next, sink); });
  }

  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// ---------------------------------------------------------------------------
// Decoders.

class ByteLevelDecoder final : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      size_t pos = 0;
      while (pos < token.size()) {
        const int b = unicode::CharToByte(unicode::NextCodePoint(token, &pos));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      // A token with any character outside the byte alphabet (an added
      // token, say) contributes its own bytes unchanged.
      if (!mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens->assign(1, lossy_ ? unicode::Utf8Lossy(bytes) : bytes);
    return absl::OkStatus();
  }
  absl::Status DecodeChainRaw(std::vector<std::string>* tokens) const override {
    return ByteLevelDecoder(/*lossy=*/false).DecodeChain(tokens);
  }
  explicit ByteLevelDecoder(bool lossy = true) : lossy_(lossy) {}

 private:
  bool lossy_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(MetaspaceConfig config, bool raw = false)
      : config_(config), raw_(raw) {}
  absl::Status DecodeChainRaw(std::vector<std::string>* tokens) const override {
    return MetaspaceDecoder(config_, /*raw=*/true).DecodeChain(tokens);
  }
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string& token = (*tokens)[i];
      std::string out;
      out.reserve(token.size());
      size_t pos = 0;
      while (pos < token.size()) {
        const size_t begin = pos;
        const char32_t cp = unicode::NextCodePoint(token, &pos);
        if (cp != config_.replacement) {
          out.append(token, begin, pos - begin);
        } else if (i != 0 || raw_ || config_.scheme == PrependScheme::kNever) {
          out.push_back(' ');
        }
        // HF drops every replacement character of the first token (not only
        // a leading one) unless prepend_scheme is "never".
      }
      (*tokens)[i] = std::move(out);
    }
    return absl::OkStatus();
  }

 private:
  MetaspaceConfig config_;
  bool raw_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  explicit ByteFallbackDecoder(bool raw = false) : raw_(raw) {}
  absl::Status DecodeChainRaw(std::vector<std::string>* tokens) const override {
    return ByteFallbackDecoder(/*raw=*/true).DecodeChain(tokens);
  }
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (raw_ || unicode::IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        // One U+FFFD per byte, not per invalid sequence: HF's rule.
        for (size_t i = 0; i < pending.size(); ++i)
          out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& token : *tokens) {
      int byte = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 &&
          token[5] == '>') {
        byte = HexByte(token[3], token[4]);
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
    return absl::OkStatus();
  }

 private:
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int HexByte(char hi, char lo) {
    const int h = HexDigit(hi);
    const int l = HexDigit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
  bool raw_;
};

class FuseDecoder final : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::string fused;
    for (const std::string& token : *tokens) fused += token;
    tokens->assign(1, std::move(fused));
    return absl::OkStatus();
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  // Strip cuts a text's ends (after Fuse, the whole text's), which a token
  // in the middle does not touch.
  absl::Status DecodeChainRaw(std::vector<std::string>* tokens) const override {
    (void)tokens;
    return absl::OkStatus();
  }
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      // Character boundaries of the token, to cut by characters as HF does.
      std::vector<size_t> bounds;
      std::vector<char32_t> chars;
      size_t pos = 0;
      while (pos < token.size()) {
        bounds.push_back(pos);
        chars.push_back(unicode::NextCodePoint(token, &pos));
      }
      bounds.push_back(token.size());
      size_t start_cut = 0;
      for (size_t i = 0; i < chars.size() && i < start_; ++i) {
        if (chars[i] != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < std::min(stop_, chars.size() - start_cut); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        stop_cut = index;
      }
      token =
          token.substr(bounds[start_cut], bounds[stop_cut] - bounds[start_cut]);
    }
    return absl::OkStatus();
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<RegexMatch> matches;
    for (std::string& token : *tokens) {
      matches.clear();
      RETURN_IF_ERROR(pattern_->FindAll(token, &matches));
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const RegexMatch& m : matches) {
        out.append(token, prev, m.begin - prev);
        out += content_;
        prev = m.end;
      }
      out.append(token, prev, std::string::npos);
      token = std::move(out);
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->DecodeChain(tokens));
    return absl::OkStatus();
  }
  absl::Status DecodeChainRaw(std::vector<std::string>* tokens) const override {
    for (const auto& part : parts_) {
      RETURN_IF_ERROR(part->DecodeChainRaw(tokens));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// The list under `key` of a Sequence component.
absl::StatusOr<const json*> GetList(const json& j, const char* key,
                                    absl::string_view component) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return Malformed(component, absl::StrCat("\"", key, "\" must be a list"));
  }
  return &*it;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j) {
  constexpr absl::string_view kWhere = "normalizer";
  ASSIGN_OR_RETURN(const std::string type, TypeOf(j, kWhere));
  if (type == "NFC") {
    return std::make_unique<UnicodeNormalizer>(
        unicode::NormalizationForm::kNfc);
  }
  if (type == "NFD") {
    return std::make_unique<UnicodeNormalizer>(
        unicode::NormalizationForm::kNfd);
  }
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(
        unicode::NormalizationForm::kNfkc);
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(
        unicode::NormalizationForm::kNfkd);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const bool left, GetBool(j, "strip_left", true, kWhere));
    ASSIGN_OR_RETURN(const bool right, GetBool(j, "strip_right", true, kWhere));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prepend, GetString(j, "prepend", kWhere));
    return std::make_unique<PrependNormalizer>(std::move(prepend));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern,
                     GetPattern(j, "normalizer Replace"));
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", kWhere));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern),
                                               std::move(content));
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* list, GetList(j, "normalizers", kWhere));
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const json& item : *list) {
      ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> part, ParseNormalizer(item));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  return Unsupported(kWhere, type);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& j) {
  constexpr absl::string_view kWhere = "pre_tokenizer";
  ASSIGN_OR_RETURN(const std::string type, TypeOf(j, kWhere));
  if (type == "Split") {
    ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern,
                     GetPattern(j, "pre_tokenizer Split"));
    ASSIGN_OR_RETURN(const SplitBehavior behavior, ParseBehavior(j, kWhere));
    ASSIGN_OR_RETURN(const bool invert, GetBool(j, "invert", false, kWhere));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior,
                                               invert);
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(const bool add_prefix_space,
                     GetBool(j, "add_prefix_space", true, kWhere));
    ASSIGN_OR_RETURN(const bool use_regex,
                     GetBool(j, "use_regex", true, kWhere));
    std::unique_ptr<Regex> regex;
    if (use_regex) {
      ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2Pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space,
                                                   std::move(regex));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(MetaspaceConfig config,
                     ParseMetaspace(j, "pre_tokenizer Metaspace"));
    return std::make_unique<MetaspacePreTokenizer>(config);
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(const bool individual,
                     GetBool(j, "individual_digits", false, kWhere));
    return std::make_unique<DigitsPreTokenizer>(individual);
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* list, GetList(j, "pretokenizers", kWhere));
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const json& item : *list) {
      ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> part,
                       ParsePreTokenizer(item));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  return Unsupported(kWhere, type);
}

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& j) {
  constexpr absl::string_view kWhere = "decoder";
  ASSIGN_OR_RETURN(const std::string type, TypeOf(j, kWhere));
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(MetaspaceConfig config,
                     ParseMetaspace(j, "decoder Metaspace"));
    return std::make_unique<MetaspaceDecoder>(config);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const char32_t content,
                     GetChar(j, "content", "decoder Strip"));
    ASSIGN_OR_RETURN(const int64_t start, GetUnsigned(j, "start", kWhere));
    ASSIGN_OR_RETURN(const int64_t stop, GetUnsigned(j, "stop", kWhere));
    return std::make_unique<StripDecoder>(content, start, stop);
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern,
                     GetPattern(j, "decoder Replace"));
    ASSIGN_OR_RETURN(std::string content, GetString(j, "content", kWhere));
    return std::make_unique<ReplaceDecoder>(std::move(pattern),
                                            std::move(content));
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* list, GetList(j, "decoders", kWhere));
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const json& item : *list) {
      ASSIGN_OR_RETURN(std::unique_ptr<Decoder> part, ParseDecoder(item));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  return Unsupported(kWhere, type);
}

}  // namespace hf
}  // namespace tessera
