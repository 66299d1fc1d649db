// The constraint engine's masks against a brute-force reference: for every
// token of a small vocabulary (multi-byte tokens, pieces of UTF-8
// characters, tokens that span rule boundaries, duplicates, a special token
// with ordinary bytes), whether a recognizer written apart from the matcher
// (whole stacks in std::set, no arena, no token classes, no DFA, no caches)
// takes its bytes from the state the output so far reached, and whether
// Accept on a copy of the matcher takes it; along random walks through
// several grammars (JSON schemas, a regex, a choice, EBNF), and through
// grammars built to push the engine past its caches' bounds.
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/structured_output.h"
#include "runtime/grammar/token_vocabulary.h"

namespace tessera {
namespace grammar {
namespace {

// The set of whole stacks the text so far allows: each stack is the
// positions to continue at, the top at the back. A frame whose continuation
// is its sequence's end is dropped when its rule is entered (the same
// language; it keeps repetition from growing the stack).
class Reference {
 public:
  using Stack = std::vector<int32_t>;
  explicit Reference(const Grammar* g) : g_(g) {
    for (int32_t alt : g->rules[g->root]) Close({alt}, &stacks_, &complete_);
  }

  bool complete() const { return complete_; }
  bool too_deep() const { return too_deep_; }

  // Whether `bytes` continue the text: every byte taken by some stack, and
  // after the last one a stack left or the root complete.
  bool Accepts(const std::string& bytes) const {
    std::set<Stack> stacks;
    bool complete;
    return Run(bytes, &stacks, &complete);
  }
  bool Feed(const std::string& bytes) {
    std::set<Stack> stacks;
    bool complete;
    if (!Run(bytes, &stacks, &complete)) return false;
    stacks_ = std::move(stacks);
    complete_ = complete;
    return true;
  }

 private:
  static constexpr size_t kMaxDepth = 500;

  bool Run(const std::string& bytes, std::set<Stack>* out,
           bool* complete) const {
    std::set<Stack> cur = stacks_;
    *complete = complete_;
    for (char c : bytes) {
      std::set<Stack> next;
      *complete = false;
      for (const Stack& s : cur) {
        const Element& e = g_->elements[s.back()];
        if (!g_->byte_sets[e.value].Has(static_cast<uint8_t>(c))) continue;
        Stack t = s;
        ++t.back();
        Close(std::move(t), &next, complete);
      }
      cur = std::move(next);
      if (cur.empty() && !*complete) return false;
    }
    *out = std::move(cur);
    return true;
  }

  // Adds the byte-topped stacks that `s` leads to without reading a byte.
  void Close(Stack s, std::set<Stack>* out, bool* complete) const {
    std::vector<Stack> work = {std::move(s)};
    std::set<Stack> seen;
    while (!work.empty()) {
      Stack t = std::move(work.back());
      work.pop_back();
      while (!t.empty() && g_->elements[t.back()].kind == Element::kEnd) {
        t.pop_back();
      }
      if (t.empty()) {
        *complete = true;
        continue;
      }
      if (t.size() > kMaxDepth) {
        too_deep_ = true;
        continue;
      }
      if (!seen.insert(t).second) continue;
      const Element& e = g_->elements[t.back()];
      if (e.kind == Element::kBytes) {
        out->insert(t);
        continue;
      }
      ++t.back();
      if (g_->elements[t.back()].kind == Element::kEnd) t.pop_back();
      for (int32_t alt : g_->rules[e.value]) {
        Stack u = t;
        u.push_back(alt);
        work.push_back(std::move(u));
      }
    }
  }

