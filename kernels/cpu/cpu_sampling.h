// The CPU sampler: one row of Ops::Sample on the host, drawing the same token
// as the CUDA sampler (kernels/cuda/sampling/sampling_kernels.h) from the same
// logits, SamplingParams and (seed, step).
//
// Order, as Hugging Face's generate() and vLLM apply them:
//  1. Penalties on the row's logits: repetition_penalty divides positive /
//     multiplies negative logits of every token in the prompt or the output
//     (once per token), then every output token loses frequency_penalty *
//     count + presence_penalty. Then the row's masked ids become -inf
//     (min_tokens; ids outside the vocabulary are ignored), and so do the
//     ids its allowed-token bitmask leaves out (structured output).
//  2. temperature == 0: the argmax of the penalized logits (ArgMax's rules).
//  3. Otherwise t = logit / temperature; min-p keeps t >= max + log(min_p);
//     top-k keeps the k best survivors (ties by lower id); top-p keeps the
//     shortest best-first prefix of the survivors whose probability mass
//     reaches top_p (the crossing token stays); NaN and -inf are never kept. A
//     row with nothing finite to keep (or whose maximum is +inf) yields its
//     argmax.
//  4. The draw: the uniform u = PhiloxUniform(seed, step) (kernels/philox.h);
//     the survivors, in id order, in kSampleThreads contiguous chunks, are
//     walked against u * total, total the sum of their weights exp(t - max).
//
// Exactness (why the backends agree token for token): the penalized and
// tempered logits are single IEEE operations on both; the weights come from
// the shared SampleExp, not a libm; log(min_p) is one host libm call handed
// to both (sampling_math.h); the top-p mass and the draw's sums are doubles
// added in the CUDA block's order (lanes strided by id, its warp shuffles
// and its chunked prefix), which this file replays; top-k counts and the
// greedy argmax are exact. So for the same inputs both backends keep the same
// set and pick the same token, with no tolerance, greedy or not. The one
// caveat: both samplers must run in one process (or with the same libm), as
// min-p's log(min_p) is the host's.
// Log-probabilities are under the unmodified logits (OpenAI's and vLLM's raw
// logprobs) and agree with the device's within f32 rounding (log-sum-exp in
// double, summed in another order).
#ifndef TESSERA_KERNELS_CPU_CPU_SAMPLING_H_
#define TESSERA_KERNELS_CPU_CPU_SAMPLING_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "kernels/ops.h"

namespace tessera {

// Index of the largest value; the first one on ties. NaN never wins; 0 when
// nothing is above -inf.
int32_t ArgMax(absl::Span<const float> values);

// Working buffers of the CPU sampler, reused between rows and steps (they
// grow to the vocabulary once).
struct CpuSampleScratch {
  std::vector<float> logits;  // Penalized.
  std::vector<int32_t> counts;
  std::vector<uint8_t> in_prompt;
  std::vector<std::pair<float, int32_t>> candidates;  // (t, id).
  std::vector<std::pair<int32_t, float>> by_id;       // (id, weight).
  std::vector<int32_t> rank;                          // By id.
  std::vector<std::pair<float, int32_t>> top;
};

// The token drawn for `row` (validated params, as Ops::Sample checks them)
// from `logits` [V].
int32_t CpuSampleToken(absl::Span<const float> logits, const SampleRow& row,
                       CpuSampleScratch* scratch);

// Fills out->logprob (of out->token) and out->top (min(top_n, V) entries)
// under the unmodified `logits` [V].
void CpuLogprobs(absl::Span<const float> logits, int32_t top_n,
                 CpuSampleScratch* scratch, SampleResult* out);

}  // namespace tessera

#endif  // TESSERA_KERNELS_CPU_CPU_SAMPLING_H_
