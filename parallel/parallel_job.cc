#include "parallel/parallel_job.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "parallel/tensor_comms.h"
#include "parallel/weight_transfer.h"
#include "runtime/core/progress_bar.h"
#include "runtime/core/status.h"
#include "runtime/model/safetensors.h"

namespace tessera {
namespace {

// The control-channel tag of StepResults (ShardChunks use kShardTag,
// weight_transfer.h).
constexpr int kResultTag = 11;

absl::StatusOr<std::string> ReadText(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!required) return std::string();
    return absl::NotFoundError(absl::StrCat(path, " not found"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The same config on every rank: parsed from the text rank 0 broadcast, with
// the generation config's eos ids merged as LoadModelConfig does.
absl::StatusOr<ModelConfig> ConfigFromManifest(const proto::ModelManifest& m) {
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(m.config_json()));
  if (!m.generation_config_json().empty()) {
    const absl::Status merged =
        MergeGenerationConfig(m.generation_config_json(), &config);
    if (!merged.ok()) return Annotate(merged, "generation_config.json");
  }
  return config;
}

ShardSpec ShardOf(const ModelConfig& config, const ProcessGrid& grid,
                  const std::vector<int64_t>& pp_layers, int rank) {
  const GridPosition p = grid.Position(rank);
  return *MakeShardSpec(config, p.tp_rank, grid.tp(), p.pp_stage, grid.pp(),
                        pp_layers);
}

// Rank 0 records which rank holds what, when the split is valid (an invalid one
// is reported by every rank alike right after the broadcast).
void DescribeLayout(proto::ModelManifest* m, int world_size) {
  absl::StatusOr<ModelConfig> config = ConfigFromManifest(*m);
  absl::StatusOr<ProcessGrid> grid = ProcessGrid::Create(
      world_size, m->tensor_parallel(), m->pipeline_parallel());
  if (!config.ok() || !grid.ok()) return;
  m->set_dtype(config->torch_dtype);
  const std::vector<int64_t> pp_layers(m->pp_layers().begin(),
                                       m->pp_layers().end());
  for (int rank = 0; rank < world_size; ++rank) {
    const GridPosition p = grid->Position(rank);
    absl::StatusOr<ShardSpec> s = MakeShardSpec(
        *config, p.tp_rank, grid->tp(), p.pp_stage, grid->pp(), pp_layers);
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

}  // namespace

ParallelJob::~ParallelJob() = default;

absl::StatusOr<std::unique_ptr<ParallelJob>> ParallelJob::Create(
    const MpiWorld& world, const std::string& model_dir,
    const ParallelOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<ParallelJob> job(new ParallelJob());
  job->world_ = &world;
  job->world_rank_ = world.rank();
  ASSIGN_OR_RETURN(ControlChannel control,
                   ControlChannel::Create(world.comm()));
  job->control_ = std::make_unique<ControlChannel>(std::move(control));

  // Rank 0 reads the config once; everyone parses the same text.
  proto::ModelManifest manifest;
  if (job->is_coordinator()) {
    manifest.set_model_dir(model_dir);
    manifest.set_tensor_parallel(options.tp);
    manifest.set_pipeline_parallel(options.pp);
    for (int64_t n : options.pp_layers) manifest.add_pp_layers(n);
    proto::EngineSettings* e = manifest.mutable_engine();
    e->set_max_num_seqs(options.max_num_seqs);
    e->set_max_num_batched_tokens(options.max_num_batched_tokens);
    e->set_block_size(options.kv.block_size);
    e->set_num_kv_blocks(options.kv.num_blocks);
    e->set_kv_cache_memory(options.kv.memory_bytes);
    e->set_kv_cache_fraction(options.kv.memory_fraction);
    e->set_kv_dtype(options.kv.dtype == DType::kI8     ? "int8"
                    : options.kv.dtype == DType::kBF16 ? "bfloat16"
                                                       : "float32");
    e->set_device(options.device);
    e->set_gpus_per_node(options.gpus_per_node);
    e->set_max_model_len(options.max_model_len);
    e->set_weight_dtype(options.weight_dtype == DType::kBF16 ? "bfloat16"
                                                             : "float32");
    e->set_attention(options.kv.backend == AttentionBackend::kStatic ? "static"
                                                                     : "paged");
    manifest.set_weights(options.weights_local
                             ? proto::ModelManifest::WEIGHTS_LOCAL
                             : proto::ModelManifest::WEIGHTS_FROM_RANK0);
    absl::StatusOr<std::string> config =
        ReadText(model_dir + "/config.json", true);
    absl::StatusOr<std::string> gen =
        ReadText(model_dir + "/generation_config.json", false);
    if (!config.ok()) {
      manifest.set_error(std::string(config.status().message()));
    } else {
      manifest.set_config_json(*config);
      if (gen.ok()) manifest.set_generation_config_json(*gen);
      DescribeLayout(&manifest, world.size());
    }
  }
  RETURN_IF_ERROR(job->control_->Broadcast(&manifest, 0));
  if (!manifest.error().empty()) return absl::NotFoundError(manifest.error());

  // Everything below until the weights is computed identically on every rank,
  // so an error here is the same everywhere and nobody waits for anybody.
  ASSIGN_OR_RETURN(job->grid_,
                   ProcessGrid::Create(world.size(), manifest.tensor_parallel(),
                                       manifest.pipeline_parallel()));
  ASSIGN_OR_RETURN(ModelConfig config, ConfigFromManifest(manifest));
  // --max-model-len: every rank sizes its KV pool and checks positions by it.
  RETURN_IF_ERROR(LimitContext(manifest.engine().max_model_len(), &config));
  const std::vector<int64_t> pp_layers(manifest.pp_layers().begin(),
                                       manifest.pp_layers().end());
  const GridPosition me = job->grid_.Position(world.rank());
  ASSIGN_OR_RETURN(ShardSpec shard,
                   MakeShardSpec(config, me.tp_rank, job->grid_.tp(),
                                 me.pp_stage, job->grid_.pp(), pp_layers));
  if (manifest.layout_size() != world.size() ||
      manifest.layout(world.rank()).first_layer() != shard.first_layer ||
      manifest.layout(world.rank()).end_layer() != shard.end_layer ||
      manifest.layout(world.rank()).local_heads() != shard.local_heads) {
    job->Fail(absl::InternalError(
        absl::StrCat("rank ", world.rank(),
                     " computed a shard that differs from rank 0's layout")));
  }
  job->layout_.assign(manifest.layout().begin(), manifest.layout().end());
  ASSIGN_OR_RETURN(job->comms_, SplitGrid(job->grid_, world.rank()));
  // The device: a failure here (no GPU on this host) is this rank's alone.
  const proto::EngineSettings& settings = manifest.engine();
  const std::string device =
      settings.device().empty() ? "cpu" : settings.device();
  if (device == "cuda") {
    // NCCL refuses two ranks of one communicator on one GPU ("invalid
    // usage"), so a node needs a GPU per rank: say so before NCCL does.
    const int gpus = settings.gpus_per_node() > 0 ? settings.gpus_per_node()
                                                  : VisibleCudaDevices();
    if (gpus > 0 && world.local_size() > gpus) {
      job->Fail(absl::FailedPreconditionError(absl::StrCat(
          "host ", world.host_name(), " runs ", world.local_size(),
          " ranks of this job but ",
          settings.gpus_per_node() > 0
              ? absl::StrCat("--gpus-per-node is ", gpus)
              : absl::StrCat("only ", gpus, " GPUs are visible"),
          ": each rank needs its own GPU (run at most that many tasks per "
          "node)")));
    }
  }
  absl::StatusOr<Backend> device_backend =
      CreateBackend(device, world.local_rank(), settings.gpus_per_node());
  if (!device_backend.ok()) job->Fail(device_backend.status());
  job->backend_ = *std::move(device_backend);
  // Tensor traffic: NCCL on a GPU, MPI collectives on the CPU. A failure
  // here leaves the other ranks in the collective: it ends the job.
  absl::StatusOr<TensorComms> comms =
      CreateTensorComms(&job->comms_, job->backend_);
  if (!comms.ok()) job->Fail(comms.status());
  job->tp_comm_ = std::move(comms->tp);
  job->pp_comm_ = std::move(comms->pp);

  // Weights: a failure here is this rank's alone, and the others are already
  // waiting on it.
  // Rank 0's progress bar counts what it reads: every shard when it sends
  // them, its own when each rank reads its own.
  const bool local_weights =
      manifest.weights() == proto::ModelManifest::WEIGHTS_LOCAL;
  int64_t parts = LlamaWeightParts(shard);
  if (!local_weights) {
    for (int rank = 1; rank < world.size(); ++rank) {
      parts += LlamaWeightParts(ShardOf(config, job->grid_, pp_layers, rank));
    }
  }
  ProgressBar bar(
      local_weights ? "loading weights (rank 0's shard)" : "loading weights",
      parts, job->is_coordinator() && options.show_progress ? stderr : nullptr,
      isatty(STDERR_FILENO));
  const std::function<void()> advance = [&bar] { bar.Advance(); };
  absl::StatusOr<LlamaWeights> weights;
  if (local_weights) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt =
        Checkpoint::Open(manifest.model_dir());
    weights = ckpt.ok() ? LoadLlamaWeights(**ckpt, config, shard, advance)
                        : ckpt.status();
  } else if (job->is_coordinator()) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt =
        Checkpoint::Open(manifest.model_dir());
    if (!ckpt.ok()) job->Fail(ckpt.status());
    for (int rank = 1; rank < world.size(); ++rank) {
      absl::StatusOr<LlamaWeights> theirs = LoadLlamaWeights(
          **ckpt, config, ShardOf(config, job->grid_, pp_layers, rank),
          advance);
      if (!theirs.ok()) job->Fail(theirs.status());
      const absl::Status sent = SendShard(*job->control_, *theirs, rank);
      if (!sent.ok())
        job->Fail(Annotate(
            sent, absl::StrCat("sending rank ", rank, " its weights")));
    }
    weights = LoadLlamaWeights(**ckpt, config, shard, advance);
  } else {
    weights = AllocateLlamaWeights(config, shard);
    if (weights.ok()) {
      const absl::Status received = ReceiveShard(*job->control_, *weights);
      if (!received.ok()) weights = received;
    }
  }
  if (!weights.ok()) {
    job->Fail(Annotate(
        weights.status(),
        absl::StrCat("loading weights from ",
                     model_dir.empty() ? manifest.model_dir() : model_dir)));
  }
  bar.Finish();
  const proto::EngineSettings& e = manifest.engine();
  Ops* ops = job->backend_.ops.get();
  if (job->backend_.is_cuda()) {
    const DType matrices =
        e.weight_dtype() == "bfloat16" ? DType::kBF16 : DType::kF32;
    const absl::Status uploaded = UploadLlamaWeights(&*weights, ops, matrices);
    if (!uploaded.ok()) job->Fail(uploaded);
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(
      config, shard, *std::move(weights), ops, job->tp_comm_.get(),
      job->pp_comm_.get(), e.max_num_batched_tokens(), e.max_num_seqs(),
      job->backend_.allocator.get());
  if (!model.ok()) job->Fail(model.status());
  job->model_ = *std::move(model);

  // The KV pool: each rank sizes it against its own memory, and every rank
  // takes the smallest count so that block ids mean the same everywhere.
  KvCacheOptions kv;
  kv.block_size = e.block_size();
  kv.num_blocks = e.num_kv_blocks();
  kv.memory_bytes = e.kv_cache_memory();
  kv.memory_fraction = e.kv_cache_fraction();
  absl::StatusOr<DType> kv_dtype = ParseKvDType(e.kv_dtype());
  absl::StatusOr<AttentionBackend> backend =
      ParseAttentionBackend(e.attention());
  if (!kv_dtype.ok()) job->Fail(kv_dtype.status());
  if (!backend.ok()) job->Fail(backend.status());
  kv.dtype = *kv_dtype;
  kv.backend = *backend;
  const KvPoolShape pool_shape = job->model_->kv_pool_shape(kv.dtype);
  absl::StatusOr<KvLayout> layout = ResolveKvLayout(
      kv, pool_shape, config.max_position_embeddings, e.max_num_seqs(),
      job->backend_.is_cuda() ? job->backend_.FreeDeviceBytes()
                              : AvailableHostMemory());
  if (!layout.ok()) job->Fail(layout.status());
  int64_t blocks = layout->num_blocks;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &blocks, 1, MPI_INT64_T, MPI_MIN,
                               world.comm().get());
  if (rc != MPI_SUCCESS) {
    job->Fail(MpiError(rc, "MPI_Allreduce", "agreeing on the KV block count"));
  }
  job->kv_layout_ = *layout;
  job->kv_layout_.num_blocks = blocks;
  absl::StatusOr<KvPool> pool = KvPool::Create(
      pool_shape, blocks, job->kv_layout_.block_size, job->model_->allocator());
  if (!pool.ok()) job->Fail(pool.status());
  const absl::Status gathered = job->GatherReports(world, pool->bytes());
  if (!gathered.ok()) job->Fail(gathered);
  absl::StatusOr<std::unique_ptr<StepRunner>> runner = StepRunner::Create(
      job->model_.get(), *std::move(pool), kv.backend, job->is_sampler());
  if (!runner.ok()) job->Fail(runner.status());
  job->runner_ = *std::move(runner);
  job->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return job;
}

absl::Status ParallelJob::GatherReports(const MpiWorld& world,
                                        int64_t kv_cache_bytes) {
  // Fixed-size records, so one MPI_Gather of bytes carries them.
  struct Wire {
    char host[MPI_MAX_PROCESSOR_NAME];
    int32_t node_leader, local_rank, local_size, gpu;
    int64_t weight_bytes, kv_cache_bytes;
  };
  Wire mine = {};
  world.host_name().copy(mine.host, sizeof(mine.host) - 1);
  mine.node_leader = world.node_leader();
  mine.local_rank = world.local_rank();
  mine.local_size = world.local_size();
  mine.gpu = backend_.gpu;
  mine.weight_bytes = model_->weight_bytes();
  mine.kv_cache_bytes = kv_cache_bytes;
  std::vector<Wire> all(is_coordinator() ? world.size() : 0);
  const int rc =
      MPI_Gather(&mine, sizeof(Wire), MPI_BYTE, all.data(), sizeof(Wire),
                 MPI_BYTE, ProcessGrid::kCoordinatorRank, world.comm().get());
  if (rc != MPI_SUCCESS) {
    return MpiError(rc, "MPI_Gather", "collecting each rank's placement");
  }
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
    reports_.push_back(std::move(report));
  }
  return absl::OkStatus();
}

std::vector<std::string> ParallelJob::PlacementWarnings() const {
  std::vector<std::string> warnings;
  if (reports_.empty()) return warnings;
  for (int stage = 0; stage < grid_.pp(); ++stage) {
    std::vector<int> nodes;
    std::vector<std::string> hosts;
    for (int t = 0; t < grid_.tp(); ++t) {
      const RankReport& r = reports_[grid_.RankOf(stage, t)];
      if (std::find(nodes.begin(), nodes.end(), r.node) != nodes.end()) {
        continue;
      }
      nodes.push_back(r.node);
      hosts.push_back(absl::StrCat(r.host, " (node ", r.node, ")"));
    }
    if (nodes.size() > 1) {
      warnings.push_back(absl::StrCat(
          "the tensor-parallel group of pipeline stage ", stage, " (ranks ",
          grid_.RankOf(stage, 0), "-", grid_.RankOf(stage, grid_.tp() - 1),
          ") spans ", nodes.size(), " nodes: ", absl::StrJoin(hosts, ", "),
          "; every layer's all-reduce crosses the network. Keep a TP group on "
          "one node: consecutive ranks on a node (mpirun --map-by slot, srun "
          "--distribution=block) and --tp at most the GPUs per node"));
    }
  }
  return warnings;
}

void ParallelJob::Fail(const absl::Status& status) const {
  world_->Abort(1, status.message());
}

int ParallelJob::sampler_rank() const {
  return grid_.RankOf(grid_.pp() - 1, 0);
}
bool ParallelJob::is_sampler() const { return world_rank_ == sampler_rank(); }

absl::Status ParallelJob::Execute(const proto::StepPlan& plan,
                                  proto::StepResult* result) {
  if (!is_coordinator()) {
    return absl::FailedPreconditionError("Execute runs on rank 0");
  }
  using Clock = std::chrono::steady_clock;
  // From here on every rank is in the step: any failure ends the job.
  proto::StepPlan sent = plan;  // Broadcast needs a mutable message.
  const auto b0 = Clock::now();
  absl::Status s = control_->Broadcast(&sent, 0);
  const auto b1 = Clock::now();
  if (s.ok()) s = runner_->Run(sent, result);
  const auto r0 = Clock::now();
  if (s.ok() && !is_sampler()) {
    s = control_->Recv(sampler_rank(), kResultTag, result);
  }
  if (!s.ok()) Fail(s);
  ++control_stats_.steps;
  control_stats_.plan_bytes += static_cast<int64_t>(sent.ByteSizeLong());
  control_stats_.broadcast_seconds +=
      std::chrono::duration<double>(b1 - b0).count();
  control_stats_.result_seconds +=
      std::chrono::duration<double>(Clock::now() - r0).count();
  return absl::OkStatus();
}

absl::Status ParallelJob::Shutdown() {
  proto::StepPlan plan;
  plan.set_kind(proto::StepPlan::SHUTDOWN);
  return control_->Broadcast(&plan, 0);
}

absl::Status ParallelJob::ServeSteps() {
  proto::StepPlan plan;
  proto::StepResult result;
  while (true) {
    RETURN_IF_ERROR(control_->Broadcast(&plan, 0));
    if (plan.kind() == proto::StepPlan::SHUTDOWN) return absl::OkStatus();
    absl::Status s = runner_->Run(plan, &result);
    if (s.ok() && is_sampler()) s = control_->Send(result, 0, kResultTag);
    if (!s.ok()) Fail(s);
  }
}

}  // namespace tessera
