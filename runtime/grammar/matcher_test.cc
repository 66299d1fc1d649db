#include "runtime/grammar/matcher.h"

#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_vocabulary.h"

namespace tessera {
namespace grammar {
namespace {

// Any JSON value, written the way the schema converter writes it.
constexpr char kJson[] = R"(
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,3} )?
ws     ::= ( " " | "\n" [ \t]{0,24} )?
)";

// 256 one-byte tokens, then an end token (id 256).
std::shared_ptr<const TokenVocabulary> ByteVocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back("</s>");
  std::vector<bool> excluded(bytes.size(), false);
  excluded[256] = true;
  return *TokenVocabulary::Create(bytes, excluded);
}

std::shared_ptr<const CompiledGrammar> Compile(
    const std::string& ebnf, std::shared_ptr<const TokenVocabulary> vocab) {
  auto g = ParseEbnf(ebnf);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<CompiledGrammar>(*std::move(g), std::move(vocab));
}

// Whether the grammar matches `text` exactly, fed byte by byte.
bool Matches(const std::string& ebnf, const std::string& text) {
  GrammarMatcher m(Compile(ebnf, ByteVocabulary()), {256});
  for (char c : text) {
    if (!m.Accept(static_cast<uint8_t>(c)).ok()) return false;
  }
  return m.CanEnd();
}

TEST(MatcherTest, LiteralsClassesAndRepetition) {
  EXPECT_TRUE(Matches(R"(root ::= "ab" "c")", "abc"));
  EXPECT_FALSE(Matches(R"(root ::= "ab" "c")", "ab"));
  EXPECT_FALSE(Matches(R"(root ::= "ab" "c")", "abcd"));
  EXPECT_TRUE(Matches(R"(root ::= [a-c]+ "!")", "abcba!"));
  EXPECT_FALSE(Matches(R"(root ::= [a-c]+ "!")", "!"));
  EXPECT_TRUE(Matches(R"(root ::= "x"{2,3})", "xx"));
  EXPECT_TRUE(Matches(R"(root ::= "x"{2,3})", "xxx"));
  EXPECT_FALSE(Matches(R"(root ::= "x"{2,3})", "x"));
  EXPECT_FALSE(Matches(R"(root ::= "x"{2,3})", "xxxx"));
  EXPECT_TRUE(Matches(R"(root ::= "x"{2,})", "xxxxxxx"));
  EXPECT_TRUE(Matches(R"(root ::= ("a" | "b" "c")* "d"?)", "abcad"));
  EXPECT_TRUE(Matches(R"(root ::= ("a" | "b" "c")* "d"?)", ""));
  EXPECT_FALSE(Matches(R"(root ::= ("a" | "b" "c")* "d"?)", "abd"));
  EXPECT_TRUE(Matches("root ::= a b\na ::= \"1\"\nb ::= \"2\" | a", "11"));
}

