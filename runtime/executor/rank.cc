#include "runtime/executor/rank.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/core/progress_bar.h"
#include "runtime/core/status.h"
#include "runtime/model/quantized_weights.h"
#include "runtime/model/random_weights.h"
#include "runtime/model/registry.h"
#include "runtime/model/safetensors.h"

namespace tessera {
namespace {

// The config every rank computes alike: the text rank 0 read, or the folder's.
absl::StatusOr<ModelConfig> SpecConfig(const RankSpec& s) {
  if (s.config_json.empty()) return LoadModelConfig(s.model_dir);
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(s.config_json));
  if (!s.generation_config_json.empty()) {
    const absl::Status merged =
        MergeGenerationConfig(s.generation_config_json, &config);
    if (!merged.ok()) return Annotate(merged, "generation_config.json");
  }
  return config;
}

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(std::string model_dir, std::string label)
      : model_dir_(std::move(model_dir)), label_(std::move(label)) {}
  std::string ProgressLabel() const override { return label_; }

  absl::StatusOr<WeightSet> Load(const ModelConfig& config,
                                 const ShardSpec& shard,
                                 const WeightLoadOptions& options) override {
    ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                     Checkpoint::Open(model_dir_));
    return LoadShardWeights(*ckpt, config, shard, options);
  }

 private:
  std::string model_dir_;
  std::string label_;
};

class RandomSource final : public WeightSource {
 public:
  std::string ProgressLabel() const override { return "making random weights"; }

  absl::StatusOr<WeightSet> Load(const ModelConfig& config,
                                 const ShardSpec& shard,
                                 const WeightLoadOptions& options) override {
    // Before the table: its shapes come from these dimensions.
    RETURN_IF_ERROR(CheckRandomWeightConfig(config));
    ASSIGN_OR_RETURN(WeightTable table, ModelWeightTable(config, shard));
    return MakeRandomWeightSet(config, std::move(table), options,
                               options.available_bytes);
  }
};

// The rank's model: its weights from `source` (stored in the backend as
// `matrices`), scratch for the spec's sizing. Every error is this rank's.
absl::StatusOr<std::unique_ptr<Model>> MakeModel(
    const RankSpec& spec, const ModelConfig& config, const ShardSpec& shard,
    WeightSource& source, const RankContext& context, Ops* ops,
    const Backend& backend, const RankComms& comms, DType matrices) {
  const int64_t parts = source.ProgressParts(config, shard);
  ProgressBar bar(source.ProgressLabel(), parts,
                  spec.show_progress ? stderr : nullptr, isatty(STDERR_FILENO));
  const std::function<void()> advance = [&bar] { bar.Advance(); };
  WeightLoadOptions options;
  options.device = ops;
  options.matrix_dtype = matrices;
  options.on_part = advance;
  // One process on the CPU backend keeps every weight in host memory, as
  // f32: a checkpoint that cannot fit is refused before any is read.
  if (backend.allocator == nullptr && context.connect == nullptr) {
    options.check_host_memory_for = spec.model_dir;
  }
  options.available_bytes = backend.is_cuda()    ? backend.FreeDeviceBytes()
                            : ops->host_memory() ? AvailableHostMemory()
                                                 : -1;
  absl::StatusOr<WeightSet> weights = source.Load(config, shard, options);
  if (!weights.ok()) {
    return Annotate(
        weights.status(),
        spec.random_weights
            ? absl::StrCat("making random weights for ", spec.model_dir,
                           "/config.json")
            : absl::StrCat("loading weights from ", spec.model_dir));
  }
  ModelContext model_context;
  model_context.ops = ops;
  model_context.tp = comms.tp.get();
  model_context.pp = comms.pp.get();
  model_context.max_step_tokens = spec.max_num_batched_tokens;
  model_context.max_logit_rows = spec.max_num_seqs;
  model_context.allocator = backend.allocator.get();
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      CreateModel(config, shard, *std::move(weights), model_context));
  bar.Finish();
  return model;
}

}  // namespace

int64_t WeightSource::ProgressParts(const ModelConfig& config,
                                    const ShardSpec& shard) const {
  absl::StatusOr<int64_t> parts = ModelWeightParts(config, shard);
  return parts.ok() ? *parts : 1;
}

std::unique_ptr<WeightSource> CheckpointWeights(std::string model_dir,
                                                std::string progress_label) {
  return std::make_unique<CheckpointSource>(std::move(model_dir),
                                            std::move(progress_label));
}

std::unique_ptr<WeightSource> RandomWeights() {
  return std::make_unique<RandomSource>();
}

std::unique_ptr<WeightSource> SpecWeights(const RankSpec& spec) {
  if (spec.random_weights) return RandomWeights();
  return CheckpointWeights(spec.model_dir);
}

