// Logits processing on the device: log-probabilities (argmax, log-sum-exp,
// top-n) and token sampling with the semantics of kernels/cpu/cpu_sampling.h,
// which draws the same tokens on the host (that header says why exactly).
// Raw launchers with plain C++ types (device pointers, f32 logits), like
// elementwise_kernels.h; one thread block per row for sampling, a row's
// chunks spread over blocks for logprobs. CudaOps::DoSample runs
// them behind Ops::Sample.
#ifndef TESSERA_KERNELS_CUDA_SAMPLING_SAMPLING_KERNELS_H_
#define TESSERA_KERNELS_CUDA_SAMPLING_SAMPLING_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/philox.h"
#include "kernels/sampling_math.h"

namespace tessera {
namespace cuda {

// The most alternatives LaunchLogprobs reports per row (so the most that
// CudaOps::Sample takes).
constexpr int32_t kMaxTopLogprobs = 20;

// Per row of logits [rows, vocab]:
//  - argmax[r]: index of the largest logit, the lowest id on ties; NaN never
//    wins (0 when no logit is above -inf), exactly as runtime/sampler ArgMax.
//  - log_z[r]: log(sum(exp(logits))) = max + log(sum(exp(l - max))), the sum
//    accumulated in double (over chunks of the row, then across them); NaN
//    logits are ignored.
//  - chosen[r] = logits[r, tokens[r]] (NaN for a token outside the
//    vocabulary): the sampled token's own logit, with no trip to the host.
//  - top_ids[r, j] and top_logprobs[r, j] = logits[id] - log_z[r] for the
//    top_n (0..kMaxTopLogprobs) largest logits, best first, ties by lower id
//    (NaN ranks below -inf). When top_n > vocab the entries past vocab get id
//    -1 and -inf.
// Any output may be null to skip it (top_ids / top_logprobs must both be given
// when top_n > 0; tokens and chosen both or neither). Each row is spread over
// ceil(vocab / 4096) blocks, whose partial results go to `workspace` (at
// least LogprobsWorkspaceBytes(rows, vocab, top_n) bytes, 8-byte aligned).
size_t LogprobsWorkspaceBytes(int64_t rows, int64_t vocab, int32_t top_n);
cudaError_t LaunchLogprobs(const float* logits, int64_t rows, int64_t vocab,
                           int32_t top_n, const int32_t* tokens, float* chosen,
                           int32_t* argmax, float* log_z, int32_t* top_ids,
                           float* top_logprobs, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream);

// One row's sampling parameters as the kernel reads them: the device-side
// image of a validated SamplingParams (runtime/sampler/sampling_params.h has
// the meaning and ranges), filled in one place, CudaOps::DoSample.
struct DeviceSamplingParams {
  float temperature = 1.0f;  // 0 = greedy.
  int32_t top_k = 0;         // 0 = off.
  float top_p = 1.0f;        // In (0, 1]; 1 = off.
  float min_p = 0.0f;        // In [0, 1]; 0 = off.
  float log_min_p = 0.0f;    // sampling::MinPLog(min_p), from the host.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  // Which draw of the sequence this is (e.g. the number of tokens generated so
  // far). The uniform is a pure function of (seed, step): see PhiloxUniform.
  uint64_t step = 0;
  // The row's masked ids: masked_ids[masked_begin, masked_end), ascending,
  // distinct, in [0, vocab). Their logits count as -inf (min_tokens).
  int32_t masked_begin = 0;
  int32_t masked_end = 0;
  // Non-zero: the row's allowed-token bitmask is allowed_bits[row] (see
  // LaunchSample); ids it leaves out count as -inf, as the masked ones.
  int32_t constrained = 0;
};

// Samples one token per row of logits [rows, vocab] into out_tokens[rows],
// following CpuSampleToken (kernels/cpu/cpu_sampling.h):
//  1. Penalties: repetition_penalty divides positive / multiplies negative
//     logits of every token seen in the prompt (prompt_mask[r, id] != 0) or
//     the output (token_counts[r, id] > 0), once per token; then every output
//     token loses frequency_penalty * count + presence_penalty. token_counts
//     and prompt_mask are device [rows, vocab] arrays and may be null (no
//     output tokens / no prompt tokens); the arithmetic is
//     sampling::PenalizeLogit, without fused multiply-adds, so penalized logits
//     are bit-identical. Then the row's masked ids (masked_ids, see
//     DeviceSamplingParams; may be null when no row has any) become -inf, as
//     the CPU sampler's `masked`; so do the ids a constrained row's bitmask
//     leaves out (allowed_bits: device [rows, (vocab + 31) / 32] words, bit
//     id % 32 of word id / 32; may be null when no row is constrained).
//  2. temperature == 0: the argmax of the penalized logits (ArgMax's rules), so
//     greedy decoding equals the CPU exactly.
//  3. Otherwise logits / temperature; min-p drops tokens below
//     max + log(min_p); top-k keeps the k best (ties by lower id); top-p keeps
//     the smallest best-first prefix whose probability mass reaches top_p (the
//     crossing token stays); then one token is drawn from the softmax of the
//     survivors. NaN (and -inf) logits are never drawn; a row whose logits are
//     all NaN / -inf (or whose maximum is +inf) yields its argmax.
// Randomness: one uniform per row, PhiloxUniform(seed, step)
// (kernels/philox.h); the row index does not enter, so the draw does not depend
// on where the sequence sits in the batch. The draw walks the survivors in id
// order, in sampling::kSampleThreads contiguous chunks (one per thread). The
// weights (sampling::SampleWeight), the top-p mass and the draw's sums (doubles
// in the block's fixed order) are what kernels/cpu/cpu_sampling.cc replays, so
// the CPU sampler picks the same token. params: device array of rows entries.
// scratch: device [rows, vocab] f32 (holds the tempered logits). top-k and
// top-p search a threshold by bisection over the float ordering, O(vocab * 32)
// work per row for each.
cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab,
                         const DeviceSamplingParams* params,
                         const int32_t* token_counts,
                         const uint8_t* prompt_mask, const int32_t* masked_ids,
                         const uint32_t* allowed_bits, float* scratch,
                         int32_t* out_tokens, cudaStream_t stream);

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_SAMPLING_SAMPLING_KERNELS_H_
