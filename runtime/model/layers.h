// The pieces a decoder's layer loop is made of, written once over the op set
// (a model file composes them): attention, the gated MLP and the
// mixture-of-experts block. Each block maps its input
// [T, H] to an output [T, H] that the layer loop adds to the residual stream;
// norms and residual adds stay in the loop, where they fuse (AddRmsNorm).
//
// Tensor parallelism (see shard.h): a block holds this rank's heads or
// intermediate slice; its output projection is row-parallel, so the partial
// sums meet in an all-reduce over `tp` before the bias (held whole) is added.
//
// Variants come from the weights a block is given, never from config flags:
// a q/k/v bias, an output bias or per-head q/k RMSNorm (qwen3) is applied
// exactly when its tensor is present.
#ifndef TESSERA_RUNTIME_MODEL_LAYERS_H_
#define TESSERA_RUNTIME_MODEL_LAYERS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/attention_metadata.h"
#include "kernels/ops.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/tensor.h"
#include "runtime/kv/kv_layout.h"
#include "runtime/kv/kv_pool.h"

namespace tessera {

// Weights of one attention block; shapes are this rank's. The q, k and v
// projections are one matrix (and one bias), their rows concatenated when the
// model binds the checkpoint's separate tensors (weights.h ConcatRows), so
// one GEMM computes all three; at TP each rank stacks its own slices.
struct AttentionWeights {
  // [(local_heads + 2 * local_kv_heads) * D, H]: q rows, then k, then v.
  // fp8 checkpoints: a Weight with its scale (quantized_weights.h).
  Weight qkv_proj;
  Weight o_proj;                   // [H, local_heads * D]
  std::optional<Tensor> qkv_bias;  // [(local_heads + 2 local_kv_heads) * D].
  std::optional<Tensor> o_bias;    // [H], whole.
  std::optional<Tensor> q_norm, k_norm;  // [D]: per-head RMSNorm.
  // An fp8 checkpoint's KV cache scales for this layer (model.h).
  std::optional<LayerKvScales> kv_scales;

  int64_t bytes() const;
};

// Weights of a gated (SwiGLU) MLP: down(silu(gate(x)) * up(x)), gate and up
// as one matrix (and one bias) of stacked rows, like q/k/v above.
struct GatedMlpWeights {
  Weight gate_up_proj;                 // [2 * local_I, H]: gate rows, then up.
  Weight down_proj;                    // [H, local_I]
  std::optional<Tensor> gate_up_bias;  // [2 * local_I].
  std::optional<Tensor> down_bias;     // [H], whole.

  int64_t bytes() const;
};

// Scratch the blocks work in, bound once by the model (views of at least the
// step's T rows).
struct AttentionScratch {
  TensorView qkv;   // [T, (local_heads + 2 local_kv_heads) * D]
  TensorView q;     // [T, local_heads, D]
  TensorView attn;  // [T, local_heads, D]
};
struct GatedMlpScratch {
  TensorView gate_up;  // [T, 2 * local_I]
  TensorView act;      // [T, local_I]
};

// One layer's attention: the q/k/v projection (+ bias) as one Linear, then
// one QkvRopeStore (optional per-head q/k norms, RoPE, the new keys and
// values into `cache`), attention over the cache (causal, GQA, an optional
// sliding window), the output projection.
struct AttentionBlock {
  AttentionWeights weights;
  // 0: none; > 0: the scaled scores are soft-capped, tanh(s / softcap) *
  // softcap (Gemma 2's attn_logit_softcapping, PagedAttentionArgs).
  float softcap = 0.0f;
  int64_t local_heads = 0;
  int64_t local_kv_heads = 0;
  int64_t head_dim = 0;
  float rms_norm_eps = 1e-6f;
  int64_t sliding_window = 0;  // 0: full attention.
  // The softmax scale q·k is multiplied by; 0: 1 / sqrt(head_dim).
  float scale = 0.0f;
  // RoPE beyond Forward's inv_freq (per-sequence frequencies, a cos/sin
  // factor; see rope.h); the default is plain RoPE. Its tables are the
  // model's, in the backend's memory.
  RopeOptions rope;

  // out [T, H] = attention(x [T, H]) for the step described by `metadata`
  // (T = metadata.num_tokens). kStatic runs every sequence with the static
  // kernel; kPaged runs decodes (which lead the batch) with the decode kernel
  // and the rest with the prefill kernel.
  absl::Status Forward(Ops* ops, Communicator* tp, const TensorView& x,
                       const AttentionMetadata& metadata,
                       AttentionBackend backend, const KvCacheLayer& cache,
                       const TensorView& inv_freq,
                       const AttentionScratch& scratch,
                       const TensorView& out) const;
};

struct GatedMlp {
  GatedMlpWeights weights;
  // act of down(act(gate(x)) * up(x)): SwiGLU by default, GeGLU for Gemma.
  GatedActivationKind activation = GatedActivationKind::kSilu;

  // out [T, H] = down(act(gate(x)) * up(x)) (+ biases) for x [T, H]: one
  // Linear for gate and up, one GatedActivation, the down Linear.
  absl::Status Forward(Ops* ops, Communicator* tp, const TensorView& x,
                       const GatedMlpScratch& scratch,
                       const TensorView& out) const;
};

// Weights of a mixture-of-experts block (config.h MoeHParams); shapes are
// this rank's. Every rank holds every expert and, of each, its slice of the
// intermediate dimension (as of a dense MLP: shard.h), so the experts'
// outputs are partial sums like GatedMlp's.
struct MoeWeights {
  Tensor router;        // [E, H], whole: every rank routes every token alike.
  Tensor gate_up_proj;  // [E, 2 * local_I, H]: each expert's gate rows, then
                        // its up rows.
  Tensor down_proj;     // [E, H, local_I]
  // Qwen2-MoE's shared expert and its gate [1, H] (whole): both or neither.
  std::optional<GatedMlpWeights> shared_expert;
  std::optional<Tensor> shared_expert_gate;

  int64_t bytes() const;
};

// The MoE block's scratch (views of at least the step's T rows).
struct MoeScratch {
  TensorView router_logits;  // f32 [T, E]
  TensorView topk_ids;       // kI32 [T, k]
  TensorView topk_weights;   // f32 [T, k]
  TensorView experts;        // Ops::MoeExpertsScratchBytes for max T.
  // The shared expert's, when there is one.
  GatedMlpScratch shared;  // gate_up [T, 2 local_Is], act [T, local_Is]
  TensorView shared_out;   // f32 [T, H]
  TensorView shared_gate;  // f32 [T, 1]
};

// A mixture-of-experts MLP: route each token (Linear by the router, then
// MoeRoute: softmax, top-k, optional renormalisation), run its experts
// (MoeExperts), [qwen2_moe] add sigmoid(x · shared_gateᵀ) · shared_expert(x)
// (SigmoidGatedAdd), then one all-reduce over `tp` for the whole block.
struct MoeBlock {
  MoeWeights weights;
  int64_t top_k = 1;
  bool renormalize = false;
  int64_t first_expert = 0;  // Global id of weights' expert 0.

  // out [T, H] = moe(x [T, H]).
  absl::Status Forward(Ops* ops, Communicator* tp, const TensorView& x,
                       const MoeScratch& scratch, const TensorView& out) const;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_LAYERS_H_
