// Logits processing on the device: log-probabilities (argmax, log-sum-exp,
// top-n) and token sampling with the semantics of runtime/sampler/sampler.cc.
// Raw launchers with plain C++ types (device pointers, f32 logits), like
// elementwise_kernels.h; one thread block per row.
#ifndef TESSERA_KERNELS_CUDA_SAMPLING_KERNELS_H_
#define TESSERA_KERNELS_CUDA_SAMPLING_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace cuda {

// The most alternatives LaunchLogprobs reports per row.
constexpr int32_t kMaxTopLogprobs = 20;

// Per row of logits [rows, vocab]:
//  - argmax[r]: index of the largest logit, the lowest id on ties; NaN never
//    wins (0 when no logit is above -inf), exactly as runtime/sampler ArgMax.
//  - log_z[r]: log(sum(exp(logits))) = max + log(sum(exp(l - max))), the sum
//    accumulated in double; NaN logits are ignored.
//  - top_ids[r, j] and top_logprobs[r, j] = logits[id] - log_z[r] for the
//    top_n (0..kMaxTopLogprobs) largest logits, best first, ties by lower id
//    (NaN ranks below -inf). When top_n > vocab the entries past vocab get id
//    -1 and -inf.
// Any output may be null to skip it (top_ids / top_logprobs must both be given
// when top_n > 0).
cudaError_t LaunchLogprobs(const float* logits, int64_t rows, int64_t vocab,
                           int32_t top_n, int32_t* argmax, float* log_z,
                           int32_t* top_ids, float* top_logprobs,
                           cudaStream_t stream);

// One row's sampling parameters (the same meaning and ranges as
// SamplingParams; validate on the host first).
struct DeviceSamplingParams {
  float temperature = 1.0f;  // 0 = greedy.
  int32_t top_k = 0;         // 0 = off.
  float top_p = 1.0f;        // In (0, 1]; 1 = off.
  float min_p = 0.0f;        // In [0, 1]; 0 = off.
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
};

// Samples one token per row of logits [rows, vocab] into out_tokens[rows],
// following Sampler::Sample:
//  1. Penalties: repetition_penalty divides positive / multiplies negative
//     logits of every token seen in the prompt (prompt_mask[r, id] != 0) or
//     the output (token_counts[r, id] > 0), once per token; then every output
//     token loses frequency_penalty * count + presence_penalty. token_counts
//     and prompt_mask are device [rows, vocab] arrays and may be null (no
//     output tokens / no prompt tokens); the arithmetic is the CPU's, without
//     fused multiply-adds, so penalized logits are bit-identical. Then the
//     row's masked ids (masked_ids, see DeviceSamplingParams; may be null when
//     no row has any) become -inf, as the CPU Sampler's `masked`.
//  2. temperature == 0: the argmax of the penalized logits (ArgMax's rules), so
//     greedy decoding equals the CPU exactly.
//  3. Otherwise logits / temperature; min-p drops tokens below
//     max + log(min_p); top-k keeps the k best (ties by lower id); top-p keeps
//     the smallest best-first prefix whose probability mass reaches top_p (the
//     crossing token stays); then one token is drawn from the softmax of the
//     survivors. NaN (and -inf) logits are never drawn; a row whose logits are
//     all NaN / -inf (or whose maximum is +inf) yields its argmax.
// Randomness: one uniform per row from Philox4x32-10 (PhiloxUniform(seed,
// step)); the row index does not enter, so the draw does not depend on where
// the sequence sits in the batch, and rows with equal (seed, step) and equal
// logits pick the same token. The draw walks the survivors in id order. These
// are not the CPU Sampler's mt19937_64 draws: only the distribution matches.
// params: device array of rows entries. scratch: device [rows, vocab] f32
// (holds the tempered logits). top-k and top-p search a threshold by bisection
// over the float ordering, O(vocab * 32) work per row for each.
cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab,
                         const DeviceSamplingParams* params,
                         const int32_t* token_counts,
                         const uint8_t* prompt_mask, const int32_t* masked_ids,
                         float* scratch, int32_t* out_tokens,
                         cudaStream_t stream);

// Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32 with 10
// rounds): encrypts `counter` with `key`. Plain C++ so that host and device
// (through the .cu) compute the same bits.
struct Philox4x32 {
  uint32_t v[4];
};
#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif
TESSERA_HOST_DEVICE inline Philox4x32 Philox4x32_10(Philox4x32 counter,
                                                    uint32_t key0,
                                                    uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t* c = counter.v;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ key0;
    const uint32_t n2 = hi0 ^ c[3] ^ key1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
  return counter;
}

// The uniform in [0, 1) that LaunchSample draws for (seed, step): counter =
// (step low, step high, 0, 0), key = (seed low, seed high); 53 bits from the
// first two output words.
TESSERA_HOST_DEVICE inline double PhiloxUniform(uint64_t seed, uint64_t step) {
  Philox4x32 counter = {
      {static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), 0u, 0u}};
  const Philox4x32 out = Philox4x32_10(counter, static_cast<uint32_t>(seed),
                                       static_cast<uint32_t>(seed >> 32));
  const uint64_t a = out.v[0] >> 5;  // 27 bits
  const uint64_t b = out.v[1] >> 6;  // 26 bits
  return static_cast<double>((a << 26) | b) * (1.0 / 9007199254740992.0);
}
#undef TESSERA_HOST_DEVICE

}  // namespace cuda
}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_SAMPLING_KERNELS_H_
