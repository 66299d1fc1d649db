#include "runtime/text/bpe.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "runtime/text/unicode.h"

namespace tessera {
namespace {

// One symbol of a word being merged: a doubly linked list threaded through a
// vector, so a merge is O(1) and positions stay stable for the heap. A symbol
// absorbed into its left neighbour gets len 0.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;
};

struct HeapEntry {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// std heap functions keep the "largest" element on top; this order makes it
// the lowest rank, then the leftmost position, which is HF's merge order. A
// functor rather than a function pointer, so that the heap code inlines it.
struct HeapAfter {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

void AddSymbol(std::vector<Symbol>* symbols, int32_t id, int32_t len) {
  const auto n = static_cast<int32_t>(symbols->size());
  if (n > 0) symbols->back().next = n;
  symbols->push_back({id, n - 1, -1, len});
}

using WordCache = absl::flat_hash_map<std::string, std::vector<int32_t>>;

// The calling thread's cache for the model with `cache_id`. Two slots, so a
// thread that alternates between two tokenizers keeps both warm; the least
// recently used slot is emptied for a third.
WordCache& ThreadWordCache(uint64_t cache_id) {
  struct Slot {
    uint64_t owner = 0;
    uint64_t last_use = 0;
    WordCache words;
  };
  thread_local std::array<Slot, 2> slots;
  thread_local uint64_t clock = 0;
  ++clock;
  Slot* victim = &slots[0];
  for (Slot& slot : slots) {
    if (slot.owner == cache_id) {
      slot.last_use = clock;
      return slot.words;
    }
    if (slot.last_use < victim->last_use) victim = &slot;
  }
  victim->owner = cache_id;
  victim->last_use = clock;
  victim->words.clear();
  return victim->words;
}

uint64_t NextCacheId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

BpeModel::BpeModel(BpeOptions options)
    : options_(std::move(options)), cache_id_(NextCacheId()) {}

size_t BpeModel::MinIds(absl::string_view word) const {
  if (word.empty()) return 0;
  if (options_.fuse_unk || max_token_bytes_ == 0) return 1;
  if (!options_.has_unk_token) {
    // Without an unknown token a character not in the vocabulary (and not
    // covered by byte fallback) gives no id at all.
    absl::string_view last_known;
    size_t pos = 0;
    while (pos < word.size()) {
      const size_t begin = pos;
      pos += std::max<size_t>(
          1, unicode::SequenceLength(static_cast<unsigned char>(word[pos])));
      pos = std::min(pos, word.size());
      const absl::string_view c = word.substr(begin, pos - begin);
      if (c.size() == 1 && single_byte_token_[static_cast<unsigned char>(c[0])])
        continue;
      if (c == last_known) continue;  // runs of one character are common
      if (vocab_.contains(c)) {
        last_known = c;
        continue;
      }
      if (options_.byte_fallback) {
        bool all_bytes = true;
        for (unsigned char b : c) all_bytes = all_bytes && byte_ids_[b] >= 0;
        if (all_bytes) continue;
      }
      return 0;
    }
  }
  return (word.size() + max_token_bytes_ - 1) / max_token_bytes_;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(Vocab vocab,
                                                           const Merges& merges,
                                                           BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel(std::move(options)));
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: model vocab token \"", token,
                       "\" has negative id ", id));
    }
    max_id = std::max(max_id, id);
  }
  model->id_to_token_.resize(max_id + 1);
  model->has_id_.assign(max_id + 1, false);
  for (const auto& [token, id] : vocab) {
    model->id_to_token_[id] = token;
    model->has_id_[id] = true;
    model->max_token_bytes_ = std::max(model->max_token_bytes_, token.size());
    if (token.size() == 1) {
      model->single_byte_token_[static_cast<unsigned char>(token[0])] = true;
    }
  }
  model->vocab_ = std::move(vocab);

  const size_t prefix_len = model->options_.continuing_subword_prefix.size();
  model->merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t left_id = model->TokenToId(left);
    const int32_t right_id = model->TokenToId(right);
    if (left_id < 0 || right_id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: BPE merge ", rank, " (\"", left, "\" \"", right,
          "\") uses a token that is not in the vocabulary"));
    }
    if (right.size() < prefix_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: BPE merge ", rank, " right side \"",
                       right, "\" is shorter than continuing_subword_prefix"));
    }
    merged.assign(left);
    merged.append(right, prefix_len, std::string::npos);
    const int32_t new_id = model->TokenToId(merged);
    if (new_id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: BPE merge ", rank, " produces \"",
                       merged, "\", which is not in the vocabulary"));
    }
    // A repeated pair keeps its last rank, as HF's map insertion does.
    model->merges_.insert_or_assign(PairKey(left_id, right_id),
                                    Merge{static_cast<int32_t>(rank), new_id});
  }

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    model->byte_ids_[b] = model->TokenToId(name);
  }
  return model;
}

