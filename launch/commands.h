// The `tessera` subcommands as functions of plain options, so tests can call
// them directly.
#ifndef TESSERA_LAUNCH_COMMANDS_H_
#define TESSERA_LAUNCH_COMMANDS_H_

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "runtime/engine/generator.h"
#include "runtime/sampler/sampler.h"

namespace tessera {

struct GenerateOptions {
  std::string model_dir;
  // Exactly one of the three prompt sources must be set.
  std::string prompt;      // Text.
  std::string prompt_ids;  // "1,2,3": used as given (no BOS).
  std::string
      prompts_file;  // JSON lines: {"prompt": ...} or {"prompt_ids": [...]}.
  int64_t max_tokens = 256;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::string stop_token_ids;  // "7,42": more ids that end a sequence like EOS.
  std::string output = "text";  // "text" or "json".
  // Wrap each text prompt as one user message and render it with the model's
  // chat template (tokenizer_config.json), with the generation prompt; the
  // template places any BOS itself. Prompts-file lines with "messages" are
  // always rendered this way.
  bool chat = false;
  // When set, a JSON file of memory statistics is written here at the end:
  // {"allocator": {"underlying_allocations", "underlying_allocations_decode",
  // "reserved_bytes",
  //  "peak_in_use_bytes", "pinned_bytes", ...}}, where
  //  underlying_allocations_decode counts the
  // source allocations made after each prompt's first decode step (summed over
  // prompts).
  std::string stats_json;
};

// Loads the model once and generates for every prompt, writing to `out`: in
// text mode the prompt followed by its continuation; in json mode one object
// per prompt:
// {"prompt_ids": [...], "output_ids": [...], "text": "...", "finish_reason":
// "length"|"stop"}
// ("text" is the continuation; null when the folder has no tokenizer).
// `generator` runs the requests (a parallel job on rank 0); null loads the
// model into this process.
absl::Status RunGenerate(const GenerateOptions& options,
                         TokenGenerator* generator, std::ostream& out);

struct BenchOptions {
  std::string model_dir;
  int64_t batch_size = 1;
  int64_t input_len = 128;
  int64_t output_len = 128;
  int64_t iterations = 5;
  bool json = false;
};

// Times prefill and decode on random prompt ids (greedy, EOS ignored) and
// reports the median over `iterations` runs after one warm-up.
absl::Status RunBench(const BenchOptions& options, std::ostream& out);

struct TokenizeOptions {
  std::string
      model_dir;  // A model folder, or a folder with only tokenizer files.
  bool decode = false;               // ids -> text instead of text -> ids.
  bool skip_special_tokens = false;  // --decode: drop special tokens' text.
};

// JSON lines on `in`: {"text": "..."} -> {"ids": [...]} (no special tokens
// added), or with decode {"ids": [...]} -> {"text": "..."}. One output line per
// input line, flushed as it is written. The first malformed line stops with an
// error naming its line number.
absl::Status RunTokenize(const TokenizeOptions& options, std::istream& in,
                         std::ostream& out);

}  // namespace tessera

#endif  // TESSERA_LAUNCH_COMMANDS_H_