  const Grammar* g_;
  std::set<Stack> stacks_;
  bool complete_ = false;
  mutable bool too_deep_ = false;
};

Grammar Parse(const std::string& ebnf) {
  auto g = ParseEbnf(ebnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << ebnf;
  return g.ok() ? *std::move(g) : *ParseEbnf("root ::= \"x\"");
}

// A random text of the grammar (or a prefix of one), byte by byte.
std::string Generate(const Grammar& g, std::mt19937* rng, size_t max_len) {
  Reference ref(&g);
  std::string text;
  while (text.size() < max_len) {
    std::vector<char> next;
    for (int b = 0; b < 256; ++b) {
      if (ref.Accepts(std::string(1, static_cast<char>(b)))) {
        next.push_back(static_cast<char>(b));
      }
    }
    if (next.empty() || (ref.complete() && (*rng)() % 6 == 0)) break;
    // Mostly printable ASCII where allowed, so texts look like outputs.
    std::vector<char> ascii;
    for (char c : next) {
      if (c >= 0x20 && c < 0x7F) ascii.push_back(c);
    }
    const std::vector<char>& from =
        !ascii.empty() && (*rng)() % 8 != 0 ? ascii : next;
    const char c = from[(*rng)() % from.size()];
    EXPECT_TRUE(ref.Feed(std::string(1, c)));
    text.push_back(c);
  }
  return text;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<bool> excluded;
  int32_t end_id = 0;
  int32_t special_id = 0;  // Excluded, with the bytes "{".
  std::shared_ptr<const TokenVocabulary> vocab;
};

Vocab MakeVocab(const std::vector<std::string>& samples, std::mt19937* rng) {
  Vocab v;
  for (int b = 0x20; b < 0x7F; ++b) v.tokens.push_back(std::string(1, char(b)));
  v.tokens.push_back("\n");
  v.tokens.push_back("\t");
  for (const char* t : {"\xC3",     "\xA9",       "\xA9\"",
                        "\"\xC3",   "\xC3\xA9",   "\xF0\x9F",
                        "\x98\x80", "\x98\x80\"", "\xF0\x9F\x98\x80",
                        "\", \"",   "\"}",        "\"]",
                        "}, {",     "\": \"",     "\\u00",
                        "\\\"",     "e9\"",       "1.5e",
                        "-0",       "ab",         "ab",
                        "true",     "null",       "\n  ",
                        "]}",       "\": [",      "\": {\""}) {
    v.tokens.push_back(t);
  }
  for (const std::string& s : samples) {
    if (s.empty()) continue;
    for (int i = 0; i < 120; ++i) {
      const size_t at = (*rng)() % s.size();
      v.tokens.push_back(s.substr(at, 1 + (*rng)() % 8));
    }
  }
  v.excluded.assign(v.tokens.size(), false);
  v.special_id = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("{");
  v.end_id = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<eos>");
  v.excluded.push_back(true);
  v.excluded.push_back(true);
  v.vocab = *TokenVocabulary::Create(v.tokens, v.excluded);
  return v;
}

// Random walks: at each step the mask, the reference and Accept on a copy
// agree on every token; then a random allowed token (multi-byte ones
// preferred) is taken. Returns how many walks reached the end.
int CheckWalks(const std::shared_ptr<const CompiledGrammar>& compiled,
               const Vocab& v, int walks, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  const int32_t n = v.vocab->size();
  int ended = 0;
  for (int walk = 0; walk < walks; ++walk) {
    GrammarMatcher m(compiled, {v.end_id});
    Reference ref(&compiled->grammar());
    std::string text;
    for (int step = 0; step < steps && !m.terminated(); ++step) {
      std::vector<uint32_t> mask(m.mask_words());
      const absl::Status s = m.FillNextTokenMask(absl::MakeSpan(mask));
      std::vector<int32_t> allowed, multi;
      for (int32_t id = 0; id < n; ++id) {
        const bool expected = id == v.end_id   ? ref.complete()
                              : v.excluded[id] ? false
                                               : ref.Accepts(v.tokens[id]);
        if (expected) {
          allowed.push_back(id);
          if (id != v.end_id && v.tokens[id].size() > 1) multi.push_back(id);
        }
        if (s.ok()) {
          const bool in_mask = (mask[id >> 5] >> (id & 31)) & 1;
          EXPECT_EQ(in_mask, expected)
              << "walk " << walk << " step " << step << " after '" << text
              << "' token " << id << " '" << v.tokens[id] << "'";
          if (in_mask != expected) return -1;
        }
        EXPECT_EQ(m.Clone()->Accept(id).ok(), expected)
            << "after '" << text << "' token '" << v.tokens[id] << "'";
      }
      EXPECT_FALSE(ref.too_deep());
      if (!s.ok()) {
        // No token of this vocabulary continues the text.
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_TRUE(allowed.empty()) << s << " after '" << text << "'";
        break;
      }
      EXPECT_FALSE(allowed.empty());
      if (allowed.empty()) break;
      int32_t pick = !multi.empty() && rng() % 3 != 0
                         ? multi[rng() % multi.size()]
                         : allowed[rng() % allowed.size()];
      if (ref.complete() && step > 8 && rng() % 3 == 0) pick = v.end_id;
      EXPECT_TRUE(m.Accept(pick).ok()) << v.tokens[pick];
      if (pick != v.end_id) {
        EXPECT_TRUE(ref.Feed(v.tokens[pick]));
        text += v.tokens[pick];
      }
      EXPECT_EQ(m.CanEnd(), ref.complete() || m.terminated()) << text;
    }
    if (m.terminated()) ++ended;
  }
  return ended;
}

// Samples: the given texts and some the grammar generates.
std::vector<std::string> Samples(const Grammar& g,
                                 std::vector<std::string> given,
                                 std::mt19937* rng) {
  for (int i = 0; i < 6; ++i) given.push_back(Generate(g, rng, 60));
  return given;
}

void CheckGrammar(const std::string& ebnf,
                  const std::vector<std::string>& given, uint32_t seed) {
  std::mt19937 rng(seed);
  Grammar g = Parse(ebnf);
  const Vocab v = MakeVocab(Samples(g, given, &rng), &rng);
  auto compiled =
      std::make_shared<const CompiledGrammar>(std::move(g), v.vocab);
  // The first walks fill the caches, the later ones start on filled ones.
  const int ended = CheckWalks(compiled, v, 10, 40, seed + 1);
  EXPECT_GE(ended, 0);
  EXPECT_GT(compiled->cached_positions(), 0);
}

std::string SchemaEbnf(const std::string& schema) {
  StructuredOutput spec;
  spec.kind = StructuredOutput::Kind::kJsonSchema;
  spec.schema = nlohmann::ordered_json::parse(schema);
  auto ebnf = StructuredOutputEbnf(spec);
  EXPECT_TRUE(ebnf.ok()) << ebnf.status();
  return ebnf.ok() ? *ebnf : "root ::= \"x\"";
}

TEST(MatcherReferenceTest, JsonSchemaNestedObjectsArraysEnumsUnicode) {
  const std::string ebnf = SchemaEbnf(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 12},
      "kind": {"enum": ["a", "ab", "é😀", 3, null]},
      "tags": {"type": "array", "items": {"enum": ["x", "é", "ü y"]},
               "maxItems": 3},
      "pos": {"type": "object",
              "properties": {"x": {"type": "number"},
                             "y": {"type": "integer", "minimum": -5,
                                   "maximum": 5}},
              "required": ["x"]},
      "list": {"type": "array",
               "items": {"type": "object",
                         "properties": {"k": {"type": "string"},
                                        "v": {"type": "boolean"}},
                         "required": ["k"]}}
    },
    "required": ["name", "kind"]})");
  CheckGrammar(
      ebnf,
      {R"({"name": "Ada é😀", "kind": "é😀", "tags": ["x", "ü y"]})",
       R"({"name":"\"q\\","kind":3,"pos":{"x":-1.5e3,"y":-5}})",
       R"({"name": "", "kind": null, "list": [{"k": "ab", "v": true}]})"},
      11);
}