absl::StatusOr<ModelConfig> RankConfig(const RankSpec& spec) {
  ASSIGN_OR_RETURN(ModelConfig config, SpecConfig(spec));
  RETURN_IF_ERROR(LimitContext(spec.max_model_len, &config));
  if (spec.quantization == "fp8") RETURN_IF_ERROR(QuantizeOnLoad(&config));
  return config;
}

absl::StatusOr<ShardSpec> RankShard(const RankSpec& spec,
                                    const ModelConfig& config) {
  return MakeShardSpec(config, spec.tp_rank, spec.tp, spec.pp_stage, spec.pp,
                       spec.pp_layers, spec.expert_parallel);
}

Rank::~Rank() {
  if (op_timer_ != nullptr && model_ != nullptr) {
    model_->ops()->set_op_timer(nullptr);
  }
}

absl::Status Rank::SetOpProfiling(bool on) {
  Ops* ops = model_->ops();
  if (!on) {
    if (op_timer_ != nullptr) ops->set_op_timer(nullptr);
    op_timer_.reset();
    return absl::OkStatus();
  }
  if (runner_->graphs() != nullptr) {
    return absl::FailedPreconditionError(
        "op profiling times eager steps, and this rank replays decode CUDA "
        "graphs (which record no op); build it without them (--no-graphs)");
  }
  if (op_timer_ != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(op_timer_, ops->NewOpTimer());
  ops->set_op_timer(op_timer_.get());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OpTimeTotal>> Rank::TakeOpProfile() {
  if (op_timer_ == nullptr) {
    return absl::FailedPreconditionError(
        "op profiling is off (SetOpProfiling(true) first)");
  }
  return op_timer_->Collect();
}

absl::StatusOr<std::unique_ptr<Rank>> BuildRank(const RankSpec& spec,
                                                WeightSource& weights,
                                                const RankContext& context) {
  // The same on every rank: the spec, the config, the context, the shard.
  ASSIGN_OR_RETURN(const DType matrices, RankWeightDType(spec));
  ASSIGN_OR_RETURN(const KvCacheOptions kv, RankKvOptions(spec, matrices));
  if (context.ops != nullptr && spec.device != "cpu") {
    return absl::InvalidArgumentError(
        "a rank over the caller's ops runs on the CPU");
  }
  ASSIGN_OR_RETURN(const ModelConfig config, RankConfig(spec));
  ASSIGN_OR_RETURN(const ShardSpec shard, RankShard(spec, config));

  // From here on an error is this rank's alone.
  Backend backend;
  if (context.ops == nullptr) {
    absl::StatusOr<Backend> made =
        CreateBackend(spec.device, spec.local_rank, spec.gpus_per_node);
    if (!made.ok()) return RankLocal(made.status());
    backend = *std::move(made);
  }
  Ops* ops = context.ops != nullptr ? context.ops : backend.ops.get();
  RankComms comms;
  if (context.connect) {
    absl::StatusOr<RankComms> connected = context.connect(backend);
    if (!connected.ok()) return RankLocal(connected.status());
    comms = *std::move(connected);
  }
  absl::StatusOr<std::unique_ptr<Model>> model = MakeModel(
      spec, config, shard, weights, context, ops, backend, comms, matrices);
  if (!model.ok()) return RankLocal(model.status());
  const bool samples = spec.pp_stage == spec.pp - 1 && spec.tp_rank == 0;
  RankContext kv_context = context;
  // Decode graphs on a GPU in one process. A job's ranks would capture their
  // collectives too (graph_runner.h) but that waits for its validation on
  // two GPUs: until then parallel ranks run eagerly.
  kv_context.decode_graphs =
      spec.cuda_graphs && backend.is_cuda() && spec.tp * spec.pp == 1;
  if (kv_context.free_bytes < 0 && backend.is_cuda()) {
    const Backend* device = &backend;
    kv_context.measure_free_bytes = [device] {
      return device->FreeDeviceBytes();
    };
  }
  absl::StatusOr<std::unique_ptr<Rank>> rank = AssembleRank(
      *std::move(model), nullptr, kv, spec.max_num_seqs, samples, kv_context);
  if (!rank.ok()) return RankLocal(rank.status());
  // The model and the communicators were made over `backend`: the rank owns
  // them together (the model is destroyed first, the backend last).
  (*rank)->backend_ = std::move(backend);
  (*rank)->comms_ = std::move(comms);
  return rank;
}

int64_t KvBudgetBaseBytes(const RankContext& context) {
  if (context.free_bytes >= 0) return context.free_bytes;
  if (context.measure_free_bytes) return context.measure_free_bytes();
  // Host memory: every rank of this node sizes its pool against the same
  // MemAvailable (the others' pools are mapped but not yet touched, so they
  // do not show in it), so each takes only its share.
  const int64_t host = AvailableHostMemory();
  return host < 0 ? host : host / std::max(1, context.host_memory_sharers);
}

absl::StatusOr<std::unique_ptr<Rank>> AssembleRank(
    std::unique_ptr<Model> owned, Model* borrowed, const KvCacheOptions& kv,
    int64_t max_num_seqs, bool samples, const RankContext& context) {
  Model* model = owned != nullptr ? owned.get() : borrowed;
  if (model == nullptr || (owned != nullptr && borrowed != nullptr)) {
    return absl::InvalidArgumentError(
        "AssembleRank takes exactly one of an owned and a borrowed model");
  }
  if (model->max_logit_rows() < max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model samples at most ", model->max_logit_rows(),
        " sequences per step, the scheduler may run ", max_num_seqs));
  }
  // The step buffers and the backend's step scratch first, for the layout's
  // block size (which the memory does not change), then the pool: sized
  // against the memory left, then (in a job) the smallest count of every
  // rank, so that block ids mean the same everywhere.
  const KvPoolShape shape = model->kv_pool_shape(kv.dtype);
  const auto free_bytes = [&context] { return KvBudgetBaseBytes(context); };
  const int64_t context_len = model->config().max_position_embeddings;
  ASSIGN_OR_RETURN(
      const KvLayout sizing,
      ResolveKvLayout(kv, shape, context_len, static_cast<int>(max_num_seqs),
                      free_bytes()));
  // The step buffers and the step scratch as the allocator counts them (on
  // the CPU the step buffers are host memory outside it: their own bytes).
  const int64_t in_use_before_step = model->memory_stats().in_use_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<StepInputs> reserved,
                   StepRunner::Reserve(model, sizing.block_size));
  MemoryBreakdown memory;
  memory.weights_bytes = model->weight_bytes();
  memory.workspace_bytes =
      model->workspace_bytes() +
      std::max<int64_t>(model->memory_stats().in_use_bytes - in_use_before_step,
                        static_cast<int64_t>(reserved->buffer_bytes()));
  // Graph memory counted by construction: graphs of every bucket exist (over
  // a probe pool of one block) while the pool is sized. Declared in this
  // order so that the probe graphs go before the probe pool.
  const bool graphs =
      context.decode_graphs && kv.backend == AttentionBackend::kPaged;
  const std::vector<int32_t> buckets =
      graphs ? DecodeGraphBuckets(
                   std::min<int64_t>({max_num_seqs, model->max_step_tokens(),
                                      model->max_logit_rows()}))
             : std::vector<int32_t>();
  KvPool probe_pool;
  std::unique_ptr<GraphRunner> probe_graphs;
  if (!buckets.empty()) {
    ASSIGN_OR_RETURN(probe_pool,
                     KvPool::Create(shape, 1, sizing.block_size, model->ops(),
                                    model->allocator()));
    RETURN_IF_ERROR(ApplyCheckpointKvScales(*model, &probe_pool));
    ASSIGN_OR_RETURN(
        probe_graphs,
        GraphRunner::Capture(model, probe_pool, kv.backend, reserved.get(),
                             buckets, context.measure_free_bytes));
  }
  ASSIGN_OR_RETURN(
      KvLayout layout,
      ResolveKvLayout(kv, shape, context_len, static_cast<int>(max_num_seqs),
                      free_bytes()));
  if (layout.block_size != sizing.block_size) {
    return absl::InternalError("the KV block size changed with free memory");
  }
  if (context.agree_kv_blocks) {
    ASSIGN_OR_RETURN(layout.num_blocks,
                     context.agree_kv_blocks(layout.num_blocks));
  }
  ASSIGN_OR_RETURN(KvPool pool,
                   KvPool::Create(shape, layout.num_blocks, layout.block_size,
                                  model->ops(), model->allocator()));
  // An fp8 cache takes the checkpoint's KV scales before any token.
  RETURN_IF_ERROR(ApplyCheckpointKvScales(*model, &pool));
  std::unique_ptr<Rank> rank(new Rank());
  rank->owned_model_ = std::move(owned);
  rank->model_ = model;
  rank->kv_layout_ = layout;
  rank->samples_ = samples;
  memory.kv_bytes = pool.bytes();
  ASSIGN_OR_RETURN(rank->runner_,
                   StepRunner::Create(model, std::move(pool), kv.backend,
                                      samples, std::move(reserved)));
  if (!buckets.empty()) {
    const int64_t probe_bytes = probe_graphs->graph_bytes();
    probe_graphs.reset();
    probe_pool = KvPool();
    RETURN_IF_ERROR(
        rank->runner_->CaptureGraphs(buckets, context.measure_free_bytes));
    // The recapture may reuse what the probe's graphs gave back without the
    // free memory moving: the probe's clean measurement is the honest one.
    memory.graphs_bytes = std::max(probe_bytes, rank->runner_->graph_bytes());
  }
  rank->memory_ = memory;
  return rank;
}

}  // namespace tessera
