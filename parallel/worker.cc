#include "parallel/worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "parallel/fault_monitor.h"
#include "parallel/tensor_comms.h"
#include "parallel/weight_transfer.h"
#include "runtime/core/status.h"
#include "runtime/model/registry.h"

namespace tessera {

int64_t PlanTokens(const proto::StepPlan& plan) {
  int64_t tokens = 0;
  for (const proto::SequenceStep& step : plan.seqs()) {
    tokens += step.tokens_size();
  }
  return tokens;
}
namespace {

// A rank that receives its shard from rank 0 (WEIGHTS_FROM_RANK0).
class ReceivedWeights final : public WeightSource {
 public:
  explicit ReceivedWeights(ControlChannel* control) : control_(control) {}

  absl::StatusOr<WeightSet> Load(const ModelConfig& config,
                                 const ShardSpec& shard,
                                 const WeightLoadOptions& options) override {
    ASSIGN_OR_RETURN(WeightTable table, ModelWeightTable(config, shard));
    ControlChannel* control = control_;
    // Each chunk is progress (fault_monitor.h, "Startup").
    return ReceiveShard(
        [control](proto::ShardChunk* chunk) -> absl::Status {
          RETURN_IF_ERROR(
              control->Recv(ProcessGrid::kCoordinatorRank, kShardTag, chunk));
          StartupProgress();
          return absl::OkStatus();
        },
        std::move(table), options.device, options.matrix_dtype);
  }

 private:
  ControlChannel* control_;
};

// Any source, with startup's progress (fault_monitor.h) after each part and
// the test-only load delay: TESSERA_TEST_LOAD_DELAY_MS=N sleeps N ms after
// each part this rank loads or sends (tests/mpi_fault_matrix_test.sh uses it
// to catch a job while it loads; never set it otherwise).
class ProgressWeights final : public WeightSource {
 public:
  ProgressWeights(WeightSource* inner, std::string phase, int rank)
      : inner_(inner), phase_(std::move(phase)), rank_(rank) {
    const char* delay = std::getenv("TESSERA_TEST_LOAD_DELAY_MS");
    int parsed = 0;
    if (delay != nullptr && absl::SimpleAtoi(delay, &parsed)) {
      delay_ms_ = std::clamp(parsed, 0, 60000);
    }
  }

  std::string ProgressLabel() const override { return inner_->ProgressLabel(); }
  int64_t ProgressParts(const ModelConfig& config,
                        const ShardSpec& shard) const override {
    return inner_->ProgressParts(config, shard);
  }

