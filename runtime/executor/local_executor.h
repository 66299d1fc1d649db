// LocalExecutor: runs step plans in this process — the whole model and its KV
// pool here (one Rank, runtime/executor/rank.h), this process samples.
#ifndef TESSERA_RUNTIME_EXECUTOR_LOCAL_EXECUTOR_H_
#define TESSERA_RUNTIME_EXECUTOR_LOCAL_EXECUTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/rank.h"

namespace tessera {

class LocalExecutor final : public StepExecutor {
 public:
  // Builds the rank the spec describes (BuildRank over the spec's
  // checkpoint, or random weights with spec.random_weights; one process).
  // Errors as BuildRank's.
  static absl::StatusOr<std::unique_ptr<LocalExecutor>> Build(
      const RankSpec& spec, const RankContext& context = {});

  // Over a model built elsewhere (tests): sizes the KV pool (ResolveKvLayout
  // against this host's free memory) and takes it from the model's
  // allocator. `model` must outlive the executor and sample at least
  // `max_num_seqs` sequences per step (max_logit_rows()); InvalidArgument
  // otherwise. `free_bytes`: the memory the KV budget's fraction applies to
  // (the device's free memory on a GPU); -1: this host's MemAvailable.
  static absl::StatusOr<std::unique_ptr<LocalExecutor>> Create(
      Model* model, const KvCacheOptions& kv, int max_num_seqs,
      int64_t free_bytes = -1);

  explicit LocalExecutor(std::unique_ptr<Rank> rank) : rank_(std::move(rank)) {}

  const ModelConfig& config() const override { return rank_->config(); }
  AllocatorStats memory_stats() const override { return rank_->memory_stats(); }
  MemoryBreakdown memory_breakdown() const override {
    return rank_->memory_breakdown();
  }
  int64_t max_step_tokens() const override { return rank_->max_step_tokens(); }
  int64_t max_step_seqs() const override { return rank_->max_step_seqs(); }
  int32_t max_top_logprobs() const override {
    return rank_->max_top_logprobs();
  }
  KvLayout kv_layout() const override { return rank_->kv_layout(); }
  std::vector<int32_t> decode_graph_buckets() const override {
    return rank_->decode_graph_buckets();
  }
  absl::Status Execute(const proto::StepPlan& plan,
                       proto::StepResult* result) override {
    return rank_->runner().Run(plan, result);
  }
  absl::Status SetTrace(TraceRing* ring) override {
    rank_->runner().set_trace(ring, 0);
    return absl::OkStatus();
  }
  absl::Status SetOpProfiling(bool on) override {
    return rank_->SetOpProfiling(on);
  }
  absl::StatusOr<std::vector<OpTimeTotal>> TakeOpProfile() override {
    return rank_->TakeOpProfile();
  }

  Rank& rank() const { return *rank_; }

 private:
  std::unique_ptr<Rank> rank_;
};

// A model served in this process: the rank (model, KV pool, runner), its
// executor and the engine, owned together (tests, tools).
class LocalEngine {
 public:
  // The model's step scratch is sized from the engine options (token budget,
  // max_num_seqs). `ops` and `tokenizer` (may be null) must outlive it.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Load(
      const std::string& model_dir, Ops* ops, const EngineOptions& options,
      const KvCacheOptions& kv, const Tokenizer* tokenizer = nullptr,
      int64_t free_bytes = -1);
  // The same over an already built model, whose max_step_tokens() and
  // max_logit_rows() must cover the options.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(
      std::unique_ptr<Model> model, const EngineOptions& options,
      const KvCacheOptions& kv, const Tokenizer* tokenizer = nullptr,
      int64_t free_bytes = -1);

  Engine& engine() { return *engine_; }
  Model& model() { return executor_->rank().model(); }
  LocalExecutor& executor() { return *executor_; }

 private:
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Over(
      std::unique_ptr<Rank> rank, const EngineOptions& options,
      const Tokenizer* tokenizer);

  std::unique_ptr<LocalExecutor> executor_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_LOCAL_EXECUTOR_H_