TEST(MatcherReferenceTest, AnyJsonObject) {
  StructuredOutput spec;
  spec.kind = StructuredOutput::Kind::kJsonObject;
  CheckGrammar(*StructuredOutputEbnf(spec),
               {R"({"a": [1, -2.5e3, true, null], "b": {"c": "d\u00e9"}})",
                R"({"é": {"😀": []}, "n": 0})"},
               12);
}

TEST(MatcherReferenceTest, Regex) {
  StructuredOutput spec;
  spec.kind = StructuredOutput::Kind::kRegex;
  spec.text = R"((ab|a)*c[0-9]{2,4}(é|ü|[x-z]+)?-\d+(\.\d{1,3})?)";
  CheckGrammar(*StructuredOutputEbnf(spec),
               {"ababac123é-42.5", "c00xyz-7", "aac9999-100.125"}, 13);
}

TEST(MatcherReferenceTest, Choice) {
  StructuredOutput spec;
  spec.kind = StructuredOutput::Kind::kChoice;
  spec.choices = {"yes", "no", "maybe so", "né", "n", "nope \"quoted\""};
  CheckGrammar(*StructuredOutputEbnf(spec), {"maybe so", "nope \"quoted\""},
               14);
}

TEST(MatcherReferenceTest, Ebnf) {
  // Arithmetic with nested parentheses, function calls and strings: rules
  // end inside tokens such as "1)*(" and "f(\"".
  CheckGrammar(
      R"G(
root   ::= expr (";" ws expr)*
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | call | str
call   ::= [a-z]+ "(" ( expr ( "," ws expr )* )? ")"
str    ::= "\"" ( [^"\\] | "\\" . )* "\""
number ::= "-"? [0-9]+ ( "." [0-9]+ )?
ws     ::= " "?
)G",
      {"(1+2)*(3-4)/f(x(1), \"é\\\"\"); 7", "max(1,2) - -3.5", "((((9))))"},
      15);
}

// A grammar whose prefixes all lead to different stacks (the stack spells the
// text read so far) and a vocabulary of long tokens: a class fill reaches
// more lazy-DFA states than its bound, so the DFA is rebuilt mid-walk, and
// the masks must not change.
TEST(MatcherReferenceTest, DfaPastItsBoundIsRebuiltNotWrong) {
  std::mt19937 rng(21);
  Vocab v;
  for (const char* t : {"a", "b", "x", "y", "xy", "yx"}) v.tokens.push_back(t);
  std::set<std::string> seen;
  while (v.tokens.size() < 3000) {
    std::string t;
    for (size_t n = 20 + rng() % 40; n > 0; --n) t.push_back("ab"[rng() % 2]);
    if (seen.insert(t).second) v.tokens.push_back(t);
  }
  v.excluded.assign(v.tokens.size(), false);
  v.special_id = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("{");
  v.end_id = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<eos>");
  v.excluded.push_back(true);
  v.excluded.push_back(true);
  v.vocab = *TokenVocabulary::Create(v.tokens, v.excluded);
  // About 90,000 trie nodes, almost all distinct states.
  ASSERT_GT(v.vocab->trie_nodes(), 4 * (1 << 14));
  auto compiled = std::make_shared<const CompiledGrammar>(
      Parse("root ::= s\ns ::= \"a\" s \"x\" | \"b\" s \"y\" | \"\""), v.vocab);
  CheckWalks(compiled, v, 2, 4, 22);
}

// More distinct stack tops than kMaxCachedTops: each "x" of the repetition
// is a new top. The oldest classes are dropped (the grammar's memory stays
// bounded) and refilled when a later walk needs them; no request fails.
TEST(MatcherReferenceTest, MoreTopsThanTheCacheBoundAreEvictedAndRefilled) {
  const int count = static_cast<int>(kMaxCachedTops) + 300;
  std::vector<std::string> tokens = {"x", "xx", "xxx", "y", "xy", "xxy", "z"};
  // Never allowed; enough of them that a top's class is a bitmask, which
  // whole-state masks point to rather than copy.
  for (int i = 0; i < 300; ++i) tokens.push_back("z" + std::to_string(i));
  std::vector<bool> excluded(tokens.size(), false);
  tokens.push_back("<eos>");
  excluded.push_back(true);
  Vocab v;
  v.tokens = tokens;
  v.excluded = excluded;
  v.end_id = static_cast<int32_t>(tokens.size()) - 1;
  v.special_id = -1;
  v.vocab = *TokenVocabulary::Create(tokens, excluded);
  auto compiled = std::make_shared<const CompiledGrammar>(
      Parse("root ::= \"x\"{0," + std::to_string(count) + "} \"y\""), v.vocab);
  std::vector<uint32_t> mask(v.vocab->mask_words());
  const auto check_mask = [&](GrammarMatcher& m, int i) {
    ASSERT_TRUE(m.FillNextTokenMask(absl::MakeSpan(mask)).ok()) << i;
    const auto has = [&](int32_t id) -> bool {
      return (mask[id >> 5] >> (id & 31)) & 1;
    };
    // After i x's: "x" while i < count, "xx" while i + 2 <= count, ...
    EXPECT_EQ(has(0), i + 1 <= count) << i;
    EXPECT_EQ(has(1), i + 2 <= count) << i;
    EXPECT_EQ(has(2), i + 3 <= count) << i;
    EXPECT_TRUE(has(3)) << i;
    EXPECT_EQ(has(4), i + 1 <= count) << i;
    EXPECT_EQ(has(5), i + 2 <= count) << i;
    for (int32_t id = 6; id < v.end_id; ++id) EXPECT_FALSE(has(id)) << i;
    EXPECT_FALSE(has(v.end_id)) << i;
  };
  for (int pass = 0; pass < 2; ++pass) {
    GrammarMatcher m(compiled, {v.end_id});
    for (int i = 0; i < count; ++i) {
      check_mask(m, i);
      ASSERT_TRUE(m.Accept(0).ok()) << i;
    }
    check_mask(m, count);
    ASSERT_TRUE(m.Accept(3).ok());
    EXPECT_TRUE(m.CanEnd());
    EXPECT_LE(compiled->cached_positions(),
              static_cast<int64_t>(kMaxCachedTops));
  }
  // The second pass refilled the tops the first pass's end had pushed out.
  EXPECT_GT(
      compiled->filled_positions(),
      2 * static_cast<int64_t>(count) - static_cast<int64_t>(kMaxCachedTops));
}

// Sequences on several threads share one compiled grammar whose caches
// evict while the others read them; every mask stays right.
TEST(MatcherReferenceTest, ThreadsShareAnEvictingGrammar) {
  const int count = static_cast<int>(kMaxCachedTops) + 500;
  std::vector<std::string> tokens = {"x", "xx", "xxx", "y"};
  std::vector<bool> excluded(tokens.size(), false);
  auto vocab = *TokenVocabulary::Create(tokens, excluded);
  auto compiled = std::make_shared<const CompiledGrammar>(
      Parse("root ::= \"x\"{0," + std::to_string(count) + "} \"y\""), vocab);
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      GrammarMatcher m(compiled, {});
      std::vector<uint32_t> mask(m.mask_words());
      int i = 0;
      while (i < count) {
        if (!m.FillNextTokenMask(absl::MakeSpan(mask)).ok()) {
          ++failures[t];
          return;
        }
        const int left = count - i;
        const uint32_t expected = (left >= 1 ? 1u : 0u) |
                                  (left >= 2 ? 2u : 0u) |
                                  (left >= 3 ? 4u : 0u) | 8u;
        if (mask[0] != expected) ++failures[t];
        const int take = 1 + static_cast<int>(rng() % std::min(3, left));
        if (!m.Accept(take - 1).ok()) {
          ++failures[t];
          return;
        }
        i += take;
      }
      if (!m.Accept(3).ok() || !m.CanEnd()) ++failures[t];
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << t;
}

// Grammars of different kinds, each with its own vocabulary, on one memory
// budget (bytes, whatever the vocabulary), and a fixed plan of walks through
// them: the same plan fills the same entries however its walks interleave.
struct SharedBudget {
  std::vector<Vocab> vocabs;
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars;
  std::shared_ptr<GrammarMemoryBudget> budget;

  explicit SharedBudget(size_t limit)
      : budget(GrammarMemoryBudget::Create(limit)) {
    StructuredOutput regex;
    regex.kind = StructuredOutput::Kind::kRegex;
    regex.text = R"((ab|a)*c[0-9]{2,4}(é|ü|[x-z]+)?-\d+(\.\d{1,3})?)";
    StructuredOutput object;
    object.kind = StructuredOutput::Kind::kJsonObject;
    const std::vector<std::string> ebnfs = {
        SchemaEbnf(R"({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 12},
            "kind": {"enum": ["a", "ab", "é😀", 3, null]},
            "tags": {"type": "array", "items": {"enum": ["x", "é", "ü y"]}},
            "pos": {"type": "object", "properties": {"x": {"type": "number"}}}},
          "required": ["name", "kind"]})"),
        *StructuredOutputEbnf(regex), *StructuredOutputEbnf(object),
        R"G(
root   ::= expr (";" ws expr)*
expr   ::= term (ws [-+] ws term)*
term   ::= number | "(" ws expr ws ")" | [a-z]+ "(" expr ")"
number ::= "-"? [0-9]+ ( "." [0-9]+ )?
ws     ::= " "?
)G"};
    for (size_t i = 0; i < ebnfs.size(); ++i) {
      std::mt19937 rng(40 + i);
      Grammar g = Parse(ebnfs[i]);
      vocabs.push_back(MakeVocab(Samples(g, {}, &rng), &rng));
      grammars.push_back(std::make_shared<const CompiledGrammar>(
          std::move(g), vocabs.back().vocab, budget));
    }
  }

  static constexpr int kRounds = 3;
  // Walk r of grammar i, checked against the reference; false on a wrong
  // mask.
  bool Walk(int r, size_t i) const {
    return CheckWalks(grammars[i], vocabs[i], 1, 30,
                      static_cast<uint32_t>(1000 * r + i)) >= 0;
  }
  size_t CachedBytes() const {
    size_t sum = 0;
    for (const auto& g : grammars) sum += g->cached_bytes();
    return sum;
  }
};