int32_t BpeModel::TokenToId(absl::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

absl::Status BpeModel::Tokenize(absl::string_view word,
                                std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    const int32_t id = TokenToId(word);
    if (id >= 0) {
      ids->push_back(id);
      return absl::OkStatus();
    }
  }
  if (word.size() >= kMaxCachedWordBytes) return MergeWord(word, ids);
  WordCache& cache = ThreadWordCache(cache_id_);
  const auto it = cache.find(word);
  if (it != cache.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return absl::OkStatus();
  }
  const size_t first = ids->size();
  if (absl::Status status = MergeWord(word, ids); !status.ok()) return status;
  if (cache.size() >= kCacheCapacity) cache.clear();
  cache.emplace(word, std::vector<int32_t>(ids->begin() + first, ids->end()));
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(absl::string_view word,
                                 std::vector<int32_t>* ids) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<HeapEntry> heap;
  thread_local std::string piece;
  symbols.clear();
  heap.clear();

  const bool affixes = !options_.continuing_subword_prefix.empty() ||
                       !options_.end_of_word_suffix.empty();
  // A run of unknown characters waiting to be emitted (fused or not).
  int32_t unk_id = -1;
  int32_t unk_len = 0;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t char_len =
        unicode::SequenceLength(static_cast<unsigned char>(word[pos]));
    const absl::string_view ch = word.substr(pos, char_len);
    const bool is_first = pos == 0;
    pos += char_len;
    const bool is_last = pos >= word.size();
    absl::string_view s = ch;
    if (affixes) {
      piece.clear();
      if (!is_first) piece += options_.continuing_subword_prefix;
      piece.append(ch.data(), ch.size());
      if (is_last) piece += options_.end_of_word_suffix;
      s = piece;
    }
    const int32_t id = TokenToId(s);
    if (id >= 0) {
      if (unk_id >= 0) {
        AddSymbol(&symbols, unk_id, unk_len);
        unk_id = -1;
      }
      AddSymbol(&symbols, id, static_cast<int32_t>(char_len));
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (unsigned char b : s) all_bytes = all_bytes && byte_ids_[b] >= 0;
      if (all_bytes) {
        // HF emits the bytes without flushing a pending unknown token first;
        // kept for exactness.
        for (unsigned char b : s) AddSymbol(&symbols, byte_ids_[b], 1);
        continue;
      }
    }
    if (!options_.has_unk_token) continue;  // HF drops the character.
    const int32_t unk = TokenToId(options_.unk_token);
    if (unk < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: unk_token \"", options_.unk_token,
                       "\" is not in the vocabulary"));
    }
    if (unk_id >= 0 && options_.fuse_unk) {
      unk_len += static_cast<int32_t>(char_len);
    } else {
      if (unk_id >= 0) AddSymbol(&symbols, unk_id, unk_len);
      unk_id = unk;
      unk_len = static_cast<int32_t>(char_len);
    }
  }
  if (unk_id >= 0) AddSymbol(&symbols, unk_id, unk_len);

  const auto find_merge = [this](int32_t left, int32_t right) -> const Merge* {
    const auto it = merges_.find(PairKey(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), HeapAfter());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), HeapAfter());
    const HeapEntry top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    // Stale entries (a neighbour changed since they were queued) are skipped;
    // like HF, only the resulting id is compared.
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;

    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[right_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) {
        heap.push_back({m->rank, left.prev, m->new_id});
        std::push_heap(heap.begin(), heap.end(), HeapAfter());
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[left.next].id)) {
        heap.push_back({m->rank, top.pos, m->new_id});
        std::push_heap(heap.begin(), heap.end(), HeapAfter());
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
  return absl::OkStatus();
}

}  // namespace tessera
