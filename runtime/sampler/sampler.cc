#include "runtime/sampler/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tessera {

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

Sampler::Sampler(const SamplingParams& params)
    : params_(params),
      rng_(params.seed.has_value() ? *params.seed : std::random_device{}()) {}

Sampler::Scratch& Sampler::ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

absl::StatusOr<int32_t> Sampler::Sample(absl::Span<const float> logits,
                                        absl::Span<const int32_t> prompt,
                                        absl::Span<const int32_t> output,
                                        absl::Span<const int32_t> masked) {
  if (logits.empty()) return absl::InvalidArgumentError("Sample: empty logits");
  Scratch& scratch = ThreadScratch();
  std::vector<std::pair<float, int32_t>>& candidates = scratch.candidates;
  std::vector<float>& penalized = scratch.penalized;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (params_.has_penalties() || !masked.empty()) {
    penalized.assign(logits.begin(), logits.end());
    auto valid = [&](int32_t id) { return id >= 0 && id < vocab; };
    if (params_.repetition_penalty != 1.0f) {
      // Each distinct token once: mark by making the penalty idempotent per
      // pass.
      std::vector<bool>& seen = scratch.seen;
      seen.assign(vocab, false);
      for (absl::Span<const int32_t> part : {prompt, output}) {
        for (int32_t id : part) {
          if (!valid(id) || seen[id]) continue;
          seen[id] = true;
          float& l = penalized[id];
          l = l > 0 ? l / params_.repetition_penalty
                    : l * params_.repetition_penalty;
        }
      }
    }
    if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
      scratch.counts.assign(vocab, 0);
      for (int32_t id : output) {
        if (valid(id)) ++scratch.counts[id];
      }
      for (int32_t id : output) {
        if (!valid(id) || scratch.counts[id] == 0) continue;
        penalized[id] -= params_.frequency_penalty * scratch.counts[id] +
                         params_.presence_penalty;
        scratch.counts[id] = 0;  // Applied once per distinct token.
      }
    }
    for (int32_t id : masked) {
      if (valid(id)) penalized[id] = -INFINITY;
    }
    logits = penalized;
  }
  if (params_.temperature == 0.0f) return ArgMax(logits);

  // Tempered logits, sorted descending (stable by id so ties break
  // deterministically).
  candidates.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    // NaN and -inf have no probability (exp(-inf) = 0): never drawn.
    if (std::isnan(logits[i]) || logits[i] == -INFINITY) continue;
    candidates.emplace_back(logits[i] / params_.temperature,
                            static_cast<int32_t>(i));
  }
  // Nothing can be drawn: the argmax, as the device sampler does.
  if (candidates.empty()) return ArgMax(logits);
  if (params_.min_p > 0.0f) {
    // p(token) >= min_p * p(best)  <=>  logit >= best + log(min_p), in tempered
    // logits.
    float best = -INFINITY;
    for (const auto& c : candidates) best = std::max(best, c.first);
    const float floor = best + std::log(params_.min_p);
    candidates.erase(
        std::remove_if(candidates.begin(), candidates.end(),
                       [&](const auto& c) { return c.first < floor; }),
        candidates.end());
  }
  size_t keep = candidates.size();
  if (params_.top_k > 0) keep = std::min<size_t>(keep, params_.top_k);
  auto by_logit = [](const std::pair<float, int32_t>& a,
                     const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (keep < candidates.size() || params_.top_p < 1.0f) {
    if (params_.top_p < 1.0f) {
      std::sort(candidates.begin(), candidates.end(), by_logit);
    } else {
      std::partial_sort(candidates.begin(), candidates.begin() + keep,
                        candidates.end(), by_logit);
    }
  }
  candidates.resize(keep);

  // Softmax over the survivors.
  const float max_logit =
      std::max_element(candidates.begin(), candidates.end(),
                       [](auto& a, auto& b) { return a.first < b.first; })
          ->first;
  double total = 0.0;
  for (auto& c : candidates) {
    c.first = std::exp(c.first - max_logit);
    total += c.first;
  }
  if (params_.top_p < 1.0f) {
    // Keep the most likely tokens until their mass reaches top_p (the token
    // that crosses the threshold stays), as transformers' TopPLogitsWarper
    // does.
    double mass = 0.0;
    size_t n = 0;
    while (n < candidates.size()) {
      mass += candidates[n].first / total;
      ++n;
      if (mass >= params_.top_p) break;
    }
    candidates.resize(n);
    total = 0.0;
    for (auto& c : candidates) total += c.first;
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng_);
  for (const auto& c : candidates) {
    r -= c.first;
    if (r < 0.0) return c.second;
  }
  return candidates.back().second;
}

}  // namespace tessera
