// Unicode helpers for the Hugging Face tokenizer pipeline.
//
// Character properties and normalization come from utf8proc (never from
// hand-written tables), so they follow one Unicode version throughout. The
// predicates below reproduce the Rust definitions that Hugging Face
// `tokenizers` relies on (`char::is_whitespace`, `char::is_numeric`, the regex
// crate's `\w`), built from general categories.
#ifndef TESSERA_RUNTIME_TEXT_UNICODE_H_
#define TESSERA_RUNTIME_TEXT_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera {
namespace unicode {

// Decodes the code point starting at `s[*pos]` and advances `*pos` past it.
// The input must be valid UTF-8 (see IsValidUtf8).
char32_t NextCodePoint(absl::string_view s, size_t* pos);

// Number of bytes of the UTF-8 sequence that starts with `lead`.
inline size_t SequenceLength(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

void AppendUtf8(char32_t cp, std::string* out);

// Strict UTF-8 validation (no surrogates, no overlong forms, <= U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// `bytes` decoded as UTF-8 with every maximal invalid subpart replaced by
// U+FFFD, as Rust's String::from_utf8_lossy and Python's errors="replace" do.
std::string Utf8Lossy(absl::string_view bytes);

// Unicode White_Space: Zs, Zl, Zp and the controls U+0009..U+000D, U+0085.
bool IsWhiteSpace(char32_t cp);
// Rust char::is_numeric: general category Nd, Nl or No.
bool IsNumeric(char32_t cp);
// The regex crate's Unicode `\w` (letters, marks, Nd, Nl, Pc, joiners), used
// by added tokens' single_word rule.
bool IsWordChar(char32_t cp);

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8 text.
std::string Normalize(absl::string_view s, NormalizationForm form);

// Full lowercase mapping per character (Rust char::to_lowercase): the simple
// mapping, plus U+0130 -> "i\u0307", the one unconditional multi-character
// lowercase mapping in SpecialCasing.txt.
std::string ToLower(absl::string_view s);

// GPT-2's byte <-> printable-character table used by ByteLevel: printable
// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
// Returns the UTF-8 encoding of byte `b`'s character.
const std::string& ByteToChar(unsigned char b);
// Writes byte `b`'s character (one or two UTF-8 bytes) at `out` and returns
// the position after it.
char* WriteByteChar(unsigned char b, char* out);
// The byte a ByteLevel character stands for, or -1.
int CharToByte(char32_t cp);

}  // namespace unicode
}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_UNICODE_H_
