#include "runtime/text/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace tessera {
namespace unicode {
namespace {

constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";

// Valid range of the second byte of a UTF-8 sequence given its lead byte
// (Unicode Table 3-7); later continuation bytes are always 0x80..0xBF.
bool SecondByteOk(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

// Length of a sequence a lead byte announces, or 0 for a byte that can never
// start one.
size_t LeadLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Length of the valid sequence at s[i], or 0 with `*subpart` set to the
// length of the maximal invalid subpart to replace.
size_t ValidSequenceAt(absl::string_view s, size_t i, size_t* subpart) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const size_t len = LeadLength(lead);
  if (len == 0) {
    *subpart = 1;
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      *subpart = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? SecondByteOk(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *subpart = k;
      return 0;
    }
  }
  return len;
}

utf8proc_category_t Category(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

struct ByteTables {
  std::array<std::string, 256> byte_to_char;
  // The same, packed for the encode hot path: every character is below
  // U+0800, so one or two bytes.
  std::array<std::array<char, 2>, 256> packed;
  std::array<uint8_t, 256> packed_len;
  // Indexed by code point; every ByteLevel character is below U+0144.
  std::array<int16_t, 0x144> char_to_byte;
};

const ByteTables& Tables() {
  static const ByteTables* const tables = [] {
    auto* t = new ByteTables;
    t->char_to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') ||
                             (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? b : 0x100 + next++;
      AppendUtf8(cp, &t->byte_to_char[b]);
      const std::string& utf8 = t->byte_to_char[b];
      t->packed_len[b] = static_cast<uint8_t>(utf8.size());
      t->packed[b] = {utf8[0], utf8.size() > 1 ? utf8[1] : '\0'};
      t->char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  const unsigned char lead = p[0];
  if (lead < 0x80) {
    *pos += 1;
    return lead;
  }
  if (lead < 0xE0) {
    *pos += 2;
    return (char32_t{lead & 0x1Fu} << 6) | (p[1] & 0x3Fu);
  }
  if (lead < 0xF0) {
    *pos += 3;
    return (char32_t{lead & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) |
           (p[2] & 0x3Fu);
  }
  *pos += 4;
  return (char32_t{lead & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart = 0;
    const size_t len = ValidSequenceAt(s, i, &subpart);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    size_t subpart = 0;
    const size_t len = ValidSequenceAt(bytes, i, &subpart);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out.append(kReplacementUtf8);
      i += subpart;
    }
  }
  return out;
}

bool IsWhiteSpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  if (cp == 0x85) return true;
  const utf8proc_category_t c = Category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL ||
         c == UTF8PROC_CATEGORY_ZP;
}

bool IsNumeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const utf8proc_category_t c = Category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL ||
         c == UTF8PROC_CATEGORY_NO;
}

bool IsWordChar(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           (cp >= '0' && cp <= '9') || cp == '_';
  }
  // Join_Control (ZWNJ, ZWJ) is part of the regex crate's \w.
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (Category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

namespace {

// Per-code-point facts for the normalization fast path, derived once from
// utf8proc's own data.
enum NormFlag : uint8_t {
  kNonStarter = 1,  // canonical combining class != 0
  kCanonicalDecomposition = 2,
  kAnyDecomposition = 4,  // canonical or compatibility
  kSecondOfPair = 8,      // may be the second of a canonical composition
};

const std::vector<uint8_t>& NormFlags() {
  static const std::vector<uint8_t>* const flags = [] {
    auto* f = new std::vector<uint8_t>(0x110000, 0);
    utf8proc_int32_t buffer[32];
    for (utf8proc_int32_t cp = 0x80; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const utf8proc_property_t* p = utf8proc_get_property(cp);
      if (p->combining_class != 0) (*f)[cp] |= kNonStarter;
      const bool hangul = cp >= 0xAC00 && cp <= 0xD7A3;
      if (p->decomp_seqindex == UINT16_MAX && !hangul) continue;
      int boundclass = 0;
      const utf8proc_ssize_t n = utf8proc_decompose_char(
          cp, buffer, 32, UTF8PROC_DECOMPOSE, &boundclass);
      if (n > 0 && (n != 1 || buffer[0] != cp)) {
        (*f)[cp] |= kCanonicalDecomposition | kAnyDecomposition;
        // Every later element of a canonical decomposition may recompose
        // with what precedes it (this over-approximates, which is safe).
        for (utf8proc_ssize_t i = 1; i < n && i < 32; ++i) {
          (*f)[buffer[i]] |= kSecondOfPair;
        }
      }
      boundclass = 0;
      const utf8proc_ssize_t m = utf8proc_decompose_char(
          cp, buffer, 32,
          static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT),
          &boundclass);
      if (m > 0 && (m != 1 || buffer[0] != cp)) (*f)[cp] |= kAnyDecomposition;
    }
    return f;
  }();
  return *flags;
}

}  // namespace

std::string Normalize(absl::string_view s, NormalizationForm form) {
  int options = UTF8PROC_STABLE;
  uint8_t unstable = kNonStarter;
  switch (form) {
    case NormalizationForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      unstable |= kCanonicalDecomposition | kSecondOfPair;
      break;
    case NormalizationForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      unstable |= kCanonicalDecomposition;
      break;
    case NormalizationForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      unstable |= kAnyDecomposition | kSecondOfPair;
      break;
    case NormalizationForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      unstable |= kAnyDecomposition;
      break;
  }
  // A character that is a starter, has no decomposition and never composes
  // as a second element is left alone by normalization and isolates what
  // comes before it from what comes after. So only the runs of other
  // characters, each with the one character before it (a possible
  // composition partner), need utf8proc; ASCII is always such a character.
  const std::vector<uint8_t>& flags = NormFlags();
  const auto is_unstable = [&](size_t pos, size_t* next) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      *next = pos + 1;
      return false;
    }
    *next = pos;
    return (flags[NextCodePoint(s, next)] & unstable) != 0;
  };
  std::string out;
  size_t copied = 0;      // s[0, copied) is already in `out`
  size_t prev_start = 0;  // start of the character before `pos`
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next;
    if (!is_unstable(pos, &next)) {
      prev_start = pos;
      pos = next;
      continue;
    }
    const size_t region_begin = pos == 0 ? 0 : prev_start;
    size_t region_end = next;
    while (region_end < s.size() && is_unstable(region_end, &next)) {
      region_end = next;
    }
    out.append(s.data() + copied, region_begin - copied);
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(
        reinterpret_cast<const utf8proc_uint8_t*>(s.data() + region_begin),
        static_cast<utf8proc_ssize_t>(region_end - region_begin), &mapped,
        static_cast<utf8proc_option_t>(options));
    if (n >= 0) {
      out.append(reinterpret_cast<const char*>(mapped), n);
    } else {
      // Only invalid UTF-8 or allocation failure make utf8proc fail;
      // callers validate their input, so keep the text rather than lose it.
      out.append(s.data() + region_begin, region_end - region_begin);
    }
    std::free(mapped);
    copied = region_end;
    prev_start = region_end;
    pos = region_end;
  }
  if (copied == 0) return std::string(s);
  out.append(s.data() + copied, s.size() - copied);
  return out;
}

std::string ToLower(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const auto b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++pos;
      continue;
    }
    const char32_t cp = NextCodePoint(s, &pos);
    if (cp == 0x130) {
      out.append("i\xCC\x87");
      continue;
    }
    AppendUtf8(static_cast<char32_t>(
                   utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))),
               &out);
  }
  return out;
}

const std::string& ByteToChar(unsigned char b) {
  return Tables().byte_to_char[b];
}

char* WriteByteChar(unsigned char b, char* out) {
  const ByteTables& t = Tables();
  out[0] = t.packed[b][0];
  out[1] = t.packed[b][1];
  return out + t.packed_len[b];
}

int CharToByte(char32_t cp) {
  return cp < 0x144 ? Tables().char_to_byte[cp] : -1;
}

}  // namespace unicode
}  // namespace tessera
