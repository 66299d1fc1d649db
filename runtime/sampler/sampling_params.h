// SamplingParams: how one request's next tokens are drawn, the one struct
// every layer passes (request, plan, sampling rank, and the op set's
// Ops::Sample rows), with its range checks. A leaf (abseil only), so that the
// kernels can take it; its wire form is in sampling_params_proto.h.
#ifndef TESSERA_RUNTIME_SAMPLER_SAMPLING_PARAMS_H_
#define TESSERA_RUNTIME_SAMPLER_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace tessera {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy; must be >= 0.
  int32_t top_k = 0;  // 0 = off; otherwise keep the k most likely tokens.
  float top_p =
      1.0f;  // In (0, 1]; keep the smallest set whose mass reaches top_p.
  std::optional<uint64_t> seed;  // Unset: seeded from std::random_device.
  // In [0, 1]: drop tokens whose probability is below min_p times the most
  // likely token's (after temperature). 0 = off.
  float min_p = 0.0f;
  // > 0; 1 = off. Tokens already in the prompt or the output have positive
  // logits divided by it and negative ones multiplied (as transformers and
  // vLLM do).
  float repetition_penalty = 1.0f;
  // In [-2, 2] (OpenAI): subtracted once from every token that appears in the
  // output so far (presence), or once per appearance (frequency).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;

  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f ||
           frequency_penalty != 0.0f;
  }

  // InvalidArgument naming the field when a value is out of range.
  absl::Status Validate() const;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SAMPLER_SAMPLING_PARAMS_H_