// The plan run alone with room for everything: what it caches in all, and
// its largest entry.
GrammarMemoryBudget::Stats UnboundedPlan() {
  SharedBudget all(size_t{1} << 30);
  for (int r = 0; r < SharedBudget::kRounds; ++r) {
    for (size_t i = 0; i < all.grammars.size(); ++i)
      EXPECT_TRUE(all.Walk(r, i));
  }
  const GrammarMemoryBudget::Stats st = all.budget->stats();
  EXPECT_EQ(st.evictions, 0);
  EXPECT_EQ(st.bytes, all.CachedBytes());
  return st;
}

// Under a budget of a few entries, each grammar's walks drop the others'
// entries (and its own), which are refilled when next needed: every mask
// still equals the reference's, nothing is refused on one thread, and the
// charge never passes the budget.
TEST(MatcherReferenceTest, GrammarsSharingATinyBudgetEvictEachOther) {
  const GrammarMemoryBudget::Stats unbounded = UnboundedPlan();
  // One thread holds at most a class while it charges a mask.
  const size_t limit = 3 * unbounded.max_entry_bytes;
  ASSERT_GT(unbounded.bytes, 4 * limit);
  SharedBudget tiny(limit);
  int64_t dropped_by_others = 0;
  for (int r = 0; r < SharedBudget::kRounds; ++r) {
    for (size_t i = 0; i < tiny.grammars.size(); ++i) {
      std::vector<int64_t> before;
      for (const auto& g : tiny.grammars) {
        before.push_back(g->cached_positions() + g->cached_masks());
      }
      ASSERT_TRUE(tiny.Walk(r, i)) << r << " " << i;
      ASSERT_LE(tiny.budget->stats().bytes, limit);
      for (size_t j = 0; j < tiny.grammars.size(); ++j) {
        const auto& g = tiny.grammars[j];
        if (j != i && g->cached_positions() + g->cached_masks() < before[j]) {
          ++dropped_by_others;
        }
      }
    }
  }
  const GrammarMemoryBudget::Stats st = tiny.budget->stats();
  EXPECT_GT(dropped_by_others, 0);
  EXPECT_GT(st.evictions, static_cast<int64_t>(unbounded.entries));
  EXPECT_EQ(st.refused, 0);
  EXPECT_EQ(st.bytes, tiny.CachedBytes());
  tiny.grammars.clear();
  EXPECT_EQ(tiny.budget->stats().bytes, 0u);
}

