#include "runtime/grammar/token_vocabulary.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace grammar {

// Tokens are bounded so that a walk's per-depth state stays small; no real
// vocabulary comes near it.
constexpr size_t kMaxTokenBytes = 1024;

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::Create(
    std::vector<std::string> bytes, std::vector<bool> excluded) {
  if (bytes.size() != excluded.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token vocabulary: ", bytes.size(), " tokens but ",
                     excluded.size(), " exclusion flags"));
  }
  if (bytes.empty() || bytes.size() > (size_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token vocabulary: ", bytes.size(), " tokens (1 to 2^24 accepted)"));
  }
  std::shared_ptr<TokenVocabulary> v(new TokenVocabulary());
  v->bytes_ = std::move(bytes);
  v->excluded_ = std::move(excluded);
  for (size_t id = 0; id < v->bytes_.size(); ++id) {
    if (v->bytes_[id].empty() || v->bytes_[id].size() > kMaxTokenBytes) {
      v->excluded_[id] = true;
    }
    if (!v->excluded_[id]) v->sorted_.push_back(static_cast<int32_t>(id));
  }
  std::sort(v->sorted_.begin(), v->sorted_.end(), [&](int32_t a, int32_t b) {
    const int c = v->bytes_[a].compare(v->bytes_[b]);
    return c != 0 ? c < 0 : a < b;
  });
  v->lcp_.assign(v->sorted_.size(), 0);
  for (size_t i = 0; i < v->sorted_.size(); ++i) {
    const std::string& cur = v->bytes_[v->sorted_[i]];
    v->max_token_bytes_ =
        std::max(v->max_token_bytes_, static_cast<int32_t>(cur.size()));
    if (i == 0) continue;
    const std::string& prev = v->bytes_[v->sorted_[i - 1]];
    size_t k = 0;
    while (k < cur.size() && k < prev.size() && cur[k] == prev[k]) ++k;
    v->lcp_[i] = static_cast<int32_t>(k);
  }
  return std::shared_ptr<const TokenVocabulary>(std::move(v));
}

}  // namespace grammar
}  // namespace tessera
