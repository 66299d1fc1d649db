#include "runtime/executor/local_executor.h"

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<LocalExecutor>> LocalExecutor::Create(
    LlamaModel* model, const KvCacheOptions& kv, int max_num_seqs,
    int64_t free_bytes) {
  if (model->max_logit_rows() < max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model samples at most ", model->max_logit_rows(),
        " sequences per step, the scheduler may run ", max_num_seqs));
  }
  const KvPoolShape shape = model->kv_pool_shape(kv.dtype);
  ASSIGN_OR_RETURN(
      const KvLayout layout,
      ResolveKvLayout(kv, shape, model->config().max_position_embeddings,
                      max_num_seqs,
                      free_bytes >= 0 ? free_bytes : AvailableHostMemory()));
  ASSIGN_OR_RETURN(KvPool pool,
                   KvPool::Create(shape, layout.num_blocks, layout.block_size,
                                  model->allocator()));
  ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner,
                   StepRunner::Create(model, std::move(pool), kv.backend,
                                      /*samples=*/true));
  return std::unique_ptr<LocalExecutor>(
      new LocalExecutor(model, layout, std::move(runner)));
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Load(
    const std::string& model_dir, Ops* ops, const EngineOptions& options,
    const KvCacheOptions& kv, const Tokenizer* tokenizer,
    const LlamaModel::Placement& placement, int64_t free_bytes) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<LlamaModel> model,
      LlamaModel::Load(model_dir, ops, options.scheduler.max_num_batched_tokens,
                       options.scheduler.max_num_seqs, placement));
  return Create(std::move(model), options, kv, tokenizer, free_bytes);
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    std::unique_ptr<LlamaModel> model, const EngineOptions& options,
    const KvCacheOptions& kv, const Tokenizer* tokenizer, int64_t free_bytes) {
  if (model->max_step_tokens() < options.scheduler.max_num_batched_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model runs at most ", model->max_step_tokens(),
                     " tokens per step, the scheduler may batch ",
                     options.scheduler.max_num_batched_tokens));
  }
  auto local = std::unique_ptr<LocalEngine>(new LocalEngine());
  local->model_ = std::move(model);
  ASSIGN_OR_RETURN(
      local->executor_,
      LocalExecutor::Create(local->model_.get(), kv,
                            options.scheduler.max_num_seqs, free_bytes));
  ASSIGN_OR_RETURN(local->engine_,
                   Engine::Create(local->executor_.get(), options, tokenizer));
  return local;
}

}  // namespace tessera