  absl::StatusOr<WeightSet> Load(const ModelConfig& config,
                                 const ShardSpec& shard,
                                 const WeightLoadOptions& options) override {
    StartupPhase(phase_);
    WeightLoadOptions wrapped = options;
    wrapped.on_part = [this, &options] {
      if (options.on_part) options.on_part();
      if (delay_ms_ > 0) {
        if (!announced_) {
          announced_ = true;
          const std::string line = absl::StrCat(
              "tessera: test hook: rank ", rank_, " sleeps ", delay_ms_,
              " ms after each weight part (TESSERA_TEST_LOAD_DELAY_MS)\n");
          std::fwrite(line.data(), 1, line.size(), stderr);
          std::fflush(stderr);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
      }
      StartupProgress();
    };
    wrapped.on_tensor = [&options] {
      if (options.on_tensor) options.on_tensor();
      StartupProgress();
    };
    return inner_->Load(config, shard, wrapped);
  }

 private:
  WeightSource* inner_;
  std::string phase_;
  int rank_;
  int delay_ms_ = 0;
  bool announced_ = false;
};

}  // namespace

RankSpec SpecFromManifest(const proto::ModelManifest& m, int rank) {
  RankSpec spec;
  spec.model_dir = m.model_dir();
  spec.config_json = m.config_json();
  spec.generation_config_json = m.generation_config_json();
  spec.tp = m.tensor_parallel();
  spec.pp = m.pipeline_parallel();
  if (spec.tp > 0) {
    spec.tp_rank = rank % spec.tp;
    spec.pp_stage = rank / spec.tp;
  }
  spec.pp_layers.assign(m.pp_layers().begin(), m.pp_layers().end());
  spec.expert_parallel = m.expert_parallel();
  spec.weights_local = m.weights() == proto::ModelManifest::WEIGHTS_LOCAL;
  spec.random_weights = m.weights() == proto::ModelManifest::WEIGHTS_RANDOM;
  const proto::EngineSettings& e = m.engine();
  spec.device = e.device().empty() ? "cpu" : e.device();
  spec.gpus_per_node = e.gpus_per_node();
  spec.max_num_seqs = e.max_num_seqs();
  spec.max_num_batched_tokens = e.max_num_batched_tokens();
  spec.block_size = e.block_size();
  spec.num_kv_blocks = e.num_kv_blocks();
  spec.kv_cache_memory = e.kv_cache_memory();
  spec.kv_cache_fraction = e.kv_cache_fraction();
  spec.kv_dtype = e.kv_dtype();
  spec.attention = e.attention();
  spec.weight_dtype = e.weight_dtype();
  spec.max_model_len = e.max_model_len();
  spec.quantization = e.quantization();
  return spec;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Join(
    const MpiWorld& world, ControlChannel* control,
    const proto::ModelManifest& manifest, WeightSource* rank0_weights,
    bool show_progress) {
  if (!manifest.error().empty()) return absl::NotFoundError(manifest.error());
  std::unique_ptr<Worker> worker(new Worker());
  worker->control_ = control;
  worker->world_rank_ = world.rank();

  // Everything below until the device is computed identically on every rank
  // from the same manifest, so an error here is the same everywhere.
  ASSIGN_OR_RETURN(worker->grid_,
                   ProcessGrid::Create(world.size(), manifest.tensor_parallel(),
                                       manifest.pipeline_parallel()));
  RankSpec spec = SpecFromManifest(manifest, world.rank());
  spec.local_rank = world.local_rank();
  spec.show_progress = show_progress;
  ASSIGN_OR_RETURN(const ModelConfig config, RankConfig(spec));
  ASSIGN_OR_RETURN(const ShardSpec shard, RankShard(spec, config));
  if (manifest.layout_size() != world.size() ||
      manifest.layout(world.rank()).first_layer() != shard.first_layer ||
      manifest.layout(world.rank()).end_layer() != shard.end_layer ||
      manifest.layout(world.rank()).local_heads() != shard.local_heads) {
    return RankLocal(absl::InternalError(
        absl::StrCat("rank ", world.rank(),
                     " computed a shard that differs from rank 0's layout")));
  }

  // From here on a failure is this rank's alone. MPI_Comm_split blocks, and
  // has no nonblocking form: a polled barrier first, so that a rank that
  // never arrives is found (fault_monitor.h).
  StartupPhase("splitting the grid's communicators");
  const absl::Status arrived = PolledBarrier(world.comm().get(), [] {
    return std::string("the barrier before splitting the grid");
  });
  if (!arrived.ok()) return RankLocal(arrived);
  absl::StatusOr<GridComms> groups = SplitGrid(worker->grid_, world.rank());
  if (!groups.ok()) return RankLocal(groups.status());
  worker->groups_ = *std::move(groups);
  if (spec.device == "cuda") {
    // NCCL refuses two ranks of one communicator on one GPU ("invalid
    // usage"), so a node needs a GPU per rank: say so before NCCL does.
    const int gpus =
        spec.gpus_per_node > 0 ? spec.gpus_per_node : VisibleCudaDevices();
    if (gpus > 0 && world.local_size() > gpus) {
      return RankLocal(absl::FailedPreconditionError(absl::StrCat(
          "host ", world.host_name(), " runs ", world.local_size(),
          " ranks of this job but ",
          spec.gpus_per_node > 0
              ? absl::StrCat("--gpus-per-node is ", gpus)
              : absl::StrCat("only ", gpus, " GPUs are visible"),
          ": each rank needs its own GPU (run at most that many tasks per "
          "node)")));
    }
  }

  // Weights: rank 0's progress bar counts what it reads — every shard when it
  // sends them, its own when each rank reads its own.
  std::unique_ptr<WeightSource> own;
  WeightSource* weights = nullptr;
  if (spec.random_weights) {
    own = RandomWeights();
    weights = own.get();
  } else if (spec.weights_local) {
    own = CheckpointWeights(spec.model_dir, "loading weights (rank 0's shard)");
    weights = own.get();
  } else if (world.rank() == ProcessGrid::kCoordinatorRank) {
    weights = rank0_weights;
  } else {
    own = std::make_unique<ReceivedWeights>(control);
    weights = own.get();
  }
  if (weights == nullptr) {
    return RankLocal(absl::InternalError(
        "rank 0 joined a job that sends weights without a source for them"));
  }
  ProgressWeights progress(weights,
                           spec.random_weights  ? "making random weights"
                           : spec.weights_local ? "reading this rank's weights"
                           : world.rank() == ProcessGrid::kCoordinatorRank
                               ? "sending every rank its weights"
                               : "receiving weights from rank 0",
                           world.rank());

  RankContext context;
  // CPU ranks of one node share its memory for their KV pools.
  context.host_memory_sharers = world.local_size();
  GridComms* grid_comms = &worker->groups_;
  context.connect =
      [grid_comms](const Backend& backend) -> absl::StatusOr<RankComms> {
    // Tensor traffic: NCCL on a GPU, MPI collectives on the CPU.
    StartupPhase("connecting the tensor communicators");
    ASSIGN_OR_RETURN(TensorComms comms, CreateTensorComms(grid_comms, backend));
    RankComms rank_comms;
    rank_comms.tp = std::move(comms.tp);
    rank_comms.pp = std::move(comms.pp);
    return rank_comms;
  };
  const MpiComm* world_comm = &world.comm();
  context.agree_kv_blocks =
      [world_comm](int64_t blocks) -> absl::StatusOr<int64_t> {
    // The slowest rank's load ends here: a polled wait (fault_monitor.h).
    StartupPhase("agreeing on the KV block count");
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, &blocks, 1, MPI_INT64_T,
                                  MPI_MIN, world_comm->get(), &request);
    if (rc != MPI_SUCCESS) {
      return MpiError(rc, "MPI_Iallreduce", "agreeing on the KV block count");
    }
    RETURN_IF_ERROR(WaitRequest(&request, nullptr, [] {
      return std::string("agreeing on the KV block count (MPI_Iallreduce)");
    }));
    return blocks;
  };
  ASSIGN_OR_RETURN(worker->rank_, BuildRank(spec, progress, context));
  const absl::Status gathered = worker->GatherReports(world);
  if (!gathered.ok()) return RankLocal(gathered);
  return worker;
}

absl::Status Worker::GatherReports(const MpiWorld& world) {
  // Fixed-size records, so one MPI_Gather of bytes carries them.
  struct Wire {
    char host[MPI_MAX_PROCESSOR_NAME];
    int32_t node_leader, local_rank, local_size, gpu;
    int64_t weight_bytes, kv_cache_bytes;
    int64_t workspace_bytes, graphs_bytes;
  };
  Wire mine = {};
  world.host_name().copy(mine.host, sizeof(mine.host) - 1);
  mine.node_leader = world.node_leader();
  mine.local_rank = world.local_rank();
  mine.local_size = world.local_size();
  mine.gpu = rank_->gpu();
  mine.weight_bytes = rank_->weight_bytes();
  mine.kv_cache_bytes = rank_->kv_cache_bytes();
  mine.workspace_bytes = rank_->memory_breakdown().workspace_bytes;
  mine.graphs_bytes = rank_->memory_breakdown().graphs_bytes;
  const bool root = world_rank_ == ProcessGrid::kCoordinatorRank;
  std::vector<Wire> all(root ? world.size() : 0);
  StartupPhase("collecting each rank's placement");
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Igather(
      &mine, sizeof(Wire), MPI_BYTE, all.data(), sizeof(Wire), MPI_BYTE,
      ProcessGrid::kCoordinatorRank, world.comm().get(), &request);
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Igather", "collecting each rank's placement");
  }
  RETURN_IF_ERROR(WaitRequest(&request, nullptr, [] {
    return std::string("collecting each rank's placement (MPI_Igather)");
  }));
  std::vector<int> leaders;  // Node index = position of its leader here.
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const Wire& w = all[r];
    auto it = std::find(leaders.begin(), leaders.end(), w.node_leader);
    if (it == leaders.end()) it = leaders.insert(leaders.end(), w.node_leader);
    RankReport report;
    report.rank = r;
    report.host = std::string(w.host, strnlen(w.host, sizeof(w.host)));
    report.node = static_cast<int>(it - leaders.begin());
    report.local_rank = w.local_rank;
    report.local_size = w.local_size;
    report.gpu = w.gpu;
    report.weight_bytes = w.weight_bytes;
    report.kv_cache_bytes = w.kv_cache_bytes;
    report.memory = {w.weight_bytes, w.workspace_bytes, w.graphs_bytes,
                     w.kv_cache_bytes};
    reports_.push_back(std::move(report));
  }
  return absl::OkStatus();
}

