// The model registry: config.json's model_type → the architecture that runs
// it. One entry per architecture: its weight table (weights.h) and how to
// build the Model over a loaded WeightSet. Callers create and load models
// through the functions here and hold a Model (model.h); no caller names an
// architecture's class.
//
// Adding an architecture = a model file (its table and layer loop) + one line
// in registry.cc.
#ifndef TESSERA_RUNTIME_MODEL_REGISTRY_H_
#define TESSERA_RUNTIME_MODEL_REGISTRY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/ops.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

struct ArchitectureEntry {
  absl::string_view model_type;  // As config.json spells it.
  // Every tensor one rank of this architecture holds.
  WeightTable (*weight_table)(const ModelConfig& config,
                              const ShardSpec& shard);
  // The model over a complete WeightSet of weight_table(config, shard).
  absl::StatusOr<std::unique_ptr<Model>> (*create)(ModelConfig config,
                                                   ShardSpec shard,
                                                   WeightSet weights,
                                                   const ModelContext& context);
};

// The entry for `model_type`; InvalidArgument naming it (and the supported
// ones) when none.
absl::StatusOr<const ArchitectureEntry*> FindArchitecture(
    absl::string_view model_type);

// The tensors `shard` of `config`'s model holds, in the order they are read,
// sent and received.
absl::StatusOr<WeightTable> ModelWeightTable(const ModelConfig& config,
                                             const ShardSpec& shard);

// How many progress parts loading `shard` has (WeightLoadOptions::on_part
// calls): the embedding, each layer, the head.
absl::StatusOr<int64_t> ModelWeightParts(const ModelConfig& config,
                                         const ShardSpec& shard);

// Reads `shard`'s tensors from `checkpoint` into options.ops' memory, tensor
// by tensor in the checkpoint's dtype (see weights.h). A missing tensor is
// NotFound naming it; a shape that does not match the config is
// InvalidArgument ("<name>: expected shape [..], found [..]").
absl::StatusOr<WeightSet> LoadShardWeights(const Checkpoint& checkpoint,
                                           const ModelConfig& config,
                                           const ShardSpec& shard,
                                           const WeightLoadOptions& options);

// The model of `config`'s architecture over `weights` (a complete set of
// ModelWeightTable(config, shard) in context.ops' memory).
absl::StatusOr<std::unique_ptr<Model>> CreateModel(ModelConfig config,
                                                   ShardSpec shard,
                                                   WeightSet weights,
                                                   const ModelContext& context);

// Loads config.json and the safetensors of `model_dir` (the whole model, one
// process) into `ops`' memory; max_step_tokens and max_logit_rows as in
// ModelContext. Errors name the folder ("loading weights from DIR: ...").
absl::StatusOr<std::unique_ptr<Model>> LoadModel(
    const std::string& model_dir, Ops* ops, int64_t max_step_tokens = 0,
    int64_t max_logit_rows = 1, const ModelPlacement& placement = {});

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_REGISTRY_H_
