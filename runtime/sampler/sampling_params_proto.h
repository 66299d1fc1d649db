// The wire form of SamplingParams (proto::SamplingParams, which crosses ranks
// in a StepPlan) and back.
#ifndef TESSERA_RUNTIME_SAMPLER_SAMPLING_PARAMS_PROTO_H_
#define TESSERA_RUNTIME_SAMPLER_SAMPLING_PARAMS_PROTO_H_

#include "proto/tessera.pb.h"
#include "runtime/sampler/sampling_params.h"

namespace tessera {

// An unset repetition_penalty (0 on the wire) is 1.
SamplingParams SamplingFromProto(const proto::SamplingParams& p);
void SamplingToProto(const SamplingParams& s, proto::SamplingParams* p);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_SAMPLER_SAMPLING_PARAMS_PROTO_H_
