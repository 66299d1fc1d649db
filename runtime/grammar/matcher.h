// CompiledGrammar and GrammarMatcher: a Grammar (grammar.h) turned into the
// per-step set of tokens a sequence may draw next.
//
// The matcher keeps the set of parse stacks the output so far allows (a
// nondeterministic pushdown automaton over bytes; stacks share their tails in
// an arena). The allowed tokens of a state are found the way xgrammar's
// "adaptive token mask cache" finds them, because walking the whole
// vocabulary per step costs tens of milliseconds:
//  - Once per set of stack tops (each stack's top kCacheFrames frames'
//    positions) and vocabulary, lazily, every token is classified with the
//    rest of the stacks unknown: accepted (some path consumes all its bytes
//    above an unknown rest), rejected (every path fails there), or uncertain
//    (a path pops into an unknown rest with bytes left). The fill walks the
//    vocabulary's byte trie (token_vocabulary.h), each distinct prefix once,
//    skipping a dead prefix's subtree, and follows the grammar through a
//    lazy DFA: the set of stacks after each prefix is a state, and a
//    (state, byte class) transition is computed once per fill, so most trie
//    nodes cost one table load (under 1 ms a fill on a 151,669-token
//    vocabulary, 333k trie nodes).
//  - Per step: the tops' accepted set is the mask, and the uncertain tokens
//    are walked once with the real stacks (through the same kind of lazy
//    DFA). In JSON they are the few that close a string or a value.
//  - The result is cached per grammar by the state's whole stacks (a
//    StepMask): a later step of any sequence that reaches the same stacks
//    writes one class's bits (or a copied mask) and a few ids, a couple of
//    microseconds.
//
// Bounds: a stack is at most kMaxStackDepth frames (deeper paths are
// dropped, so nesting that deep is refused rather than followed); a state
// holds at most kMaxStacks stacks and a mask is computed over at most
// kMaxMaskStacks (an ambiguous or hostile grammar past them fails its
// request with an error rather than growing or stalling the step). A
// grammar keeps at most kMaxCachedTops token classes and kMaxCachedMaskBytes
// of whole-state masks: past them the least recently used are dropped and
// filled again when next needed, so a large legitimate grammar (or many
// sequences exploring one) costs fills, never an error, and memory stays
// bounded. A walk's lazy DFA is rebuilt from the states it stands on when it
// outgrows its own bounds (matcher.cc), so it costs time, not memory.
//
// Threads: a CompiledGrammar is shared and thread-safe (its caches are
// behind one mutex, filled outside it; two threads may fill the same entry
// and the first stored wins; a class in use stays alive when dropped); a
// GrammarMatcher belongs to one sequence and one thread at a time.
#ifndef TESSERA_RUNTIME_GRAMMAR_MATCHER_H_
#define TESSERA_RUNTIME_GRAMMAR_MATCHER_H_

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/token_vocabulary.h"

namespace tessera {
namespace grammar {

inline constexpr int32_t kMaxStackDepth = 1000;
// How many of a stack's top frames key its token classes. One frame (the
// position alone) leaves every token that leaves the position's rule
// uncertain: in a JSON string that is nearly all of them, since each
// character is its own rule. Four frames reach past the string's closing
// quote, so only the tokens that end a value stay uncertain.
inline constexpr int kCacheFrames = 4;
namespace internal {
class Arena;
// The grammar's bytes in classes that every byte set treats alike:
// of[byte] is its class, representative[class] one byte of it.
struct ByteClasses {
  explicit ByteClasses(const Grammar& g);
  std::array<uint8_t, 256> of;
  int32_t count = 1;
  std::vector<uint8_t> representative;
};
}  // namespace internal
inline constexpr size_t kMaxStacks = 4096;
// A mask's walks carry every stack of the state, so their cost grows with
// the stacks: a state with more than this fails its request rather than
// stalling every sequence of the step.
inline constexpr size_t kMaxMaskStacks = 64;
// Token classes kept per grammar (each up to a vocabulary bitmask, 19 KB for
// 151,669 tokens): the least recently used past this are dropped.
inline constexpr size_t kMaxCachedTops = 2048;

// Whole-state masks kept per grammar (see CompiledGrammar::StepMask), in
// bytes of what they hold beyond their classes.
inline constexpr size_t kMaxCachedMaskBytes = size_t{8} << 20;
// A state whose stacks have more frames than this in all is not cached (its
// key would cost more than the mask).
inline constexpr size_t kMaxMaskKeyFrames = 4096;

namespace internal {
// A map holding entries of at most `capacity` cost in all (each Insert says
// what its entry costs) that drops the least recently used. Not
// thread-safe: its owner locks around it.
template <typename V>
class LruMap {
 public:
  using Key = std::vector<int32_t>;
  explicit LruMap(size_t capacity) : capacity_(capacity) {}

  // The value stored for `key`, now the most recent; null when absent.
  const V* Find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    items_.splice(items_.begin(), items_, it->second);
    return &it->second->value;
  }
  // Stores `value` unless `key` is present (then keeps the stored one);
  // returns what is stored. Drops the least recently used past capacity
  // (never the entry just stored).
  const V& Insert(Key key, V value, size_t cost = 1) {
    if (const V* found = Find(key)) return *found;
    items_.push_front(Item{key, std::move(value), cost});
    index_.emplace(std::move(key), items_.begin());
    total_ += cost;
    while (total_ > capacity_ && items_.size() > 1) {
      total_ -= items_.back().cost;
      index_.erase(items_.back().key);
      items_.pop_back();
      ++evictions_;
    }
    return items_.front().value;
  }
  size_t size() const { return items_.size(); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Item {
    Key key;
    V value;
    size_t cost;
  };
  size_t capacity_;
  size_t total_ = 0;
  std::list<Item> items_;  // Most recent first.
  absl::flat_hash_map<Key, typename std::list<Item>::iterator> index_;
  int64_t evictions_ = 0;
};
}  // namespace internal

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar,
                  std::shared_ptr<const TokenVocabulary> vocabulary);
  ~CompiledGrammar();

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  const internal::ByteClasses& byte_classes() const { return byte_classes_; }

