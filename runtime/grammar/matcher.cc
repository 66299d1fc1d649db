#include "runtime/grammar/matcher.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace grammar {
namespace internal {

// Parents that are not nodes: the grammar's own end (the root rule done),
// and, in a cache walk, the unknown rest of the stack.
constexpr int32_t kBottom = -1;
constexpr int32_t kUnknown = -2;

// What an expansion ran into besides byte-topped stacks.
struct Reached {
  bool bottom = false;    // The root rule ended: the text is complete.
  bool unknown = false;   // A rule ended above the unknown rest of the stack.
  bool overflow = false;  // More than kMaxStacks stacks.
  void Merge(const Reached& o) {
    bottom |= o.bottom;
    unknown |= o.unknown;
    overflow |= o.overflow;
  }
};

// Stacks as nodes (a position to continue from, and the node below it),
// interned so that equal stacks are one node and a state set needs no
// comparison beyond ids.
class Arena {
 public:
  explicit Arena(const Grammar* grammar) : g_(grammar) {
    // A sequence's arena holds a few hundred nodes between compactions:
    // sized once rather than grown through every power of two.
    nodes_.reserve(256);
    index_.reserve(256);
  }

  struct Node {
    int32_t pos;
    int32_t parent;
    int32_t depth;
    uint32_t mark;
  };
  const Node& node(int32_t id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }

  // The node (pos, parent), or -1 when the stack would be deeper than
  // kMaxStackDepth.
  int32_t Intern(int32_t pos, int32_t parent) {
    const uint64_t key = Key(pos, parent);
    if (auto it = index_.find(key); it != index_.end()) return it->second;
    const int32_t depth = parent >= 0 ? nodes_[parent].depth + 1 : 1;
    if (depth > kMaxStackDepth) return -1;
    const int32_t id = static_cast<int32_t>(nodes_.size());
    nodes_.push_back(Node{pos, parent, depth, 0});
    index_.emplace(key, id);
    return id;
  }

  // Drops every node from `n` on.
  void Truncate(size_t n) {
    for (size_t i = n; i < nodes_.size(); ++i) {
      index_.erase(Key(nodes_[i].pos, nodes_[i].parent));
    }
    nodes_.resize(std::min(n, nodes_.size()));
  }

  void BeginPass() {
    if (++epoch_ == 0) {
      for (Node& n : nodes_) n.mark = 0;
      epoch_ = 1;
    }
  }

  // Adds to `out` the byte-topped stacks that continuing at `pos` above
  // `parent` leads to (rules entered, ended rules popped), each once per
  // pass.
  void Expand(int32_t pos, int32_t parent, std::vector<int32_t>* out,
              Reached* reached) {
    const int32_t start = Intern(pos, parent);
    if (start < 0) return;
    work_.clear();
    Push(start);
    while (!work_.empty()) {
      const int32_t id = work_.back();
      work_.pop_back();
      const Node n = nodes_[id];
      const Element& e = g_->elements[n.pos];
      switch (e.kind) {
        case Element::kBytes:
          if (out->size() >= kMaxStacks) {
            reached->overflow = true;
          } else {
            out->push_back(id);
          }
          break;
        case Element::kEnd:
          if (n.parent == kBottom) {
            reached->bottom = true;
          } else if (n.parent == kUnknown) {
            reached->unknown = true;
          } else {
            Push(n.parent);
          }
          break;
        case Element::kRule: {
          // A rule in last place continues where this sequence would: the
          // stack does not grow with right recursion.
          int32_t cont = n.parent;
          if (g_->elements[n.pos + 1].kind != Element::kEnd) {
            cont = Intern(n.pos + 1, n.parent);
            if (cont < 0) break;
          }
          for (int32_t alt : g_->rules[e.value]) {
            const int32_t child = Intern(alt, cont);
            if (child >= 0) Push(child);
          }
          break;
        }
      }
    }
  }

  // The stacks after byte `b` from the byte-topped `in`.
  void Advance(absl::Span<const int32_t> in, uint8_t b,
               std::vector<int32_t>* out, Reached* reached) {
    out->clear();
    BeginPass();
    for (int32_t id : in) {
      const Node n = nodes_[id];
      if (!g_->byte_sets[g_->elements[n.pos].value].Has(b)) continue;
      Expand(n.pos + 1, n.parent, out, reached);
    }
  }

  // Keeps only the nodes `roots` reach, renumbering them (and `roots`).
  void Compact(std::vector<int32_t>* roots) {
    std::vector<int32_t> remap(nodes_.size(), -1);
    std::vector<Node> kept;
    // Parents have lower ids than their children, so one ascending pass
    // over the marked nodes renumbers parents first.
    std::vector<char> live(nodes_.size(), 0);
    for (int32_t r : *roots) {
      for (int32_t id = r; id >= 0 && !live[id]; id = nodes_[id].parent) {
        live[id] = 1;
      }
    }
    index_.clear();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (!live[i]) continue;
      Node n = nodes_[i];
      if (n.parent >= 0) n.parent = remap[n.parent];
      n.mark = 0;
      remap[i] = static_cast<int32_t>(kept.size());
      index_.emplace(Key(n.pos, n.parent), remap[i]);
      kept.push_back(n);
    }
    nodes_ = std::move(kept);
    for (int32_t& r : *roots) r = remap[r];
    epoch_ = 0;
  }

