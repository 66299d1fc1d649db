#include "parallel/coordinator.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "parallel/fault_monitor.h"
#include "parallel/weight_transfer.h"
#include "runtime/core/device_wait.h"
#include "runtime/core/model_file.h"
#include "runtime/core/status.h"
#include "runtime/model/registry.h"
#include "runtime/model/safetensors.h"

namespace tessera {
namespace {

// Not a plain open(): a FIFO named config.json must be refused, not waited
// on (rank 0 reads these for every rank).
absl::StatusOr<std::string> ReadText(const std::string& path, bool required) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (!required) return std::string();
    return absl::NotFoundError(absl::StrCat(path, " not found"));
  }
  return ReadRegularFile(path, uint64_t{16} << 20);
}

// Rank 0 records which rank holds what, when the split is valid (an invalid one
// is reported by every rank alike right after the broadcast).
void DescribeLayout(proto::ModelManifest* m, int world_size) {
  absl::StatusOr<ModelConfig> config = RankConfig(SpecFromManifest(*m, 0));
  absl::StatusOr<ProcessGrid> grid = ProcessGrid::Create(
      world_size, m->tensor_parallel(), m->pipeline_parallel());
  if (!config.ok() || !grid.ok()) return;
  m->set_dtype(config->torch_dtype);
  for (int rank = 0; rank < world_size; ++rank) {
    const GridPosition p = grid->Position(rank);
    absl::StatusOr<ShardSpec> s =
        RankShard(SpecFromManifest(*m, rank), *config);
    if (!s.ok()) {
      m->clear_layout();
      return;
    }
    proto::RankLayout* l = m->add_layout();
    l->set_rank(rank);
    l->set_tp_rank(p.tp_rank);
    l->set_pp_stage(p.pp_stage);
    l->set_first_layer(s->first_layer);
    l->set_end_layer(s->end_layer);
    l->set_local_heads(s->local_heads);
    l->set_local_kv_heads(s->local_kv_heads);
    l->set_first_vocab_id(s->first_vocab_id);
    l->set_vocab_rows(s->vocab_per_rank);
  }
}

// The manifest every rank builds its rank from: rank 0's spec (resolved, so
// every rank parses the same names) and the config's text.
proto::ModelManifest MakeManifest(const RankSpec& given, int world_size) {
  proto::ModelManifest manifest;
  absl::StatusOr<RankSpec> resolved = ResolveRankSpec(given);
  if (!resolved.ok()) {
    manifest.set_error(std::string(resolved.status().message()));
    return manifest;
  }
  const RankSpec& spec = *resolved;
  manifest.set_model_dir(spec.model_dir);
  manifest.set_tensor_parallel(spec.tp);
  manifest.set_pipeline_parallel(spec.pp);
  for (int64_t n : spec.pp_layers) manifest.add_pp_layers(n);
  manifest.set_expert_parallel(spec.expert_parallel);
  proto::EngineSettings* e = manifest.mutable_engine();
  e->set_max_num_seqs(static_cast<int32_t>(spec.max_num_seqs));
  e->set_max_num_batched_tokens(spec.max_num_batched_tokens);
  e->set_block_size(spec.block_size);
  e->set_num_kv_blocks(spec.num_kv_blocks);
  e->set_kv_cache_memory(spec.kv_cache_memory);
  e->set_kv_cache_fraction(spec.kv_cache_fraction);
  e->set_kv_dtype(spec.kv_dtype);
  e->set_device(spec.device);
  e->set_gpus_per_node(spec.gpus_per_node);
  e->set_max_model_len(spec.max_model_len);
  e->set_weight_dtype(spec.weight_dtype);
  e->set_quantization(spec.quantization);
  e->set_attention(spec.attention);
  manifest.set_weights(
      spec.random_weights  ? proto::ModelManifest::WEIGHTS_RANDOM
      : spec.weights_local ? proto::ModelManifest::WEIGHTS_LOCAL
                           : proto::ModelManifest::WEIGHTS_FROM_RANK0);
  absl::StatusOr<std::string> config =
      ReadText(spec.model_dir + "/config.json", true);
  absl::StatusOr<std::string> gen =
      ReadText(spec.model_dir + "/generation_config.json", false);
  if (!config.ok()) {
    manifest.set_error(std::string(config.status().message()));
  } else {
    manifest.set_config_json(*config);
    if (gen.ok()) manifest.set_generation_config_json(*gen);
    DescribeLayout(&manifest, world_size);
  }
  return manifest;
}

