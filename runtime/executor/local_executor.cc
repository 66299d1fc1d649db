#include "runtime/executor/local_executor.h"

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

// A KvCacheOptions as the spec's values (the names ParseKvDType and
// ParseAttentionBackend read back).
void SetKv(const KvCacheOptions& kv, RankSpec* spec) {
  spec->block_size = kv.block_size;
  spec->num_kv_blocks = kv.num_blocks;
  spec->kv_cache_memory = kv.memory_bytes;
  spec->kv_cache_fraction = kv.memory_fraction;
  spec->kv_dtype = kv.dtype == DType::kI8       ? "int8"
                   : kv.dtype == DType::kBF16   ? "bfloat16"
                   : kv.dtype == DType::kF8E4M3 ? "fp8"
                                                : "float32";
  spec->attention =
      kv.backend == AttentionBackend::kStatic ? "static" : "paged";
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalExecutor>> LocalExecutor::Build(
    const RankSpec& spec, const RankContext& context) {
  std::unique_ptr<WeightSource> weights = SpecWeights(spec);
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank,
                   BuildRank(spec, *weights, context));
  return std::make_unique<LocalExecutor>(std::move(rank));
}

absl::StatusOr<std::unique_ptr<LocalExecutor>> LocalExecutor::Create(
    Model* model, const KvCacheOptions& kv, int max_num_seqs,
    int64_t free_bytes) {
  RankContext context;
  context.free_bytes = free_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank,
                   AssembleRank(nullptr, model, kv, max_num_seqs,
                                /*samples=*/true, context));
  return std::make_unique<LocalExecutor>(std::move(rank));
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Load(
    const std::string& model_dir, Ops* ops, const EngineOptions& options,
    const KvCacheOptions& kv, const Tokenizer* tokenizer, int64_t free_bytes) {
  RankSpec spec;
  spec.model_dir = model_dir;
  spec.max_num_seqs = options.scheduler.max_num_seqs;
  spec.max_num_batched_tokens = options.scheduler.max_num_batched_tokens;
  SetKv(kv, &spec);
  RankContext context;
  context.ops = ops;
  context.free_bytes = free_bytes;
  std::unique_ptr<WeightSource> weights = CheckpointWeights(model_dir);
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank,
                   BuildRank(spec, *weights, context));
  return Over(std::move(rank), options, tokenizer);
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    std::unique_ptr<Model> model, const EngineOptions& options,
    const KvCacheOptions& kv, const Tokenizer* tokenizer, int64_t free_bytes) {
  RankContext context;
  context.free_bytes = free_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank,
                   AssembleRank(std::move(model), nullptr, kv,
                                options.scheduler.max_num_seqs,
                                /*samples=*/true, context));
  return Over(std::move(rank), options, tokenizer);
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Over(
    std::unique_ptr<Rank> rank, const EngineOptions& options,
    const Tokenizer* tokenizer) {
  if (rank->max_step_tokens() < options.scheduler.max_num_batched_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model runs at most ", rank->max_step_tokens(),
                     " tokens per step, the scheduler may batch ",
                     options.scheduler.max_num_batched_tokens));
  }
  auto local = std::unique_ptr<LocalEngine>(new LocalEngine());
  local->executor_ = std::make_unique<LocalExecutor>(std::move(rank));
  ASSIGN_OR_RETURN(local->engine_,
                   Engine::Create(local->executor_.get(), options, tokenizer));
  return local;
}

}  // namespace tessera
