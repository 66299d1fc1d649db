// ShardSpec: which part of a Llama-family model one rank holds under tensor
// (TP) and pipeline (PP) parallelism, and the per-rank sizes that follow from
// it.
//
// Tensor parallelism (Megatron-style, as vLLM and TensorRT-LLM split these
// models):
//  - q/k/v and gate/up are split by output rows ("columns" of the math): rank r
//  holds query
//    heads [r·H/T, (r+1)·H/T) and the matching rows of gate and up;
//  - o and down are split by input columns; their partial products are summed
//  across the TP
//    group (all-reduce), then any bias is added once;
//  - KV heads are split like query heads when kv_heads ≥ T, and replicated when
//  kv_heads < T
//    (rank r then holds KV head r / (T / kv_heads), the one its query heads
//    read);
//  - embedding and LM head are vocabulary-parallel: rank r holds rows [r·Vp,
//  (r+1)·Vp) with
//    Vp = ceil(V / T); rows past V are zero padding (never a real token).
// Pipeline parallelism: stage s holds layers [first_layer, end_layer); the
// first stage also holds the embedding, the last the final norm and LM head.
#ifndef TESSERA_RUNTIME_MODEL_SHARD_H_
#define TESSERA_RUNTIME_MODEL_SHARD_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"

namespace tessera {

struct ShardSpec {
  int tp_rank = 0;
  int tp_size = 1;
  int pp_stage = 0;
  int pp_size = 1;
  int64_t first_layer = 0;  // This stage's layers: [first_layer, end_layer).
  int64_t end_layer = 0;

  bool first_stage() const { return pp_stage == 0; }
  bool last_stage() const { return pp_stage == pp_size - 1; }

  // Local sizes (valid after MakeShardSpec).
  int64_t local_heads = 0;
  int64_t local_kv_heads = 0;
  int64_t first_kv_head = 0;  // Global index of this rank's first KV head.
  int64_t local_intermediate = 0;
  int64_t vocab_per_rank = 0;  // Vp (padded).
  int64_t first_vocab_id = 0;  // tp_rank · Vp.

  // Mixtures of experts (config.moe): every rank holds every expert, and of
  // each expert (and of the shared expert) the intermediate slice
  // [tp_rank · local, (tp_rank + 1) · local), as of a dense MLP.
  int64_t local_expert_intermediate = 0;
  int64_t local_shared_intermediate = 0;
  // Expert parallelism (--ep): the TP group splits the experts instead of
  // their intermediate dimension, so rank r holds whole experts
  // [first_expert, first_expert + local_experts) (attention and the shared
  // expert stay split as above). Without it every rank holds all of them.
  bool expert_parallel = false;
  int64_t first_expert = 0;
  int64_t local_experts = 0;
};

// The whole model on one rank.
ShardSpec FullModel(const ModelConfig& config);

// Validates the split and computes the local sizes. `pp_layers` lists the
// number of layers of each stage (empty: as even as possible, earlier stages
// taking the remainder). Errors (InvalidArgument) say why the model cannot be
// split: heads, KV heads or intermediate size (or an expert's or the shared
// expert's) not divisible by tp, more stages than layers, pp_layers not
// summing to num_layers, ...
// `expert_parallel` (--ep): see ShardSpec::expert_parallel; InvalidArgument
// for a model without experts or experts not divisible by tp.
absl::StatusOr<ShardSpec> MakeShardSpec(
    const ModelConfig& config, int tp_rank, int tp_size, int pp_stage,
    int pp_size, const std::vector<int64_t>& pp_layers = {},
    bool expert_parallel = false);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_SHARD_H_