 private:
  static uint64_t Key(int32_t pos, int32_t parent) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) |
           static_cast<uint32_t>(parent);
  }
  void Push(int32_t id) {
    if (nodes_[id].mark == epoch_) return;
    nodes_[id].mark = epoch_;
    work_.push_back(id);
  }

  const Grammar* g_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<uint64_t, int32_t> index_;
  uint32_t epoch_ = 1;
  std::vector<int32_t> work_;
};

// Bytes that every byte set of the grammar treats alike share a class, so a
// lazy DFA's transition is computed once per class rather than per byte (a
// JSON string's plain characters are one class).
ByteClasses::ByteClasses(const Grammar& g) {
  of.fill(0);
  int32_t n = 1;
  std::array<int16_t, 512> split;
  for (const ByteSet& set : g.byte_sets) {
    if (n == 256) break;
    split.fill(-1);
    int32_t next = 0;
    for (int b = 0; b < 256; ++b) {
      const int key = of[b] * 2 + (set.Has(static_cast<uint8_t>(b)) ? 1 : 0);
      if (split[key] < 0) split[key] = static_cast<int16_t>(next++);
      of[b] = static_cast<uint8_t>(split[key]);
    }
    n = next;
  }
  count = n;
  representative.assign(n, 0);
  std::vector<char> seen(n, 0);
  for (int b = 0; b < 256; ++b) {
    if (!seen[of[b]]) {
      seen[of[b]] = 1;
      representative[of[b]] = static_cast<uint8_t>(b);
    }
  }
}

// A lazy DFA over sets of byte-topped stacks: state 0 is the empty set (no
// stack survives), and Step(s, b) is the state after byte b from state s,
// computed on first use and memoized. Tokens that share a prefix share its
// states, and different prefixes that lead to the same stacks (every plain
// character of a JSON string does) share their transitions, so most trie
// nodes cost one table load.
//
// A transition carries the flags of what its expansion ran into besides
// stacks: the grammar's end, the unknown rest of a cache walk's stack, or
// more than kMaxStacks stacks (then its target is state 0 and the walk must
// treat what follows as undecided).
//
// Memory is bounded: past kMaxDfaStates states, kMaxDfaTableWords
// transitions, kMaxDfaSetInts stack ids in all or kMaxDfaArenaNodes arena
// nodes, the DFA is rebuilt from the states the walk still stands on (its
// path), so a grammar whose prefixes all lead to different stacks costs
// time, not memory.
class Dfa {
 public:
  static constexpr uint32_t kBottomFlag = 1;    // The root rule ended.
  static constexpr uint32_t kUnknownFlag = 2;   // Popped into the unknown.
  static constexpr uint32_t kOverflowFlag = 4;  // Past kMaxStacks.
  static constexpr int kFlagBits = 3;
  static constexpr uint32_t kUnset = ~uint32_t{0};
  static constexpr size_t kMaxDfaStates = 1 << 14;
  static constexpr size_t kMaxDfaSetInts = 1 << 20;
  static constexpr size_t kMaxDfaArenaNodes = 1 << 18;
  static constexpr size_t kMaxDfaTableWords = 1 << 21;

  Dfa(const Grammar* g, const ByteClasses* classes)
      : arena_(g), classes_(classes), width_(classes->count) {
    limit_states_ = MaxStates();
    Intern({});
  }

  Arena& arena() { return arena_; }

  // The transition table: state s's transition by a byte of class c is
  // table()[s * width() + c], kUnset until computed (then call Step).
  // Valid until the next Step.
  const uint32_t* table() const { return trans_.data(); }
  size_t width() const { return width_; }
  const uint8_t* byte_class_of() const { return classes_->of.data(); }

  // The state of the byte-topped stacks `set` (arena nodes, unique).
  int32_t Intern(std::vector<int32_t> set) {
    std::sort(set.begin(), set.end());
    if (auto it = index_.find(set); it != index_.end()) return it->second;
    const int32_t id = static_cast<int32_t>(sets_.size());
    set_ints_ += set.size();
    index_.emplace(set, id);
    sets_.push_back(std::move(set));
    trans_.resize(trans_.size() + width_, kUnset);
    return id;
  }

  static int32_t Target(uint32_t t) {
    return static_cast<int32_t>(t >> kFlagBits);
  }

  // The transition from path[d] by `byte`. path[0..d] are the states the
  // caller's walk stands on: a rebuild renumbers them in place.
  uint32_t Step(int32_t* path, int32_t d, uint8_t byte) {
    const uint32_t t =
        trans_[static_cast<size_t>(path[d]) * width_ + classes_->of[byte]];
    if (t != kUnset) return t;
    return Compute(path, d, byte);
  }

