#include <cfloat>
#include <climits>

#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/common/reduce.cuh"
#include "kernels/cuda/sampling/sampling_kernels.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"

namespace tessera {
namespace cuda {
namespace {

constexpr int kLogprobThreads = 256;
constexpr int kSampleThreads = sampling::kSampleThreads;
static_assert(kLogprobThreads % 32 == 0 && kSampleThreads % 32 == 0,
              "blocks must be whole warps");

// A (value, id) candidate. id == INT_MAX is "none" in argmax reductions; id <
// 0 is "empty" in top-n lists.
struct ValId {
  float v;
  int32_t id;
};

// ArgMax's order: larger value, then lower id. NaN never enters (it fails
// every comparison, so it is never stored).
struct ArgBetter {
  __device__ __forceinline__ bool operator()(ValId a, ValId b) const {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
  }
};

// Top-n order, a strict total order over distinct ids: empty entries last,
// then NaN (by id), then larger value, ties by lower id.
struct TopBetter {
  __device__ __forceinline__ bool operator()(ValId a, ValId b) const {
    if (b.id < 0) return a.id >= 0;
    if (a.id < 0) return false;
    const bool a_nan = isnan(a.v), b_nan = isnan(b.v);
    if (a_nan || b_nan) return a_nan != b_nan ? b_nan : a.id < b.id;
    return a.v > b.v || (a.v == b.v && a.id < b.id);
  }
};

// The best candidate of the block under `better` (a strict order on the
// candidates present); every thread gets it. `shared` holds 33 entries.
template <typename Better>
__device__ ValId BlockBest(ValId x, ValId* shared, Better better) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    ValId y;
    y.v = __shfl_xor_sync(kFullMask, x.v, offset);
    y.id = __shfl_xor_sync(kFullMask, x.id, offset);
    if (better(y, x)) x = y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  __syncthreads();  // The previous use of `shared` is finished.
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  if (warp == 0) {
    ValId w = lane < warps ? shared[lane] : shared[0];
    for (int offset = 16; offset > 0; offset >>= 1) {
      ValId y;
      y.v = __shfl_xor_sync(kFullMask, w.v, offset);
      y.id = __shfl_xor_sync(kFullMask, w.id, offset);
      if (better(y, w)) w = y;
    }
    if (lane == 0) shared[32] = w;
  }
  __syncthreads();
  return shared[32];
}

// BlockSum and BlockMax (common/reduce.cuh) take `shared` arrays of 33.

// ---------------------------------------------------------------------------
// Logprobs.

// Inserts (v, id) into a best-first list of at most n entries. Ids arrive in
// increasing order per thread.
__device__ __forceinline__ void TopInsert(ValId* list, int n, int* count,
                                          ValId c) {
  if (*count < n) {
    ++*count;
  } else if (!TopBetter()(c, list[n - 1])) {
    return;
  }
  int j = *count - 1;
  while (j > 0 && TopBetter()(c, list[j - 1])) {
    list[j] = list[j - 1];
    --j;
  }
  list[j] = c;
}

// Logprobs run in two kernels so that a row of a large vocabulary (150k
// logits) is spread over the GPU rather than read by one block: each block
// of LogprobsChunkKernel takes kLogprobChunk logits of a row and writes their
// maximum, argmax, sum of exp(l - chunk max) (in double) and top-n list;
// LogprobsCombineKernel merges a row's chunks. The argmax and the top-n are
// those of the whole row (their orders are total); the log-sum-exp differs
// from a single pass only in the order of its double-precision sum.
constexpr int64_t kLogprobChunk = 4096;

struct ChunkStats {
  float max;  // -inf when the chunk has no logit above -inf (NaN ignored).
  ValId best;
  double sum;  // Σ exp(l - max) over the chunk's non-NaN logits (finite max).
};

int64_t LogprobChunks(int64_t vocab) {
  return (vocab + kLogprobChunk - 1) / kLogprobChunk;
}

// grid (chunks, rows).
__global__ void __launch_bounds__(kLogprobThreads)
    LogprobsChunkKernel(const float* __restrict__ logits, int64_t vocab,
                        int32_t top_n, ChunkStats* __restrict__ stats,
                        ValId* __restrict__ tops) {
  __shared__ ValId shared_best[33];
  __shared__ float shared_max[33];
  __shared__ double shared_sum[33];
  const int64_t row = blockIdx.y, chunk = blockIdx.x, chunks = gridDim.x;
  const int64_t begin = chunk * kLogprobChunk;
  const int64_t end =
      begin + kLogprobChunk < vocab ? begin + kLogprobChunk : vocab;
  const float* l = logits + row * vocab;

  // Pass 1: maximum, argmax and each thread's own top-n list.
  ValId list[kMaxTopLogprobs];
  int count = 0;
  ValId best = {-INFINITY, INT_MAX};
  float max = -INFINITY;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = l[i];
    const ValId c = {v, static_cast<int32_t>(i)};
    if (v > best.v) best = c;
    max = fmaxf(max, v);
    if (top_n > 0) TopInsert(list, top_n, &count, c);
  }
  best = BlockBest(best, shared_best, ArgBetter());
  max = BlockMax(max, shared_max);

