#include "runtime/grammar/code_ranges.h"

#include <algorithm>

namespace tessera {
namespace grammar {

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

CodeRanges NormalizeRanges(CodeRanges ranges) {
  CodeRanges cut;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (lo < 0xD800 && hi > 0xDFFF) {
      cut.push_back({lo, 0xD7FF});
      cut.push_back({0xE000, hi});
    } else if (lo >= 0xD800 && hi <= 0xDFFF) {
      continue;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      cut.push_back({0xE000, hi});
    } else if (hi >= 0xD800 && hi <= 0xDFFF) {
      cut.push_back({lo, 0xD7FF});
    } else {
      cut.push_back({lo, hi});
    }
  }
  std::sort(cut.begin(), cut.end());
  CodeRanges merged;
  for (auto r : cut) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

CodeRanges ComplementRanges(const CodeRanges& ranges) {
  CodeRanges out;
  char32_t next = 0;
  for (auto [lo, hi] : ranges) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return NormalizeRanges(std::move(out));
}

}  // namespace grammar
}  // namespace tessera
