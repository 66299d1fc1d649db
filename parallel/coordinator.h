// Coordinator: rank 0 of a tensor × pipeline parallel job, and RunJob, the
// rank loop every rank of an MPI job runs.
//
//   rank 0 (Coordinator): reads config.json, broadcasts the ModelManifest
//     (the RankSpec every rank builds from), sends every rank its weight
//     shard (or lets each read its own with --weights local), joins the job
//     as a Worker itself, then is the engine's StepExecutor: each step it
//     broadcasts the engine's StepPlan, runs its own stage, and receives the
//     sampled tokens in a StepResult from the last stage.
//   every other rank: a Worker (worker.h) that builds the same rank from the
//     manifest and serves steps until the coordinator broadcasts SHUTDOWN.
//
// Nothing here or in worker.h aborts: errors come back as Statuses marked as
// runtime/core/status.h says ("Error scope"), and RunJob alone decides how
// the job ends.
#ifndef TESSERA_PARALLEL_COORDINATOR_H_
#define TESSERA_PARALLEL_COORDINATOR_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/control_channel.h"
#include "parallel/mpi_world.h"
#include "parallel/process_grid.h"
#include "parallel/worker.h"
#include "proto/tessera.pb.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/rank.h"

namespace tessera {

class Coordinator final : public StepExecutor {
 public:
  // Rank 0's part of the job's start; every other rank is meanwhile in
  // RunJob's worker branch (the manifest's broadcast and Worker::Join are
  // collective). `spec` is rank 0's (from flags; its grid position is
  // ignored). Errors as Worker::Join's: unmarked when every rank sees them
  // alike (config.json missing, a model the grid cannot split), RankLocal
  // otherwise. `control` must outlive the coordinator.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const MpiWorld& world, ControlChannel* control, const RankSpec& spec);

  const ModelConfig& config() const override { return rank().config(); }
  AllocatorStats memory_stats() const override { return rank().memory_stats(); }
  // Rank 0's (rank_reports() has every rank's).
  MemoryBreakdown memory_breakdown() const override {
    return rank().memory_breakdown();
  }
  int64_t max_step_tokens() const override { return rank().max_step_tokens(); }
  int64_t max_step_seqs() const override { return rank().max_step_seqs(); }
  // Rank 0's backend is the sampling rank's kind (one device per job).
  int32_t max_top_logprobs() const override {
    return rank().max_top_logprobs();
  }
  KvLayout kv_layout() const override { return rank().kv_layout(); }
  // Rank 0's (every rank captures the same buckets).
  std::vector<int32_t> decode_graph_buckets() const override {
    return rank().decode_graph_buckets();
  }

  // Runs one plan across the job (see StepExecutor). Any failure once the
  // plan is out is RankLocal: the other ranks are in the step, so the rank
  // loop must end the job.
  absl::Status Execute(const proto::StepPlan& plan,
                       proto::StepResult* result) override;
  // False once this job's step ran past its deadline (fault_monitor.h).
  bool making_progress() const override;
  // A HEARTBEAT plan to every rank when none went out for a quarter of the
  // step timeout (fault_monitor.h). RankLocal errors, as Execute's.
  absl::Status Idle() override;

  // Op profiling of rank 0's own ops (its shard of the model; the other
  // ranks' ops are not timed): see StepExecutor.
  absl::Status SetOpProfiling(bool on) override {
    return rank().SetOpProfiling(on);
  }
  absl::StatusOr<std::vector<OpTimeTotal>> TakeOpProfile() override {
    return rank().TakeOpProfile();
  }
  std::string op_profile_scope() const override {
    return "rank 0's ops (its shard; the other ranks are not timed)";
  }

  // --trace: rank 0's forwards go to `ring`, and every other rank starts
  // recording its own (TRACE_START), which CollectRemoteTrace brings here.
  absl::Status SetTrace(TraceRing* ring) override;
  absl::StatusOr<std::vector<TraceEvent>> CollectRemoteTrace() override;
  int32_t trace_processes() const override { return grid().world_size(); }

  // Tells every worker to leave ServeSteps().
  absl::Status Shutdown();

  Rank& rank() const { return worker_->rank(); }
  const ProcessGrid& grid() const { return worker_->grid(); }
  double load_seconds() const { return load_seconds_; }
  // Every rank's report, by rank.
  const std::vector<RankReport>& rank_reports() const {
    return worker_->reports();
  }
  // Placements that work but cost speed (a tensor-parallel group spread over
  // nodes), one sentence each.
  std::vector<std::string> PlacementWarnings() const;
  // Which rank holds what (from the manifest): layers, heads and vocabulary
  // rows per rank.
  const std::vector<proto::RankLayout>& layout() const { return layout_; }

  // Control-plane cost so far: steps broadcast, their serialized plan bytes,
  // and the time spent in those broadcasts (plan out) and in receiving
  // results.
  struct ControlStats {
    int64_t steps = 0;
    int64_t plan_bytes = 0;
    double broadcast_seconds = 0.0;
    double result_seconds = 0.0;
  };
  const ControlStats& control_stats() const { return control_stats_; }

 private:
  Coordinator() = default;

  ControlChannel* control_ = nullptr;
  std::unique_ptr<Worker> worker_;
  double load_seconds_ = 0.0;
  std::vector<proto::RankLayout> layout_;
  ControlStats control_stats_;
  bool tracing_ = false;
  // The other ranks' event names, kept for the TraceEvents that point at them.
  std::deque<std::string> trace_strings_;
  // When the last plan (step or heartbeat) went out.
  std::chrono::steady_clock::time_point last_plan_ =
      std::chrono::steady_clock::now();
};

// The rank loop of an MPI job: every rank calls it once, after
// MpiWorld::Init. Rank 0 builds the Coordinator from `spec` and runs
// `command` over it, then shuts the workers down; every other rank joins as a
// Worker and serves steps until then. Returns the process's exit code.
//
// The one place that decides how a failure ends the job:
//   - an error every rank computed alike (unmarked, from the start: a config
//     or grid every rank read the same): rank 0 prints "tessera: <message>"
//     once and every rank returns 1; nobody aborts, nobody waits;
//   - a rank-local error (IsRankLocal: the device, the weights, a step, a
//     control message) ends the whole job at once through MpiWorld::Abort
//     ("tessera: rank R: <message>"), wherever the other ranks are blocked;
//   - `command`'s own unmarked error on rank 0 (a bad prompts file, a
//     server that cannot bind): the workers are between steps, so rank 0
//     shuts them down (they return 0), prints it and returns 1.
// `workers_ignore_signals`: SIGTERM/SIGINT are rank 0's to handle (a server
// drains, then shuts every rank down), so the other ranks ignore them.
int RunJob(const MpiWorld& world, const RankSpec& spec,
           const std::function<absl::Status(Coordinator&)>& command,
           bool workers_ignore_signals = false);

}  // namespace tessera

#endif  // TESSERA_PARALLEL_COORDINATOR_H_
