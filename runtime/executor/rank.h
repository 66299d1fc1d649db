// Rank: everything one rank runs steps with — its backend (op set and
// memory), its part of the model, its KV pool and the StepRunner over them —
// and BuildRank, THE one place that assembles it. A single process (generate,
// bench, serve without --tp/--pp, tests) and every rank of a parallel job
// (parallel/coordinator, parallel/worker) build their rank here; only where
// the weights come from (WeightSource) and how the rank talks to the others
// (RankContext) differ.
//
// Order of assembly, and whose an error is (runtime/core/status.h, "Error
// scope"): the spec is checked and the config, the context limit and the
// shard are computed first — from the same input on every rank, so their
// errors are the same everywhere and unmarked, and no weight has been read.
// From the backend on (a missing GPU, the communicators, the weights, the
// model's memory, the KV pool) an error is this rank's alone and comes back
// marked RankLocal: in a job the others are already waiting on this rank.
//
// launch/ fills a RankSpec from flags and never sees the model, the op set or
// the KV types; what it needs of them (the config, the KV layout) comes
// through Rank's accessors or the StepExecutor.
#ifndef TESSERA_RUNTIME_EXECUTOR_RANK_H_
#define TESSERA_RUNTIME_EXECUTOR_RANK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend/backend.h"
#include "kernels/op_timer.h"
#include "runtime/comm/communicator.h"
#include "runtime/executor/memory_breakdown.h"
#include "runtime/executor/rank_spec.h"
#include "runtime/executor/step_runner.h"
#include "runtime/kv/kv_layout.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/shard.h"
#include "runtime/model/weights.h"

namespace tessera {

// The spec's values as the types behind them (InvalidArgument as
// CheckRankSpec): the weights' dtype on the device (bfloat16 on a GPU unless
// float32 is asked for, float32 on the CPU), the KV dtype ("auto" follows the
// weights) and the KV options.
absl::StatusOr<DType> RankWeightDType(const RankSpec& spec);
absl::StatusOr<DType> RankKvDType(const RankSpec& spec, DType weights);
absl::StatusOr<KvCacheOptions> RankKvOptions(const RankSpec& spec,
                                             DType weights);

// The config the spec's rank serves: config_json (or model_dir's files), the
// generation config's eos ids merged, the context lowered to max_model_len.
// The same on every rank of a job (errors unmarked).
absl::StatusOr<ModelConfig> RankConfig(const RankSpec& spec);

// The spec's shard of `config` (its tp_rank and pp_stage in the tp x pp grid,
// pp_layers). InvalidArgument, the same on every rank, when the model cannot
// be split so.
absl::StatusOr<ShardSpec> RankShard(const RankSpec& spec,
                                    const ModelConfig& config);

// Where a rank's weights come from. BuildRank asks for them once the backend
// and the communicators exist (so a source may talk to other ranks: rank 0
// sending every rank its shard, a rank receiving its own).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // What the progress bar says and how many parts it counts while Load runs
  // (rank 0 that sends every rank its shard counts them all).
  virtual std::string ProgressLabel() const { return "loading weights"; }
  virtual int64_t ProgressParts(const ModelConfig& config,
                                const ShardSpec& shard) const;
  // This rank's weights for `shard`, stored through options.ops as they
  // arrive (matrices as options.matrix_dtype, in the checkpoint's dtype until
  // then); options.on_part is called after each part (ModelWeightParts of
  // them).
  virtual absl::StatusOr<WeightSet> Load(const ModelConfig& config,
                                         const ShardSpec& shard,
                                         const WeightLoadOptions& options) = 0;
};

// Reads this rank's slice (the whole model in one process) from the
// safetensors of `model_dir`; the progress bar says `progress_label`.
std::unique_ptr<WeightSource> CheckpointWeights(
    std::string model_dir, std::string progress_label = "loading weights");

// Makes this rank's weights up from the config (runtime/model/
// random_weights.h: deterministic, the same tensors at any TP/PP split), no
// checkpoint read; refuses a shape that cannot fit before making any.
std::unique_ptr<WeightSource> RandomWeights();

// The spec's source in one process: RandomWeights() with
// spec.random_weights, else CheckpointWeights(spec.model_dir).
std::unique_ptr<WeightSource> SpecWeights(const RankSpec& spec);

// The rank's TP and PP communicators (see runtime/comm/communicator.h).
struct RankComms {
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
};

// What a rank's surroundings give it. The default is one process: no other
// ranks, a backend made from the spec's device.
struct RankContext {
  // Makes the communicators once the backend exists (parallel/: NCCL on the
  // backend's stream, MPI on the CPU). Null: one process, no communicators.
  std::function<absl::StatusOr<RankComms>(const Backend&)> connect;
  // Agrees on the KV pool's block count across the job (every rank takes the
  // smallest, so block ids mean the same everywhere); gets this rank's count.
  // Null: this rank's own count.
  std::function<absl::StatusOr<int64_t>(int64_t)> agree_kv_blocks;
  // Tests and tools: run on these ops (host memory; not owned, must outlive
  // the rank) instead of a backend made from spec.device ("cpu" only).
  Ops* ops = nullptr;
  // The memory the KV budget's fraction applies to; -1: measured by
  // `measure_free_bytes` (BuildRank: the device's free memory on a GPU), or
  // MemAvailable without it. Measured after the model, the step buffers and
  // the step scratch exist, so the KV pool takes only what is left.
  int64_t free_bytes = -1;
  std::function<int64_t()> measure_free_bytes;
  // The ranks of the job whose KV pools come out of this host's memory
  // (the ranks on this node, on CPUs): MemAvailable is shared among them, so
  // each takes its share of it (KvBudgetBaseBytes). Not applied to a
  // measured device's memory (each GPU rank has its own).
  int host_memory_sharers = 1;
  // Capture decode CUDA graphs (runtime/executor/graph_runner.h) for buckets
  // up to max_num_seqs. BuildRank sets it for a CUDA rank unless
  // spec.cuda_graphs is off; the ops must capture (not the CPU's).
  bool decode_graphs = false;
};