TEST(MatcherTest, Utf8ClassesMatchWholeCharacters) {
  // é is C3 A9; ÿ is C3 BF; 😀 is F0 9F 98 80.
  EXPECT_TRUE(Matches(R"(root ::= [à-ÿ])", "é"));
  EXPECT_FALSE(Matches(R"(root ::= [à-ÿ])", "e"));
  EXPECT_TRUE(Matches(R"(root ::= [^a])", "é"));
  EXPECT_TRUE(Matches(R"(root ::= [^a])", "😀"));
  EXPECT_FALSE(Matches(R"(root ::= [^a])", "a"));
  EXPECT_FALSE(Matches(R"(root ::= [^a])", "\xC3"));  // half a character
  EXPECT_TRUE(Matches(R"(root ::= .+)", "a😀é\n"));
  EXPECT_TRUE(Matches(R"(root ::= "\u00e9\U0001F600")", "é😀"));
  // Every code point of a wide range, spot-checked at the encoding edges.
  const std::string ebnf = R"(root ::= [\u0080-\U0010FFFF])";
  for (const char* s :
       {"\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80",
        "\xEF\xBF\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(Matches(ebnf, s)) << s;
  }
  // Surrogates and overlong forms are not UTF-8.
  EXPECT_FALSE(Matches(ebnf, "\xED\xA0\x80"));
  EXPECT_FALSE(Matches(ebnf, "\xC0\x80"));
}

TEST(MatcherTest, JsonGrammarAcceptsJsonOnly) {
  EXPECT_TRUE(Matches(kJson, R"({"a": [1, -2.5e3, true, null], "b": {}})"));
  EXPECT_TRUE(Matches(kJson, R"("caf\u00e9 é")"));
  EXPECT_FALSE(Matches(kJson, R"({"a": 01})"));
  EXPECT_FALSE(Matches(kJson, R"({"a" 1})"));
  EXPECT_FALSE(Matches(kJson, "\"tab\there\""));
}

TEST(MatcherTest, RightRecursionDoesNotGrowTheStack) {
  // 100,000 characters of one string: far past kMaxStackDepth frames if each
  // repetition kept one.
  std::string text = "\"" + std::string(100000, 'x') + "\"";
  EXPECT_TRUE(Matches(kJson, text));
}

TEST(MatcherTest, NestingPastTheStackBoundIsRefused) {
  const std::string deep(kMaxStackDepth, '[');
  GrammarMatcher m(Compile(kJson, ByteVocabulary()), {256});
  absl::Status s;
  for (char c : deep) {
    s = m.Accept(static_cast<uint8_t>(c));
    if (!s.ok()) break;
  }
  EXPECT_FALSE(s.ok());
}

// A state too deep for the whole-state mask cache (its stacks hold more than
// kMaxMaskKeyFrames frames in all) is masked directly, every time.
TEST(MatcherTest, DeepStatesAreMaskedWithoutTheStepCache) {
  GrammarMatcher m(Compile(kJson, ByteVocabulary()), {256});
  int depth = 0;
  for (; depth < 400 && m.Accept('[').ok(); ++depth) {
  }
  ASSERT_GT(depth, 100);
  std::vector<uint32_t> mask(m.mask_words());
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(m.FillNextTokenMask(absl::MakeSpan(mask)).ok());
    const auto has = [&](int id) -> bool {
      return (mask[id >> 5] >> (id & 31)) & 1;
    };
    EXPECT_TRUE(has(']'));
    EXPECT_TRUE(has('"'));
    EXPECT_TRUE(has('7'));
    EXPECT_FALSE(has('}'));
    EXPECT_FALSE(has(256));
  }
  int closed = 0;
  for (; closed < depth && m.Accept(']').ok(); ++closed) {
  }
  EXPECT_EQ(closed, depth);
  EXPECT_TRUE(m.CanEnd());
}

// Each "x" may or may not open a "y" to close later: after n of them the
// state holds n + 1 stacks. A mask over more than kMaxMaskStacks fails the
// request instead of walking the vocabulary that many times.
TEST(MatcherTest, TooManyStacksFailTheMaskNotTheProcess) {
  GrammarMatcher m(Compile("root ::= s\ns ::= \"x\" s \"y\" | \"x\" s | \"\"",
                           ByteVocabulary()),
                   {256});
  std::vector<uint32_t> mask(m.mask_words());
  absl::Status s;
  size_t n = 0;
  for (; n < kMaxMaskStacks + 10 && s.ok(); ++n) {
    ASSERT_TRUE(m.Accept('x').ok()) << n;
    s = m.FillNextTokenMask(absl::MakeSpan(mask));
  }
  // The first masks (a few stacks) are fine; a later one is refused.
  EXPECT_GT(n, 5u);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << n;
  EXPECT_NE(s.message().find("too ambiguous"), std::string::npos) << s;
}

TEST(MatcherTest, EndTokenOnlyWhenComplete) {
  GrammarMatcher m(Compile(R"(root ::= "ab")", ByteVocabulary()), {256});
  std::vector<uint32_t> mask(m.mask_words());
  ASSERT_TRUE(m.FillNextTokenMask(absl::MakeSpan(mask)).ok());
  EXPECT_FALSE(mask[256 >> 5] & 1u);
  EXPECT_FALSE(m.Accept(256).ok());
  ASSERT_TRUE(m.Accept('a').ok());
  EXPECT_FALSE(m.Accept('c').ok());  // refused, state unchanged
  ASSERT_TRUE(m.Accept('b').ok());
  ASSERT_TRUE(m.FillNextTokenMask(absl::MakeSpan(mask)).ok());
  int allowed = 0;
  for (int id = 0; id < 257; ++id) allowed += (mask[id >> 5] >> (id & 31)) & 1;
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(mask[256 >> 5] & 1u);
  ASSERT_TRUE(m.Accept(256).ok());
  EXPECT_TRUE(m.terminated());
}

