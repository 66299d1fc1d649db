// Token sampling from next-token logits: greedy, temperature, top-k, top-p,
// seeded.
//
// The processing order follows Hugging Face's generate(): temperature, then
// top-k, then top-p over the tempered distribution, then a draw. temperature ==
// 0 means greedy (argmax; the lowest id wins a tie, as torch.argmax does).
// NaN and -inf logits are never drawn; a row with nothing else yields its
// argmax (as the device sampler does), never an error that would end the job. A
// Sampler owns its random engine, so two samplers made with the same seed draw
// the same tokens from the same logits.
#ifndef TESSERA_RUNTIME_SAMPLER_SAMPLER_H_
#define TESSERA_RUNTIME_SAMPLER_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token from `logits` [vocab]. Penalties look at `prompt`
  // (repetition only) and `output` (the tokens generated so far). `masked`
  // ids get the logit -inf after the penalties, so they are never picked
  // while any other token can be (min_tokens: transformers'
  // MinNewTokensLengthLogitsProcessor); ids outside the vocabulary are
  // ignored.
  absl::StatusOr<int32_t> Sample(absl::Span<const float> logits,
                                 absl::Span<const int32_t> prompt,
                                 absl::Span<const int32_t> output,
                                 absl::Span<const int32_t> masked = {});
  absl::StatusOr<int32_t> Sample(absl::Span<const float> logits) {
    return Sample(logits, {}, {});
  }

 private:
  // Working buffers (vocabulary-sized), shared by every sampler of a thread so
  // that a batch of many sequences does not hold one set each; reused between
  // calls, so nothing is allocated per token once they have grown.
  struct Scratch {
    std::vector<std::pair<float, int32_t>> candidates;
    std::vector<float> penalized;  // Logits after penalties.
    std::vector<bool> seen;
    std::vector<int32_t> counts;
  };
  static Scratch& ThreadScratch();

  SamplingParams params_;
  std::mt19937_64 rng_;
};

// Index of the largest value; the first one on ties. NaN never wins.
int32_t ArgMax(absl::Span<const float> values);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SAMPLER_SAMPLER_H_
