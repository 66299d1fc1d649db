#include "runtime/model/shard.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

ShardSpec FullModel(const ModelConfig& c) {
  ShardSpec s;
  s.end_layer = c.num_layers;
  s.local_heads = c.num_heads;
  s.local_kv_heads = c.num_kv_heads;
  s.local_intermediate = c.intermediate_size;
  s.vocab_per_rank = c.vocab_size;
  s.local_expert_intermediate = c.moe.expert_intermediate_size;
  s.local_shared_intermediate = c.moe.shared_expert_intermediate_size;
  s.local_experts = c.moe.num_experts;
  return s;
}

absl::StatusOr<ShardSpec> MakeShardSpec(const ModelConfig& c, int tp_rank,
                                        int tp_size, int pp_stage, int pp_size,
                                        const std::vector<int64_t>& pp_layers,
                                        bool expert_parallel) {
  if (tp_size < 1 || pp_size < 1 || tp_rank < 0 || tp_rank >= tp_size ||
      pp_stage < 0 || pp_stage >= pp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid position tp ", tp_rank, "/", tp_size, ", pp ",
                     pp_stage, "/", pp_size));
  }
  const std::string model = absl::StrCat(ArchitectureName(c.arch), " model");
  if (c.num_heads % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split the ", model, " over --tp ", tp_size, ": ",
                     c.num_heads, " attention heads are not divisible by it"));
  }
  if (c.num_kv_heads % tp_size != 0 && tp_size % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split the ", model, " over --tp ", tp_size, ": ",
        c.num_kv_heads, " KV heads neither divide nor are divisible by it"));
  }
  if (c.intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split the ", model, " over --tp ", tp_size,
                     ": intermediate_size ", c.intermediate_size,
                     " is not divisible by it"));
  }
  if (expert_parallel && !c.moe.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ep: the ", model, " has no experts to split over the ranks"));
  }
  if (expert_parallel && c.moe.num_experts % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split the ", model, "'s ", c.moe.num_experts,
        " experts over --tp ", tp_size, " (--ep): not divisible by it"));
  }
  // With --ep every rank holds whole experts.
  for (const auto& [what, size] :
       {std::pair<const char*, int64_t>(
            "moe_intermediate_size",
            expert_parallel ? 0 : c.moe.expert_intermediate_size),
        std::pair<const char*, int64_t>(
            "shared_expert_intermediate_size",
            c.moe.shared_expert_intermediate_size)}) {
    if (size % tp_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot split the ", model, " over --tp ", tp_size, ": ",
                       what, " ", size, " is not divisible by it"));
    }
  }
  ShardSpec s;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  s.pp_stage = pp_stage;
  s.pp_size = pp_size;
  s.local_heads = c.num_heads / tp_size;
  if (c.num_kv_heads >= tp_size) {
    s.local_kv_heads = c.num_kv_heads / tp_size;
    s.first_kv_head = tp_rank * s.local_kv_heads;
  } else {  // Replicated: each KV head serves tp / kv_heads consecutive ranks.
    s.local_kv_heads = 1;
    s.first_kv_head = tp_rank / (tp_size / c.num_kv_heads);
  }
  s.local_intermediate = c.intermediate_size / tp_size;
  s.local_expert_intermediate = c.moe.expert_intermediate_size / tp_size;
  s.local_experts = c.moe.num_experts;
  if (expert_parallel) {
    s.expert_parallel = true;
    s.local_expert_intermediate = c.moe.expert_intermediate_size;
    s.local_experts = c.moe.num_experts / tp_size;
    s.first_expert = tp_rank * s.local_experts;
  }
  s.local_shared_intermediate = c.moe.shared_expert_intermediate_size / tp_size;
  s.vocab_per_rank = (c.vocab_size + tp_size - 1) / tp_size;
  s.first_vocab_id = tp_rank * s.vocab_per_rank;

  std::vector<int64_t> layers = pp_layers;
  if (layers.empty()) {
    if (pp_size > c.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot split ", c.num_layers, " layers over --pp ",
                       pp_size, " stages"));
    }
    for (int i = 0; i < pp_size; ++i) {
      layers.push_back(c.num_layers / pp_size +
                       (i < c.num_layers % pp_size ? 1 : 0));
    }
  }
  int64_t total = 0;
  for (int64_t n : layers) {
    if (n < 1) {
      return absl::InvalidArgumentError(
          "--pp-layers: every stage needs at least one layer");
    }
    total += n;
  }
  if (static_cast<int>(layers.size()) != pp_size || total != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pp-layers ", absl::StrJoin(layers, ","), " must give ", pp_size,
        " stages that add up to the model's ", c.num_layers, " layers"));
  }
  for (int i = 0; i < pp_stage; ++i) s.first_layer += layers[i];
  s.end_layer = s.first_layer + layers[pp_stage];
  return s;
}

}  // namespace tessera