// The cached mask against the direct answer (a fresh matcher replaying the
// output, then Accept of each token), along random walks through JSON with a
// vocabulary of multi-byte pieces that cross every kind of boundary.
TEST(MatcherTest, MaskEqualsDirectCheckOnRandomWalks) {
  std::mt19937 rng(7);
  const std::vector<std::string> samples = {
      R"({"name": "Ada \u00e9", "tags": ["x", "y"], "n": -12.5e2})",
      R"([true, false, null, {"k": [1, 2, {"z": "\"q\""}]}])",
      R"({"a":{"b":{"c":[0,1.25,"é😀"]}}, "d" : "\\n"})"};
  std::vector<std::string> tokens;
  for (int b = 0; b < 128; ++b) tokens.push_back(std::string(1, char(b)));
  for (const std::string& s : samples) {
    for (int i = 0; i < 200; ++i) {
      const size_t at = rng() % s.size();
      const size_t len = 1 + rng() % 6;
      tokens.push_back(s.substr(at, len));
    }
  }
  tokens.push_back("\xC3");  // a lone lead byte: half of é
  tokens.push_back("\xA9\"");
  const int32_t end_id = static_cast<int32_t>(tokens.size());
  tokens.push_back("<eos>");
  std::vector<bool> excluded(tokens.size(), false);
  excluded[end_id] = true;
  auto vocab = *TokenVocabulary::Create(tokens, excluded);
  auto grammar = Compile(kJson, vocab);
  for (int walk = 0; walk < 12; ++walk) {
    GrammarMatcher m(grammar, {end_id});
    std::vector<int32_t> output;
    for (int step = 0; step < 60 && !m.terminated(); ++step) {
      std::vector<uint32_t> mask(m.mask_words());
      ASSERT_TRUE(m.FillNextTokenMask(absl::MakeSpan(mask)).ok());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        const bool in_mask = (mask[id >> 5] >> (id & 31)) & 1;
        GrammarMatcher direct(grammar, {end_id});
        for (int32_t t : output) ASSERT_TRUE(direct.Accept(t).ok());
        const bool ok = direct.Accept(id).ok();
        ASSERT_EQ(in_mask, ok) << "walk " << walk << " step " << step
                               << " token " << id << " '" << tokens[id] << "'";
        if (ok) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      // Prefer the end once allowed half the time, so walks finish.
      int32_t pick = allowed[rng() % allowed.size()];
      if (m.CanEnd() && rng() % 2 == 0) pick = end_id;
      ASSERT_TRUE(m.Accept(pick).ok());
      output.push_back(pick);
    }
    if (m.terminated()) {
      std::string text;
      for (int32_t t : output) {
        if (t != end_id) text += tokens[t];
      }
      EXPECT_TRUE(nlohmann::json::accept(text)) << text;
    }
  }
  EXPECT_GT(grammar->cached_positions(), 10);
}

