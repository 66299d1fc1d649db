#include "runtime/grammar/matcher.h"

#include <algorithm>
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
  explicit Arena(const Grammar* grammar) : g_(grammar) {}

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

enum class TokenClass { kAccepted, kRejected, kUncertain };

// Classifies the tokens vocab.sorted()[list[k]] (list ascending) from the
// byte-topped stacks `start`, calling on_token(sorted_index, class) for each.
// Tokens are walked in byte order, so a shared prefix is advanced once; a
// prefix no stack survives decides every token that extends it at once.
template <typename OnToken>
bool WalkTokens(Arena* arena, const TokenVocabulary& vocab,
                std::vector<int32_t> start, const int32_t* list, size_t n,
                bool list_is_all, OnToken on_token) {
  const size_t max_len = static_cast<size_t>(vocab.max_token_bytes());
  // sets[d]: stacks after the current token's first d bytes (valid for
  // d <= valid); ended[d]: a path reached a rule's end above the unknown
  // stack (or the root's end) after d bytes; unknown_upto[d]: a path ended
  // above the unknown stack after some j in [1, d] bytes.
  std::vector<std::vector<int32_t>> sets(max_len + 1);
  std::vector<char> ended(max_len + 1, 0), unknown_upto(max_len + 1, 0);
  std::vector<size_t> arena_mark(max_len + 1, 0);
  sets[0] = std::move(start);
  arena_mark[0] = arena->size();
  size_t valid = 0;
  bool overflow = false;
  const std::string* prev = nullptr;
  for (size_t k = 0; k < n; ++k) {
    const int32_t index = list[k];
    const std::string& tok = vocab.bytes(vocab.sorted()[index]);
    size_t common = 0;
    if (k > 0) {
      if (list_is_all) {
        common = static_cast<size_t>(vocab.lcp(index));
      } else {
        while (common < tok.size() && common < prev->size() &&
               tok[common] == (*prev)[common]) {
          ++common;
        }
      }
    }
    prev = &tok;
    size_t d = std::min(common, valid);
    arena->Truncate(arena_mark[d]);
    valid = d;
    const size_t len = tok.size();
    while (d < len && (d == 0 || !sets[d].empty())) {
      Reached reached;
      arena->Advance(sets[d], static_cast<uint8_t>(tok[d]), &sets[d + 1],
                     &reached);
      overflow |= reached.overflow;
      ++d;
      ended[d] = reached.bottom || reached.unknown;
      unknown_upto[d] = unknown_upto[d - 1] || reached.unknown;
      arena_mark[d] = arena->size();
      valid = d;
    }
    TokenClass c;
    if (d == len) {
      if (!sets[len].empty() || ended[len]) {
        c = TokenClass::kAccepted;
      } else {
        c = unknown_upto[len - 1] ? TokenClass::kUncertain
                                  : TokenClass::kRejected;
      }
    } else {
      // No stack survives the first d bytes (d < len).
      c = unknown_upto[d] ? TokenClass::kUncertain : TokenClass::kRejected;
    }
    on_token(index, c);
  }
  arena->Truncate(arena_mark[0]);
  return !overflow;
}

}  // namespace internal

using internal::Arena;
using internal::kBottom;
using internal::kUnknown;
using internal::Reached;
using internal::TokenClass;