// Rank 0 in WEIGHTS_FROM_RANK0 mode: reads every other rank's shard and sends
// it (weight_transfer.h), then reads its own. BuildRank calls Load once the
// communicators exist, while every other rank waits to receive its shard.
class SentWeights final : public WeightSource {
 public:
  SentWeights(ControlChannel* control, const proto::ModelManifest& manifest,
              int world_size)
      : control_(control), model_dir_(manifest.model_dir()) {
    absl::StatusOr<ModelConfig> config =
        RankConfig(SpecFromManifest(manifest, 0));
    if (!config.ok()) return;
    for (int rank = 1; rank < world_size; ++rank) {
      absl::StatusOr<ShardSpec> shard =
          RankShard(SpecFromManifest(manifest, rank), *config);
      if (!shard.ok()) return;
      theirs_.push_back(*shard);
    }
  }

  int64_t ProgressParts(const ModelConfig& config,
                        const ShardSpec& mine) const override {
    int64_t parts = WeightSource::ProgressParts(config, mine);
    for (const ShardSpec& s : theirs_) {
      parts += WeightSource::ProgressParts(config, s);
    }
    return parts;
  }

  absl::StatusOr<WeightSet> Load(const ModelConfig& config,
                                 const ShardSpec& mine,
                                 const WeightLoadOptions& options) override {
    ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                     Checkpoint::Open(model_dir_));
    for (size_t i = 0; i < theirs_.size(); ++i) {
      const int rank = static_cast<int>(i) + 1;
      ASSIGN_OR_RETURN(const WeightTable table,
                       ModelWeightTable(config, theirs_[i]));
      ControlChannel* control = control_;
      // Each chunk sent is progress (fault_monitor.h, "Startup").
      const absl::Status sent = SendShard(
          [control, rank](const proto::ShardChunk& chunk) -> absl::Status {
            RETURN_IF_ERROR(control->Send(chunk, rank, kShardTag));
            StartupProgress();
            return absl::OkStatus();
          },
          *ckpt, table, options.on_part);
      if (!sent.ok()) {
        return Annotate(sent,
                        absl::StrCat("sending rank ", rank, " its weights"));
      }
    }
    return LoadShardWeights(*ckpt, config, mine, options);
  }

 private:
  ControlChannel* control_;
  std::string model_dir_;
  std::vector<ShardSpec> theirs_;  // Ranks 1, 2, ...
};

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const MpiWorld& world, ControlChannel* control, const RankSpec& spec) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->control_ = control;
  proto::ModelManifest manifest = MakeManifest(spec, world.size());
  const absl::Status sent =
      control->Broadcast(&manifest, ProcessGrid::kCoordinatorRank);
  if (!sent.ok()) return RankLocal(sent);
  SentWeights weights(control, manifest, world.size());
  ASSIGN_OR_RETURN(c->worker_, Worker::Join(world, control, manifest, &weights,
                                            spec.show_progress));
  c->layout_.assign(manifest.layout().begin(), manifest.layout().end());
  c->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return c;
}

std::vector<std::string> Coordinator::PlacementWarnings() const {
  std::vector<std::string> warnings;
  const std::vector<RankReport>& reports = rank_reports();
  if (reports.empty()) return warnings;
  const ProcessGrid& g = grid();
  for (int stage = 0; stage < g.pp(); ++stage) {
    std::vector<int> nodes;
    std::vector<std::string> hosts;
    for (int t = 0; t < g.tp(); ++t) {
      const RankReport& r = reports[g.RankOf(stage, t)];
      if (std::find(nodes.begin(), nodes.end(), r.node) != nodes.end()) {
        continue;
      }
      nodes.push_back(r.node);
      hosts.push_back(absl::StrCat(r.host, " (node ", r.node, ")"));
    }
    if (nodes.size() > 1) {
      warnings.push_back(absl::StrCat(
          "the tensor-parallel group of pipeline stage ", stage, " (ranks ",
          g.RankOf(stage, 0), "-", g.RankOf(stage, g.tp() - 1), ") spans ",
          nodes.size(), " nodes: ", absl::StrJoin(hosts, ", "),
          "; every layer's all-reduce crosses the network. Keep a TP group on "
          "one node: consecutive ranks on a node (mpirun --map-by slot, srun "
          "--distribution=block) and --tp at most the GPUs per node"));
    }
  }
  return warnings;
}

