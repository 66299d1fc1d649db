// LocalExecutor: runs step plans in this process — the whole model and its KV
// pool here, this process samples.
#ifndef TESSERA_RUNTIME_EXECUTOR_LOCAL_EXECUTOR_H_
#define TESSERA_RUNTIME_EXECUTOR_LOCAL_EXECUTOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/step_runner.h"
#include "runtime/model/llama.h"

namespace tessera {

class LocalExecutor final : public StepExecutor {
 public:
  // Sizes the KV pool (ResolveKvLayout against this host's free memory) and
  // takes it from the model's allocator. `model` must outlive the executor
  // and sample at least `max_num_seqs` sequences per step
  // (max_logit_rows()); InvalidArgument otherwise.
  // `free_bytes`: the memory the KV budget's fraction applies to (the
  // device's free memory on a GPU); -1: this host's MemAvailable.
  static absl::StatusOr<std::unique_ptr<LocalExecutor>> Create(
      LlamaModel* model, const KvCacheOptions& kv, int max_num_seqs,
      int64_t free_bytes = -1);

  const ModelConfig& config() const override { return model_->config(); }
  AllocatorStats memory_stats() const override {
    return model_->memory_stats();
  }
  int64_t max_step_tokens() const override { return model_->max_step_tokens(); }
  int64_t max_step_seqs() const override { return model_->max_logit_rows(); }
  KvLayout kv_layout() const override { return layout_; }
  absl::Status Execute(const proto::StepPlan& plan,
                       proto::StepResult* result) override {
    return runner_->Run(plan, result);
  }

 private:
  LocalExecutor(LlamaModel* model, KvLayout layout,
                std::unique_ptr<StepRunner> runner)
      : model_(model), layout_(layout), runner_(std::move(runner)) {}

  LlamaModel* model_;
  KvLayout layout_;
  std::unique_ptr<StepRunner> runner_;
};

// A model served in this process: the model, its executor and the engine,
// owned together (tests, tools, the single-process CLI).
class LocalEngine {
 public:
  // The model's step scratch is sized from the engine options (token budget,
  // max_num_seqs). `ops` and `tokenizer` (may be null) must outlive it.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Load(
      const std::string& model_dir, Ops* ops, const EngineOptions& options,
      const KvCacheOptions& kv, const Tokenizer* tokenizer = nullptr,
      const LlamaModel::Placement& placement = {}, int64_t free_bytes = -1);
  // The same over an already built model, whose max_step_tokens() and
  // max_logit_rows() must cover the options.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(
      std::unique_ptr<LlamaModel> model, const EngineOptions& options,
      const KvCacheOptions& kv, const Tokenizer* tokenizer = nullptr,
      int64_t free_bytes = -1);

  Engine& engine() { return *engine_; }
  LlamaModel& model() { return *model_; }
  LocalExecutor& executor() { return *executor_; }

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<LocalExecutor> executor_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_LOCAL_EXECUTOR_H_
