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
// of whole-state masks: past them its least recently used are dropped and
// filled again when next needed, so a large legitimate grammar (or many
// sequences exploring one) costs fills, never an error. Across grammars
// (many schemas: a GrammarCache's), every cached class and mask is charged
// to one GrammarMemoryBudget (1 GiB by default): past it the least recently
// used entries of any grammar that no step holds are dropped, and only when
// every entry left is in use does a class fail its request. A walk's lazy
// DFA is rebuilt from the states it stands on when it outgrows its own
// bounds (matcher.cc), so it costs time, not memory (a walk's DFA is the
// walking thread's scratch, outside the budget).
//
// Threads: a CompiledGrammar is shared and thread-safe (the caches of every
// grammar on a budget are behind the budget's one mutex, filled outside it;
// two threads may fill the same entry and the first stored wins; an entry
// in use stays alive, and charged, when dropped); a GrammarMatcher belongs
// to one sequence and one thread at a time.
#ifndef TESSERA_RUNTIME_GRAMMAR_MATCHER_H_
#define TESSERA_RUNTIME_GRAMMAR_MATCHER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
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

class CompiledGrammar;
class GrammarMemoryBudget;

namespace internal {
// The bytes one cached entry holds of a GrammarMemoryBudget, credited back
// when the entry is freed (not when it leaves the cache: a step may still
// hold it, and its bytes are held until then). Move-only.
class BudgetCharge {
 public:
  BudgetCharge() = default;
  BudgetCharge(std::shared_ptr<GrammarMemoryBudget> budget, size_t bytes);
  BudgetCharge(BudgetCharge&& o) noexcept;
  BudgetCharge& operator=(BudgetCharge&& o) noexcept;
  ~BudgetCharge();
  size_t bytes() const { return bytes_; }

 private:
  void Release();
  std::shared_ptr<GrammarMemoryBudget> budget_;
  size_t bytes_ = 0;
};

class BudgetedLru;
// One cached entry: in its grammar's map (and that map's recency list) and
// in its budget's recency list over every grammar.
struct BudgetSlot {
  BudgetedLru* owner;
  const std::vector<int32_t>* key;  // The map's own key.
  std::shared_ptr<const void> value;
  size_t cost;   // Bytes charged.
  size_t units;  // Of the map's own bound: 1, or `cost` when in bytes.
  std::list<BudgetSlot*>::iterator local;
  std::list<BudgetSlot*>::iterator global;
};

// One kind of cached entry (token classes, or step masks) of one grammar: a
// map that keeps at most `capacity` units (entries, or bytes when
// `by_bytes`), dropping its least recently used past that, and whose
// entries are charged to a GrammarMemoryBudget shared with other grammars.
// Every method needs the budget's mutex held: the budget drops entries of
// any grammar to make room, so one mutex guards them all (no lock order to
// get wrong).
class BudgetedLru {
 public:
  using Key = std::vector<int32_t>;
  BudgetedLru(GrammarMemoryBudget* budget, size_t capacity, bool by_bytes)
      : budget_(budget), capacity_(capacity), by_bytes_(by_bytes) {}
  ~BudgetedLru();  // TakeAll() must have run.
  BudgetedLru(const BudgetedLru&) = delete;
  BudgetedLru& operator=(const BudgetedLru&) = delete;