 private:
  uint32_t Compute(int32_t* path, int32_t d, uint8_t byte) {
    if (sets_.size() >= limit_states_ || set_ints_ >= limit_ints_ ||
        arena_.size() >= limit_nodes_) {
      Rebuild(path, d);
      // What the path alone holds stays; the next rebuild waits until as
      // much again has been added, so rebuilds cannot follow each other.
      limit_states_ = std::max(MaxStates(), 2 * sets_.size());
      limit_ints_ = std::max(kMaxDfaSetInts, 2 * set_ints_);
      limit_nodes_ = std::max(kMaxDfaArenaNodes, 2 * arena_.size());
    }
    const uint8_t c = classes_->of[byte];
    Reached reached;
    arena_.Advance(sets_[path[d]], classes_->representative[c], &scratch_,
                   &reached);
    uint32_t t;
    if (reached.overflow) {
      t = kOverflowFlag;
    } else {
      t = (static_cast<uint32_t>(Intern(scratch_)) << kFlagBits) |
          (reached.bottom ? kBottomFlag : 0) |
          (reached.unknown ? kUnknownFlag : 0);
    }
    trans_[static_cast<size_t>(path[d]) * width_ + c] = t;
    return t;
  }

  // Keeps only the states path[0..d] and the arena nodes they use.
  void Rebuild(int32_t* path, int32_t d) {
    std::vector<int32_t> roots;
    std::vector<size_t> begin;
    for (int32_t i = 0; i <= d; ++i) {
      begin.push_back(roots.size());
      roots.insert(roots.end(), sets_[path[i]].begin(), sets_[path[i]].end());
    }
    begin.push_back(roots.size());
    arena_.Compact(&roots);
    sets_.clear();
    index_.clear();
    trans_.clear();
    set_ints_ = 0;
    Intern({});
    // Compact renumbers in id order, so each set stays sorted and unique.
    for (int32_t i = 0; i <= d; ++i) {
      path[i] = Intern(std::vector<int32_t>(roots.begin() + begin[i],
                                            roots.begin() + begin[i + 1]));
    }
  }

  // States whose transition rows fit kMaxDfaTableWords.
  size_t MaxStates() const {
    return std::min(kMaxDfaStates, kMaxDfaTableWords / width_);
  }

  Arena arena_;
  const ByteClasses* classes_;
  size_t width_;
  size_t limit_states_ = 0;
  size_t limit_ints_ = kMaxDfaSetInts;
  size_t limit_nodes_ = kMaxDfaArenaNodes;
  std::vector<std::vector<int32_t>> sets_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> index_;
  std::vector<uint32_t> trans_;  // sets_.size() * width_; kUnset if not yet.
  size_t set_ints_ = 0;
  std::vector<int32_t> scratch_;
};

// Calls on_accepted(sorted_index) for each token vocab.sorted()[list[k]]
// (list ascending) that some stack of `start` (complete stacks, no unknown
// rest) accepts whole. Consecutive tokens share their common prefix's
// states. False when a state grew past kMaxStacks.
template <typename OnAccepted>
bool WalkList(Dfa* dfa, const TokenVocabulary& vocab, int32_t start,
              const int32_t* list, size_t n, OnAccepted on_accepted) {
  const size_t max_len = static_cast<size_t>(vocab.max_token_bytes());
  // path[d]: the state after the current token's first d bytes (for
  // d <= valid); ended[d]: the transition into it reached the root's end.
  std::vector<int32_t> path(max_len + 1, 0);
  std::vector<char> ended(max_len + 1, 0);
  path[0] = start;
  size_t valid = 0;
  const std::string* prev = nullptr;
  for (size_t k = 0; k < n; ++k) {
    const std::string& tok = vocab.bytes(vocab.sorted()[list[k]]);
    size_t common = 0;
    if (prev != nullptr) {
      const size_t limit = std::min({tok.size(), prev->size(), valid});
      while (common < limit && tok[common] == (*prev)[common]) ++common;
    }
    prev = &tok;
    size_t d = common;
    const size_t len = tok.size();
    while (d < len && (d == 0 || path[d] != 0)) {
      const uint32_t t = dfa->Step(path.data(), static_cast<int32_t>(d),
                                   static_cast<uint8_t>(tok[d]));
      if (t & Dfa::kOverflowFlag) return false;
      ++d;
      path[d] = Dfa::Target(t);
      ended[d] = (t & Dfa::kBottomFlag) != 0;
    }
    valid = d;
    if (d == len && (path[len] != 0 || ended[len])) on_accepted(list[k]);
  }
  return true;
}

