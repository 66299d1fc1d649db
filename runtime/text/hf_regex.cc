#include "runtime/text/hf_regex.h"

#include <pcre2.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/text/unicode.h"

namespace tessera {
namespace {

// Oniguruma's \s is Unicode White_Space; PCRE2's (10.42, UCP) also matches
// U+180E. \w is the Unicode word class (letters, marks, decimal and letter
// numbers, connector punctuation, joiners); PCRE2's omits marks. \h is a hex
// digit in Oniguruma but horizontal space in PCRE2. Each is spelled out as
// class contents so it works inside and outside brackets.
constexpr char kSpaceClass[] = "\\p{Z}\\t-\\r\\x{85}";
constexpr char kWordClass[] =
    "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}";
constexpr char kHexClass[] = "0-9a-fA-F";

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
         (c >= 'A' && c <= 'F');
}

// Per-thread match state: JIT matching needs a stack and match data, and
// sharing them across threads would need locks on the hot path.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    // Long runs of letters or spaces recurse in JIT code; 32 KiB (the default)
    // can run out on pathological inputs, 8 MiB cannot in practice.
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (match_context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
    }
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(match_context);
    pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigurumaPattern(
    absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  // Offset in `out` where the current class's contents start (after "[" or
  // "[^"), to recognise a leading literal ']'.
  size_t class_start = 0;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 >= pattern.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("regex \"", pattern, "\" ends with a backslash"));
      }
      const char e = pattern[i + 1];
      const char* contents = nullptr;
      bool negated = false;
      switch (e) {
        case 's':
        case 'S':
          contents = kSpaceClass;
          negated = e == 'S';
          break;
        case 'w':
        case 'W':
          contents = kWordClass;
          negated = e == 'W';
          break;
        case 'h':
        case 'H':
          contents = kHexClass;
          negated = e == 'H';
          break;
        default:
          break;
      }
      if (contents != nullptr) {
        if (in_class) {
          if (negated) {
            return absl::UnimplementedError(
                absl::StrCat("regex \"", pattern, "\": \\", std::string(1, e),
                             " inside a character class is not supported"));
          }
          out += contents;
        } else {
          absl::StrAppend(&out, negated ? "[^" : "[", contents, "]");
        }
        i += 2;
        continue;
      }
      if (e == 'u' && i + 5 < pattern.size() && IsHexDigit(pattern[i + 2]) &&
          IsHexDigit(pattern[i + 3]) && IsHexDigit(pattern[i + 4]) &&
          IsHexDigit(pattern[i + 5])) {
        absl::StrAppend(&out, "\\x{", pattern.substr(i + 2, 4), "}");
        i += 6;
        continue;
      }
      // Any other escape means the same in both engines: copy it with the
      // whole (possibly multi-byte) escaped character.
      out.push_back('\\');
      const size_t len = unicode::SequenceLength(static_cast<unsigned char>(e));
      out.append(pattern.data() + i + 1, std::min(len, pattern.size() - i - 1));
      i += 1 + len;
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (pattern.substr(i, 2) == "[:") {
          // A POSIX class such as [:alpha:]: copy it whole.
          const size_t end = pattern.find(":]", i + 2);
          if (end == absl::string_view::npos) {
            return absl::InvalidArgumentError(absl::StrCat(
                "regex \"", pattern, "\": unterminated POSIX class"));
          }
          out.append(pattern.data() + i, end + 2 - i);
          i = end + 2;
          continue;
        }
        return absl::UnimplementedError(
            absl::StrCat("regex \"", pattern,
                         "\": nested character classes are not supported"));
      }
      if (c == '&' && pattern.substr(i, 2) == "&&") {
        return absl::UnimplementedError(absl::StrCat(
            "regex \"", pattern,
            "\": character class intersection (&&) is not supported"));
      }
      if (c == ']' && out.size() > class_start) in_class = false;
      out.push_back(c);
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out.push_back('[');
      ++i;
      if (i < pattern.size() && pattern[i] == '^') {
        out.push_back('^');
        ++i;
      }
      class_start = out.size();
      continue;
    }
    out.push_back(c);
    ++i;
  }
  if (in_class) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", pattern, "\": unterminated character class"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(
    absl::string_view pattern) {
  auto translated = TranslateOnigurumaPattern(pattern);
  if (!translated.ok()) return translated.status();
  return CompileTranslated(std::string(pattern), *translated,
                           /*literal=*/false);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(
    absl::string_view literal) {
  return CompileTranslated(std::string(literal), std::string(literal),
                           /*literal=*/true);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileTranslated(
    std::string original, const std::string& pcre_pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2 rejects UCP together with LITERAL; a literal needs no classes.
  // Oniguruma's ^ and $ always match at line boundaries (Ruby semantics),
  // which PCRE2 calls multiline mode.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL
                                   : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(pcre_pattern.data()), pcre_pattern.size(),
      options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", original, "\" does not compile (PCRE2: ", Pcre2Error(error),
        " at offset ", error_offset, ")"));
  }
  // Without JIT the interpreter still gives the same matches, only slower.
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Regex>(new Regex(std::move(original), code, jit));
}

Regex::~Regex() { pcre2_code_free(code_); }

absl::Status Regex::FindAll(absl::string_view text,
                            std::vector<RegexMatch>* out) const {
  return ForEachMatch(text, [out](RegexMatch m) {
    out->push_back(m);
    return absl::OkStatus();
  });
}

absl::Status Regex::ForEachMatch(
    absl::string_view text,
    absl::FunctionRef<absl::Status(RegexMatch)> on_match) const {
  ThreadMatchState& state = MatchState();
  if (state.match_data == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  std::optional<size_t> last_match_end;
  while (start <= n) {
    int rc = PCRE2_ERROR_JIT_STACKLIMIT;
    if (jit_) {
      rc = pcre2_jit_match(code_, subject, n, start, 0, state.match_data,
                           state.match_context);
    }
    if (!jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) {
      // The interpreter keeps its backtracking frames on the heap, so it
      // copes where the JIT stack ran out. The text was validated once.
      rc = pcre2_match(code_, subject, n, start, PCRE2_NO_UTF_CHECK,
                       state.match_data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      // A property of the text (a run too long for the matcher's limits),
      // not of the server's load: never ResourceExhausted (HTTP 429).
      return absl::InvalidArgumentError(
          absl::StrCat("regex \"", pattern_, "\" failed: ", Pcre2Error(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && begin == start && last_match_end == start) {
      // Step over one character and look again, as Oniguruma does.
      if (start >= n) break;
      start += unicode::SequenceLength(static_cast<unsigned char>(text[start]));
      continue;
    }
    if (absl::Status status = on_match({begin, end}); !status.ok()) {
      return status;
    }
    last_match_end = end;
    start = end;
    if (begin == end && end >= n) break;
  }
  return absl::OkStatus();
}

}  // namespace tessera