// The memory a rank's default KV budget is a fraction of: context.free_bytes
// when given, else the measured device memory, else this host's MemAvailable
// divided among context.host_memory_sharers; -1 when unknown.
int64_t KvBudgetBaseBytes(const RankContext& context);

class Rank {
 public:
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  ~Rank();

  const ModelConfig& config() const { return model_->config(); }
  const ShardSpec& shard() const { return model_->shard(); }
  Model& model() const { return *model_; }
  StepRunner& runner() const { return *runner_; }
  KvLayout kv_layout() const { return kv_layout_; }
  // Whether this rank samples: tp-rank 0 of the last pipeline stage (it holds
  // the full logits after the vocabulary-parallel gather); always in one
  // process.
  bool samples() const { return samples_; }
  // The CUDA device, or -1 on the CPU.
  int gpu() const { return backend_.gpu; }
  int64_t weight_bytes() const { return model_->weight_bytes(); }
  int64_t kv_cache_bytes() const { return runner_->pool().bytes(); }
  // Device memory the decode CUDA graphs hold (0 without graphs; also
  // memory_breakdown().graphs_bytes). Counted by construction: the KV pool
  // was sized while graphs of the same buckets existed (see AssembleRank).
  int64_t graph_bytes() const { return memory_.graphs_bytes; }
  // The decode batch sizes replayed as CUDA graphs, ascending (empty: eager).
  std::vector<int32_t> decode_graph_buckets() const {
    const GraphRunner* graphs = runner_->graphs();
    return graphs != nullptr ? graphs->buckets() : std::vector<int32_t>();
  }
  AllocatorStats memory_stats() const { return model_->memory_stats(); }
  // Where the rank's memory went when it was built (memory_breakdown.h).
  MemoryBreakdown memory_breakdown() const { return memory_; }
  // The most tokens and sampled sequences one step may hold.
  int64_t max_step_tokens() const { return model_->max_step_tokens(); }
  int64_t max_step_seqs() const { return model_->max_logit_rows(); }
  // The most top log-probabilities this rank's sampler ranks per token.
  int32_t max_top_logprobs() const { return model_->ops()->max_top_logprobs(); }

  // Op profiling of this rank's ops (kernels/op_timer.h): while on, every op
  // of a step is timed on the device, and TakeOpProfile returns the totals
  // per label since the last take (waiting for the device) and starts over.
  // Only eager steps can be profiled: FailedPrecondition turning it on where
  // decode steps replay CUDA graphs (a replay records nothing; build the rank
  // without them, --no-graphs), and taking a profile while it is off. Errors
  // of the backend's timer come back from TakeOpProfile.
  absl::Status SetOpProfiling(bool on);
  absl::StatusOr<std::vector<OpTimeTotal>> TakeOpProfile();

 private:
  friend absl::StatusOr<std::unique_ptr<Rank>> BuildRank(const RankSpec&,
                                                         WeightSource&,
                                                         const RankContext&);
  friend absl::StatusOr<std::unique_ptr<Rank>> AssembleRank(
      std::unique_ptr<Model>, Model*, const KvCacheOptions&, int64_t, bool,
      const RankContext&);
  Rank() = default;

  // Declared in destruction order's reverse: the communicators and the model
  // use the backend, the runner uses the model.
  Backend backend_;
  RankComms comms_;
  std::unique_ptr<Model> owned_model_;
  Model* model_ = nullptr;
  KvLayout kv_layout_;
  bool samples_ = true;
  MemoryBreakdown memory_;
  std::unique_ptr<StepRunner> runner_;
  // Set on the model's ops while profiling is on (the ops may be borrowed
  // and outlive the rank, so the destructor unsets it).
  std::unique_ptr<OpTimer> op_timer_;
};

// THE assembly: checks the spec, computes the config and the shard, makes the
// backend (or takes context.ops) and the communicators, reads the weights
// from `weights` (and uploads them to a GPU), creates the model with scratch
// for the spec's sizing, sizes the KV pool against free memory (agreeing on
// the block count through the context) and creates the StepRunner. Errors as
// the header says: unmarked before the backend, RankLocal from it on.
absl::StatusOr<std::unique_ptr<Rank>> BuildRank(
    const RankSpec& spec, WeightSource& weights,
    const RankContext& context = {});

// The tail of the assembly over a model built elsewhere (tests that edit a
// config or weights, LocalExecutor over a caller's model): the KV layout and
// pool, and the StepRunner. With context.decode_graphs, the KV pool is sized
// after every decode graph exists, so that graph memory is counted by
// construction: the graphs are first captured over a one-block probe pool,
// the pool is sized from the memory then left, and the graphs are captured
// again over the real pool (the probe's are destroyed just before: the same
// buckets take the same memory). Exactly one of `owned` and `borrowed` is set
// (`borrowed` must outlive the rank). The model must sample at least
// `max_num_seqs` sequences per step (InvalidArgument otherwise).
absl::StatusOr<std::unique_ptr<Rank>> AssembleRank(
    std::unique_ptr<Model> owned, Model* borrowed, const KvCacheOptions& kv,
    int64_t max_num_seqs, bool samples, const RankContext& context = {});

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_RANK_H_
