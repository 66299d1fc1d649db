#include "runtime/sampler/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature must be a finite number >= 0, got ", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0, got ", top_k));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  if (!(repetition_penalty > 0.0f) || std::isinf(repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetition_penalty must be > 0, got ", repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "presence_penalty must be in [-2, 2], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frequency_penalty must be in [-2, 2], got ", frequency_penalty));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

SamplingParams SamplingFromProto(const proto::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p();
  if (p.has_seed()) s.seed = p.seed();
  s.min_p = p.min_p();
  s.repetition_penalty =
      p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  return s;
}

void SamplingToProto(const SamplingParams& s, proto::SamplingParams* p) {
  p->set_temperature(s.temperature);
  p->set_top_k(s.top_k);
  p->set_top_p(s.top_p);
  p->set_has_seed(s.seed.has_value());
  if (s.seed) p->set_seed(*s.seed);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
}

}  // namespace tessera