CompiledGrammar::CompiledGrammar(
    Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {}

CompiledGrammar::~CompiledGrammar() = default;

absl::StatusOr<const CompiledGrammar::PositionCache*> CompiledGrammar::Cache(
    const std::vector<int32_t>& frames, bool exact) const {
  std::vector<int32_t> key = frames;
  key.push_back(exact ? 1 : 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = caches_.find(key); it != caches_.end()) {
      return it->second.get();
    }
    if (caches_.size() >= kMaxCachedTops) {
      return absl::FailedPreconditionError(
          absl::StrCat("the grammar reaches more than ", kMaxCachedTops,
                       " distinct parse states (too large or too ambiguous)"));
    }
  }
  // Filled outside the lock (a walk of the vocabulary); two threads may fill
  // the same key at once, and the first stored wins.
  auto cache = std::make_unique<PositionCache>();
  const TokenVocabulary& vocab = *vocabulary_;
  Arena arena(&grammar_);
  int32_t node = exact ? kBottom : kUnknown;
  for (size_t i = frames.size(); i-- > 0;) {
    node = arena.Intern(frames[i], node);
  }
  std::vector<int32_t> accepted;
  const std::vector<int32_t>& all = vocab.sorted();
  std::vector<int32_t> indices(all.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    indices[i] = static_cast<int32_t>(i);
  }
  // Overflow here only loses precision: an overflowing walk's missing
  // stacks make tokens look rejected, so treat them all as uncertain.
  const bool complete = internal::WalkTokens(
      &arena, vocab, {node}, indices.data(), indices.size(),
      /*list_is_all=*/true, [&](int32_t index, TokenClass c) {
        if (c == TokenClass::kAccepted) {
          accepted.push_back(all[index]);
        } else if (c == TokenClass::kUncertain) {
          cache->uncertain.push_back(index);
        }
      });
  if (!complete) {
    accepted.clear();
    cache->uncertain = indices;
  }
  if (accepted.size() > static_cast<size_t>(vocab.mask_words())) {
    cache->accepted_bits.assign(vocab.mask_words(), 0);
    for (int32_t id : accepted) {
      cache->accepted_bits[id >> 5] |= uint32_t{1} << (id & 31);
    }
  } else {
    std::sort(accepted.begin(), accepted.end());
    cache->accepted_ids = std::move(accepted);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = caches_.emplace(std::move(key), std::move(cache));
  return it->second.get();
}

int64_t CompiledGrammar::cached_positions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(caches_.size());
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary,
                           size_t capacity)
    : vocabulary_(std::move(vocabulary)),
      capacity_(std::max<size_t>(1, capacity)) {}

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
  auto compiled =
      std::make_shared<const CompiledGrammar>(std::move(g), vocabulary_);
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
}

GrammarMatcher::~GrammarMatcher() = default;

absl::Status GrammarMatcher::FillNextTokenMask(absl::Span<uint32_t> mask) {
  const TokenVocabulary& vocab = grammar_->vocabulary();
  if (mask.size() != static_cast<size_t>(vocab.mask_words())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grammar mask: ", mask.size(), " words for ", vocab.mask_words()));
  }
  std::fill(mask.begin(), mask.end(), 0u);
  const auto allow = [&](int32_t id) {
    if (id >= 0 && id < vocab.size()) mask[id >> 5] |= uint32_t{1} << (id & 31);
  };
  if (!terminated_) {
    if (state_.size() > kMaxMaskStacks) {
      return absl::FailedPreconditionError(
          absl::StrCat("the grammar is too ambiguous: ", state_.size(),
                       " parse stacks at once (at most ", kMaxMaskStacks, ")"));
    }
    std::vector<std::vector<int32_t>> seen;
    std::vector<int32_t> frames;
    for (int32_t id : state_) {
      // The stack's top frames: its cache key.
      frames.clear();
      int32_t n = id;
      while (n >= 0 && static_cast<int>(frames.size()) < kCacheFrames) {
        frames.push_back(arena_->node(n).pos);
        n = arena_->node(n).parent;
      }
      const bool exact = n == kBottom;
      ASSIGN_OR_RETURN(const CompiledGrammar::PositionCache* cached,
                       grammar_->Cache(frames, exact));
      const CompiledGrammar::PositionCache& cache = *cached;
      frames.push_back(exact ? 1 : 0);
      if (std::find(seen.begin(), seen.end(), frames) == seen.end()) {
        seen.push_back(frames);
        if (!cache.accepted_bits.empty()) {
          for (size_t w = 0; w < mask.size(); ++w) {
            mask[w] |= cache.accepted_bits[w];
          }
        }
        for (int32_t t : cache.accepted_ids) allow(t);
      }
      if (cache.uncertain.empty()) continue;
      const bool complete = internal::WalkTokens(
          arena_.get(), vocab, {id}, cache.uncertain.data(),
          cache.uncertain.size(), /*list_is_all=*/false,
          [&](int32_t index, TokenClass c) {
            // With the real stack below, nothing is unknown any more.
            if (c == TokenClass::kAccepted) allow(vocab.sorted()[index]);
          });
      if (!complete) {
        return absl::FailedPreconditionError(
            absl::StrCat("the grammar is too ambiguous: more than ", kMaxStacks,
                         " parse stacks at once"));
      }
    }
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
  std::vector<int32_t> cur = state_, next;
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
  state_ = std::move(cur);
  can_end_ = reached.bottom;
  arena_->Compact(&state_);
  return absl::OkStatus();
}

}  // namespace grammar
}  // namespace tessera
