#include "kernels/cpu/cpu_sampling.h"

#include <algorithm>
#include <cmath>

#include "kernels/philox.h"
#include "kernels/sampling_math.h"

namespace tessera {
namespace {

using sampling::kSampleThreads;
using sampling::kWarpSize;

// The candidate order: larger tempered logit first, ties by lower id (the
// CUDA sampler's key order; no NaN and no -0 reach it).
bool Better(const std::pair<float, int32_t>& a,
            const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// One warp's butterfly (__shfl_xor_sync with offsets 16, 8, 4, 2, 1): every
// lane ends with the same sum, in this order.
double WarpSum(double lanes[kWarpSize]) {
  double next[kWarpSize];
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    for (int l = 0; l < kWarpSize; ++l) next[l] = lanes[l] + lanes[l ^ offset];
    std::copy(next, next + kWarpSize, lanes);
  }
  return lanes[0];
}

// The CUDA sampler's BlockSum of per-thread partial sums: each warp's
// butterfly, then one over the warp sums (zeros past the last warp).
double BlockSum(const double partial[kSampleThreads]) {
  constexpr int kWarps = kSampleThreads / kWarpSize;
  double second[kWarpSize] = {};
  for (int w = 0; w < kWarps; ++w) {
    double lanes[kWarpSize];
    std::copy(partial + w * kWarpSize, partial + (w + 1) * kWarpSize, lanes);
    second[w] = WarpSum(lanes);
  }
  return WarpSum(second);
}

// The CUDA sampler's Metric with mass: the weights of `by_id` (ascending ids)
// whose rank is below `n`, each thread summing ids = lane (mod
// kSampleThreads) in increasing order, then BlockSum.
double TreeMass(absl::Span<const std::pair<int32_t, float>> by_id,
                absl::Span<const int32_t> rank, int64_t n) {
  double partial[kSampleThreads] = {};
  for (const auto& [id, w] : by_id) {
    if (rank[id] < n) partial[id % kSampleThreads] += static_cast<double>(w);
  }
  return BlockSum(partial);
}

}  // namespace

int32_t ArgMax(absl::Span<const float> values) {
  int32_t best = 0;
  float best_value = -INFINITY;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > best_value) {
      best_value = values[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

int32_t CpuSampleToken(absl::Span<const float> raw, const SampleRow& row,
                       CpuSampleScratch* s) {
  const SamplingParams& p = *row.params;
  const int64_t vocab = static_cast<int64_t>(raw.size());
  auto valid = [&](int32_t id) { return id >= 0 && id < vocab; };

  // 1. Penalties, then the mask.
  absl::Span<const float> logits = raw;
  if (p.has_penalties() || !row.masked.empty() || !row.allowed.empty()) {
    s->logits.assign(raw.begin(), raw.end());
    if (p.has_penalties()) {
      s->counts.assign(vocab, 0);
      s->in_prompt.assign(vocab, 0);
      for (int32_t id : row.output) {
        if (valid(id)) ++s->counts[id];
      }
      for (int32_t id : row.prompt) {
        if (valid(id)) s->in_prompt[id] = 1;
      }
      for (int64_t i = 0; i < vocab; ++i) {
        if (s->counts[i] == 0 && s->in_prompt[i] == 0) continue;
        s->logits[i] = sampling::PenalizeLogit(
            s->logits[i], s->counts[i], s->in_prompt[i] != 0,
            p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
      }
    }
    for (int32_t id : row.masked) {
      if (valid(id)) s->logits[id] = -INFINITY;
    }
    if (!row.allowed.empty()) {
      for (int64_t i = 0; i < vocab; ++i) {
        if (!((row.allowed[i >> 5] >> (i & 31)) & 1u)) {
          s->logits[i] = -INFINITY;
        }
      }
    }
    logits = s->logits;
  }
  // 2. Greedy.
  const int32_t argmax = ArgMax(logits);
  if (p.temperature == 0.0f) return argmax;

  // 3. Tempered logits and their maximum; then min-p.
  std::vector<std::pair<float, int32_t>>& cand = s->candidates;
  cand.clear();
  float max = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    const float t = sampling::TemperLogit(logits[i], p.temperature);
    max = std::max(max, t);
    if (t > -INFINITY) cand.emplace_back(t, static_cast<int32_t>(i));
  }
  if (!(max > -INFINITY && max < INFINITY)) return argmax;
  if (p.min_p > 0.0f) {
    const float floor = sampling::MinPFloor(max, sampling::MinPLog(p.min_p));
    cand.erase(
        std::remove_if(cand.begin(), cand.end(),
                       [&](const auto& c) { return !(c.first >= floor); }),
        cand.end());
  }
  // top-k: the k best survivors (a count is exact, so this is the device's
  // cutoff).
  const bool top_k_cut =
      p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size();
  if (top_k_cut) {
    std::nth_element(cand.begin(), cand.begin() + (p.top_k - 1), cand.end(),
                     Better);
    cand.resize(p.top_k);
  }
  // The survivors by id, with their weights (cand is in id order unless top-k
  // reordered it).
  std::vector<std::pair<int32_t, float>>& by_id = s->by_id;
  by_id.clear();
  for (const auto& [t, id] : cand) {
    by_id.emplace_back(id, sampling::SampleWeight(t, max));
  }
  if (top_k_cut) std::sort(by_id.begin(), by_id.end());
  // top-p: the shortest best-first prefix whose mass, summed as the device
  // sums it, reaches top_p.
  if (p.top_p < 1.0f) {
    std::sort(cand.begin(), cand.end(), Better);
    const int64_t n_cand = static_cast<int64_t>(cand.size());
    s->rank.resize(vocab);
    for (int64_t j = 0; j < n_cand; ++j) {
      s->rank[cand[j].second] = static_cast<int32_t>(j);
    }
    const double target = p.top_p > 0.0f ? static_cast<double>(p.top_p) : 0.0;
    int64_t keep = 1;
    if (target > 0.0) {
      const double total = TreeMass(by_id, s->rank, n_cand);
      auto reaches = [&](int64_t n) {
        return TreeMass(by_id, s->rank, n) / total >= target;
      };
      // A guess from the mass in sorted order (within a few ulp of the
      // device's), then the exact answer around it: reaches() is monotone (a
      // rounded sum never shrinks when a term grows), reaches(n_cand) holds.
      int64_t guess = 0;
      double mass = 0.0;
      while (guess < n_cand) {
        mass += sampling::SampleWeight(cand[guess].first, max) / total;
        ++guess;
        if (mass >= target) break;
      }
      int64_t lo, hi;  // reaches(hi), !reaches(lo) (0 never reaches).
      if (reaches(guess)) {
        hi = guess;
        lo = guess - 1;
        for (int64_t step = 1; lo >= 1 && reaches(lo); step *= 2) {
          hi = lo;
          lo = std::max<int64_t>(hi - 2 * step, 0);
        }
      } else {
        lo = guess;
        hi = guess + 1;
        for (int64_t step = 1; hi < n_cand && !reaches(hi); step *= 2) {
          lo = hi;
          hi = std::min<int64_t>(lo + 2 * step, n_cand);
        }
        hi = std::min(hi, n_cand);
      }
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (reaches(mid)) {
          hi = mid;
        } else {
          lo = mid;
        }
      }
      keep = hi;
    }
    by_id.erase(
        std::remove_if(by_id.begin(), by_id.end(),
                       [&](const auto& e) { return s->rank[e.first] >= keep; }),
        by_id.end());
  }

  // 4. The draw, as the device's block makes it: kSampleThreads contiguous
  // chunks of ids, each summed in id order, a sequential prefix over them,
  // and the chunk that holds r walked to the token.
  const int64_t chunk = (vocab + kSampleThreads - 1) / kSampleThreads;
  double prefix[kSampleThreads + 1] = {};
  int32_t last_kept = -1;
  for (const auto& [id, w] : by_id) {
    if (w > 0.0f) {
      prefix[id / chunk + 1] += static_cast<double>(w);
      last_kept = id;
    }
  }
  for (int j = 1; j <= kSampleThreads; ++j) prefix[j] += prefix[j - 1];
  const double total = prefix[kSampleThreads];
  const double r = PhiloxUniform(row.seed, row.step) * total;
  int picked_chunk = -1;
  for (int j = 0; j < kSampleThreads; ++j) {
    if (prefix[j] <= r && r < prefix[j + 1]) {
      picked_chunk = j;
      break;
    }
  }
  if (picked_chunk < 0) return last_kept >= 0 ? last_kept : argmax;
  const double target = r - prefix[picked_chunk];
  const int64_t begin = picked_chunk * chunk, end = begin + chunk;
  double acc = 0.0;
  int32_t choice = -1;
  for (auto it = std::lower_bound(
           by_id.begin(), by_id.end(), begin,
           [](const auto&e, int64_t id) { return e.first < id; });
       it != by_id.end() && it->first < end; ++it) {
    if (!(it->second > 0.0f)) continue;
    choice = it->first;  // The chunk's last kept token, if r is not reached.
    acc += static_cast<double>(it->second);
    if (target < acc) return it->first;
  }
  return choice >= 0 ? choice : (last_kept >= 0 ? last_kept : argmax);
}

void CpuLogprobs(absl::Span<const float> logits, int32_t top_n,
                 CpuSampleScratch* s, SampleResult* out) {
  // log-sum-exp over the non-NaN logits, as the device's LaunchLogprobs.
  float max = -INFINITY;
  for (float l : logits) max = std::fmax(max, l);
  float log_z = max;
  if (max > -INFINITY && max < INFINITY) {
    double sum = 0.0;
    for (float l : logits) {
      if (!std::isnan(l)) sum += std::exp(static_cast<double>(l) - max);
    }
    log_z = max + static_cast<float>(std::log(sum));
  }
  out->logprob = logits[out->token] - log_z;
  out->top.clear();
  const int64_t n = std::min<int64_t>(top_n, logits.size());
  if (n <= 0) return;
  // Best first, ties by lower id, NaN after everything else (by id).
  auto better = [](const std::pair<float, int32_t>& a,
                   const std::pair<float, int32_t>& b) {
    const bool a_nan = std::isnan(a.first), b_nan = std::isnan(b.first);
    if (a_nan || b_nan) return a_nan != b_nan ? b_nan : a.second < b.second;
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  s->top.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    s->top.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  std::partial_sort(s->top.begin(), s->top.begin() + n, s->top.end(), better);
  for (int64_t i = 0; i < n; ++i) {
    out->top.emplace_back(s->top[i].second, s->top[i].first - log_z);
  }
}

}  // namespace tessera
