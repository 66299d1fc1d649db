#include "runtime/sampler/sampling_params_proto.h"

namespace tessera {

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