// The trie against its definition: every node's tokens are exactly the
// sorted tokens that extend (or equal) the node's prefix, and every distinct
// prefix of every allowed token is one node.
TEST(TokenVocabularyTest, TrieMatchesPrefixes) {
  std::mt19937 rng(3);
  std::vector<std::string> tokens = {"a",        "ab",   "ab", "abc", "b",
                                     "\xC3\xA9", "\xC3", "",   "zz",  "z"};
  for (int i = 0; i < 300; ++i) {
    std::string t;
    for (size_t n = 1 + rng() % 5; n > 0; --n)
      t.push_back("ab\xC3\xA9z"[rng() % 5]);
    tokens.push_back(t);
  }
  std::vector<bool> excluded(tokens.size(), false);
  excluded[4] = true;  // "b" is special: not in the trie.
  auto vocab = *TokenVocabulary::Create(tokens, excluded);
  const int32_t n = vocab->trie_nodes();
  const std::vector<int32_t>& sorted = vocab->sorted();
  ASSERT_EQ(vocab->trie_end(0), n);
  ASSERT_EQ(vocab->trie_tokens(0), 0);
  ASSERT_EQ(vocab->trie_tokens(n), static_cast<int32_t>(sorted.size()));
  std::vector<std::string> prefix(n);
  std::vector<int32_t> parents = {0};
  std::set<std::string> all_prefixes;
  for (int32_t id : sorted) {
    const std::string& t = vocab->bytes(id);
    for (size_t d = 1; d <= t.size(); ++d) all_prefixes.insert(t.substr(0, d));
  }
  EXPECT_EQ(static_cast<size_t>(n - 1), all_prefixes.size());
  for (int32_t i = 1; i < n; ++i) {
    // The parent is the nearest earlier node one level up.
    const int32_t d = vocab->trie_depth(i);
    parents.resize(d);
    prefix[i] = prefix[parents[d - 1]] + char(vocab->trie_byte(i));
    parents.push_back(i);
    ASSERT_EQ(static_cast<int32_t>(prefix[i].size()), d);
    for (size_t k = 0; k < sorted.size(); ++k) {
      const std::string& t = vocab->bytes(sorted[k]);
      const bool extends = t.compare(0, prefix[i].size(), prefix[i]) == 0;
      const bool in_subtree =
          static_cast<int32_t>(k) >= vocab->trie_tokens(i) &&
          static_cast<int32_t>(k) < vocab->trie_tokens(vocab->trie_end(i));
      const bool here = static_cast<int32_t>(k) >= vocab->trie_tokens(i) &&
                        static_cast<int32_t>(k) < vocab->trie_tokens(i + 1);
      ASSERT_EQ(extends, in_subtree) << i << " '" << prefix[i] << "' " << t;
      ASSERT_EQ(extends && t.size() == prefix[i].size(), here)
          << i << " '" << prefix[i] << "' " << t;
    }
    for (int32_t j = i + 1; j < vocab->trie_end(i); ++j) {
      ASSERT_GT(vocab->trie_depth(j), d);
    }
  }
}

TEST(GrammarCacheTest, SameTextSameGrammar) {
  GrammarCache cache(ByteVocabulary(), 2);
  auto a = cache.Get(R"(root ::= "a")");
  auto b = cache.Get(R"(root ::= "a")");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_FALSE(cache.Get("root ::= undefined_rule").ok());
  ASSERT_TRUE(cache.Get(R"(root ::= "b")").ok());
  ASSERT_TRUE(cache.Get(R"(root ::= "c")").ok());  // "a" is the oldest: gone
  auto a2 = cache.Get(R"(root ::= "a")");
  ASSERT_TRUE(a2.ok());
  EXPECT_NE(a->get(), a2->get());
}

// Steps `m` through `text` byte by byte (a byte vocabulary), each step's mask
// first; false at the first failure.
bool WalkText(GrammarMatcher* m, const std::string& text) {
  std::vector<uint32_t> mask(m->mask_words());
  for (char c : text) {
    const int32_t id = static_cast<uint8_t>(c);
    if (!m->FillNextTokenMask(absl::MakeSpan(mask)).ok()) return false;
    if (!((mask[id >> 5] >> (id & 31)) & 1)) return false;
    if (!m->Accept(id).ok()) return false;
  }
  return true;
}

size_t SumCachedBytes(
    const std::vector<std::shared_ptr<const CompiledGrammar>>& grammars) {
  size_t sum = 0;
  for (const auto& g : grammars) {
    if (g != nullptr) sum += g->cached_bytes();
  }
  return sum;
}

