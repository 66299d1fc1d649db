// GraphRunner: decode steps replayed as CUDA graphs, one per batch bucket.
//
// Buckets (DecodeGraphBuckets): 1, 2, 4, 8, then every multiple of 8 up to
// min(256, the rank's most sequences per step), and that cap itself when it
// is no multiple of 8, so every decode batch up to the cap has a bucket. A
// pure-decode step (every sequence runs one token and samples) of n <= the
// largest bucket sequences is padded to the smallest bucket >= n
// (StepInputs::Fill's pad_to: graph-safe steps 2 of attention_metadata.h,
// seq_len 0 rows that attention answers with zeros and the cache write skips),
// and the bucket's graph is replayed; the logits then have `bucket` rows, the
// real ones first, and only those are sampled — sampling stays outside the
// graph (it copies to and from the host). Any other step runs eagerly
// (StepRunner).
//
// Capture (Capture): the step inputs are filled with a batch of padding only
// (no real sequence: nothing reads or writes a KV block), the model runs it
// once eagerly (the warm-up: cuBLASLt plans and anything made on first use
// exist before the capture), then again between Device::BeginCapture and
// EndCapture. Buckets are captured largest first so that smaller graphs find
// everything the larger ones made. Every launch of a decode step is
// graph-safe (attention_metadata.h, graph-safe steps 1: its configuration
// depends only on the bucket, the model's dims and
// AttentionMetadata::grid_max_seq_len, which a padded step sets to the rank's
// context), so one graph serves every step of its bucket whatever the lengths;
// the device arrays the graph reads are the step inputs' fixed buffers,
// refilled by one upload before each replay.
//
// Memory: one pool, the rank's allocator. Nothing is allocated while a graph
// is captured (the step scratch was reserved for the largest step,
// Ops::ReserveStepScratch); each graph holds a PinLease on the blocks it
// references (the step inputs' buffer, the KV pool's layers, and anything
// allocated during its capture), so trimming the allocator never returns
// them to the driver while the graph lives. What the driver takes for the
// instantiated graphs is measured as the change of free device memory over
// the whole capture (graph_bytes(), with the allocator's growth). Graphs and
// eager steps run on the one stream of the rank's ops, so they are serialized.
//
// Parallel ranks (designed for, validated in the two-GPU issue; BuildRank
// enables graphs in one process only until then): the TP collectives are ops
// on the same stream (NCCL) issued inside Model::ForwardBatch, so the capture
// records them in the graph like any kernel; every rank of a job captures the
// same buckets in the same order (they depend only on the shared sizing), and
// the graph-or-eager choice depends only on the plan, which every rank gets
// alike, so all ranks replay the same bucket together. Each pipeline stage
// captures its own graphs over its own layers (its Recv/Send sit inside them;
// a non-last stage's graphs have no logits).
//
// RAII and exception-safe: a capture that fails (or throws) is ended and its
// recording dropped, the allocator's capture cancelled; destroying the runner
// destroys every graph before its lease. Not thread-safe; must not outlive the
// model, the pool or the step inputs it was captured over.
#ifndef TESSERA_RUNTIME_EXECUTOR_GRAPH_RUNNER_H_
#define TESSERA_RUNTIME_EXECUTOR_GRAPH_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"
#include "runtime/executor/step_inputs.h"
#include "runtime/kv/kv_layout.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/model/model.h"

namespace tessera {

// The most sequences a decode graph takes.
inline constexpr int32_t kMaxDecodeGraphBatch = 256;

// The buckets for a rank whose steps hold at most `max_batch` sequences (and
// tokens), ascending (see above); empty for max_batch < 1.
std::vector<int32_t> DecodeGraphBuckets(int64_t max_batch);

// The smallest of the ascending `buckets` that holds `batch` sequences, or 0
// when none does (batch < 1 or beyond the largest).
int32_t DecodeGraphBucket(absl::Span<const int32_t> buckets, int64_t batch);

class GraphRunner {
 public:
  // Captures one graph per bucket of `buckets` (ascending, each in [1,
  // inputs' sequence, token and logit-row limits]) over `model`, `pool` and
  // `inputs` (all must outlive the runner), largest first. The model's ops
  // must capture (Unimplemented on the CPU backend, before anything runs).
  // `free_device_bytes`, if set, measures the device's free memory before and
  // after (graph_bytes()); the allocator's growth is counted either way. On
  // error nothing is left captured.
  static absl::StatusOr<std::unique_ptr<GraphRunner>> Capture(
      Model* model, const KvPool& pool, AttentionBackend backend,
      StepInputs* inputs, absl::Span<const int32_t> buckets,
      const std::function<int64_t()>& free_device_bytes = nullptr);

  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  const std::vector<int32_t>& buckets() const { return buckets_; }
  // DecodeGraphBucket over this runner's buckets.
  int32_t BucketFor(int64_t batch) const {
    return DecodeGraphBucket(buckets_, batch);
  }

  // Enqueues the graph of `bucket` on the ops' stream. The step inputs must
  // hold a step padded to `bucket` (Fill with pad_to = bucket) over the pool
  // the graphs were captured with. InvalidArgument for a bucket without a
  // graph or inputs that are not such a step.
  absl::Status Replay(int32_t bucket);

  // Where the replay of `bucket` leaves its logits ([bucket, vocab], the real
  // sequences' rows first); empty on a rank without logits (not the last
  // pipeline stage) or for an unknown bucket.
  TensorView logits(int32_t bucket) const;

  // Device memory the graphs hold: free device memory lost over the capture
  // (when measured) or, if more, what the allocator reserved during it. Free
  // memory moves in the driver's pages (2 MiB on an H200: the demo model's
  // five graphs read 2 MiB), and a capture may reuse what destroyed graphs
  // gave back without it moving at all (0) — which is why a Rank reports the
  // measurement of its first (probe) capture.
  int64_t graph_bytes() const { return graph_bytes_; }
  // Replays so far (tests).
  int64_t replays() const { return replays_; }

 private:
  struct Graph {
    int32_t bucket = 0;
    // Declared before the graph: destroyed after it.
    PinLease lease;
    std::unique_ptr<DeviceGraph> graph;
    TensorView logits;
  };
  GraphRunner() = default;
  const Graph* Find(int32_t bucket) const;
  absl::Status CaptureOne(int32_t bucket);

  Model* model_ = nullptr;
  const KvPool* pool_ = nullptr;
  AttentionBackend backend_ = AttentionBackend::kPaged;
  StepInputs* inputs_ = nullptr;
  std::vector<int32_t> buckets_;
  std::vector<Graph> graphs_;  // Ascending buckets.
  int64_t graph_bytes_ = 0;
  int64_t replays_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_GRAPH_RUNNER_H_
