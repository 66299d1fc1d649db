// Rotary position embeddings: the inverse frequencies a model's attention
// rotates q and k by, with the long-context scalings of Hugging Face's
// `rope_type` (see RopeConfig in config.h), and how a model applies them.
//
// Static types (default, linear, llama3, yarn) are one table. Dynamic NTK and
// LongRoPE depend on each sequence's length at each step: the table here is
// the one for sequences within the original context, and RopeOptions
// (kernels/ops.h) tells QkvRopeStore how to change it per sequence, on the
// device, from the step's own seq_lens.
//
// transformers multiplies cos and sin by attention_scaling (yarn and
// longrope's attention_factor). Where every dim of a head rotates, Tessera
// multiplies the softmax scale by attention_factor² instead: q and k each
// carry one factor into q·k, which is bilinear, so scaling q·k by its square
// before the softmax is the same function and keeps the rope kernels and the
// cached keys as for an unscaled model. With partial rotary the pass-through
// dims carry no factor, so there cos and sin are scaled as transformers does.
#ifndef TESSERA_RUNTIME_MODEL_ROPE_H_
#define TESSERA_RUNTIME_MODEL_ROPE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "runtime/core/tensor.h"
#include "runtime/model/config.h"

namespace tessera {

struct RopeTables {
  // Host f32 [R/2] (R = the rotated dims): the frequencies of every token
  // (static types), of sequences within original_max_position (dynamic NTK),
  // or LongRoPE's short-factor ones.
  Tensor inv_freq;
  // LongRoPE's long-factor frequencies, [R/2].
  std::optional<Tensor> long_inv_freq;
  // Length scaling, its constants and cos_sin_scale. long_inv_freq is left
  // empty: the model points it at its own copy of the table above.
  RopeOptions options;
  // The factor the attention's softmax scale (1 / sqrt(head_dim)) is
  // multiplied by: attention_factor² where every dim rotates, else 1.
  double softmax_scale_factor = 1.0;
};

// The rope of `config`, computed as transformers does in f32 (each operation
// rounded where transformers rounds it). InvalidArgument for an odd or
// oversized rotary dim, or LongRoPE factor lists of the wrong length.
absl::StatusOr<RopeTables> ComputeRope(const ModelConfig& config);

// ComputeRope(config).inv_freq.
absl::StatusOr<Tensor> ComputeRopeInvFreq(const ModelConfig& config);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_ROPE_H_