// The token classes of the one state `start` of a cache walk: the whole
// vocabulary walked down its trie, each distinct prefix once. On a prefix
// that no stack survives, every token extending it is decided at once:
// uncertain if a path popped into the unknown rest of the stack on the way
// (with bytes left, the rest decides), else rejected. Accepted ids are set
// in `accepted_bits` (mask words, zeroed), counted in `accepted_count`;
// uncertain ones appended to `uncertain` as sorted() indices, ascending.
void FillClasses(Dfa* dfa, const TokenVocabulary& vocab, int32_t start,
                 std::vector<uint32_t>* accepted_bits, size_t* accepted_count,
                 std::vector<int32_t>* uncertain) {
  const size_t max_len = static_cast<size_t>(vocab.max_token_bytes());
  // path[d]: the state after the current node's first d bytes; unknown[d]:
  // a path popped into the unknown rest within them (words, not chars, so
  // that stores to it do not make the compiler reload everything).
  std::vector<int32_t> path_storage(max_len + 1, 0);
  std::vector<uint32_t> unknown_storage(max_len + 1, 0);
  int32_t* path = path_storage.data();
  uint32_t* unknown = unknown_storage.data();
  path[0] = start;
  const int32_t* sorted = vocab.sorted().data();
  const TokenVocabulary::TrieNode* trie = vocab.trie();
  uint32_t* bits = accepted_bits->data();
  size_t count = 0;
  const auto accept = [&](int32_t begin, int32_t end) {
    for (int32_t k = begin; k < end; ++k) {
      const int32_t id = sorted[k];
      bits[id >> 5] |= uint32_t{1} << (id & 31);
    }
    count += static_cast<size_t>(end - begin);
  };
  const auto undecided = [&](int32_t begin, int32_t end) {
    for (int32_t k = begin; k < end; ++k) uncertain->push_back(k);
  };
  // The DFA's table, reloaded after a transition is computed (it grows).
  const uint8_t* of = dfa->byte_class_of();
  const size_t width = dfa->width();
  const uint32_t* table = dfa->table();
  const int32_t nodes = vocab.trie_nodes();
  int32_t i = 1;
  while (i < nodes) {
    const TokenVocabulary::TrieNode& node = trie[i];
    const int32_t d = node.depth;
    uint32_t t =
        table[static_cast<size_t>(path[d - 1]) * width + of[node.byte]];
    if (t == Dfa::kUnset) {
      t = dfa->Step(path, d - 1, node.byte);
      table = dfa->table();
    }
    if (t & Dfa::kOverflowFlag) {
      // Stacks were dropped: nothing below is known to be rejected.
      undecided(node.tokens, trie[node.end].tokens);
      i = node.end;
      continue;
    }
    const int32_t target = Dfa::Target(t);
    const int32_t here_end = trie[i + 1].tokens;
    if (target != 0 || (t & (Dfa::kBottomFlag | Dfa::kUnknownFlag))) {
      accept(node.tokens, here_end);
    } else if (unknown[d - 1]) {
      undecided(node.tokens, here_end);
    }
    const uint32_t unknown_here = unknown[d - 1] | (t & Dfa::kUnknownFlag);
    if (target == 0) {
      if (unknown_here) undecided(here_end, trie[node.end].tokens);
      i = node.end;
    } else {
      path[d] = target;
      unknown[d] = unknown_here;
      ++i;
    }
  }
  *accepted_count = count;
}

}  // namespace internal

using internal::Arena;
using internal::Dfa;
using internal::kBottom;
using internal::kUnknown;
using internal::Reached;