  // The token classes (see above) of a state whose stacks' top frames are
  // `tops`: for each distinct stack top, in sorted order, its positions
  // (top first, at most kCacheFrames) then kExactTop when those are the
  // whole stack (the root's end below them) or kOpenTop when the rest is
  // unknown. Filled on first use, by one walk for all the stacks.
  static constexpr int32_t kOpenTop = -1;
  static constexpr int32_t kExactTop = -2;
  struct PositionCache {
    // Accepted ids: a bitmask of vocabulary().mask_words() words when there
    // are many, else a list.
    std::vector<uint32_t> accepted_bits;
    std::vector<int32_t> accepted_ids;
    // Uncertain tokens as indices into vocabulary().sorted(), ascending (so
    // a walk over them shares prefixes).
    std::vector<int32_t> uncertain;
  };
  // Shared: a class dropped from the cache lives on while a step uses it.
  std::shared_ptr<const PositionCache> Cache(
      const std::vector<int32_t>& tops) const;

  // A whole state's mask, for the next step of any sequence that reaches
  // the same stacks, in the form that is quickest to write: one class's
  // accepted bits (weak: a class dropped from the cache makes the entry
  // stale rather than keeping the class alive) or a copy of the whole mask
  // when several dense classes make it, plus the ids set besides. Keyed by
  // every stack's positions, top first, each stack followed by -1. The end
  // ids are the matcher's to add.
  struct StepMask {
    std::weak_ptr<const PositionCache> base;
    bool has_base = false;
    std::vector<uint32_t> bits;  // Empty, or mask words.
    std::vector<int32_t> ids;
  };
  std::shared_ptr<const StepMask> FindMask(
      const std::vector<int32_t>& key) const;
  void StoreMask(std::vector<int32_t> key,
                 std::shared_ptr<const StepMask> mask) const;

  // Classes held now (at most kMaxCachedTops), and filled in all (tests,
  // statistics).
  int64_t cached_positions() const;
  int64_t filled_positions() const;

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  internal::ByteClasses byte_classes_;
  mutable std::mutex mu_;
  // Key: the tops (see Cache).
  mutable internal::LruMap<std::shared_ptr<const PositionCache>> caches_{
      kMaxCachedTops};
  mutable int64_t fills_ = 0;
  mutable internal::LruMap<std::shared_ptr<const StepMask>> masks_{
      kMaxCachedMaskBytes};
};

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary,
               size_t capacity = 256);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(
      const std::string& ebnf);
  const std::shared_ptr<const TokenVocabulary>& vocabulary() const {
    return vocabulary_;
  }

 private:
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t capacity_;
  std::mutex mu_;
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    uint64_t last_used = 0;
  };
  absl::flat_hash_map<std::string, Entry> entries_;
  uint64_t clock_ = 0;
};

class GrammarMatcher {
 public:
  // `end_ids`: the ids that end the sequence (EOS, stop_token_ids): allowed
  // exactly when the grammar is complete.
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                 std::vector<int32_t> end_ids);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // Writes the next draw's allowed ids as a bitmask of mask_words() words.
  // FailedPrecondition when no token is allowed (the vocabulary cannot
  // continue the grammar) or the state grew past kMaxStacks.
  absl::Status FillNextTokenMask(absl::Span<uint32_t> mask);
  // Advances by `token`; InvalidArgument when the grammar does not allow it
  // (the state is unchanged then).
  absl::Status Accept(int32_t token);

  // A matcher in the same state, sharing the compiled grammar (a rollback
  // point, or a reference check in tests).
  std::unique_ptr<GrammarMatcher> Clone() const;

  // The output so far is a complete sentence of the grammar.
  bool CanEnd() const { return can_end_; }
  // An end id was accepted.
  bool terminated() const { return terminated_; }
  int32_t mask_words() const { return grammar_->vocabulary().mask_words(); }

 private:
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                 std::vector<int32_t> end_ids, const internal::Arena& arena);
  // Writes the state's mask (without the end ids) over `mask` from the
  // grammar's cache of whole-state masks; false (`mask` untouched) when it
  // has none.
  bool ApplyCachedMask(const std::vector<int32_t>& key,
                       absl::Span<uint32_t> mask) const;
  // ORs the state's mask into `mask` from its stacks' token classes and a
  // walk of their uncertain tokens; stores it under `key` unless null.
  absl::Status ComputeMask(absl::Span<uint32_t> mask,
                           std::vector<int32_t>* key) const;
  // The state's stacks interned into `to` (whole, over the grammar's end).
  std::vector<int32_t> CopyStacks(internal::Arena* to) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> end_ids_;
  // The stacks' arena (matcher.cc): the committed state's nodes, then
  // scratch that each call discards.
  std::unique_ptr<internal::Arena> arena_;
  std::vector<int32_t> state_;  // Its byte-topped stacks (arena nodes).
  size_t compacted_size_ = 0;   // The arena's size after its last Compact.
  std::vector<int32_t> scratch_[2];
  bool can_end_ = false;
  bool terminated_ = false;
};

}  // namespace grammar
}  // namespace tessera

#endif  // TESSERA_RUNTIME_GRAMMAR_MATCHER_H_
