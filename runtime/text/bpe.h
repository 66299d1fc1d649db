// Byte-pair-encoding model of a Hugging Face tokenizer.json.
//
// Tokenize() turns one pre-tokenized word into ids exactly as `tokenizers`'
// BPE model does: characters to vocabulary ids (with byte fallback or an
// unknown token for the rest), then merges applied lowest rank first, ties to
// the leftmost pair, through a heap over a linked list of symbols: O(n log n)
// per word. Results for short words are cached.
//
// Thread safety: Tokenize() may be called from several threads at once. The
// word cache is per thread (the last two models each thread used), so lookups
// take no lock; a lock per word cost more than a tenth of the encode time.
#ifndef TESSERA_RUNTIME_TEXT_BPE_H_
#define TESSERA_RUNTIME_TEXT_BPE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

struct BpeOptions {
  // Id of `unk_token` is resolved when it is first needed, as HF does: a
  // missing unknown token is only an error for text that needs it.
  bool has_unk_token = false;
  std::string unk_token;
  // Prefix of every symbol but a word's first ("##"), suffix of its last
  // ("</w>"); both empty for byte-level and SentencePiece-style models.
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  // Consecutive unknown characters become one unknown token.
  bool fuse_unk = false;
  // Unknown characters become their UTF-8 bytes as "<0xXX>" tokens.
  bool byte_fallback = false;
  // A word that is itself in the vocabulary is emitted as is (Llama 3).
  bool ignore_merges = false;
};

class BpeModel {
 public:
  using Vocab = absl::flat_hash_map<std::string, int32_t>;
  using Merges = std::vector<std::pair<std::string, std::string>>;

  // `merges` are (left, right) token pairs, highest priority first; every
  // token of a merge and its result must be in `vocab`.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(Vocab vocab,
                                                          const Merges& merges,
                                                          BpeOptions options);

  // Appends the ids of `word` (one pre-token, non-empty) to `ids`.
  absl::Status Tokenize(absl::string_view word,
                        std::vector<int32_t>* ids) const;

  // A lower bound on the ids Tokenize(word) appends: every id stands for at
  // most the bytes of its vocabulary string, so ceil(size / longest
  // vocabulary string) when no character can vanish (each is a vocabulary
  // token, or becomes the unknown token or bytes); 1 when consecutive
  // unknown characters fuse into one id; 0 when a character would be
  // dropped (HF drops unknown characters without an unk token). Linear in
  // the word, with no allocation: cheap next to merging it.
  size_t MinIds(absl::string_view word) const;

  // -1 when `token` is not in the vocabulary.
  int32_t TokenToId(absl::string_view token) const;
  // nullptr when no vocabulary token has this id.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest vocabulary id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

  // Words longer than this (bytes) are not cached, as in HF.
  static constexpr size_t kMaxCachedWordBytes = 256;
  // A thread's cache for one model is emptied when it reaches this many
  // words, which bounds its memory (a few MB) while keeping the common words
  // of any steady stream of text.
  static constexpr size_t kCacheCapacity = 1 << 15;

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  explicit BpeModel(BpeOptions options);
  // Characters -> symbols -> merged ids, without the cache.
  absl::Status MergeWord(absl::string_view word,
                         std::vector<int32_t>* ids) const;

  BpeOptions options_;
  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  size_t max_token_bytes_ = 0;        // the longest vocabulary string
  bool single_byte_token_[256] = {};  // one-byte strings in the vocabulary
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // "<0xXX>" ids for byte fallback, -1 where the vocabulary lacks one.
  int32_t byte_ids_[256];

  // Identifies this model's entries in the per-thread word caches; unique
  // for the process, so a cache never serves a destroyed model's words to a
  // new one allocated at the same address.
  const uint64_t cache_id_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_TEXT_BPE_H_