namespace internal {

BudgetCharge::BudgetCharge(std::shared_ptr<GrammarMemoryBudget> budget,
                           size_t bytes)
    : budget_(std::move(budget)), bytes_(bytes) {
  budget_->bytes_.fetch_add(bytes_, std::memory_order_relaxed);
}

BudgetCharge::BudgetCharge(BudgetCharge&& o) noexcept
    : budget_(std::move(o.budget_)), bytes_(std::exchange(o.bytes_, 0)) {}

BudgetCharge& BudgetCharge::operator=(BudgetCharge&& o) noexcept {
  if (this != &o) {
    Release();
    budget_ = std::move(o.budget_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

BudgetCharge::~BudgetCharge() { Release(); }

void BudgetCharge::Release() {
  // No lock: an entry is freed by whichever thread drops it last, which
  // may be an eviction holding the budget's mutex.
  if (budget_ != nullptr) {
    budget_->bytes_.fetch_sub(bytes_, std::memory_order_relaxed);
  }
  budget_.reset();
  bytes_ = 0;
}

BudgetedLru::~BudgetedLru() = default;

const std::shared_ptr<const void>* BudgetedLru::Find(const Key& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  BudgetSlot& slot = it->second;
  lru_.splice(lru_.begin(), lru_, slot.local);
  budget_->lru_.splice(budget_->lru_.begin(), budget_->lru_, slot.global);
  return &slot.value;
}

std::shared_ptr<const void> BudgetedLru::Insert(
    Key key, std::shared_ptr<const void> value, size_t cost,
    BudgetCharge* charge, bool replace) {
  if (auto it = map_.find(key); it != map_.end()) {
    if (!replace) return *Find(key);
    Erase(&it->second);
  }
  // The grammar's own bound first: a grammar past it recycles its own
  // entries before it takes others'.
  const size_t units = by_bytes_ ? cost : 1;
  while (!lru_.empty() && units_ + units > capacity_) {
    Erase(lru_.back());
    ++budget_->evictions_;
  }
  if (!budget_->MakeRoom(cost)) {
    ++budget_->refused_;
    return nullptr;
  }
  *charge = BudgetCharge(budget_->shared_from_this(), cost);
  auto [it, inserted] = map_.try_emplace(std::move(key));
  BudgetSlot& slot = it->second;
  slot.owner = this;
  slot.key = &it->first;
  slot.value = std::move(value);
  slot.cost = cost;
  slot.units = units;
  lru_.push_front(&slot);
  slot.local = lru_.begin();
  budget_->lru_.push_front(&slot);
  slot.global = budget_->lru_.begin();
  units_ += units;
  bytes_ += cost;
  return slot.value;
}

void BudgetedLru::Erase(BudgetSlot* slot) {
  lru_.erase(slot->local);
  budget_->lru_.erase(slot->global);
  units_ -= slot->units;
  bytes_ -= slot->cost;
  // Frees the value unless a step holds it (its charge goes with it).
  map_.erase(map_.find(*slot->key));
}

BudgetedLru::Entries BudgetedLru::TakeAll() {
  for (BudgetSlot* slot : lru_) budget_->lru_.erase(slot->global);
  lru_.clear();
  units_ = 0;
  bytes_ = 0;
  Entries out;
  out.swap(map_);
  return out;
}

// What an entry costs besides its vectors' contents: its slot, its map
// key's header, its map node and its two list nodes, and its shared_ptr's
// control block (estimates of the allocator's share included).
constexpr size_t kEntryOverhead =
    sizeof(BudgetSlot) + sizeof(std::vector<int32_t>) + 2 * sizeof(void*) +
    2 * 4 * sizeof(void*) + 32;

}  // namespace internal

std::shared_ptr<GrammarMemoryBudget> GrammarMemoryBudget::Create(
    size_t limit_bytes) {
  return std::make_shared<GrammarMemoryBudget>(Passkey(), limit_bytes);
}

GrammarMemoryBudget::Stats GrammarMemoryBudget::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats st;
  st.limit_bytes = limit_;
  st.bytes = bytes_.load(std::memory_order_relaxed);
  st.entries = lru_.size();
  st.evictions = evictions_;
  st.refused = refused_;
  st.max_entry_bytes = max_entry_bytes_;
  return st;
}

bool GrammarMemoryBudget::MakeRoom(size_t cost) {
  max_entry_bytes_ = std::max(max_entry_bytes_, cost);
  if (cost > limit_) return false;
  // From the least recently used, across every grammar, skipping the
  // entries a step holds: dropping them would free nothing until the step
  // is done (and they are about to be used).
  auto it = lru_.end();
  while (bytes_.load(std::memory_order_relaxed) + cost > limit_ &&
         it != lru_.begin()) {
    auto victim = std::prev(it);
    internal::BudgetSlot* slot = *victim;
    // Under mu_ no step can take a new reference, so 1 is only the cache.
    if (slot->value.use_count() > 1) {
      it = victim;
      continue;
    }
    slot->owner->Erase(slot);  // `it` (after the victim) stays valid.
    ++evictions_;
  }
  return bytes_.load(std::memory_order_relaxed) + cost <= limit_;
}

CompiledGrammar::CompiledGrammar(
    Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
    std::shared_ptr<GrammarMemoryBudget> budget)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      byte_classes_(grammar_),
      budget_(budget != nullptr ? std::move(budget)
                                : GrammarMemoryBudget::Create()),
      caches_(budget_.get(), kMaxCachedTops, /*by_bytes=*/false),
      masks_(budget_.get(), kMaxCachedMaskBytes, /*by_bytes=*/true) {}

CompiledGrammar::~CompiledGrammar() {
  // The budget reaches these entries through its own list: they leave it
  // under its mutex, and are freed (credited) after it.
  internal::BudgetedLru::Entries classes, masks;
  std::lock_guard<std::mutex> lock(budget_->mu_);
  classes = caches_.TakeAll();
  masks = masks_.TakeAll();
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar::PositionCache>>
CompiledGrammar::Cache(const std::vector<int32_t>& tops) const {
  {
    std::lock_guard<std::mutex> lock(budget_->mu_);
    if (const auto* found = caches_.Find(tops)) {
      return std::static_pointer_cast<const PositionCache>(*found);
    }
  }
  // Filled outside the lock (a walk of the vocabulary); two threads may fill
  // the same key at once, and the first stored wins.
  auto cache = std::make_shared<PositionCache>();
  const TokenVocabulary& vocab = *vocabulary_;
  Dfa dfa(&grammar_, &byte_classes_);
  // Each stack's frames come from a byte-topped stack: its top node is one
  // of the start state's stacks.
  std::vector<int32_t> start;
  for (size_t begin = 0; begin < tops.size();) {
    size_t end = begin;
    while (tops[end] >= 0) ++end;
    int32_t node = tops[end] == kExactTop ? kBottom : kUnknown;
    for (size_t i = end; i-- > begin;) node = dfa.arena().Intern(tops[i], node);
    start.push_back(node);
    begin = end + 1;
  }
  // The frames come from a byte-topped stack: the node is a state's stack.
  std::vector<uint32_t> bits(vocab.mask_words(), 0);
  size_t accepted = 0;
  internal::FillClasses(&dfa, vocab, dfa.Intern(std::move(start)), &bits,
                        &accepted, &cache->uncertain);
  // A list when setting its ids costs less than copying the words.
  if (accepted > static_cast<size_t>(vocab.mask_words()) / 8) {
    cache->accepted_bits = std::move(bits);
  } else {
    cache->accepted_ids.reserve(accepted);
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint32_t x = bits[w]; x != 0; x &= x - 1) {
        cache->accepted_ids.push_back(static_cast<int32_t>(w * 32) +
                                      __builtin_ctz(x));
      }
    }
  }
  // Held for as long as the cache keeps it: no slack charged or held.
  cache->uncertain.shrink_to_fit();
  const size_t cost = sizeof(PositionCache) + internal::kEntryOverhead +
                      tops.size() * sizeof(int32_t) +
                      cache->accepted_bits.capacity() * sizeof(uint32_t) +
                      cache->accepted_ids.capacity() * sizeof(int32_t) +
                      cache->uncertain.capacity() * sizeof(int32_t);
  PositionCache* const charged = cache.get();
  std::shared_ptr<const void> stored;
  {
    std::lock_guard<std::mutex> lock(budget_->mu_);
    ++fills_;
    stored = caches_.Insert(tops, std::move(cache), cost, &charged->charge,
                            /*replace=*/false);
  }
  if (stored == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "structured output: the grammar cache's memory budget (",
        budget_->limit_bytes(), " bytes) has no room for a token class of ",
        cost, " bytes: what it holds is in use by other steps"));
  }
  return std::static_pointer_cast<const PositionCache>(std::move(stored));
}

