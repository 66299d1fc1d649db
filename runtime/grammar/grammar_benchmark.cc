// The structured-output engine's costs, on a real vocabulary:
//   TESSERA_TOKENIZER_DIR=../shared/tokenizers/qwen3 \
//     bazel run -c opt //runtime/grammar:grammar_benchmark
// - BM_CompileSchema: a JSON schema to EBNF to a parsed grammar (what rank 0
//   does per request).
// - BM_CreateVocabulary: the tokenizer's TokenVocabulary (sorted ids and the
//   byte trie), once per tokenizer.
// - BM_ColdMasks: a fresh compiled grammar's masks along one JSON output,
//   every position's token cache filled on first use (a new schema's first
//   request).
// - BM_WarmMaskAndAccept: one step's mask and accept with the caches filled
//   (every later request with the schema); the per-token time is what a
//   decode step waits for when the forward does not hide it.
// - BM_Batch64ArrayOfObjects: 64 sequences of one new compiled grammar
//   (tools/bench_schemas/array_of_objects.json) drawing random allowed
//   tokens for up to 256 steps each, as a batch explores a schema
//   (this once failed past 2048 distinct stack tops); per-step time,
//   classes filled, what the caches hold, and failed sequences (must be 0).
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/text/tokenizer.h"

namespace tessera {
namespace grammar {
namespace {

constexpr char kSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "address": {"type": "object",
                "properties": {"city": {"type": "string"},
                               "zip": {"type": "string",
                                       "pattern": "[0-9]{5}"}},
                "required": ["city", "zip"], "additionalProperties": false},
    "role": {"enum": ["admin", "user", "guest"]}
  },
  "required": ["name", "age", "tags", "address", "role"],
  "additionalProperties": false})";

constexpr char kOutput[] =
    R"({"name": "Ada Lovelace, the first programmer", "age": 36, "tags": ["math", "engines", "poetry of science"], "address": {"city": "London", "zip": "12345"}, "role": "admin"})";

constexpr char kArrayOfObjects[] = R"({
  "type": "array", "minItems": 1, "maxItems": 8,
  "items": {
    "type": "object",
    "properties": {
      "id": {"type": "integer", "minimum": 0, "maximum": 999999},
      "name": {"type": "string", "maxLength": 40},
      "kind": {"enum": ["person", "place", "thing", "event"]},
      "active": {"type": "boolean"},
      "score": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 16},
               "maxItems": 4},
      "address": {
        "type": "object",
        "properties": {
          "street": {"type": "string", "maxLength": 40},
          "city": {"type": "string", "maxLength": 24},
          "zip": {"type": "string", "pattern": "[0-9]{5}"}
        },
        "required": ["street", "city", "zip"]
      }
    },
    "required": ["id", "name", "kind", "active", "score", "tags", "address"]
  }})";

struct Setup {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const TokenVocabulary> vocab;
  std::vector<int32_t> output_ids;
  std::string ebnf;
  std::vector<std::string> bytes;
  std::vector<bool> excluded;
};

const Setup& GetSetup() {
  static Setup* setup = [] {
    auto* s = new Setup();
    const char* dir = std::getenv("TESSERA_TOKENIZER_DIR");
    auto tok =
        LoadTokenizer(dir != nullptr ? dir : "../shared/tokenizers/qwen3", -1);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
      std::exit(1);
    }
    s->tokenizer = *std::move(tok);
    std::vector<std::string> bytes;
    std::vector<bool> excluded;
    for (int32_t id = 0; id < s->tokenizer->vocab_size(); ++id) {
      bytes.push_back(s->tokenizer->TokenBytes(id));
      excluded.push_back(s->tokenizer->IsSpecial(id));
    }
    s->vocab = *TokenVocabulary::Create(bytes, excluded);
    s->bytes = bytes;
    s->excluded = excluded;
    s->output_ids = *s->tokenizer->Encode(kOutput);
    s->ebnf = *JsonSchemaTextToEbnf(kSchema);
    return s;
  }();
  return *setup;
}

void BM_CompileSchema(benchmark::State& state) {
  for (auto _ : state) {
    auto ebnf = JsonSchemaTextToEbnf(kSchema);
    auto g = ParseEbnf(*ebnf);
    benchmark::DoNotOptimize(g);
  }
}
BENCHMARK(BM_CompileSchema)->Unit(benchmark::kMicrosecond);

// Once per tokenizer: sorting the vocabulary and building its trie.
void BM_CreateVocabulary(benchmark::State& state) {
  const Setup& s = GetSetup();
  for (auto _ : state) {
    auto v = TokenVocabulary::Create(s.bytes, s.excluded);
    benchmark::DoNotOptimize(v);
  }
  state.counters["trie_nodes"] = static_cast<double>(s.vocab->trie_nodes());
}
BENCHMARK(BM_CreateVocabulary)->Unit(benchmark::kMillisecond);

