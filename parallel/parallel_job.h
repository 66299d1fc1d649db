// ParallelJob: one rank's part of a tensor × pipeline parallel model under MPI,
// and the two rank loops that drive it.
//
//   rank 0 (coordinator): reads config.json, broadcasts the ModelManifest,
//     sends every rank its weight shard (or lets each read its own with
//     --weights local), then is the engine's StepExecutor: each step it
//     broadcasts the engine's StepPlan, runs its own stage, and receives the
//     sampled tokens in a StepResult from the last stage.
//   every other rank (worker): builds the same model and KV pool from the
//     manifest and runs ServeSteps() until the coordinator broadcasts
//     SHUTDOWN.
//
// Which rank samples: tp-rank 0 of the last pipeline stage (it holds the full
// logits after the vocabulary-parallel gather). Errors on any rank are fatal
// for the job: the caller reports them through MpiWorld::Abort, so no rank is
// ever left waiting.
#ifndef TESSERA_PARALLEL_PARALLEL_JOB_H_
#define TESSERA_PARALLEL_PARALLEL_JOB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "parallel/control_channel.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_world.h"
#include "parallel/process_grid.h"
#include "proto/tessera.pb.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/step_runner.h"
#include "runtime/model/llama.h"

namespace tessera {

struct ParallelOptions {
  int tp = 1;
  int pp = 1;
  std::vector<int64_t> pp_layers;  // Layers per stage; empty = even split.
  bool weights_local =
      false;  // Each rank reads its own slices (shared filesystem).
  int max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  KvCacheOptions kv;
  std::string device = "cpu";        // cpu, or cuda (NCCL between ranks).
  DType weight_dtype = DType::kF32;  // Matrices on a GPU: kF32 or kBF16.
  // The GPUs each node gives the job (> 0), or 0 for every visible one; a
  // rank uses GPU local_rank % that. More ranks on a node than GPUs is an
  // error either way (NCCL needs a GPU per rank).
  int gpus_per_node = 0;
  // > 0: the context the job serves (--max-model-len; at most the config's
  // max_position_embeddings, which every rank lowers to it).
  int64_t max_model_len = 0;
  // Rank 0 draws a progress bar on stderr while it reads weights.
  bool show_progress = false;
};

// One rank as the startup log shows it (gathered on rank 0 after loading).
struct RankReport {
  int rank = 0;
  std::string host;    // MPI_Get_processor_name.
  int node = 0;        // Index of its node in the job, by first rank.
  int local_rank = 0;  // Among the ranks of its node.
  int local_size = 1;  // Ranks on its node.
  int gpu = -1;        // Its CUDA device, or -1 on the CPU.
  int64_t weight_bytes = 0;
  int64_t kv_cache_bytes = 0;
};

class ParallelJob final : public StepExecutor {
 public:
  // Collective over the world: every rank calls it. `model_dir` and `options`
  // are read on rank 0 (and model_dir also on every rank with weights_local).
  // InvalidArgument on every rank alike when the world's size is not tp × pp or
  // the model cannot be split.
  static absl::StatusOr<std::unique_ptr<ParallelJob>> Create(
      const MpiWorld& world, const std::string& model_dir,
      const ParallelOptions& options);

  ~ParallelJob() override;

  int rank() const { return world_rank_; }
  bool is_coordinator() const {
    return world_rank_ == ProcessGrid::kCoordinatorRank;
  }
  const ModelConfig& config() const override { return model_->config(); }
  AllocatorStats memory_stats() const override {
    return model_->memory_stats();
  }
  const ShardSpec& shard() const { return model_->shard(); }
  int64_t weight_bytes() const { return model_->weight_bytes(); }
  double load_seconds() const { return load_seconds_; }
  // Rank 0: every rank's report, by rank (empty on the other ranks).
  const std::vector<RankReport>& rank_reports() const { return reports_; }
  // Rank 0: placements that work but cost speed (a tensor-parallel group
  // spread over nodes), one sentence each.
  std::vector<std::string> PlacementWarnings() const;
  // Which rank holds what (from the manifest): layers, heads and vocabulary
  // rows per rank.
  const std::vector<proto::RankLayout>& layout() const { return layout_; }

  // Control-plane cost on the coordinator so far: steps broadcast, their
  // serialized plan bytes, and the time spent in those broadcasts (plan out)
  // and in receiving results.
  struct ControlStats {
    int64_t steps = 0;
    int64_t plan_bytes = 0;
    double broadcast_seconds = 0.0;
    double result_seconds = 0.0;
  };
  const ControlStats& control_stats() const { return control_stats_; }

  int64_t max_step_tokens() const override { return model_->max_step_tokens(); }
  int64_t max_step_seqs() const override { return model_->max_logit_rows(); }
  KvLayout kv_layout() const override { return kv_layout_; }

  // Coordinator only: runs one plan across the job (see StepExecutor). Any
  // failure once the plan is out ends the job.
  absl::Status Execute(const proto::StepPlan& plan,
                       proto::StepResult* result) override;

  // Coordinator only: tells every worker to leave ServeSteps().
  absl::Status Shutdown();

  // Workers: executes StepPlans until SHUTDOWN.
  absl::Status ServeSteps();

 private:
  ParallelJob() = default;
  // Ends the job from inside a step: once a plan is out, a failure on one rank
  // would leave the others blocked in a collective.
  [[noreturn]] void Fail(const absl::Status& status) const;
  // Collective: gathers every rank's RankReport on rank 0.
  absl::Status GatherReports(const MpiWorld& world, int64_t kv_cache_bytes);
  bool is_sampler() const;
  int sampler_rank() const;

  const MpiWorld* world_ = nullptr;
  int world_rank_ = 0;
  ProcessGrid grid_ = *ProcessGrid::Create(1, 1, 1);
  std::unique_ptr<ControlChannel> control_;
  GridComms comms_;
  // Declared before the communicators and the model that use it.
  Backend backend_;
  std::unique_ptr<Communicator> tp_comm_, pp_comm_;
  std::unique_ptr<LlamaModel> model_;
  double load_seconds_ = 0.0;
  std::vector<RankReport> reports_;
  std::vector<proto::RankLayout> layout_;
  ControlStats control_stats_;

  KvLayout kv_layout_;
  std::unique_ptr<StepRunner> runner_;
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_PARALLEL_JOB_H_