std::shared_ptr<const CompiledGrammar::StepMask> CompiledGrammar::FindMask(
    const std::vector<int32_t>& key) const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  const auto* found = masks_.Find(key);
  return found != nullptr ? std::static_pointer_cast<const StepMask>(*found)
                          : nullptr;
}

void CompiledGrammar::StoreMask(std::vector<int32_t> key,
                                std::shared_ptr<StepMask> mask) const {
  // What it holds beyond its base class (the class's own charge), but the
  // base's control block, which its weak reference keeps.
  const size_t cost =
      sizeof(StepMask) + internal::kEntryOverhead +
      key.capacity() * sizeof(int32_t) +
      mask->bits.capacity() * sizeof(uint32_t) +
      mask->ids.capacity() * sizeof(int32_t) +
      (mask->has_base ? sizeof(PositionCache) + 2 * sizeof(void*) : 0);
  StepMask* const charged = mask.get();
  std::lock_guard<std::mutex> lock(budget_->mu_);
  // Replacing: an entry stored for the key was stale (its base dropped), or
  // another thread's equal mask.
  masks_.Insert(std::move(key), std::move(mask), cost, &charged->charge,
                /*replace=*/true);
}

int64_t CompiledGrammar::cached_positions() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return static_cast<int64_t>(caches_.size());
}

int64_t CompiledGrammar::filled_positions() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return fills_;
}

int64_t CompiledGrammar::cached_masks() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return static_cast<int64_t>(masks_.size());
}

size_t CompiledGrammar::cached_bytes() const {
  std::lock_guard<std::mutex> lock(budget_->mu_);
  return caches_.bytes() + masks_.bytes();
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary,
                           size_t capacity, size_t memory_budget_bytes)
    : vocabulary_(std::move(vocabulary)),
      capacity_(std::max<size_t>(1, capacity)),
      budget_(GrammarMemoryBudget::Create(memory_budget_bytes)) {}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(
    const std::string& ebnf) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(ebnf); it != entries_.end()) {
      it->second.last_used = ++clock_;
      return it->second.grammar;
    }
  }
  // Parsed outside the lock: another thread may compile the same text at
  // once; the first stored wins and both are correct.
  ASSIGN_OR_RETURN(Grammar g, ParseEbnf(ebnf));
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(g),
                                                          vocabulary_, budget_);
  // A grammar dropped here is freed (its cached entries credited to the
  // budget) after the lock, unless a request still holds it.
  std::shared_ptr<const CompiledGrammar> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(ebnf); it != entries_.end()) {
    it->second.last_used = ++clock_;
    return it->second.grammar;
  }
  if (entries_.size() >= capacity_) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    dropped = std::move(oldest->second.grammar);
    entries_.erase(oldest);
  }
  entries_[ebnf] = Entry{compiled, ++clock_};
  return std::shared_ptr<const CompiledGrammar>(compiled);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                               std::vector<int32_t> end_ids)
    : grammar_(std::move(grammar)),
      end_ids_(std::move(end_ids)),
      arena_(std::make_unique<Arena>(&grammar_->grammar())) {
  const Grammar& g = grammar_->grammar();
  Reached reached;
  arena_->BeginPass();
  for (int32_t alt : g.rules[g.root]) {
    arena_->Expand(alt, kBottom, &state_, &reached);
  }
  can_end_ = reached.bottom;
  arena_->Compact(&state_);
  compacted_size_ = arena_->size();
}

