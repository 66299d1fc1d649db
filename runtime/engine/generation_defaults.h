// Sampling defaults a model folder ships in generation_config.json, applied
// to every request that leaves the field unset (vLLM's
// `--generation-config auto`, its default).
//
// The fields are vLLM's: temperature, top_p, top_k, min_p,
// repetition_penalty, and max_new_tokens (the default max_tokens). Everything
// else in the file (do_sample, num_beams, ...) is ignored for sampling, as
// vLLM ignores it; eos_token_id is merged into the model config elsewhere
// (runtime/model/config.h). A request's own value always wins.
//
//   --generation-config auto   (default) the model folder's file, if any
//   --generation-config vllm   none: the API's own defaults (also "none")
//   --generation-config DIR    DIR/generation_config.json
#ifndef TESSERA_RUNTIME_ENGINE_GENERATION_DEFAULTS_H_
#define TESSERA_RUNTIME_ENGINE_GENERATION_DEFAULTS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;  // 0 = off (-1 in the file is normalised).
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<int64_t> max_tokens;  // max_new_tokens.

  bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty &&
           !max_tokens;
  }
  // "temperature=0.6, top_p=0.95, top_k=20" (or "none"), for the startup log.
  std::string Describe() const;
};

// Parses generation_config.json text. InvalidArgument naming the key for
// malformed JSON, a wrong type, or a value out of the range the API accepts
// (temperature >= 0, top_p in (0, 1], top_k >= -1, min_p in [0, 1],
// repetition_penalty > 0, max_new_tokens >= 1).
absl::StatusOr<GenerationDefaults> ParseGenerationDefaults(
    absl::string_view json_text);

// The defaults `mode` (the flag above) selects for `model_dir`. "auto" with
// no file is empty; a DIR without the file is NotFound; anything that is
// neither a mode nor a folder is InvalidArgument.
absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(
    const std::string& model_dir, absl::string_view mode);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_ENGINE_GENERATION_DEFAULTS_H_