absl::Status Coordinator::Execute(const proto::StepPlan& plan,
                                  proto::StepResult* result) {
  using Clock = std::chrono::steady_clock;
  // From here on every rank is in the step: any failure is this rank's and
  // ends the job (RankLocal).
  proto::StepPlan sent = plan;  // Broadcast needs a mutable message.
  FaultMonitor* monitor = FaultMonitor::Get();
  if (monitor != nullptr) {
    monitor->BeginStep(control_stats_.steps, PlanTokens(plan));
  }
  const auto b0 = Clock::now();
  absl::Status s = control_->Broadcast(&sent, ProcessGrid::kCoordinatorRank);
  const auto b1 = Clock::now();
  last_plan_ = b1;
  if (s.ok()) s = worker_->RunStep(sent, result);
  const auto r0 = Clock::now();
  if (s.ok() && !worker_->is_sampler()) {
    s = control_->Recv(worker_->sampler_rank(), kResultTag, result);
  }
  if (!s.ok()) return RankLocal(s);
  if (monitor != nullptr) monitor->EndStep();
  ++control_stats_.steps;
  control_stats_.plan_bytes += static_cast<int64_t>(sent.ByteSizeLong());
  control_stats_.broadcast_seconds +=
      std::chrono::duration<double>(b1 - b0).count();
  control_stats_.result_seconds +=
      std::chrono::duration<double>(Clock::now() - r0).count();
  return absl::OkStatus();
}

bool Coordinator::making_progress() const {
  const FaultMonitor* monitor = FaultMonitor::Get();
  return monitor == nullptr || !monitor->stalled();
}

absl::Status Coordinator::Idle() {
  const FaultMonitor* monitor = FaultMonitor::Get();
  if (monitor == nullptr || monitor->heartbeat_interval_seconds() <= 0) {
    return absl::OkStatus();
  }
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_plan_).count() <
      monitor->heartbeat_interval_seconds()) {
    return absl::OkStatus();
  }
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::HEARTBEAT);
  last_plan_ = now;
  return RankLocal(control_->Broadcast(&plan, ProcessGrid::kCoordinatorRank));
}

absl::Status Coordinator::SetTrace(TraceRing* ring) {
  rank().runner().set_trace(ring, ProcessGrid::kCoordinatorRank);
  if (ring == nullptr || tracing_ || grid().world_size() == 1) {
    return absl::OkStatus();
  }
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::TRACE_START);
  last_plan_ = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(
      RankLocal(control_->Broadcast(&plan, ProcessGrid::kCoordinatorRank)));
  tracing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TraceEvent>> Coordinator::CollectRemoteTrace() {
  std::vector<TraceEvent> events;
  if (!tracing_) return events;
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::TRACE_COLLECT);
  const int64_t sent_ns = TraceClockNs();
  last_plan_ = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(
      RankLocal(control_->Broadcast(&plan, ProcessGrid::kCoordinatorRank)));
  absl::flat_hash_map<std::string, const char*> interned;
  const auto intern = [&](const std::string& s) -> const char* {
    auto [it, inserted] = interned.emplace(s, nullptr);
    if (inserted) it->second = trace_strings_.emplace_back(s).c_str();
    return it->second;
  };
  for (int r = 0; r < grid().world_size(); ++r) {
    if (r == ProcessGrid::kCoordinatorRank) continue;
    proto::TraceEvents got;
    RETURN_IF_ERROR(RankLocal(control_->Recv(r, kTraceTag, &got)));
    // The rank stamped its clock as the broadcast arrived, about when this
    // rank sent it: the difference is the two clocks' offset (within the
    // broadcast's latency).
    const int64_t offset = got.clock_ns() - sent_ns;
    for (const proto::TraceEventProto& e : got.events()) {
      TraceEvent t;
      t.name = intern(e.name());
      t.category = intern(e.category());
      t.start_ns = e.start_ns() - offset;
      t.duration_ns = e.duration_ns();
      t.pid = e.pid();
      t.tid = e.tid();
      t.arg_name = e.arg_name().empty() ? nullptr : intern(e.arg_name());
      t.arg = e.arg();
      events.push_back(t);
    }
  }
  return events;
}