GrammarMatcher::~GrammarMatcher() = default;

std::unique_ptr<GrammarMatcher> GrammarMatcher::Clone() const {
  // Through the private default state: the constructor's root expansion
  // would be thrown away.
  std::unique_ptr<GrammarMatcher> m(
      new GrammarMatcher(grammar_, end_ids_, *arena_));
  m->state_ = state_;
  m->can_end_ = can_end_;
  m->terminated_ = terminated_;
  m->compacted_size_ = compacted_size_;
  return m;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                               std::vector<int32_t> end_ids, const Arena& arena)
    : grammar_(std::move(grammar)),
      end_ids_(std::move(end_ids)),
      arena_(std::make_unique<Arena>(arena)) {}

bool GrammarMatcher::ApplyCachedMask(const std::vector<int32_t>& key,
                                     absl::Span<uint32_t> mask) const {
  const std::shared_ptr<const CompiledGrammar::StepMask> cached =
      grammar_->FindMask(key);
  if (cached == nullptr) return false;
  if (!cached->bits.empty()) {
    std::copy(cached->bits.begin(), cached->bits.end(), mask.begin());
  } else if (cached->has_base) {
    const std::shared_ptr<const CompiledGrammar::PositionCache> base =
        cached->base.lock();
    if (base == nullptr) return false;  // Dropped: recompute.
    std::copy(base->accepted_bits.begin(), base->accepted_bits.end(),
              mask.begin());
  } else {
    std::fill(mask.begin(), mask.end(), 0u);
  }
  uint32_t* words = mask.data();
  for (int32_t id : cached->ids) words[id >> 5] |= uint32_t{1} << (id & 31);
  return true;
}

absl::Status GrammarMatcher::ComputeMask(absl::Span<uint32_t> mask,
                                         std::vector<int32_t>* key) const {
  const TokenVocabulary& vocab = grammar_->vocabulary();
  auto entry = std::make_shared<CompiledGrammar::StepMask>();
  std::vector<int32_t> extra;  // Uncertain tokens the real stacks accept.
  // The key of the state's token classes: each stack's top frames and how
  // it ends, in a canonical order (a set: equal tops classify alike).
  std::vector<std::vector<int32_t>> tops;
  tops.reserve(state_.size());
  for (int32_t id : state_) {
    std::vector<int32_t> top;
    int32_t n = id;
    while (n >= 0 && static_cast<int>(top.size()) < kCacheFrames) {
      top.push_back(arena_->node(n).pos);
      n = arena_->node(n).parent;
    }
    top.push_back(n == kBottom ? CompiledGrammar::kExactTop
                               : CompiledGrammar::kOpenTop);
    tops.push_back(std::move(top));
  }
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  std::vector<int32_t> flat;
  for (const auto& top : tops) flat.insert(flat.end(), top.begin(), top.end());
  ASSIGN_OR_RETURN(
      const std::shared_ptr<const CompiledGrammar::PositionCache> cls,
      grammar_->Cache(flat));
  if (!cls->accepted_bits.empty()) {
    for (size_t w = 0; w < mask.size(); ++w) mask[w] |= cls->accepted_bits[w];
  }
  for (int32_t t : cls->accepted_ids) mask[t >> 5] |= uint32_t{1} << (t & 31);
  const std::vector<int32_t>& uncertain = cls->uncertain;
  if (!uncertain.empty()) {
    // One walk of every stack's uncertain tokens from all the stacks at
    // once: a token is allowed when any stack accepts it, and with the
    // real stacks below nothing is unknown any more.
    Dfa dfa(&grammar_->grammar(), &grammar_->byte_classes());
    const int32_t start = dfa.Intern(CopyStacks(&dfa.arena()));
    const bool complete =
        internal::WalkList(&dfa, vocab, start, uncertain.data(),
                           uncertain.size(), [&](int32_t index) {
                             const int32_t t = vocab.sorted()[index];
                             mask[t >> 5] |= uint32_t{1} << (t & 31);
                             extra.push_back(t);
                           });
    if (!complete) {
      return absl::FailedPreconditionError(
          absl::StrCat("the grammar is too ambiguous: more than ", kMaxStacks,
                       " parse stacks at once"));
    }
  }
  if (key != nullptr) {
    // The quickest form to write next time (see StepMask): the class's
    // bits by reference with the few other ids, else a list of ids when
    // they are few, else a copy of the mask.
    const size_t few = static_cast<size_t>(vocab.mask_words()) / 8;
    if (!cls->accepted_bits.empty() && extra.size() <= few) {
      entry->base = cls;
      entry->has_base = true;
      entry->ids = std::move(extra);
    } else if (cls->accepted_bits.empty() &&
               cls->accepted_ids.size() + extra.size() <= few) {
      entry->ids = cls->accepted_ids;
      entry->ids.insert(entry->ids.end(), extra.begin(), extra.end());
    } else {
      entry->bits.assign(mask.begin(), mask.end());
    }
    grammar_->StoreMask(std::move(*key), std::move(entry));
  }
  return absl::OkStatus();
}

