// A Qwen3-shaped checkpoint for tests, written at test time: the real Qwen
// vocabulary shape (151,936 embedding rows, as Qwen2/2.5/3 checkpoints pad
// it, against the tokenizer's 151,669 ids), tiny otherwise (hidden 16, one
// layer), with the real Qwen3 tokenizer files beside it.
#ifndef TESSERA_TESTS_TESTING_TINY_QWEN_H_
#define TESSERA_TESTS_TESTING_TINY_QWEN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tessera {

inline constexpr int64_t kQwenVocab = 151936;
inline constexpr int32_t kQwenTokenizerVocab = 151669;

struct TinyQwenOptions {
  // The head's gap rows (ids kQwenTokenizerVocab..kQwenVocab-1) are
  // +/-40 e_0, so whatever the sign of the final hidden state's first
  // element, half of the gap ids get logits far above every real id's: greedy
  // and sampled tokens land in the gap. Otherwise every weight is random, and
  // the tokens are random real ones (many of them non-ASCII text).
  bool gap_wins = true;
  int64_t max_position_embeddings = 64;
};

// Writes config.json, model.safetensors (f32, deterministic weights) and the
// tokenizer files of `tokenizer_dir` (tokenizer.json, tokenizer_config.json)
// into `dir`, which must exist.
absl::Status WriteTinyQwen(const std::string& dir,
                           const std::string& tokenizer_dir,
                           const TinyQwenOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_TESTS_TESTING_TINY_QWEN_H_
