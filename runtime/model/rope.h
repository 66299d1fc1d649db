// Rotary position embeddings: the inverse frequencies a model's Rope op
// rotates by, with the long-context scalings of Hugging Face's `rope_type`
// (see RopeConfig in config.h).
#ifndef TESSERA_RUNTIME_MODEL_ROPE_H_
#define TESSERA_RUNTIME_MODEL_ROPE_H_

#include "absl/status/statusor.h"
#include "runtime/core/tensor.h"
#include "runtime/model/config.h"

namespace tessera {

// Rotary inverse frequencies [head_dim / 2] (host, f32) for the config's rope
// type, computed as transformers does in f32. InvalidArgument for an odd
// head_dim.
absl::StatusOr<Tensor> ComputeRopeInvFreq(const ModelConfig& config);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_ROPE_H_