std::vector<int32_t> GrammarMatcher::CopyStacks(Arena* to) const {
  std::vector<int32_t> out, frames;
  out.reserve(state_.size());
  for (int32_t id : state_) {
    frames.clear();
    for (int32_t n = id; n >= 0; n = arena_->node(n).parent) {
      frames.push_back(arena_->node(n).pos);
    }
    int32_t node = kBottom;
    for (size_t i = frames.size(); i-- > 0;) node = to->Intern(frames[i], node);
    out.push_back(node);
  }
  return out;
}

absl::Status GrammarMatcher::FillNextTokenMask(absl::Span<uint32_t> mask) {
  const TokenVocabulary& vocab = grammar_->vocabulary();
  if (mask.size() != static_cast<size_t>(vocab.mask_words())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grammar mask: ", mask.size(), " words for ", vocab.mask_words()));
  }
  const auto allow = [&](int32_t id) {
    if (id >= 0 && id < vocab.size()) mask[id >> 5] |= uint32_t{1} << (id & 31);
  };
  if (!terminated_ && !state_.empty()) {
    if (state_.size() > kMaxMaskStacks) {
      return absl::FailedPreconditionError(
          absl::StrCat("the grammar is too ambiguous: ", state_.size(),
                       " parse stacks at once (at most ", kMaxMaskStacks, ")"));
    }
    std::vector<int32_t> key;
    bool cacheable = true;
    for (int32_t id : state_) {
      for (int32_t n = id; n >= 0 && cacheable; n = arena_->node(n).parent) {
        key.push_back(arena_->node(n).pos);
        cacheable = key.size() <= kMaxMaskKeyFrames + state_.size();
      }
      key.push_back(-1);
    }
    if (cacheable && ApplyCachedMask(key, mask)) {
      // A warm step: the same stacks were masked before.
    } else {
      std::fill(mask.begin(), mask.end(), 0u);
      RETURN_IF_ERROR(ComputeMask(mask, cacheable ? &key : nullptr));
    }
  } else {
    std::fill(mask.begin(), mask.end(), 0u);
  }
  if (can_end_ || terminated_) {
    for (int32_t id : end_ids_) allow(id);
  }
  for (uint32_t w : mask) {
    if (w != 0) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "the grammar allows no token of this vocabulary here (it needs text "
      "that no token spells)");
}

absl::Status GrammarMatcher::Accept(int32_t token) {
  const TokenVocabulary& vocab = grammar_->vocabulary();
  if (std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) {
    if (!can_end_ && !terminated_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar: the end token ", token, " before the output is complete"));
    }
    terminated_ = true;
    return absl::OkStatus();
  }
  if (terminated_) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: token ", token, " after the end"));
  }
  if (token < 0 || token >= vocab.size() || vocab.excluded(token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: token ", token, " is never allowed"));
  }
  const std::string& bytes = vocab.bytes(token);
  const size_t mark = arena_->size();
  std::vector<int32_t>& cur = scratch_[0];
  std::vector<int32_t>& next = scratch_[1];
  cur = state_;
  Reached reached;
  for (size_t i = 0; i < bytes.size(); ++i) {
    reached = Reached();
    arena_->Advance(cur, static_cast<uint8_t>(bytes[i]), &next, &reached);
    if (reached.overflow) {
      arena_->Truncate(mark);
      return absl::FailedPreconditionError(
          absl::StrCat("the grammar is too ambiguous: more than ", kMaxStacks,
                       " parse stacks at once"));
    }
    cur.swap(next);
    // No stack left with bytes to go: the root ending here does not help.
    const bool last = i + 1 == bytes.size();
    if (cur.empty() && (!last || !reached.bottom)) {
      arena_->Truncate(mark);
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar: token ", token, " does not continue the output"));
    }
  }
  state_.swap(cur);
  can_end_ = reached.bottom;
  // Dead nodes are dropped once they outnumber the live ones, not per
  // token: compaction rebuilds the arena's index.
  if (arena_->size() > 2 * compacted_size_ + 256) {
    arena_->Compact(&state_);
    compacted_size_ = arena_->size();
  }
  return absl::OkStatus();
}

}  // namespace grammar
}  // namespace tessera
