#include "runtime/grammar/code_ranges.h"

#include <algorithm>

namespace tessera {
namespace grammar {

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