// Four threads run the same plan in different orders on a budget a few
// times smaller than what it fills: entries of every grammar are dropped
// while the other threads use and refill them. Each thread holds at most
// two entries at once (a step mask and its class, or a class while its mask
// is charged), so 12 of the largest leave room for every charge.
TEST(MatcherReferenceTest, ThreadsOnATinySharedBudget) {
  const GrammarMemoryBudget::Stats unbounded = UnboundedPlan();
  const size_t limit = 12 * unbounded.max_entry_bytes;
  ASSERT_GT(unbounded.bytes, 2 * limit);
  SharedBudget tiny(limit);
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < SharedBudget::kRounds; ++r) {
        for (size_t k = 0; k < tiny.grammars.size(); ++k) {
          const size_t i = (k + t) % tiny.grammars.size();
          if (!tiny.Walk((r + t) % SharedBudget::kRounds, i)) ++failures[t];
          if (tiny.budget->stats().bytes > limit) ++failures[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << t;
  const GrammarMemoryBudget::Stats st = tiny.budget->stats();
  EXPECT_GT(st.evictions, 0);
  EXPECT_EQ(st.refused, 0);
  EXPECT_LE(st.bytes, limit);
  EXPECT_EQ(st.bytes, tiny.CachedBytes());
  tiny.grammars.clear();
  EXPECT_EQ(tiny.budget->stats().bytes, 0u);
}

}  // namespace
}  // namespace grammar
}  // namespace tessera
