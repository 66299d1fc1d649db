// Encode throughput of a Hugging Face tokenizer.json tokenizer, one thread:
//
//   TESSERA_TOKENIZER_DIR=/dir/with/tokenizer.json
//   TESSERA_CORPUS=/path/to/text.txt   (optional)
//   bazel run -c opt //runtime/text:tokenizer_benchmark
//
// Reports bytes/s of UTF-8 input (SetBytesProcessed) and tokens/s. Without
// TESSERA_CORPUS the input is a built-in mixed-language paragraph (prose,
// code, CJK, Arabic, Cyrillic, emoji) repeated to about 1 MB. Also prints the
// load time and the speed of a first pass with an empty word cache.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "runtime/text/hf_tokenizer.h"

namespace tessera {
namespace {

constexpr char kParagraph[] =
    "Tokenizers turn text into numbers, and a fast one keeps the GPU fed. "
    "\xE5\xA4\xA7\xE5\x9E\x8B\xE8\xAF\xAD\xE8\xA8\x80\xE6\xA8\xA1\xE5\x9E\x8B"
    "\xE9\x9C\x80\xE8\xA6\x81\xE9\xAB\x98\xE6\x95\x88\xE7\x9A\x84\xE5\x88\x86"
    "\xE8\xAF\x8D\xE5\x99\xA8\xE3\x80\x82 "
    "Les mod\xC3\xA8les de langue sont partout ; \xC3\xA7"
    "a va tr\xC3\xA8s vite ! "
    "\xD0\x93\xD0\xBE\xD0\xB2\xD0\xBE\xD1\x80\xD1\x8F\xD1\x82, \xD1\x87\xD1\x82"
    "\xD0\xBE 2024-05-17 \xE2\x80\x94 \xD1\x85\xD0\xBE\xD1\x80\xD0\xBE\xD1\x88"
    "\xD0\xB8\xD0\xB9 \xD0\xB4\xD0\xB5\xD0\xBD\xD1\x8C. "
    "def main():\n    print(\"hello, world\")  # \xF0\x9F\x98\x80\n\treturn 0\n"
    "\xD8\xA7\xD9\x84\xD9\x84\xD8\xBA\xD8\xA9 \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1"
    "\xD8\xA8\xD9\x8A\xD8\xA9 \xD8\xAC\xD9\x85\xD9\x8A\xD9\x84\xD8\xA9. "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x82\x82\xE5\xA4\xA7\xE4\xB8\x88"
    "\xE5\xA4\xAB\xE3\x81\xA7\xE3\x81\x99\xE3\x81\x8B\xEF\xBC\x9F "
    "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4\xEB\x8F\x84 \xEC\x9E\x98 "
    "\xEB\x90\xA9\xEB\x8B\x88\xEB\x8B\xA4. "
    "The quick brown fox jumps over the lazy dog; numbers like 3.14159, "
    "1,000,000 and 42% appear too.\r\n\r\n";

bool ReadFile(const std::string& path, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) {
    out->append(buffer, n);
  }
  std::fclose(f);
  return true;
}

void BM_Encode(benchmark::State& state, const Tokenizer* tok,
               const std::string* text) {
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->Encode(*text);
    if (!ids.ok()) {
      state.SkipWithError(std::string(ids.status().message()).c_str());
      return;
    }
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text->size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens),
                         benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const char* dir = std::getenv("TESSERA_TOKENIZER_DIR");
  if (dir == nullptr || *dir == '\0') {
    std::printf(
        "tokenizer_benchmark: TESSERA_TOKENIZER_DIR is not set (a folder with "
        "tokenizer.json); skipping.\n");
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  auto tok = tessera::LoadHfTokenizer(dir);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_benchmark: %s\n",
                 std::string(tok.status().message()).c_str());
    return 1;
  }
  std::printf("loaded %s in %.3f s\n", dir, load_s);

  std::string text;
  const char* corpus = std::getenv("TESSERA_CORPUS");
  if (corpus != nullptr && *corpus != '\0') {
    if (!tessera::ReadFile(corpus, &text)) {
      std::fprintf(stderr, "tokenizer_benchmark: cannot read %s\n", corpus);
      return 1;
    }
  } else {
    while (text.size() < (1 << 20)) text += tessera::kParagraph;
  }
  {
    // The first pass runs with an empty word cache: the worst case for text
    // that repeats no words.
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = (*tok)->Encode(text);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!ids.ok()) {
      std::fprintf(stderr, "tokenizer_benchmark: %s\n",
                   std::string(ids.status().message()).c_str());
      return 1;
    }
    std::printf(
        "first encode (cold word cache): %zu bytes, %zu tokens, %.1f MB/s\n",
        text.size(), ids->size(), text.size() / s / 1e6);
  }
  const std::string name = absl::StrCat(
      "Encode/",
      corpus != nullptr && *corpus != '\0' ? "corpus" : "builtin_mixed");
  benchmark::RegisterBenchmark(name.c_str(), tessera::BM_Encode, tok->get(),
                               &text)
      ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
