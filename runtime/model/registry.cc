#include "runtime/model/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/core/status.h"
#include "runtime/model/gemma.h"
#include "runtime/model/llama.h"
#include "runtime/model/quantized_weights.h"

namespace tessera {
namespace {

absl::StatusOr<std::unique_ptr<Model>> CreateLlama(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                   LlamaModel::Create(std::move(config), shard,
                                      std::move(weights), context));
  return std::unique_ptr<Model>(std::move(model));
}

absl::StatusOr<std::unique_ptr<Model>> CreateGemma(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  ASSIGN_OR_RETURN(std::unique_ptr<GemmaModel> model,
                   GemmaModel::Create(std::move(config), shard,
                                      std::move(weights), context));
  return std::unique_ptr<Model>(std::move(model));
}

// One line per architecture. The Llama family differs only in its hparams
// (biases, q/k norms, sliding windows), so its members share the weight
// table and the layer loop.
constexpr ArchitectureEntry kArchitectures[] = {
    {"llama", &ParseLlamaHParams, &LlamaWeightTable, &CreateLlama},
    {"mistral", &ParseMistralHParams, &LlamaWeightTable, &CreateLlama},
    {"qwen2", &ParseQwen2HParams, &LlamaWeightTable, &CreateLlama},
    {"qwen3", &ParseQwen3HParams, &LlamaWeightTable, &CreateLlama},
    // Llama with fused q/k/v and gate/up tensors: its own table, the same
    // layer loop.
    {"phi3", &ParsePhi3HParams, &Phi3WeightTable, &CreateLlama},
    {"gemma", &ParseGemmaHParams, &GemmaWeightTable, &CreateGemma},
    {"gemma2", &ParseGemma2HParams, &GemmaWeightTable, &CreateGemma},
    {"gemma3_text", &ParseGemma3HParams, &GemmaWeightTable, &CreateGemma},
    // Mixtures of experts: the same layers with a MoeBlock for the MLP.
    {"mixtral", &ParseMixtralHParams, &LlamaWeightTable, &CreateLlama},
    {"qwen3_moe", &ParseQwen3MoeHParams, &LlamaWeightTable, &CreateLlama},
    {"qwen2_moe", &ParseQwen2MoeHParams, &LlamaWeightTable, &CreateLlama},
};

}  // namespace

absl::StatusOr<const ArchitectureEntry*> FindArchitecture(
    absl::string_view model_type) {
  for (const ArchitectureEntry& entry : kArchitectures) {
    if (entry.model_type == model_type) return &entry;
  }
  std::vector<absl::string_view> names;
  for (const ArchitectureEntry& entry : kArchitectures) {
    names.push_back(entry.model_type);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported model_type \"", model_type,
                   "\" (supported: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<WeightTable> ModelWeightTable(const ModelConfig& config,
                                             const ShardSpec& shard) {
  ASSIGN_OR_RETURN(const ArchitectureEntry* arch,
                   FindArchitecture(config.model_type));
  RETURN_IF_ERROR(CheckQuantizedShard(config, shard));
  return arch->weight_table(config, shard);
}

absl::StatusOr<int64_t> ModelWeightParts(const ModelConfig& config,
                                         const ShardSpec& shard) {
  ASSIGN_OR_RETURN(const WeightTable table, ModelWeightTable(config, shard));
  return WeightParts(table);
}

absl::StatusOr<WeightSet> LoadShardWeights(const Checkpoint& checkpoint,
                                           const ModelConfig& config,
                                           const ShardSpec& shard,
                                           const WeightLoadOptions& options) {
  ASSIGN_OR_RETURN(WeightTable table, ModelWeightTable(config, shard));
  return LoadWeightSet(checkpoint, std::move(table), options);
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(
    ModelConfig config, ShardSpec shard, WeightSet weights,
    const ModelContext& context) {
  ASSIGN_OR_RETURN(const ArchitectureEntry* arch,
                   FindArchitecture(config.model_type));
  return arch->create(std::move(config), shard, std::move(weights), context);
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(
    const std::string& model_dir, Ops* ops, int64_t max_step_tokens,
    int64_t max_logit_rows, const ModelPlacement& placement) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  RETURN_IF_ERROR(LimitContext(placement.max_model_len, &config));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                   Checkpoint::Open(model_dir));
  const ShardSpec shard = FullModel(config);
  WeightLoadOptions options;
  options.device = ops;
  options.matrix_dtype = placement.matrix_dtype;
  options.on_part = placement.on_weight_part;
  // Weights in host memory (the CPU backend): they are f32 there.
  if (placement.allocator == nullptr) options.check_host_memory_for = model_dir;
  absl::StatusOr<WeightSet> weights =
      LoadShardWeights(*ckpt, config, shard, options);
  if (!weights.ok()) {
    return Annotate(weights.status(),
                    absl::StrCat("loading weights from ", model_dir));
  }
  ModelContext context;
  context.ops = ops;
  context.max_step_tokens = max_step_tokens;
  context.max_logit_rows = max_logit_rows;
  context.allocator = placement.allocator;
  return CreateModel(std::move(config), shard, *std::move(weights), context);
}

}  // namespace tessera
