// RankSpec: what a rank is asked to be, as plain values — no model, op set
// or KV type — so launch/ can make one from flags and parallel/ can carry it
// to every rank in the ModelManifest. BuildRank (rank.h) turns it into a
// Rank.
#ifndef TESSERA_RUNTIME_EXECUTOR_RANK_SPEC_H_
#define TESSERA_RUNTIME_EXECUTOR_RANK_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

// The names and defaults are the flags' (vLLM's).
struct RankSpec {
  std::string model_dir;
  // The config as rank 0 read it (config.json and generation_config.json
  // text): every rank of a job parses the same bytes. Empty: read model_dir's.
  std::string config_json;
  std::string generation_config_json;

  std::string device = "cpu";  // cpu, or cuda (one GPU per rank).
  // GPUs per node for the job (> 0): the rank uses GPU local_rank % this;
  // 0: every visible GPU.
  int gpus_per_node = 0;
  int local_rank = 0;  // Among the ranks of its node (picks the GPU).

  // The grid and this rank's place in it (world rank = pp_stage * tp +
  // tp_rank). pp_layers: layers per stage; empty = even split.
  int tp = 1;
  int pp = 1;
  int tp_rank = 0;
  int pp_stage = 0;
  std::vector<int64_t> pp_layers;
  // --ep: a mixture of experts' TP group splits its experts rather than
  // their intermediate dimension (shard.h ShardSpec::expert_parallel).
  bool expert_parallel = false;
  // A job's ranks each read their own slices (--weights local) instead of
  // receiving them from rank 0 (parallel/ picks the WeightSource by it).
  bool weights_local = false;
  // Every rank makes its weights up from the config (runtime/model/
  // random_weights.h; --random-weights): no safetensors are read or sent.
  bool random_weights = false;

  // Engine sizing: every rank's scratch is sized for these.
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;

  // The KV cache (see ResolveKvLayout in runtime/kv/kv_layout.h).
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;       // > 0: exactly this many blocks.
  int64_t kv_cache_memory = 0;     // > 0: KV budget in bytes per rank.
  double kv_cache_fraction = 0.5;  // Else this share of free memory.
  // auto (the weights' dtype on a GPU, float32 on the CPU), float32,
  // bfloat16 (GPU) or int8.
  std::string kv_dtype = "auto";
  std::string attention = "paged";  // paged or static.

  // Weights on the GPU: auto (bfloat16), bfloat16 or float32. The CPU
  // computes in float32 whatever the checkpoint holds.
  std::string weight_dtype = "auto";
  // "" (none) or "fp8": quantize the checkpoint's linear weights to fp8 as
  // they load (--quantization; runtime/model/quantized_weights.h). Needs
  // --device cuda with bfloat16 matrices; an fp8 checkpoint needs no flag.
  std::string quantization;
  // > 0: the context the rank serves (at most max_position_embeddings, which
  // it lowers to this); 0: the config's.
  int64_t max_model_len = 0;
  // Decode CUDA graphs (runtime/executor/graph_runner.h) on a GPU rank
  // (--no-graphs turns them off; the CPU never has them). Parallel ranks run
  // eagerly until multi-GPU capture is validated (rank.cc); the manifest does
  // not carry this field yet for the same reason.
  bool cuda_graphs = true;
  // Draw a progress bar on stderr while the weights are read (redrawn in
  // place on a terminal, a few log lines otherwise).
  bool show_progress = false;
  // A parallel job's step deadline in seconds (parallel/fault_monitor.h);
  // every rank reads it from its own flags. 0: none.
  double step_timeout_seconds = 6.0;
  // Its startup's progress deadline in seconds (parallel/fault_monitor.h,
  // "Startup"). 0: none.
  double startup_timeout_seconds = 60.0;
};

// Checks the spec's values before anything is read: InvalidArgument naming
// the flag ("--dtype must be auto, bfloat16 or float32, got ...", "--kv-dtype
// bfloat16 needs --device cuda", ...), or FailedPrecondition for --device
// cuda in a build without the CUDA backend (CudaUnavailableError,
// kernels/backend/backend.h). BuildRank calls it first; launch/ calls it while
// parsing flags, so a bad value costs no load.
absl::Status CheckRankSpec(const RankSpec& spec);

// The spec checked as CheckRankSpec does, with "auto" resolved: weight_dtype
// and kv_dtype become "float32", "bfloat16", "int8" or "fp8" (what rank 0 sends
// every rank, so all parse the same names).
absl::StatusOr<RankSpec> ResolveRankSpec(RankSpec spec);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_RANK_SPEC_H_