  // Pass 2 (the chunk is in L1/L2 now): the sum of exp(l - max).
  double sum = 0.0;
  if (max > -INFINITY && max < INFINITY) {  // Uniform over the block.
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = l[i];
      if (!isnan(v)) sum += exp(static_cast<double>(v) - max);
    }
    sum = BlockSum(sum, shared_sum);
  }
  const int64_t at = row * chunks + chunk;
  if (threadIdx.x == 0) stats[at] = ChunkStats{max, best, sum};

  // The chunk's top-n: top_n rounds, each taking the best head.
  int head = 0;
  for (int j = 0; j < top_n; ++j) {
    const ValId mine = head < count ? list[head] : ValId{0.0f, -1};
    const ValId win = BlockBest(mine, shared_best, TopBetter());
    if (win.id >= 0 && mine.id == win.id) ++head;
    if (threadIdx.x == 0) tops[at * top_n + j] = win;
  }
}

// One block per row.
__global__ void __launch_bounds__(kLogprobThreads)
    LogprobsCombineKernel(const float* __restrict__ logits, int64_t vocab,
                          int32_t top_n, int64_t chunks,
                          const ChunkStats* __restrict__ stats,
                          const ValId* __restrict__ tops,
                          const int32_t* __restrict__ tokens, float* chosen,
                          int32_t* argmax, float* log_z, int32_t* top_ids,
                          float* top_logprobs) {
  __shared__ ValId shared_best[33];
  __shared__ float shared_max[33];
  __shared__ double shared_sum[33];
  const int64_t row = blockIdx.x;
  const ChunkStats* st = stats + row * chunks;

  ValId best = {-INFINITY, INT_MAX};
  float max = -INFINITY;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    max = fmaxf(max, st[c].max);
    if (ArgBetter()(st[c].best, best)) best = st[c].best;
  }
  best = BlockBest(best, shared_best, ArgBetter());
  max = BlockMax(max, shared_max);
  float z;
  if (max == -INFINITY || max == INFINITY) {
    z = max;
  } else {
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      if (st[c].max > -INFINITY) {
        sum += st[c].sum * exp(static_cast<double>(st[c].max) - max);
      }
    }
    sum = BlockSum(sum, shared_sum);
    z = max + static_cast<float>(log(sum));
  }
  if (threadIdx.x == 0) {
    if (argmax != nullptr) argmax[row] = best.id == INT_MAX ? 0 : best.id;
    if (log_z != nullptr) log_z[row] = z;
    if (chosen != nullptr) {
      const int32_t t = tokens[row];
      chosen[row] = t >= 0 && t < vocab ? logits[row * vocab + t] : NAN;
    }
  }
  if (top_n == 0) return;

  // Each thread's list of the best of its chunks' lists, then top_n rounds.
  ValId list[kMaxTopLogprobs];
  int count = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const ValId* t = tops + (row * chunks + c) * top_n;
    for (int j = 0; j < top_n && t[j].id >= 0; ++j)
      TopInsert(list, top_n, &count, t[j]);
  }
  int head = 0;
  for (int j = 0; j < top_n; ++j) {
    const ValId mine = head < count ? list[head] : ValId{0.0f, -1};
    const ValId win = BlockBest(mine, shared_best, TopBetter());
    if (win.id >= 0 && mine.id == win.id) ++head;
    if (threadIdx.x == 0) {
      top_ids[row * top_n + j] = win.id;
      top_logprobs[row * top_n + j] = win.id >= 0 ? win.v - z : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------
// Sampling.

// Maps a float to an unsigned key with the same order (for non-NaN floats;
// -0 sorts below +0, so callers store +0 for both).
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  const uint32_t bits = __float_as_uint(f);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Keeps token i with key k iff k > key || (k == key && i < id_limit): the
// best-first prefix of the (value desc, id asc) order that ends at (key,
// id_limit). {0, INT_MAX} keeps everything.
struct Cutoff {
  uint32_t key;
  int32_t id_limit;
};
__device__ __forceinline__ bool Keeps(Cutoff c, uint32_t key, int64_t i) {
  return key > c.key || (key == c.key && i < c.id_limit);
}

// Whether id i is in the ascending list ids[begin, end) (binary search; the
// lists are a few EOS and stop ids).
__device__ __forceinline__ bool IsMasked(const int32_t* __restrict__ ids,
                                         int32_t begin, int32_t end,
                                         int64_t i) {
  int32_t lo = begin, hi = end;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < end && ids[lo] == i;
}

struct RowState {
  const float* t;  // Tempered logits; -inf for NaN (never kept).
  int64_t vocab;
  float max;  // Largest tempered logit, finite.
};

// Sum over the eligible tokens kept by a, b and c of 1 (mass == false) or
// exp(t - max) (mass == true).
__device__ double Metric(const RowState& s, Cutoff a, Cutoff b, Cutoff c,
                         bool mass, double* shared) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < s.vocab; i += blockDim.x) {
    const float t = s.t[i];
    if (!(t > -INFINITY)) continue;
    const uint32_t key = OrderedKey(t);
    if (Keeps(a, key, i) && Keeps(b, key, i) && Keeps(c, key, i)) {
      sum += mass ? static_cast<double>(sampling::SampleWeight(t, s.max)) : 1.0;
    }
  }
  return BlockSum(sum, shared);
}