absl::Status Coordinator::Shutdown() {
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::SHUTDOWN);
  return RankLocal(control_->Broadcast(&plan, ProcessGrid::kCoordinatorRank));
}

int RunJob(const MpiWorld& world, const RankSpec& spec,
           const std::function<absl::Status(Coordinator&)>& command,
           bool workers_ignore_signals) {
  const bool is_coordinator = world.rank() == ProcessGrid::kCoordinatorRank;
  // Every failure of this rank ends here, in one of the ways the header
  // lists.
  std::unique_ptr<FaultMonitor> monitor;
  auto end = [&](const absl::Status& status) {
    // A stalled peer: the fault round names it (fault_monitor.h).
    if (monitor != nullptr && IsStallFault(status)) {
      monitor->EndJobAfterFault(status);
    }
    if (IsRankLocal(status)) world.Abort(1, status.message());
    if (is_coordinator) std::cerr << "tessera: " << status.message() << "\n";
    return 1;
  };
  absl::StatusOr<ControlChannel> control = ControlChannel::Create(world.comm());
  if (!control.ok()) return end(RankLocal(control.status()));
  // Every rank reads the same flags, so every rank has the same options.
  FaultMonitorOptions fault_options;
  fault_options.step_timeout_seconds = spec.step_timeout_seconds;
  fault_options.startup_timeout_seconds = spec.startup_timeout_seconds;
  fault_options.tp = std::max(1, spec.tp);
  absl::StatusOr<std::unique_ptr<FaultMonitor>> created =
      FaultMonitor::Create(world, fault_options);
  if (!created.ok()) return end(RankLocal(created.status()));
  monitor = *std::move(created);
  FaultMonitor::Install(monitor.get());
  // Device waits on this (the MPI) thread answer the fault round and the
  // step's deadline too (runtime/core/device_wait.h).
  ScopedDeviceWaitCheck device_waits(
      [m = monitor.get()](absl::FunctionRef<std::string()> what) {
        return m->Check(what);
      });
  // Startup has a progress-based deadline from here on (fault_monitor.h).
  monitor->BeginStartup(is_coordinator ? "broadcasting the manifest"
                                       : "waiting for the manifest");
  if (!is_coordinator) {
    proto::ModelManifest manifest;
    const absl::Status received =
        control->Broadcast(&manifest, ProcessGrid::kCoordinatorRank);
    if (!received.ok()) return end(RankLocal(received));
    absl::StatusOr<std::unique_ptr<Worker>> worker =
        Worker::Join(world, &*control, manifest, nullptr,
                     /*show_progress=*/false);
    if (!worker.ok()) return end(worker.status());
    if (workers_ignore_signals) {
      std::signal(SIGTERM, SIG_IGN);
      std::signal(SIGINT, SIG_IGN);
    }
    // Every error of the step loop is this rank's (ServeSteps marks them).
    const absl::Status served = (*worker)->ServeSteps();
    if (!served.ok()) return end(RankLocal(served));
    return 0;
  }
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(world, &*control, spec);
  if (!coordinator.ok()) return end(coordinator.status());
  // Rank 0's startup ends here; the workers' wait for the first plan keeps
  // its limit.
  monitor->EndStartup();
  const absl::Status status = command(**coordinator);
  // A failed step left the other ranks inside it: only an abort ends them.
  if (IsRankLocal(status)) return end(status);
  const absl::Status shutdown = (*coordinator)->Shutdown();
  if (!shutdown.ok()) return end(shutdown);
  if (!status.ok()) return end(status);
  return 0;
}

}  // namespace tessera