TEST(GrammarMemoryBudgetTest, ChargedBytesAreTheLiveEntriesAndReturnToZero) {
  auto budget = GrammarMemoryBudget::Create();
  auto vocab = ByteVocabulary();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {kJson, R"({"a": [1, -2.5e3, true, null], "b": {"c": "d\u00e9"}})"},
      {R"(root ::= ("ab" | "a" [0-9]+)* "!")", "aba12a3ab!"},
      {R"(root ::= [a-z]+ ("," [a-z]+)*)", "abc,de,f"}};
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars;
  for (const auto& c : cases) {
    auto g = ParseEbnf(c.first);
    ASSERT_TRUE(g.ok()) << g.status();
    grammars.push_back(
        std::make_shared<CompiledGrammar>(*std::move(g), vocab, budget));
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const int64_t fills = grammars[i]->filled_positions();
      GrammarMatcher m(grammars[i], {256});
      ASSERT_TRUE(WalkText(&m, cases[i].second)) << i;
      // No step holds an entry now: what is charged is what is cached.
      const GrammarMemoryBudget::Stats st = budget->stats();
      EXPECT_EQ(st.bytes, SumCachedBytes(grammars)) << pass << " " << i;
      int64_t entries = 0;
      for (const auto& g : grammars) {
        entries += g->cached_positions() + g->cached_masks();
      }
      EXPECT_EQ(static_cast<int64_t>(st.entries), entries);
      EXPECT_GT(grammars[i]->cached_bytes(), 0u);
      EXPECT_EQ(st.evictions, 0);
      EXPECT_EQ(st.refused, 0);
      // A budget this large keeps everything: the second pass fills nothing.
      if (pass == 1) {
        EXPECT_EQ(grammars[i]->filled_positions(), fills) << i;
      }
    }
  }
  // Dropping a grammar credits its entries.
  for (size_t i = 0; i < grammars.size(); ++i) {
    grammars[i].reset();
    EXPECT_EQ(budget->stats().bytes, SumCachedBytes(grammars)) << i;
  }
  EXPECT_EQ(budget->stats().bytes, 0u);
  EXPECT_EQ(budget->stats().entries, 0u);
}