// The shortest best-first prefix of the tokens kept by a and b whose metric
// reaches the target: count >= target, or mass / total >= target. Bisection
// on the float key, then (only when several tokens share the boundary value)
// on the id.
__device__ Cutoff FindCutoff(const RowState& s, Cutoff a, Cutoff b, bool mass,
                             double target, double total, double* shared) {
  auto reaches = [&](Cutoff c) {
    const double m = Metric(s, a, b, c, mass, shared);
    return mass ? m / total >= target : m >= target;
  };
  // Invariant: the prefix of keys >= lo reaches the target; the answer <= hi.
  uint32_t lo = 0, hi = OrderedKey(s.max);
  while (lo < hi) {
    const uint32_t mid =
        lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
    if (reaches({mid, INT_MAX})) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const Cutoff all_of_key = {lo, INT_MAX};
  const double ge = Metric(s, a, b, all_of_key, false, shared);
  const double gt = Metric(s, a, b, {lo, 0}, false, shared);
  if (ge - gt <= 1.0) return all_of_key;
  // Ties at the boundary value: take them by increasing id.
  int64_t id_lo = 0, id_hi = s.vocab;
  while (id_lo < id_hi) {
    const int64_t mid = (id_lo + id_hi) / 2;
    if (reaches({lo, static_cast<int32_t>(mid)})) {
      id_hi = mid;
    } else {
      id_lo = mid + 1;
    }
  }
  return {lo, static_cast<int32_t>(id_lo)};
}

__global__ void SampleKernel(const float* __restrict__ logits, int64_t vocab,
                             const DeviceSamplingParams* __restrict__ params,
                             const int32_t* __restrict__ token_counts,
                             const uint8_t* __restrict__ prompt_mask,
                             const int32_t* __restrict__ masked_ids,
                             const uint32_t* __restrict__ allowed_bits,
                             float* __restrict__ scratch,
                             int32_t* __restrict__ out_tokens) {
  __shared__ ValId shared_best[33];
  __shared__ float shared_max[33];
  __shared__ double shared_sum[33];
  __shared__ double prefix[kSampleThreads + 1];
  __shared__ int32_t picked;
  __shared__ int32_t last_kept;

  const int64_t row = blockIdx.x;
  const DeviceSamplingParams p = params[row];
  const float* l = logits + row * vocab;
  const int32_t* counts =
      token_counts != nullptr ? token_counts + row * vocab : nullptr;
  const uint8_t* mask =
      prompt_mask != nullptr ? prompt_mask + row * vocab : nullptr;
  float* t = scratch + row * vocab;
  const bool repetition = p.repetition_penalty != 1.0f;
  const bool additive =
      p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  const bool greedy = p.temperature == 0.0f;
  const bool masking = masked_ids != nullptr && p.masked_end > p.masked_begin;
  const uint32_t* allow = allowed_bits != nullptr && p.constrained != 0
                              ? allowed_bits + row * ((vocab + 31) / 32)
                              : nullptr;

  // Pass 1: penalties, the argmax of the penalized logits and (sampling) the
  // tempered logits and their maximum.
  ValId best = {-INFINITY, INT_MAX};
  float max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = l[i];
    if (repetition || additive) {
      v = sampling::PenalizeLogit(
          v, counts != nullptr ? counts[i] : 0, mask != nullptr && mask[i] != 0,
          p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
    }
    if (masking && IsMasked(masked_ids, p.masked_begin, p.masked_end, i)) {
      v = -INFINITY;
    }
    if (allow != nullptr && !((allow[i >> 5] >> (i & 31)) & 1u)) {
      v = -INFINITY;
    }
    if (v > best.v) best = {v, static_cast<int32_t>(i)};
    if (!greedy) {
      // NaN -> -inf; -0 -> +0 for the key order.
      const float tempered = sampling::TemperLogit(v, p.temperature);
      t[i] = tempered;
      max = fmaxf(max, tempered);
    }
  }
  best = BlockBest(best, shared_best, ArgBetter());
  const int32_t argmax = best.id == INT_MAX ? 0 : best.id;
  if (greedy) {
    if (threadIdx.x == 0) out_tokens[row] = argmax;
    return;
  }
  max = BlockMax(max, shared_max);
  if (!(max > -INFINITY && max < INFINITY)) {
    if (threadIdx.x == 0) out_tokens[row] = argmax;
    return;
  }
  const RowState s = {t, vocab, max};
  const Cutoff all = {0u, INT_MAX};

  // min-p: p >= min_p * p_max  <=>  t >= max + log(min_p).
  Cutoff min_p = all;
  if (p.min_p > 0.0f) {
    min_p = {OrderedKey(sampling::MinPFloor(max, p.log_min_p)), INT_MAX};
  }
  // top-k over the min-p survivors.
  Cutoff top_k = all;
  if (p.top_k > 0) {
    const double kept = Metric(s, min_p, all, all, false, shared_sum);
    if (static_cast<double>(p.top_k) < kept) {
      top_k = FindCutoff(s, min_p, all, false, static_cast<double>(p.top_k),
                         0.0, shared_sum);
    }
  }
  // top-p over the min-p and top-k survivors.
  Cutoff top_p = all;
  if (p.top_p < 1.0f) {
    const double total = Metric(s, min_p, top_k, all, true, shared_sum);
    // At least the best token stays, whatever top_p is.
    const double target = p.top_p > 0.0f ? static_cast<double>(p.top_p) : 0.0;
    if (target > 0.0) {
      top_p = FindCutoff(s, min_p, top_k, true, target, total, shared_sum);
    } else {
      top_p = FindCutoff(s, min_p, top_k, false, 1.0, 0.0, shared_sum);
    }
  }

  // Draw: each thread sums the weights of a contiguous chunk of ids, thread 0
  // scans the chunk sums, and the thread whose range holds r walks its chunk.
  const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = threadIdx.x * chunk;
  const int64_t end = begin + chunk < vocab ? begin + chunk : vocab;
  auto weight = [&](int64_t i) -> float {
    const float v = t[i];
    if (!(v > -INFINITY)) return 0.0f;
    const uint32_t key = OrderedKey(v);
    if (!Keeps(min_p, key, i) || !Keeps(top_k, key, i) ||
        !Keeps(top_p, key, i)) {
      return 0.0f;
    }
    return sampling::SampleWeight(v, max);
  };
  double sum = 0.0;
  int32_t my_last = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float w = weight(i);
    if (w > 0.0f) {
      sum += w;
      my_last = static_cast<int32_t>(i);
    }
  }
  if (threadIdx.x == 0) {
    picked = -1;
    last_kept = -1;
  }
  prefix[threadIdx.x + 1] = sum;
  __syncthreads();
  if (my_last >= 0) atomicMax(&last_kept, my_last);
  if (threadIdx.x == 0) {
    prefix[0] = 0.0;
    for (int j = 1; j <= static_cast<int>(blockDim.x); ++j)
      prefix[j] += prefix[j - 1];
  }
  __syncthreads();
  const double total = prefix[blockDim.x];
  // Rounded operations, never fused (nvcc would contract u * total - prefix
  // into an FMA): the CPU sampler computes these same two roundings.
  const double r = __dmul_rn(PhiloxUniform(p.seed, p.step), total);
  if (prefix[threadIdx.x] <= r && r < prefix[threadIdx.x + 1]) {
    const double target = __dsub_rn(r, prefix[threadIdx.x]);
    double acc = 0.0;
    int32_t choice = my_last;
    for (int64_t i = begin; i < end; ++i) {
      const float w = weight(i);
      if (w > 0.0f) {
        acc += w;
        if (target < acc) {
          choice = static_cast<int32_t>(i);
          break;
        }
      }
    }
    picked = choice;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    out_tokens[row] =
        picked >= 0 ? picked : (last_kept >= 0 ? last_kept : argmax);
  }
}

}  // namespace

