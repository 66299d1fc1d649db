// TokenVocabulary: what a grammar needs to know of a tokenizer, prepared
// once per tokenizer and shared by every compiled grammar: each id's bytes
// (what the token adds to the text in the middle of a sequence), which ids a
// grammar may never produce (special tokens, empty ones, ids past the
// tokenizer's end), and the ids in byte order with each one's common prefix
// with the one before, so that a grammar walks shared prefixes once; and the
// same order as a byte trie, so that a walk of the whole vocabulary visits
// each distinct prefix once and skips a dead prefix's subtree in one step.
#ifndef TESSERA_RUNTIME_GRAMMAR_TOKEN_VOCABULARY_H_
#define TESSERA_RUNTIME_GRAMMAR_TOKEN_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {
namespace grammar {

class TokenVocabulary {
 public:
  // `bytes[id]` for every id of the model's logits (size = the vocabulary the
  // sampler sees); `excluded[id]` (same size) marks ids a grammar never
  // allows. Empty tokens are excluded too (they would not move a grammar).
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> Create(
      std::vector<std::string> bytes, std::vector<bool> excluded);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  // Words of a bitmask over the ids (bit id % 32 of word id / 32).
  int32_t mask_words() const { return (size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool excluded(int32_t id) const { return excluded_[id]; }

  // The allowed ids sorted by their bytes; lcp(i) is the length of the
  // common prefix of sorted(i - 1) and sorted(i) (0 for i = 0).
  const std::vector<int32_t>& sorted() const { return sorted_; }
  int32_t lcp(size_t i) const { return lcp_[i]; }
  // The longest token, in bytes.
  int32_t max_token_bytes() const { return max_token_bytes_; }

  // The byte trie of the allowed tokens, in preorder (children in byte
  // order), which is sorted()'s order: node 0 is the root (the empty
  // prefix) and node i > 0 spells its parent's prefix and trie_byte(i), at
  // depth trie_depth(i) (its length). Node i's subtree is the nodes
  // [i, trie_end(i)); the tokens whose bytes extend its prefix are
  // sorted()[trie_tokens(i) .. trie_tokens(trie_end(i))), and those whose
  // bytes equal it sorted()[trie_tokens(i) .. trie_tokens(i + 1)).
  // trie_tokens(trie_nodes()) is sorted().size().
  struct TrieNode {
    int32_t end;     // trie_end
    int32_t tokens;  // trie_tokens
    uint16_t depth;  // trie_depth
    uint8_t byte;    // trie_byte
  };
  int32_t trie_nodes() const { return static_cast<int32_t>(trie_.size()) - 1; }
  uint8_t trie_byte(int32_t i) const { return trie_[i].byte; }
  int32_t trie_depth(int32_t i) const { return trie_[i].depth; }
  int32_t trie_end(int32_t i) const { return trie_[i].end; }
  int32_t trie_tokens(int32_t i) const { return trie_[i].tokens; }
  // The nodes, then one past the last whose `tokens` is sorted().size().
  const TrieNode* trie() const { return trie_.data(); }

 private:
  TokenVocabulary() = default;
  void BuildTrie();
  std::vector<std::string> bytes_;
  std::vector<bool> excluded_;
  std::vector<int32_t> sorted_;
  std::vector<int32_t> lcp_;
  int32_t max_token_bytes_ = 0;
  std::vector<TrieNode> trie_;  // One more than the nodes.
};

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_TOKEN_VOCABULARY_H_
