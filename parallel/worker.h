// Worker: every rank's part of a tensor × pipeline parallel job, rank 0's
// included. From the ModelManifest rank 0 broadcast it builds the rank
// (runtime/executor/rank.h, BuildRank) with what parallel/ provides — the TP
// and PP communicators (tensor_comms), the weights (received from rank 0,
// sent by rank 0's own WeightSource, read from the rank's own slice with
// --weights local, or made up from the config by every rank itself with
// --random-weights), the KV block count every rank agrees on (the smallest,
// MPI_MIN) — gathers each rank's placement on rank 0, and runs its stage of
// each step. On every rank but 0, ServeSteps() is the loop until SHUTDOWN.
//
// Which rank samples: tp-rank 0 of the last pipeline stage (it holds the full
// logits after the vocabulary-parallel gather); it sends the StepResult to
// rank 0 unless it is rank 0.
//
// Errors follow runtime/core/status.h ("Error scope"): what every rank
// computes alike from the manifest (the grid, the config, the split) comes
// back unmarked; everything this rank does alone (the device, the weights, a
// step) comes back RankLocal. Nothing here aborts: the rank loop
// (coordinator.h, RunJob) decides.
#ifndef TESSERA_PARALLEL_WORKER_H_
#define TESSERA_PARALLEL_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/control_channel.h"
#include "parallel/mpi_world.h"
#include "parallel/process_grid.h"
#include "proto/tessera.pb.h"
#include "runtime/core/trace_ring.h"
#include "runtime/executor/rank.h"

namespace tessera {

// The tokens a step plan computes (every sequence's new tokens): what scales
// the step's deadline (fault_monitor.h).
int64_t PlanTokens(const proto::StepPlan& plan);

// The control-channel tag of StepResults (ShardChunks use kShardTag,
// weight_transfer.h).
inline constexpr int kResultTag = 11;
// A rank's TraceEvents for rank 0 (TRACE_COLLECT).
inline constexpr int kTraceTag = 12;

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
  MemoryBreakdown memory;  // Rank::memory_breakdown().
};

// The RankSpec the manifest describes, for world rank `rank` (its place in
// the grid filled in; local_rank is the caller's). Rank 0 wrote it from its
// own spec (coordinator.cc), so every rank reads the same values.
RankSpec SpecFromManifest(const proto::ModelManifest& manifest, int rank);

class Worker {
 public:
  // Collective over the world, after the manifest's broadcast (every rank
  // calls it with the same manifest). `rank0_weights`: on rank 0 when it
  // sends every rank its shard, the source that does so (coordinator.cc);
  // null elsewhere. `show_progress`: this rank draws the loading bar.
  static absl::StatusOr<std::unique_ptr<Worker>> Join(
      const MpiWorld& world, ControlChannel* control,
      const proto::ModelManifest& manifest, WeightSource* rank0_weights,
      bool show_progress);

  Rank& rank() const { return *rank_; }
  const ProcessGrid& grid() const { return grid_; }
  int world_rank() const { return world_rank_; }
  int sampler_rank() const { return grid_.RankOf(grid_.pp() - 1, 0); }
  bool is_sampler() const { return world_rank_ == sampler_rank(); }
  // Rank 0: every rank's report, by rank (empty on the other ranks).
  const std::vector<RankReport>& reports() const { return reports_; }

  // Runs this rank's stage of a plan every rank has; the sampler's result
  // goes to `result` (and to rank 0, when the sampler is another rank). Every
  // error is RankLocal: the other ranks are in the same step.
  absl::Status RunStep(const proto::StepPlan& plan, proto::StepResult* result);

  // Ranks other than 0: receives and runs StepPlans until SHUTDOWN. Every
  // error is RankLocal.
  absl::Status ServeSteps();

 private:
  Worker() = default;
  // Collective: gathers every rank's RankReport on rank 0.
  absl::Status GatherReports(const MpiWorld& world);

  ControlChannel* control_ = nullptr;
  int world_rank_ = 0;
  ProcessGrid grid_ = *ProcessGrid::Create(1, 1, 1);
  // The TP and PP groups; declared before the rank whose communicators use
  // them.
  GridComms groups_;
  std::unique_ptr<Rank> rank_;
  std::vector<RankReport> reports_;
  // Ranks other than 0, from TRACE_START on: this rank's forwards.
  std::unique_ptr<TraceRing> trace_;
};

}  // namespace tessera

#endif  // TESSERA_PARALLEL_WORKER_H_
