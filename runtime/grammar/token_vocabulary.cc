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
  v->BuildTrie();
  return std::shared_ptr<const TokenVocabulary>(std::move(v));
}

void TokenVocabulary::BuildTrie() {
  // One node per distinct prefix: token i adds the nodes of its bytes past
  // its common prefix with token i - 1. `path[d]` is the node of the current
  // token's first d bytes; a node's subtree ends when the path leaves it.
  trie_.assign(1, TrieNode{0, 0, 0, 0});
  std::vector<int32_t> path = {0};
  const auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      trie_[path.back()].end = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
  };
  for (size_t k = 0; k < sorted_.size(); ++k) {
    const std::string& tok = bytes_[sorted_[k]];
    const size_t common = k == 0 ? 0 : static_cast<size_t>(lcp_[k]);
    close_to(common);
    for (size_t d = common; d < tok.size(); ++d) {
      path.push_back(static_cast<int32_t>(trie_.size()));
      trie_.push_back(TrieNode{0, static_cast<int32_t>(k),
                               static_cast<uint16_t>(d + 1),
                               static_cast<uint8_t>(tok[d])});
    }
  }
  close_to(0);
  trie_[0].end = static_cast<int32_t>(trie_.size());
  trie_.push_back(TrieNode{static_cast<int32_t>(trie_.size()) + 1,
                           static_cast<int32_t>(sorted_.size()), 0, 0});
}

}  // namespace grammar
}  // namespace tessera