size_t LogprobsWorkspaceBytes(int64_t rows, int64_t vocab, int32_t top_n) {
  if (rows <= 0 || vocab <= 0 || top_n < 0) return 0;
  const size_t entries =
      static_cast<size_t>(rows) * static_cast<size_t>(LogprobChunks(vocab));
  return entries *
         (sizeof(ChunkStats) + static_cast<size_t>(top_n) * sizeof(ValId));
}

cudaError_t LaunchLogprobs(const float* logits, int64_t rows, int64_t vocab,
                           int32_t top_n, const int32_t* tokens, float* chosen,
                           int32_t* argmax, float* log_z, int32_t* top_ids,
                           float* top_logprobs, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream) {
  if (top_n < 0 || top_n > kMaxTopLogprobs || vocab <= 0 || vocab > INT32_MAX ||
      rows < 0 || rows > kMaxGridDim ||
      (top_n > 0 && (top_ids == nullptr || top_logprobs == nullptr)) ||
      ((tokens == nullptr) != (chosen == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int64_t chunks = LogprobChunks(vocab);
  if (logits == nullptr || workspace == nullptr ||
      workspace_bytes < LogprobsWorkspaceBytes(rows, vocab, top_n) ||
      reinterpret_cast<uintptr_t>(workspace) % alignof(ChunkStats) != 0) {
    return cudaErrorInvalidValue;
  }
  ChunkStats* stats = static_cast<ChunkStats*>(workspace);
  ValId* tops = reinterpret_cast<ValId*>(stats + rows * chunks);
  LogprobsChunkKernel<<<dim3(static_cast<unsigned>(chunks),
                             static_cast<unsigned>(rows)),
                        kLogprobThreads, 0, stream>>>(logits, vocab, top_n,
                                                      stats, tops);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  LogprobsCombineKernel<<<static_cast<unsigned>(rows), kLogprobThreads, 0,
                          stream>>>(logits, vocab, top_n, chunks, stats, tops,
                                    tokens, chosen, argmax, log_z, top_ids,
                                    top_logprobs);
  return cudaGetLastError();
}

cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab,
                         const DeviceSamplingParams* params,
                         const int32_t* token_counts,
                         const uint8_t* prompt_mask, const int32_t* masked_ids,
                         const uint32_t* allowed_bits, float* scratch,
                         int32_t* out_tokens, cudaStream_t stream) {
  if (vocab <= 0 || vocab > INT32_MAX) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  SampleKernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(
      logits, vocab, params, token_counts, prompt_mask, masked_ids,
      allowed_bits, scratch, out_tokens);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tessera