  // The value stored for `key`, now the most recent here and in the
  // budget; null when absent. Valid until the mutex is released.
  const std::shared_ptr<const void>* Find(const Key& key);
  // Stores `value` (which costs `cost` bytes) under `key` and returns it;
  // when `key` is present, keeps and returns the stored one instead unless
  // `replace`. Room is made first in this map's own bound (its least
  // recently used go, in use or not), then in the budget (the least
  // recently used entries of every grammar that no step holds). Null when
  // the budget cannot make room: what it holds is in use. On success
  // `*charge` (the value's own) holds the cost.
  std::shared_ptr<const void> Insert(Key key, std::shared_ptr<const void> value,
                                     size_t cost, BudgetCharge* charge,
                                     bool replace);
  using Entries = absl::node_hash_map<Key, BudgetSlot>;
  // Takes every entry out (of the budget's list too), for the caller to
  // free after the mutex: a grammar's entries can be megabytes, and every
  // grammar on the budget waits for its mutex.
  Entries TakeAll();
  size_t size() const { return map_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  friend class tessera::grammar::GrammarMemoryBudget;
  void Erase(BudgetSlot* slot);

  GrammarMemoryBudget* budget_;
  size_t capacity_;
  bool by_bytes_;
  size_t units_ = 0;
  size_t bytes_ = 0;
  Entries map_;
  std::list<BudgetSlot*> lru_;  // Most recent first.
};
}  // namespace internal

// One byte budget for the cached token classes and step masks of every
// grammar that shares it (a GrammarCache's, so that many schemas cannot
// hold more than it between them). Each entry is charged when cached and
// credited when freed; a charge past the limit drops the least recently
// used entries of any grammar that no step is using, and when only entries
// in use are left the charge is refused: a class then fails its request
// with FailedPrecondition (a step mask is just not cached). Thread-safe.
class GrammarMemoryBudget
    : public std::enable_shared_from_this<GrammarMemoryBudget> {
 public:
  static constexpr size_t kDefaultBytes = size_t{1} << 30;
  static std::shared_ptr<GrammarMemoryBudget> Create(
      size_t limit_bytes = kDefaultBytes);
  GrammarMemoryBudget(const GrammarMemoryBudget&) = delete;
  GrammarMemoryBudget& operator=(const GrammarMemoryBudget&) = delete;

  struct Stats {
    size_t limit_bytes = 0;
    // Charged now: cached entries and dropped ones a step still holds.
    size_t bytes = 0;
    size_t entries = 0;  // Cached, in every grammar.
    // Entries dropped to make room: for the budget, or for a grammar's own
    // bounds (kMaxCachedTops, kMaxCachedMaskBytes).
    int64_t evictions = 0;
    // Charges refused because what was left was in use (or larger than
    // the limit).
    int64_t refused = 0;
    // The largest entry a charge asked for so far (a budget below a few of
    // these per thread refuses requests).
    size_t max_entry_bytes = 0;
  };
  Stats stats() const;
  size_t limit_bytes() const { return limit_; }

 private:
  // Only Create makes one (entries' charges share it through
  // shared_from_this).
  struct Passkey {
    explicit Passkey() = default;
  };

 public:
  GrammarMemoryBudget(Passkey, size_t limit_bytes) : limit_(limit_bytes) {}

 private:
  friend class CompiledGrammar;
  friend class internal::BudgetCharge;
  friend class internal::BudgetedLru;
  // With mu_ held: drops entries until `cost` more bytes fit; false when
  // they cannot.
  bool MakeRoom(size_t cost);

  const size_t limit_;
  mutable std::mutex mu_;
  // Atomic: credits come from whichever thread frees an entry, without mu_
  // (an entry may be freed while mu_ is held, by an eviction).
  std::atomic<size_t> bytes_{0};
  std::list<internal::BudgetSlot*> lru_;  // Most recent first; mu_.
  int64_t evictions_ = 0;                 // mu_.
  int64_t refused_ = 0;                   // mu_.
  size_t max_entry_bytes_ = 0;            // mu_.
};

class CompiledGrammar {
 public:
  // `budget`: shared with the other grammars whose caches it bounds; null
  // gives the grammar one of its own of GrammarMemoryBudget::kDefaultBytes.
  CompiledGrammar(Grammar grammar,
                  std::shared_ptr<const TokenVocabulary> vocabulary,
                  std::shared_ptr<GrammarMemoryBudget> budget = nullptr);
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  const internal::ByteClasses& byte_classes() const { return byte_classes_; }
  const std::shared_ptr<GrammarMemoryBudget>& budget() const { return budget_; }

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
    internal::BudgetCharge charge;  // Its bytes of the budget.
  };
  // Shared: a class dropped from the cache lives on while a step uses it.
  // FailedPrecondition when the memory budget has no room for it (what it
  // holds is all in use by steps).
  absl::StatusOr<std::shared_ptr<const PositionCache>> Cache(
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
    internal::BudgetCharge charge;  // Its bytes of the budget.
  };
  std::shared_ptr<const StepMask> FindMask(
      const std::vector<int32_t>& key) const;
  // Caches `mask` (replacing a stale one stored for `key`); when the budget
  // has no room it is not cached.
  void StoreMask(std::vector<int32_t> key,
                 std::shared_ptr<StepMask> mask) const;

  // Classes held now (at most kMaxCachedTops), and filled in all (tests,
  // statistics).
  int64_t cached_positions() const;
  int64_t filled_positions() const;
  // Step masks held now, and the bytes this grammar's cached entries are
  // charged (classes and masks).
  int64_t cached_masks() const;
  size_t cached_bytes() const;

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  internal::ByteClasses byte_classes_;
  // Before the caches: they are cleared under its mutex, which guards them.
  std::shared_ptr<GrammarMemoryBudget> budget_;
  // Key: the tops (see Cache).
  mutable internal::BudgetedLru caches_;
  mutable int64_t fills_ = 0;  // Under the budget's mutex.
  mutable internal::BudgetedLru masks_;
};

class GrammarCache {
 public:
  // `memory_budget_bytes`: what the compiled grammars' caches may hold
  // between them (GrammarMemoryBudget).
  GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary,
               size_t capacity = 256,
               size_t memory_budget_bytes = GrammarMemoryBudget::kDefaultBytes);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(
      const std::string& ebnf);
  const std::shared_ptr<const TokenVocabulary>& vocabulary() const {
    return vocabulary_;
  }
  // The budget every grammar of this cache charges (it outlives the cache
  // while a grammar or a step holds it).
  const std::shared_ptr<GrammarMemoryBudget>& budget() const { return budget_; }
  GrammarMemoryBudget::Stats memory_stats() const { return budget_->stats(); }
  size_t size() const;

 private:
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t capacity_;
  std::shared_ptr<GrammarMemoryBudget> budget_;
  mutable std::mutex mu_;
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