// Walks the output: mask, then accept, token by token.
void Walk(const std::shared_ptr<const CompiledGrammar>& g) {
  const Setup& s = GetSetup();
  GrammarMatcher m(g, {s.tokenizer->eos_id()});
  std::vector<uint32_t> mask(m.mask_words());
  for (int32_t id : s.output_ids) {
    if (!m.FillNextTokenMask(absl::MakeSpan(mask)).ok() ||
        !((mask[id >> 5] >> (id & 31)) & 1u) || !m.Accept(id).ok()) {
      std::fprintf(stderr, "the output does not follow the schema\n");
      std::exit(1);
    }
  }
}

void BM_ColdMasks(benchmark::State& state) {
  const Setup& s = GetSetup();
  for (auto _ : state) {
    auto g =
        std::make_shared<const CompiledGrammar>(*ParseEbnf(s.ebnf), s.vocab);
    Walk(g);
    state.counters["fills"] = static_cast<double>(g->filled_positions());
  }
  state.counters["tokens"] = static_cast<double>(s.output_ids.size());
}
BENCHMARK(BM_ColdMasks)->Unit(benchmark::kMillisecond);

void BM_WarmMaskAndAccept(benchmark::State& state) {
  const Setup& s = GetSetup();
  auto g = std::make_shared<const CompiledGrammar>(*ParseEbnf(s.ebnf), s.vocab);
  Walk(g);  // fills the caches
  for (auto _ : state) Walk(g);
  state.counters["per_token_us"] =
      benchmark::Counter(static_cast<double>(s.output_ids.size()) * 1e-6,
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert);
}
BENCHMARK(BM_WarmMaskAndAccept)->Unit(benchmark::kMillisecond);

void BM_Batch64ArrayOfObjects(benchmark::State& state) {
  const Setup& s = GetSetup();
  const std::string ebnf = *JsonSchemaTextToEbnf(kArrayOfObjects);
  int64_t steps = 0, failed = 0, fills = 0, cached = 0, cached_bytes = 0;
  for (auto _ : state) {
    auto g = std::make_shared<const CompiledGrammar>(*ParseEbnf(ebnf), s.vocab);
    std::mt19937 rng(1);
    std::vector<std::unique_ptr<GrammarMatcher>> seqs;
    for (int i = 0; i < 64; ++i) {
      seqs.push_back(std::make_unique<GrammarMatcher>(
          g, std::vector<int32_t>{s.tokenizer->eos_id()}));
    }
    std::vector<uint32_t> mask(seqs[0]->mask_words());
    for (int step = 0; step < 256; ++step) {
      for (auto& m : seqs) {
        if (m == nullptr || m->terminated()) continue;
        ++steps;
        if (!m->FillNextTokenMask(absl::MakeSpan(mask)).ok()) {
          ++failed;
          m.reset();
          continue;
        }
        // A random allowed token: uniform by rejection where the mask is
        // dense, else the first allowed id from a random one on.
        const auto allowed = [&](int32_t id) {
          return ((mask[id >> 5] >> (id & 31)) & 1u) != 0;
        };
        int32_t pick = static_cast<int32_t>(rng() % s.vocab->size());
        for (int tries = 0; tries < 64 && !allowed(pick); ++tries) {
          pick = static_cast<int32_t>(rng() % s.vocab->size());
        }
        if (!allowed(pick)) {
          size_t w = static_cast<size_t>(pick >> 5);
          uint32_t word = mask[w] & (~uint32_t{0} << (pick & 31));
          while (word == 0) {
            w = (w + 1) % mask.size();
            word = mask[w];
          }
          pick = static_cast<int32_t>(w * 32) + __builtin_ctz(word);
        }
        if (!m->Accept(pick).ok()) {
          ++failed;
          m.reset();
        }
      }
    }
    fills = g->filled_positions();
    cached = g->cached_positions();
    cached_bytes = static_cast<int64_t>(g->cached_bytes());
  }
  state.counters["per_step_us"] = benchmark::Counter(
      static_cast<double>(steps) * 1e-6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["fills"] = static_cast<double>(fills);
  state.counters["cached"] = static_cast<double>(cached);
  // Classes and step masks, as charged to the memory budget.
  state.counters["cached_MB"] = static_cast<double>(cached_bytes) / 1e6;
  state.counters["failed"] = static_cast<double>(failed);
}
BENCHMARK(BM_Batch64ArrayOfObjects)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
}  // namespace grammar
}  // namespace tessera

BENCHMARK_MAIN();