// A class a step holds is never dropped for room: the charge that would
// need it fails its request, and succeeds once the step lets go. An entry
// dropped while held stays valid and charged until freed.
TEST(GrammarMemoryBudgetTest, EntriesInUseAreKeptAndTheChargeIsRefused) {
  auto vocab = ByteVocabulary();
  const auto compile = [&](const std::string& ebnf,
                           std::shared_ptr<GrammarMemoryBudget> budget) {
    auto g = ParseEbnf(ebnf);
    EXPECT_TRUE(g.ok()) << g.status();
    return std::make_shared<CompiledGrammar>(*std::move(g), vocab,
                                             std::move(budget));
  };
  // The start state's tops: one stack, exact, at the literal's first byte.
  const auto start_tops = [](const CompiledGrammar& g) {
    const int32_t pos = g.grammar().rules[g.grammar().root][0];
    EXPECT_EQ(g.grammar().elements[pos].kind, Element::kBytes);
    return std::vector<int32_t>{pos, CompiledGrammar::kExactTop};
  };
  // Each class's charge, measured alone.
  size_t cost_a, cost_b;
  {
    auto g = compile(R"(root ::= "ab")", nullptr);
    auto c = g->Cache(start_tops(*g));
    ASSERT_TRUE(c.ok()) << c.status();
    cost_a = (*c)->charge.bytes();
    EXPECT_EQ(g->cached_bytes(), cost_a);
    EXPECT_EQ(g->budget()->stats().bytes, cost_a);
    // The charge covers what the class holds.
    EXPECT_GE(cost_a,
              sizeof(CompiledGrammar::PositionCache) +
                  4 * ((*c)->accepted_bits.size() + (*c)->accepted_ids.size() +
                       (*c)->uncertain.size() + 2));
    ASSERT_EQ((*c)->accepted_ids, std::vector<int32_t>{'a'});
  }
  {
    auto g = compile(R"(root ::= "cd")", nullptr);
    auto c = g->Cache(start_tops(*g));
    ASSERT_TRUE(c.ok()) << c.status();
    cost_b = (*c)->charge.bytes();
  }
  // Room for one of them, not both.
  auto budget = GrammarMemoryBudget::Create(cost_a + cost_b - 1);
  auto a = compile(R"(root ::= "ab")", budget);
  auto b = compile(R"(root ::= "cd")", budget);
  auto held = a->Cache(start_tops(*a));
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(budget->stats().bytes, cost_a);
  auto refused = b->Cache(start_tops(*b));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("memory budget"),
            absl::string_view::npos)
      << refused.status();
  // Through a matcher: that request fails, the process goes on.
  {
    GrammarMatcher m(b, {256});
    std::vector<uint32_t> mask(m.mask_words());
    const absl::Status s = m.FillNextTokenMask(absl::MakeSpan(mask));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  EXPECT_EQ(budget->stats().refused, 2);
  EXPECT_EQ(budget->stats().bytes, cost_a);
  EXPECT_EQ(a->cached_positions(), 1);
  // Let go: b's class now drops a's.
  held = absl::UnknownError("released");
  auto c = b->Cache(start_tops(*b));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(a->cached_positions(), 0);
  EXPECT_EQ(b->cached_positions(), 1);
  EXPECT_EQ(budget->stats().evictions, 1);
  EXPECT_EQ(budget->stats().bytes, cost_b);
  // b's class outlives its grammar while held, charged until freed.
  std::shared_ptr<const CompiledGrammar::PositionCache> kept = *c;
  c = absl::UnknownError("released");
  b.reset();
  EXPECT_EQ(budget->stats().entries, 0u);
  EXPECT_EQ(budget->stats().bytes, cost_b);
  EXPECT_EQ(kept->accepted_ids, std::vector<int32_t>{'c'});
  kept.reset();
  EXPECT_EQ(budget->stats().bytes, 0u);
  // A class larger than the whole budget is refused outright.
  auto tiny = compile(R"(root ::= "ab")", GrammarMemoryBudget::Create(16));
  EXPECT_EQ(tiny->Cache(start_tops(*tiny)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A hostile client: 1000 distinct schemas, each explored for a few steps,
// through one GrammarCache with a small budget. The charged bytes never
// pass it, equal the entries of the grammars still alive, every mask is
// the matcher's own Accept's answer, and dropping the cache frees it all.
TEST(GrammarCacheTest, ThousandDistinctSchemasStayUnderTheBudget) {
  constexpr size_t kBudget = 64 << 10;
  auto cache = std::make_unique<GrammarCache>(ByteVocabulary(), 256, kBudget);
  const std::shared_ptr<GrammarMemoryBudget> budget = cache->budget();
  std::vector<std::weak_ptr<const CompiledGrammar>> seen;
  std::mt19937 rng(7);
  size_t peak = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::string schema =
        R"({"type": "object", "properties": {"f)" + std::to_string(i) +
        R"(": {"type": "string", "maxLength": 12}, "n": {"enum": [)" +
        std::to_string(i) + ", " + std::to_string(i * 7 + 1) +
        R"(]}}, "required": ["f)" + std::to_string(i) +
        R"(", "n"], "additionalProperties": false})";
    auto ebnf = JsonSchemaTextToEbnf(schema);
    ASSERT_TRUE(ebnf.ok()) << ebnf.status();
    auto g = cache->Get(*ebnf);
    ASSERT_TRUE(g.ok()) << g.status();
    seen.push_back(*g);
    {
      GrammarMatcher m(*g, {256});
      std::vector<uint32_t> mask(m.mask_words());
      for (int step = 0; step < 24 && !m.terminated(); ++step) {
        ASSERT_TRUE(m.FillNextTokenMask(absl::MakeSpan(mask)).ok())
            << i << " " << step;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id <= 256; ++id) {
          const bool in_mask = (mask[id >> 5] >> (id & 31)) & 1;
          if (in_mask) allowed.push_back(id);
          // Accept walks the real stacks, no cache: a reference for every
          // tenth schema (all 257 tokens each step cost time).
          if (i % 10 == 0) {
            ASSERT_EQ(in_mask, m.Clone()->Accept(id).ok())
                << i << " " << step << " " << id;
          }
        }
        ASSERT_FALSE(allowed.empty());
        ASSERT_TRUE(m.Accept(allowed[rng() % allowed.size()]).ok());
        peak = std::max(peak, budget->stats().bytes);
      }
    }
    g = absl::UnknownError("released");
    const GrammarMemoryBudget::Stats st = budget->stats();
    ASSERT_LE(st.bytes, kBudget) << i;
    size_t alive_bytes = 0;
    int alive = 0;
    for (const auto& w : seen) {
      if (auto p = w.lock()) {
        alive_bytes += p->cached_bytes();
        ++alive;
      }
    }
    // The cache's own eviction of whole grammars credits their entries.
    ASSERT_EQ(st.bytes, alive_bytes) << i;
    ASSERT_LE(alive, 256) << i;
  }
  const GrammarMemoryBudget::Stats st = budget->stats();
  EXPECT_LE(peak, kBudget);
  EXPECT_GT(st.evictions, 1000);  // The budget, not only the 256, bound it.
  EXPECT_EQ(st.refused, 0);       // One thread: nothing else holds entries.
  EXPECT_EQ(cache->size(), 256u);
  cache.reset();
  EXPECT_EQ(budget->stats().bytes, 0u);
  EXPECT_EQ(budget->stats().entries, 0u);
}

}  // namespace
}  // namespace grammar
}  // namespace tessera