absl::Status Worker::RunStep(const proto::StepPlan& plan,
                             proto::StepResult* result) {
  absl::Status s = rank_->runner().Run(plan, result);
  if (s.ok() && is_sampler() && world_rank_ != ProcessGrid::kCoordinatorRank) {
    s = control_->Send(*result, ProcessGrid::kCoordinatorRank, kResultTag);
  }
  return RankLocal(s);
}

absl::Status Worker::ServeSteps() {
  proto::StepPlan plan;
  proto::StepResult result;
  FaultMonitor* monitor = FaultMonitor::Get();
  for (int64_t step = 0;; ++step) {
    // From the first plan on, rank 0 sends a plan (a step or, while idle, a
    // HEARTBEAT) at least every quarter of the step timeout, so a wait for
    // the next one that outlasts the limit means rank 0 is stalled. The first
    // is startup's last wait (its limit, from the last progress). Every wait
    // answers a fault round (fault_monitor.h).
    if (monitor != nullptr) {
      if (step > 0) {
        monitor->BeginWaitForPlan(step);
      } else {
        monitor->BeginStartup("waiting for the first plan");
      }
    }
    const absl::Status received =
        control_->Broadcast(&plan, ProcessGrid::kCoordinatorRank);
    if (!received.ok()) return RankLocal(received);
    if (monitor != nullptr) monitor->EndStep();
    if (plan.kind() == proto::StepPlan::SHUTDOWN) return absl::OkStatus();
    if (plan.kind() == proto::StepPlan::HEARTBEAT) continue;
    if (plan.kind() == proto::StepPlan::TRACE_START) {
      if (trace_ == nullptr) trace_ = std::make_unique<TraceRing>(kTraceEvents);
      rank_->runner().set_trace(trace_.get(), world_rank_);
      continue;
    }
    if (plan.kind() == proto::StepPlan::TRACE_COLLECT) {
      proto::TraceEvents events;
      // The clock just after the collection's broadcast arrived: rank 0
      // aligns this rank's times with it.
      events.set_clock_ns(TraceClockNs());
      if (trace_ != nullptr) {
        for (const TraceEvent& e : trace_->Snapshot()) {
          proto::TraceEventProto* out = events.add_events();
          out->set_name(e.name != nullptr ? e.name : "");
          out->set_category(e.category != nullptr ? e.category : "");
          out->set_start_ns(e.start_ns);
          out->set_duration_ns(e.duration_ns);
          out->set_pid(e.pid);
          out->set_tid(e.tid);
          if (e.arg_name != nullptr) out->set_arg_name(e.arg_name);
          out->set_arg(e.arg);
        }
      }
      RETURN_IF_ERROR(RankLocal(
          control_->Send(events, ProcessGrid::kCoordinatorRank, kTraceTag)));
      continue;
    }
    if (monitor != nullptr) monitor->BeginStep(step, PlanTokens(plan));
    RETURN_IF_ERROR(RunStep(plan, &result));
    if (monitor != nullptr) monitor->EndStep();
  }
}

}  // namespace tessera
